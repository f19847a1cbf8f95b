//! `--report FILE.html`: one self-contained page - the command, the summary
//! table and the plots as inline SVG drawn here (no scripts, stylesheets,
//! fonts or images from elsewhere).

use std::fmt::Write;

/// A plot: lines over time (seconds since the start).
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub y_label: String,
    pub lines: Vec<Line>,
    /// A shaded time span with its label (the warm-up).
    pub shade: Option<(f64, f64, String)>,
}

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Line {
    /// The JSON series field it plots (each point's `data-series`).
    pub key: String,
    pub label: String,
    /// (t in s, value).
    pub points: Vec<(f64, f64)>,
}

const COLORS: [&str; 4] = ["#1f6fb2", "#d9480f", "#2b8a3e", "#862e9c"];
const W: f64 = 760.0;
const H: f64 = 300.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 45.0;

/// Text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// 1, 2 or 5 times a power of ten, near `rough`.
fn nice_step(rough: f64) -> f64 {
    if !rough.is_finite() || rough <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(rough.log10().floor());
    let m = rough / p;
    p * if m < 1.5 {
        1.0
    } else if m < 3.5 {
        2.0
    } else if m < 7.5 {
        5.0
    } else {
        10.0
    }
}

/// A number for an axis label: 12k, 1.5M, 0.25.
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_owned()
    }
}

/// The chart as an `<svg>` element.
pub fn svg(chart: &Chart) -> String {
    let all = chart.lines.iter().flat_map(|l| l.points.iter());
    let x_max = all
        .clone()
        .map(|p| p.0)
        .chain(chart.shade.iter().map(|s| s.1))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let y_top = all.map(|p| p.1).fold(0.0f64, f64::max);
    let y_step = nice_step(y_top / 5.0);
    let y_max = ((y_top / y_step).ceil() * y_step).max(y_step);
    let x_step = nice_step(x_max / 8.0);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |x: f64| LEFT + x / x_max * pw;
    let sy = |y: f64| TOP + ph - y / y_max * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{}">"#,
        escape(&chart.title)
    );
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="18" class="title">{}</text>"#,
        escape(&chart.title)
    );
    if let Some((a, b, label)) = &chart.shade {
        let (xa, xb) = (sx(a.max(0.0)), sx(b.min(x_max)));
        if xb > xa {
            let _ = write!(
                s,
                r#"<rect x="{xa:.1}" y="{TOP}" width="{:.1}" height="{ph}" class="shade"/><text x="{:.1}" y="{:.1}" class="shade-label">{}</text>"#,
                xb - xa,
                xa + 4.0,
                TOP + 14.0,
                escape(label)
            );
        }
    }
    // Grid and axes.
    let mut y = 0.0;
    while y <= y_max + y_step / 2.0 {
        let py = sy(y);
        let _ = write!(
            s,
            r#"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" class="grid"/><text x="{:.1}" y="{:.1}" class="ytick">{}</text>"#,
            W - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            short(y)
        );
        y += y_step;
    }
    let mut x = 0.0;
    while x <= x_max + x_step / 100.0 {
        let px = sx(x);
        let _ = write!(
            s,
            r#"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" class="axis"/><text x="{px:.1}" y="{:.1}" class="xtick">{}</text>"#,
            TOP + ph,
            TOP + ph + 5.0,
            TOP + ph + 18.0,
            short(x)
        );
        x += x_step;
    }
    let _ = write!(
        s,
        r#"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" class="axis"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" class="axis"/>"#,
        TOP + ph,
        W - RIGHT,
        TOP + ph,
        TOP + ph
    );
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" class="xlabel">time (s)</text><text x="14" y="{:.1}" class="ylabel" transform="rotate(-90 14 {:.1})">{}</text>"#,
        LEFT + pw / 2.0,
        H - 6.0,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        escape(&chart.y_label)
    );
    // Lines, points (each with its value as a tooltip) and the legend.
    for (i, line) in chart.lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = line
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            pts.join(" ")
        );
        let key = escape(&line.key);
        for &(x, y) in &line.points {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}" data-series="{key}"><title>{}: {} at {:.1} s</title></circle>"#,
                sx(x),
                sy(y),
                escape(&line.label),
                trim(y),
                x
            );
        }
        // The legend, top right, one entry per line.
        let lx = W - RIGHT - (chart.lines.len() - i) as f64 * 130.0;
        let _ = write!(
            s,
            r#"<rect x="{lx:.1}" y="10" width="12" height="4" fill="{color}"/><text x="{:.1}" y="16" class="legend">{}</text>"#,
            lx + 16.0,
            escape(&line.label)
        );
    }
    s.push_str("</svg>");
    s
}

/// The whole page.
pub fn page(command: &str, title: &str, rows: &[(String, String)], charts: &[Chart]) -> String {
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(h, "<title>{}</title>", escape(title));
    h.push_str(
        "<style>
body{font-family:sans-serif;margin:2em;color:#222;max-width:60em}
code{background:#f3f3f3;padding:0.2em 0.4em;word-break:break-all}
table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:0.3em 0.7em;text-align:left;vertical-align:top}
th{background:#f3f3f3}
svg{display:block;margin:1.5em 0;font-size:12px}
svg .title{font-size:15px;font-weight:bold}
svg .grid{stroke:#e5e5e5}
svg .axis{stroke:#555}
svg .ytick{text-anchor:end;fill:#555}
svg .xtick,svg .xlabel{text-anchor:middle;fill:#555}
svg .ylabel{text-anchor:middle;fill:#555}
svg .shade{fill:#f1f1f1}
svg .shade-label{fill:#888}
</style>
</head>
<body>
",
    );
    let _ = writeln!(h, "<h1>{}</h1>", escape(title));
    let _ = writeln!(h, "<p>Command: <code>{}</code></p>", escape(command));
    h.push_str("<table>\n");
    for (k, v) in rows {
        let _ = writeln!(h, "<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(v));
    }
    h.push_str("</table>\n");
    for c in charts {
        h.push_str(&svg(c));
        h.push('\n');
    }
    h.push_str("</body>\n</html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn steps_and_labels() {
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(nice_step(23.0), 20.0);
        assert_eq!(nice_step(40_000.0), 50_000.0);
        assert_eq!(short(80_000.0), "80k");
        assert_eq!(short(1_500_000.0), "1.5M");
        assert_eq!(short(0.25), "0.25");
    }

    #[test]
    fn a_point_per_value_and_text_escaped() {
        let chart = Chart {
            title: "<T>".into(),
            y_label: "y".into(),
            lines: vec![Line {
                key: "k".into(),
                label: "a&b".into(),
                points: vec![(1.0, 5.0), (2.0, 7.5), (3.0, 0.0)],
            }],
            shade: Some((0.0, 1.0, "warm-up".into())),
        };
        let s = svg(&chart);
        assert_eq!(s.matches(r#"data-series="k""#).count(), 3);
        assert!(s.contains("&lt;T&gt;") && !s.contains("<T>"));
        assert!(s.contains("a&amp;b"));
        let page = page(
            "uascale bench read 'x<y'",
            "t",
            &[("k".into(), "<v>".into())],
            &[chart],
        );
        assert!(page.contains("<td>&lt;v&gt;</td>"));
        assert!(page.contains("x&lt;y"));
        // An empty chart still draws.
        let empty = Chart {
            lines: vec![],
            shade: None,
            ..chart_with_title()
        };
        assert!(svg(&empty).starts_with("<svg"));
    }

    fn chart_with_title() -> Chart {
        Chart {
            title: "t".into(),
            y_label: "y".into(),
            lines: vec![],
            shade: None,
        }
    }
}
