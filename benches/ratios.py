#!/usr/bin/env python3
"""Prints the criterion results of `cargo bench --bench queue` as a table with ratios.

Reads target/criterion/<group>/<function>/new/estimates.json (mean point estimates, ns per
iteration) and the throughput each group declared, and prints, per group, jobs/s of every
side (sqlite, redb_floor, leaseq, leaseq_live_reads) and the ratios leaseq/sqlite,
leaseq/redb_floor (higher is better for leaseq), leaseq_live_reads/leaseq (the cost of live
reads), leaseq/leaseq_no_metrics (the cost of the per-minute metrics),
leaseq/leaseq_no_journal (what the write-ahead journal gains), leaseq/leaseq_limited (the
cost of a queue size limit, never full) and leaseq/leaseq_no_reserve (the cost of the disk
reserve's look before each commit), plus enqueue_1 against the fsync_limit group. Then
the same for the bytes written per job, from the bytes pass's
target/criterion/<group>/<function>/bytes.json (lower is better; the ratios are of bytes, so
above 1x the first side writes more), and the bytes per call of the one-thread groups. A side
with no results in any group loses its columns; a side missing from one group shows "-" there.
Usage: python3 benches/ratios.py [TARGET_DIR]
"""
import json
import os
import sys

target = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CARGO_TARGET_DIR", "target")
root = os.path.join(target, "criterion")

SIDES = ["sqlite", "redb_floor", "leaseq", "leaseq_live_reads", "leaseq_no_metrics",
         "leaseq_no_journal", "leaseq_limited", "leaseq_no_reserve"]
# leaseq against each baseline; live reads (Builder::live_reads) against leaseq's default;
# the default (with the write-ahead journal) against the journal off; a queue without a size
# limit against one with a limit it never reaches (Queue::set_limit); the default (with the
# disk reserve) against disk_reserve(0).
RATIOS = [("leaseq", "sqlite"), ("leaseq", "redb_floor"), ("leaseq_live_reads", "leaseq"),
          ("leaseq", "leaseq_no_metrics"), ("leaseq", "leaseq_no_journal"),
          ("leaseq", "leaseq_limited"), ("leaseq", "leaseq_no_reserve")]
GROUPS = ["enqueue_1", "cycle_1", "cycle_1_ack_next", "cycle_1_extend_ack", "cycle_batch_100",
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


def bytes_of(group, side):
    """The bytes pass's row of `side` in `group` (bytes.json), or None without one."""
    try:
        with open(os.path.join(root, group, side, "bytes.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def kb(value):
    return "-" if value is None else f"{value / 1000:,.1f} KB"


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def print_table(title, first, rows):
    """rows: [(label, {side: bytes or None})]; only the sides with a value somewhere."""
    shown = [s for s in SIDES if any(r[s] is not None for _, r in rows)]
    pairs = [(a, b) for a, b in RATIOS if a in shown and b in shown]
    if not shown:
        return
    print()
    print(title)
    print()
    header = [first] + [f"{s} bytes" for s in shown] + [f"{a}/{b}" for a, b in pairs]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for label, r in rows:
        cells = [label] + [kb(r[s]) for s in shown] + [ratio(r[a], r[b]) for a, b in pairs]
        print("| " + " | ".join(cells) + " |")


found = {g: {s: bytes_of(g, s) for s in SIDES} for g in GROUPS}
per_job = [(f"`{g}`", {s: (found[g][s] or {}).get("bytes_per_job") for s in SIDES})
           for g in GROUPS if any(found[g][s] for s in SIDES)]
print_table("bytes written per job (/proc/self/io write_bytes, KB = 1,000 bytes; a ratio above "
            "1x: the first side writes more)", "group", per_job)
per_call = []
for g in GROUPS:
    calls = []  # call names in the order the rows list them
    for s in SIDES:
        for c in (found[g][s] or {}).get("calls", []):
            if c["call"] not in calls:
                calls.append(c["call"])
    for name in calls:
        values = {}
        for s in SIDES:
            row = {c["call"]: c for c in (found[g][s] or {}).get("calls", [])}.get(name)
            values[s] = row and row["bytes_per_call"]
        per_call.append((f"`{name}` (`{g}`)", values))
print_table("bytes written per call (one thread; a batch call does 100 jobs)", "call (group)",
            per_call)
