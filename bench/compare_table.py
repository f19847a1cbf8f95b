"""Summarise a bench/compare.sh output directory as a Markdown table.

usage: compare_table.py OUT_DIR

Reads OUT_DIR/raw/<server>-<shape>-<round>.json (the --json output of
`uascale bench`, or uabench's RESULT line) and OUT_DIR/meta.txt; prints the
median over the rounds of each figure per server, and the ratio of each
peer's server CPU per operation to uascale's.
"""

import json
import statistics
import sys
from pathlib import Path

ORDER = ["uascale", "o6", "async-opcua", "asyncua"]
TITLES = {
    "uascale": "uascale",
    "o6": "open62541 (o6 2.2.0)",
    "async-opcua": "async-opcua 0.19",
    "asyncua": "asyncua 2.1.0",
}


def load(out: Path):
    runs = {}
    for p in sorted((out / "raw").glob("*.json")):
        stem = p.stem
        name_shape, _, _round = stem.rpartition("-")
        for shape in ("sessions", "read100", "read1", "uabench", "scale", "publish"):
            if name_shape.endswith("-" + shape):
                name = name_shape[: -len(shape) - 1]
                break
        else:
            continue
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            print(f"skipping {p}: {e}", file=sys.stderr)
            continue
        runs.setdefault((name, shape), []).append(d)
    return runs


def dig(d, key):
    """d[key], where key may be a dotted path into nested objects."""
    for part in key.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def med(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def errors_of(shape, d):
    if shape == "publish":
        e = d.get("failures") or {}
        return sum(e.values()) + int(d.get("lost_messages", 0))
    if shape in ("sessions", "scale"):
        f = d.get("failures") or {}
        n = sum(f.values()) if isinstance(f, dict) else int(f or 0)
        return n + max(0, d.get("sessions", 0) - d.get("established", 0))
    e = d.get("errors")
    if isinstance(e, dict):
        return sum(e.values())
    return int(e or 0)


def rate(v):
    if v is None:
        return "-"
    if v >= 10_000:
        return f"{v / 1000:.0f}k"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def main():
    out = Path(sys.argv[1])
    meta = {}
    meta_path = out / "meta.txt"
    if meta_path.exists():
        for line in meta_path.read_text().splitlines():
            k, _, v = line.partition("=")
            meta[k] = v
    runs = load(out)
    servers = [s for s in ORDER if any(k[0] == s for k in runs)]
    if "uascale" not in servers:
        sys.exit("no uascale results: nothing to compare with")

    # (label, shape, cpu key, cpu scale, unit, rate key, rate unit)
    rows = [
        ("server CPU per 1-value Read (uascale bench)", "read1",
         "server_cpu_us_per_read", 1.0, "us", "reads_per_s", "reads/s"),
        ("server CPU per 1-value Read (uabench cross-check)", "uabench",
         "server_cpu_us_per_read", 1.0, "us", "reads_per_s", "reads/s"),
        ("server CPU per value, 100 values/Read", "read100",
         "server_cpu_us_per_read", 0.01, "us", "values_per_s", "values/s"),
        ("None session: establish + hold + close, server CPU", "sessions",
         "server_cpu_ms_per_session", 1.0, "ms", "sessions_per_s", "sessions/s"),
        ("sessions at scale (--scale-sessions): server CPU per session", "scale",
         "server_cpu_ms_per_session", 1.0, "ms", "sessions_per_s", "sessions/s"),
        ("sessions at scale: server memory per session", "scale",
         "server_bytes_per_session", 1 / 1024, "KiB", "established", "held"),
        ("publish (50 x 10 items, 100 ms): server CPU per notification", "publish",
         "server.cpu_us_per_notification", 1.0, "us", "notifications_per_s", "notif./s"),
    ]
    head = ["Shape"] + [TITLES[s] for s in servers]
    head += [f"{TITLES[s]} / uascale" for s in servers if s != "uascale"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    flagged = []
    for label, shape, cpu_key, scale, unit, rate_key, rate_unit in rows:
        if not any((s, shape) in runs for s in servers):
            continue
        cells, cpus = [], {}
        for s in servers:
            ds = runs.get((s, shape), [])
            if not ds:
                cells.append("-")
                continue
            cpu = med([dig(d, cpu_key) for d in ds])
            r = med([d.get(rate_key) for d in ds])
            errs = sum(errors_of(shape, d) for d in ds)
            mark = ""
            if errs:
                mark = " *"
                flagged.append(f"{TITLES[s]}, {shape}: {errs} errors/failures over {len(ds)} runs")
            if cpu is None:
                cells.append(f"- ({rate(r)} {rate_unit}){mark}")
                continue
            cpu *= scale
            cpus[s] = cpu
            prec = 3 if cpu < 1 else 2 if cpu < 100 else 0
            cells.append(f"{cpu:.{prec}f} {unit} ({rate(r)} {rate_unit}, n={len(ds)}){mark}")
        for s in servers:
            if s == "uascale":
                continue
            if s in cpus and cpus.get("uascale"):
                cells.append(f"{cpus[s] / cpus['uascale']:.1f}x")
            else:
                cells.append("-")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    print(
        f"Median of the rounds; {meta.get('date_utc', '?')}, uascale {meta.get('uascale_commit', '?')}, "
        f"load average before {meta.get('loadavg_before', '?')}, after {meta.get('loadavg_after', '?')}; "
        f"repeat={meta.get('repeat', '?')}."
    )
    for f in flagged:
        print(f"* {f}")


if __name__ == "__main__":
    main()
