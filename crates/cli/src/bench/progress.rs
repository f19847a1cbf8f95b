//! Progress on stderr: a bar redrawn in place on a terminal, one plain line
//! per update otherwise (logs, CI). Nothing goes to stdout.

use std::io::{IsTerminal, Write};

const WIDTH: usize = 30;

/// Draws the progress of one run's phases.
pub struct Progress {
    tty: bool,
    drawn: bool,
}

impl Progress {
    /// A bar when stderr is a terminal, lines otherwise.
    pub fn new() -> Self {
        Progress {
            tty: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    /// Shows `phase` at `fraction` (0..=1) done, with `text` after it.
    pub fn update(&mut self, phase: &str, fraction: f64, text: &str) {
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[K{}", bar_line(phase, fraction, text));
            self.drawn = true;
        } else {
            let _ = writeln!(
                err,
                "  {phase}: {:>3.0}% {text}",
                fraction.clamp(0.0, 1.0) * 100.0
            );
        }
        let _ = err.flush();
    }

    /// Ends the bar's line (before other output).
    pub fn finish(&mut self) {
        if self.tty && self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// `phase [#######.......]  45% text`
fn bar_line(phase: &str, fraction: f64, text: &str) -> String {
    let f = if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let full = (f * WIDTH as f64).round() as usize;
    format!(
        "  {phase:<9} [{}{}] {:>3.0}% {text}",
        "#".repeat(full),
        ".".repeat(WIDTH - full),
        f * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_fills_with_the_fraction_and_clamps() {
        assert_eq!(
            bar_line("measure", 0.5, "x"),
            format!("  measure   [{}{}]  50% x", "#".repeat(15), ".".repeat(15))
        );
        assert!(bar_line("a", 7.0, "").contains(&"#".repeat(WIDTH)));
        assert!(bar_line("a", f64::NAN, "").contains(&".".repeat(WIDTH)));
    }
}
