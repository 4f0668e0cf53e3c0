#!/usr/bin/env python3
"""Prints the peer benchmark's results (benches/peers) as one table per peer, with ratios.

Reads RESULTS/<run>/<peer>.<group>/<side>/new/{estimates,benchmark}.json for every run
directory (as `benches/peers/run` leaves them; a criterion directory holding
<peer>.<group> directories itself is read as one run): the mean point estimate (ns per
iteration; `--median`: the median) and the jobs per iteration each group declared. Prints, per
peer and group, every side's jobs/s per run ("run 1 / run 2 / ...") and, for every side but
leaseq, `leaseq / side` as the median (range) of the per-run ratios (higher is better for
leaseq; each ratio compares numbers of one process run). Then, from the bytes pass's
<peer>.<group>/<side>/bytes.json beside them, every side's bytes written per job per run and
`leaseq / side` of those (lower is better for leaseq: above 1x, leaseq writes more).
Usage: python3 benches/peers/table.py [--median] [RESULTS]
(default: target/peers/peers-runs at the repository's root)
"""
import json
import os
import statistics
import sys

here = os.path.dirname(os.path.abspath(__file__))
args = [a for a in sys.argv[1:] if a != "--median"]
estimate = "median" if "--median" in sys.argv[1:] else "mean"
results = args[0] if args else os.path.join(here, "..", "..", "target", "peers", "peers-runs")
GROUPS = ["enqueue_1", "cycle_1", "cycle_batch_100", "cycle_concurrent_4x4",
          "cycle_concurrent_16x16"]


def bytes_per_job(directory):
    """Bytes written per job from one function directory's bytes.json, or None without it."""
    try:
        with open(os.path.join(directory, "bytes.json")) as f:
            return json.load(f)["bytes_per_job"]
    except FileNotFoundError:
        return None


def jobs_per_s(directory):
    """Jobs per second from one criterion function directory, or None without results."""
    try:
        with open(os.path.join(directory, "new", "estimates.json")) as f:
            ns = json.load(f)[estimate]["point_estimate"]
        with open(os.path.join(directory, "new", "benchmark.json")) as f:
            per_iter = (json.load(f).get("throughput") or {}).get("Elements", 1)
    except FileNotFoundError:
        return None
    return per_iter / (ns / 1e9)


if not os.path.isdir(results):
    sys.exit(f"no results under {results}")
if any("." in d for d in os.listdir(results)):
    runs = [results]
else:
    runs = [os.path.join(results, d) for d in sorted(os.listdir(results), key=int)]
# data[peer][group][side] = [jobs/s of run 1, run 2, ...] (None where a run has none);
# written[...] the same of bytes per job
data = {}
written = {}
for i, run in enumerate(runs):
    for d in os.listdir(run):
        if "." not in d:
            continue
        peer, group = d.split(".", 1)
        for side in os.listdir(os.path.join(run, d)):
            if side == "report":
                continue
            for table, value in ((data, jobs_per_s), (written, bytes_per_job)):
                cell = table.setdefault(peer, {}).setdefault(group, {}).setdefault(
                    side, [None] * len(runs))
                cell[i] = value(os.path.join(run, d, side))
if not data:
    sys.exit(f"no results under {results}")
print(f"{len(runs)} run(s), jobs/s from criterion's {estimate}\n")


def ratio_cell(row, side):
    """leaseq / side over the runs: the one ratio, or the median (range)."""
    ratios = [a / b for a, b in zip(row.get("leaseq", []), row.get(side, []))
              if a is not None and b]
    if not ratios:
        return "-"
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}x"
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def print_table(rows, unit, fmt):
    """One table of `rows` (group -> side -> a value per run), or nothing without a value."""
    sides = sorted({s for g in rows.values() for s in g if any(v is not None for v in g[s])},
                   key=lambda s: (s != "leaseq", s))
    if not sides:
        return
    others = [s for s in sides if s != "leaseq"]
    header = ["group"] + [f"{s} {unit}" for s in sides] + [f"leaseq / {s}" for s in others]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for g in GROUPS:
        row = rows.get(g)
        if not row:
            continue
        cells = [f"`{g}`"]
        for s in sides:
            vals = row.get(s, [None] * len(runs))
            cells.append(" / ".join("-" if v is None else fmt(v) for v in vals))
        cells += [ratio_cell(row, s) for s in others]
        print("| " + " | ".join(cells) + " |")
    print()


for peer in sorted(data):
    print(f"### {peer}\n")
    print_table(data[peer], "jobs/s", lambda v: f"{v:,.0f}")
    if any(v is not None for g in written[peer].values() for vs in g.values() for v in vs):
        print(f"{peer}: bytes written per job (/proc/self/io write_bytes, KB = 1,000 bytes)\n")
        print_table(written[peer], "bytes/job", lambda v: f"{v / 1000:,.1f} KB")
