#!/usr/bin/env python3
"""Percentiles of the durations in Sandtree's debug log lines.

The engine logs its steps at debug level with durations as fields, e.g.
`rolled back sandbox=... layer=131µs committed=209µs planned=262µs done=2.5ms`.
Run a benchmark with them on, then summarise the lines you care about:

    RUST_LOG=sandtree_runtime=debug,sandtree_proc=debug \
        ./target/release/sandtree bench --processes-only --quick 2> /tmp/bench.log
    scripts/phases.py /tmp/bench.log "rolled back" "in place" "restore released"

For every line that contains one of the messages, each `field=<duration>`
is collected under (message, field) and printed with its count, p50, p90
and mean in milliseconds. With `--by FIELD`, lines are grouped by the value
of FIELD too (an A/B switch logged as `mode=0` / `mode=1`, say).
"""

import argparse
import re
import statistics

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FIELD = re.compile(r"(\w+)=([\d.]+)(ns|µs|us|ms|s)\b")
SCALE = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="the log file (stderr of the daemon or of `sandtree bench`)")
    ap.add_argument("messages", nargs="+", help="text that marks the lines to read")
    ap.add_argument("--by", help="group the lines by the value of this field too")
    args = ap.parse_args()
    found: dict[tuple[str, str, str], list[float]] = {}
    with open(args.log, errors="replace") as f:
        for line in f:
            line = ANSI.sub("", line)
            for msg in args.messages:
                if msg not in line:
                    continue
                group = ""
                if args.by:
                    m = re.search(rf"\b{re.escape(args.by)}=(\S+)", line)
                    group = m.group(1) if m else "-"
                for name, value, unit in FIELD.findall(line):
                    found.setdefault((msg, group, name), []).append(float(value) * SCALE[unit])
    if not found:
        raise SystemExit("no line with a duration field matched")
    for (msg, group, name), vals in sorted(found.items()):
        vals.sort()
        n = len(vals)
        label = f"{msg} [{args.by}={group}]" if args.by else msg
        print(
            f"{label:40s} {name:14s} n={n:4d} p50={vals[n // 2]:8.3f} "
            f"p90={vals[int(n * 0.9)]:8.3f} mean={statistics.mean(vals):8.3f} ms"
        )


if __name__ == "__main__":
    main()
