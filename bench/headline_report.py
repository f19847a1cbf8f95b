"""Writes the headline table of a bench/headline.sh run: headline.md and
headline.html (the same table, the conditions and plots as inline SVG,
nothing loaded from elsewhere).

usage: headline_report.py OUT_DIR

Reads what bench/headline.sh left in OUT_DIR: meta.txt, skipped.tsv,
compare/raw/*.json (bench/compare.sh), sessions/<server>-<policy>-<round>/
bench-N-off.json (bench/session_table.sh), floor-before.txt and
floor-after.txt (`openssl speed`), storm/uascale-<round>.json,
fairness/<round>/<profile>.json, failover/<round>/failover.json and
drain/<round>/failover.json.
Every figure is the median over the rounds that produced it.
"""

import html
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_table import dig, load as load_compare  # noqa: E402

SERVERS = ["uascale", "async-opcua", "o6", "asyncua"]
TITLES = {
    "uascale": "uascale",
    "async-opcua": "async-opcua 0.19",
    "o6": "open62541 (o6)",
    "asyncua": "asyncua 2.1",
}


def med(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def fmt(v, unit, digits=None):
    if v is None:
        return None
    if digits is None:
        digits = 3 if abs(v) < 1 else 2 if abs(v) < 100 else 0
    return f"{v:,.{digits}f} {unit}".strip()


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


class Table:
    """Rows of cells per server; a cell is a figure, or the reason there is
    none."""

    def __init__(self, servers, skipped):
        self.servers = servers
        self.skipped = skipped
        self.rows = []  # (label, {server: text}, {server: number}, unit)

    def add(self, label, cells, numbers=None, unit=""):
        self.rows.append((label, cells, numbers or {}, unit))

    def cell(self, cells, server):
        if server in cells and cells[server] is not None:
            return cells[server]
        if server not in self.servers:
            return "not run here (see Skipped)" if server in self.skipped else "not requested"
        return "no result (see the logs)"


def floor_ms(path):
    """RSA-2048 sign and ECDSA P-256 sign times (ms) from `openssl speed`."""
    out = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        # The rates (signs per second) keep their digits; the times are
        # printed with four decimals of a second only.
        m = re.match(r"rsa 2048 bits\s+[\d.]+s\s+[\d.]+s\s+([\d.]+)", line)
        if m and float(m.group(1)) > 0:
            out["rsa_sign_ms"] = 1000 / float(m.group(1))
        m = re.match(r"\s*256 bits ecdsa \(nistp256\)\s+[\d.]+s\s+[\d.]+s\s+([\d.]+)", line)
        if m and float(m.group(1)) > 0:
            out["ecdsa_sign_ms"] = 1000 / float(m.group(1))
    return out


def compare_rows(t, out):
    runs = load_compare(out / "compare") if (out / "compare" / "raw").exists() else {}
    shapes = [
        ("Server CPU per 1-value Read (10 connections x 100 in flight)", "read1",
         "server_cpu_us_per_read", 1.0, "us"),
        ("Server CPU per value, 100 values per Read", "read100",
         "server_cpu_us_per_read", 0.01, "us"),
        ("Server CPU per None session: establish, hold, close", "sessions",
         "server_cpu_ms_per_session", 1.0, "ms"),
        ("Server CPU per notification: 50 sessions x 10 items at 100 ms", "publish",
         "server.cpu_us_per_notification", 1.0, "us"),
    ]
    for label, shape, key, scale, unit in shapes:
        cells, numbers = {}, {}
        for s in t.servers:
            v = med([dig(d, key) for d in runs.get((s, shape), [])])
            if v is not None:
                numbers[s] = v * scale
                cells[s] = fmt(v * scale, unit)
        if shape == "publish" and "async-opcua" in cells:
            cells["async-opcua"] += " (not comparable: its clock value changes once a second)"
            numbers.pop("async-opcua", None)
        t.add(label, cells, numbers, unit)


def session_rows(t, out, floors):
    for policy, title in [
        ("None", "None"),
        ("Basic256Sha256", "Basic256Sha256 SignAndEncrypt"),
        ("ECC_nistP256", "ECC_nistP256 SignAndEncrypt"),
    ]:
        cpu_cells, cpu_numbers, mem_cells, mem_numbers = {}, {}, {}, {}
        for s in t.servers:
            reports = [read_json(p) for p in sorted((out / "sessions").glob(f"{s}-{policy}-*/bench-*-off.json"))]
            reports = [r for r in reports if r]
            if not reports:
                if s != "uascale" and policy.startswith("ECC"):
                    cpu_cells[s] = "not measured: its peer server here offers no ECC policy"
                elif s == "o6" and policy != "None":
                    cpu_cells[s] = "not measured: o6 caps at 100 sessions, its peer script serves None only"
                elif s == "o6":
                    cpu_cells[s] = "see the None session row above (o6 caps at 100 sessions)"
                continue
            cpu = med([r.get("server_cpu_ms_per_session") for r in reports])
            mem = med([r.get("server_bytes_per_session") for r in reports])
            failures = sum(sum((r.get("failures") or {}).values()) for r in reports)
            n = med([r.get("established") for r in reports])
            note = f" ({n:.0f} sessions" + (f", {failures} failures)" if failures else ")") if n else ""
            if cpu is not None:
                text = fmt(cpu, "ms")
                if policy == "Basic256Sha256" and floors.get("rsa_sign_ms"):
                    text += f", {cpu / (4 * floors['rsa_sign_ms']):.2f}x four RSA signatures"
                cpu_cells[s] = text + note
                cpu_numbers[s] = cpu
            if mem is not None:
                mem_cells[s] = fmt(mem / 1024, "KB", 1)
                mem_numbers[s] = mem / 1024
        t.add(f"Server CPU per {title} session established", cpu_cells, cpu_numbers, "ms")
        t.add(f"Server memory per {title} session", mem_cells | {
            s: v for s, v in cpu_cells.items() if s not in mem_cells and s not in cpu_numbers
        }, mem_numbers, "KB")


def storm_rows(t, out):
    reports = [read_json(p) for p in sorted((out / "storm").glob("uascale-*.json"))]
    reports = [r for r in reports if r]
    none = "no admission control: a storm measures its collapse, not a shed (not run)"
    peers = {s: none for s in t.servers if s != "uascale"}

    def row(label, values, unit, text=None):
        cells = dict(peers)
        numbers = {}
        v = med(values)
        if v is not None:
            cells["uascale"] = text(v) if text else fmt(v, unit)
            numbers["uascale"] = v
        t.add(label, cells, numbers, unit)

    if not reports:
        row("Secured connect storm", [], "")
        return
    clients = med([r.get("clients") for r in reports])
    row(f"Secured storm ({clients:.0f} clients, Basic256Sha256): established",
        [r.get("established") for r in reports], "",
        lambda v: f"{v:.0f} of {clients:.0f} in {med([r.get('storm_s') for r in reports]):.1f} s")
    for b in ("naive", "cooperative"):
        row(f"Secured storm: time to establish p99, {b} clients",
            [dig(r, f"by_behaviour.{b}.time_to_establish_ms.p99") for r in reports], "ms")
    for phase in ("before", "storm", "after"):
        row(f"Secured storm: steady sessions' publish lateness p99, {phase}",
            [dig(r, f"steady.lateness_ms.{phase}.p99") for r in reports], "ms")
    row("Secured storm: busy answers with a retry-after hint",
        [dig(r, "busy_answers.with_hint") for r in reports], "",
        lambda v: f"{v:.0f} of {med([dig(r, 'busy_answers.total') for r in reports]):.0f}")


def fairness_rows(t, out):
    none = "no request queue or isolation (not run)"
    for profile in ("shared_only", "balanced"):
        reports = [read_json(p) for p in sorted((out / "fairness").glob(f"*/{profile}.json"))]
        reports = [r for r in reports if r]
        cells = {s: none for s in t.servers if s != "uascale"}
        numbers = {}
        share = med([
            r["victim"]["reads"] / (r["victim"]["reads"] + r["flood"]["reads"])
            for r in reports
            if dig(r, "victim.reads") is not None and (r["victim"]["reads"] + r["flood"]["reads"]) > 0
        ])
        p99 = med([dig(r, "victim.latency_p99_ms") for r in reports])
        rate = med([dig(r, "victim.reads") / r["seconds"] for r in reports if r.get("seconds")])
        if share is not None:
            cells["uascale"] = f"{share * 100:.1f} % of the Reads ({rate:.0f}/s, p99 {p99:.1f} ms)"
            numbers["uascale"] = share * 100
        t.add(f"Fairness, isolation_profile {profile}: the victim's share under a flood",
              cells, numbers, "%")


def cluster_reports(t, out, part):
    """The failover reports of one part (failover, drain) and the cells of
    the peers, which have no cluster."""
    reports = [read_json(p) for p in sorted((out / part).glob("*/failover.json"))]
    cells = {s: "no cluster (not run)" for s in t.servers if s != "uascale"}
    return [r for r in reports if r], cells, {}


def failover_rows(t, out):
    reports, cells, numbers = cluster_reports(t, out, "failover")
    if reports:
        moved = med([r.get("moved") for r in reports])
        pct = med([r.get("resumed_within_5s_percent") for r in reports])
        p99 = med([dig(r, "resume_ms.p99") for r in reports])
        lost = sum(int(r.get("lost") or 0) for r in reports)
        dup = sum(int(r.get("duplicates") or 0) for r in reports)
        cells["uascale"] = (f"{pct:.1f} % of {moved:.0f} moved sessions resumed within 5 s, "
                            f"p99 {p99 / 1000:.2f} s; {lost} lost, {dup} duplicated")
        numbers["uascale"] = pct
    t.add("Failover: kill -9 of one of three nodes", cells, numbers, "%")


def drain_rows(t, out):
    reports, cells, numbers = cluster_reports(t, out, "drain")
    if reports:
        moved = med([r.get("moved") for r in reports])
        resumed = med([(r.get("moved") or 0) - (r.get("moved_not_resumed") or 0) for r in reports])
        p99 = med([dig(r, "resume_ms.p99") for r in reports])
        gap = max(dig(r, "gap_ms.max") or 0 for r in reports)
        recreated = sum(int(r.get("recreated") or 0) for r in reports)
        lost = sum(int(r.get("lost") or 0) for r in reports)
        dup = sum(int(r.get("duplicates") or 0) for r in reports)
        interval = reports[0].get("interval_ms")
        cells["uascale"] = (f"{resumed:.0f} of {moved:.0f} moved sessions resumed, p99 "
                            f"{p99 / 1000:.2f} s after the close; {recreated} recreated, {lost} lost, "
                            f"{dup} duplicated; largest gap {gap:,.0f} ms at a {interval or 0:,.0f} ms interval")
        numbers["uascale"] = 100.0 * resumed / moved if moved else None
    t.add("Failover: a drain (SIGTERM) of one of three nodes", cells, numbers, "%")


def svg_bars(label, numbers, unit):
    """A horizontal bar chart of one row, the servers with a figure."""
    items = [(TITLES[s], v) for s, v in numbers.items() if v is not None and v > 0]
    if len(items) < 1:
        return ""
    width, bar_h, left = 640, 22, 170
    top = 28
    height = top + bar_h * len(items) + 10
    biggest = max(v for _, v in items)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<text x="0" y="16" class="title">{html.escape(label)}</text>']
    for i, (name, v) in enumerate(items):
        y = top + i * bar_h
        w = (width - left - 120) * v / biggest
        parts.append(f'<text x="0" y="{y + 15}">{html.escape(name)}</text>')
        parts.append(f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{bar_h - 6}" />')
        parts.append(f'<text x="{left + w + 6:.1f}" y="{y + 15}">{html.escape(fmt(v, unit) or "")}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def main():
    out = Path(sys.argv[1])
    meta = {}
    for line in (out / "meta.txt").read_text().splitlines():
        k, _, v = line.partition("=")
        meta[k] = v
    skipped = {}
    skipped_lines = []
    if (out / "skipped.tsv").exists():
        for line in (out / "skipped.tsv").read_text().splitlines():
            what, _, why = line.partition("\t")
            skipped.setdefault(what, why)
            skipped_lines.append((what, why))
    servers = [s for s in SERVERS if s in meta.get("servers", "uascale").split(",")]
    shown = [s for s in SERVERS if s in servers or s in skipped]
    floors = floor_ms(out / "floor-before.txt")
    after = floor_ms(out / "floor-after.txt")

    t = Table(servers, skipped)
    compare_rows(t, out)
    session_rows(t, out, floors)
    storm_rows(t, out)
    fairness_rows(t, out)
    failover_rows(t, out)
    drain_rows(t, out)

    quick = meta.get("quick") == "1"
    conditions = (
        f"{meta.get('date_utc', '?')}, {meta.get('cpu', '?')}, {meta.get('cpus', '?')} CPUs, "
        f"load average {meta.get('loadavg_start', '?')} at the start and {meta.get('loadavg_end', '?')} "
        f"at the end, commit {meta.get('commit', '?')}; median of {meta.get('rounds', '?')} round(s); "
        f"each server on core 0, the load on core 1, loopback."
    )
    floor_text = "OpenSSL floor on core 0: " + (
        ", ".join(
            f"{name} {b.get(key, float('nan')):.3f} ms before, {a.get(key, float('nan')):.3f} ms after"
            for name, key, b, a in [
                ("RSA-2048 sign", "rsa_sign_ms", floors, after),
                ("ECDSA P-256 sign", "ecdsa_sign_ms", floors, after),
            ]
        )
        if floors else "not measured"
    )
    warning = ("**QUICK MODE: tiny counts and windows, one round. These numbers only show "
               "that every part ran; do not quote them.**\n\n") if quick else ""

    md = [f"Measured with `{meta.get('command', 'bench/headline.sh')}`: {conditions} {floor_text}.", ""]
    md.insert(0, warning) if warning else None
    head = ["", *(TITLES[s] for s in shown)]
    md.append("| " + " | ".join(head) + " |")
    md.append("|" + "---|" * len(head))
    for label, cells, _, _ in t.rows:
        md.append("| " + " | ".join([label, *(t.cell(cells, s) for s in shown)]) + " |")
    if skipped_lines:
        md.append("")
        md.append("Skipped in this run:")
        for what, why in skipped_lines:
            md.append(f"- {what}: {why}")
    text = "\n".join(md) + "\n"
    (out / "headline.md").write_text(text)

    rows_html = "".join(
        "<tr><th>" + html.escape(label) + "</th>"
        + "".join("<td>" + html.escape(t.cell(cells, s)) + "</td>" for s in shown) + "</tr>\n"
        for label, cells, _, _ in t.rows
    )
    plots = "\n".join(svg_bars(label, numbers, unit) for label, _, numbers, unit in t.rows if numbers)
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>uascale headline numbers</title>
<style>
body{{font-family:sans-serif;margin:2em;color:#222;max-width:70em}}
table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}
svg{{display:block;margin:1em 0;font-size:12px}} svg rect{{fill:#4a7ab5}} svg .title{{font-weight:bold}}
.warn{{color:#a00;font-weight:bold}}
</style></head><body>
<h1>uascale headline numbers</h1>
{'<p class="warn">QUICK MODE: tiny counts and windows, one round. These numbers only show that every part ran; do not quote them.</p>' if quick else ''}
<p>{html.escape(meta.get('command', ''))}</p>
<p>{html.escape(conditions)} {html.escape(floor_text)}.</p>
<table><tr><th></th>{''.join('<th>' + html.escape(TITLES[s]) + '</th>' for s in shown)}</tr>
{rows_html}</table>
{'<h2>Skipped</h2><ul>' + ''.join('<li>' + html.escape(w + ': ' + y) + '</li>' for w, y in skipped_lines) + '</ul>' if skipped_lines else ''}
<h2>Plots</h2>
{plots}
</body></html>
"""
    (out / "headline.html").write_text(page)
    print(text)


if __name__ == "__main__":
    main()
