#!/usr/bin/env python3
"""Prints the criterion results of `cargo bench --bench queue` as a table with ratios.

Reads target/criterion/<group>/<function>/new/estimates.json (mean point estimates, ns per
iteration) and the throughput each group declared, and prints, per group, jobs/s of every
side (sqlite, redb_floor, leaseq, leaseq_live_reads) and the ratios leaseq/sqlite,
leaseq/redb_floor (higher is better for leaseq), leaseq_live_reads/leaseq (the cost of live
reads) and leaseq/leaseq_no_metrics (the cost of the per-minute metrics), plus enqueue_1 against the fsync_limit group. A side with no results
in any group loses its columns; a side missing from one group shows "-" there.
Usage: python3 benches/ratios.py [TARGET_DIR]
"""
import json
import os
import sys

target = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CARGO_TARGET_DIR", "target")
root = os.path.join(target, "criterion")

SIDES = ["sqlite", "redb_floor", "leaseq", "leaseq_live_reads", "leaseq_no_metrics"]
# leaseq against each baseline; live reads (Builder::live_reads) against leaseq's default.
RATIOS = [("leaseq", "sqlite"), ("leaseq", "redb_floor"), ("leaseq_live_reads", "leaseq"),
          ("leaseq", "leaseq_no_metrics")]
GROUPS = ["enqueue_1", "cycle_1", "cycle_1_ack_next", "cycle_batch_100",
          "cycle_concurrent_4x4", "cycle_concurrent_16x16"]


def mean_ns(group, function):
    path = os.path.join(root, group, function, "new", "estimates.json")
    with open(path) as f:
        return json.load(f)["mean"]["point_estimate"]


def per_iter(group, function):
    path = os.path.join(root, group, function, "new", "benchmark.json")
    with open(path) as f:
        tp = json.load(f).get("throughput") or {}
    return tp.get("Elements", 1)


def jobs_per_s(group, side):
    """Jobs per second of `side` in `group`, or None without results."""
    try:
        return per_iter(group, side) / (mean_ns(group, side) / 1e9)
    except FileNotFoundError:
        return None


rows = {g: {s: jobs_per_s(g, s) for s in SIDES} for g in GROUPS}
sides = [s for s in SIDES if any(rows[g][s] is not None for g in GROUPS)]
ratios = [(a, b) for a, b in RATIOS if a in sides and b in sides]
if not sides:
    sys.exit(f"no queue results under {root}")

header = ["group"] + [f"{s} jobs/s" for s in sides] + [f"{a}/{b}" for a, b in ratios]
print("| " + " | ".join(header) + " |")
print("|" + "---|" * len(header))
for g in GROUPS:
    r = rows[g]
    if all(r[s] is None for s in sides):
        continue
    cells = [f"`{g}`"]
    cells += ["-" if r[s] is None else f"{r[s]:,.0f}" for s in sides]
    cells += ["-" if r[a] is None or r[b] is None else f"{r[a] / r[b]:.2f}x"
              for a, b in ratios]
    print("| " + " | ".join(cells) + " |")
try:
    f = 1e9 / mean_ns("fsync_limit", "fsync")
    fo = 1e9 / mean_ns("fsync_limit", "fsync_overwrite")
    e = 1e9 / mean_ns("enqueue_1", "leaseq")
    print()
    print(f"fsync_limit: append+sync_data {f:,.0f}/s, overwrite+sync_data {fo:,.0f}/s; "
          f"enqueue_1/leaseq = {e / f:.2f}x fsync (append), {e / fo:.2f}x fsync (overwrite)")
except FileNotFoundError:
    pass
