#!/usr/bin/env python3
"""Prints the criterion results of `cargo bench --bench queue` as a table with ratios.

Reads target/criterion/<group>/<function>/new/estimates.json (mean point estimates, ns per
iteration) and the throughput each group declared, and prints, per group, jobs/s of both
sides and the ratio leaseq/sqlite (higher is better for leaseq), plus enqueue_1 against the
fsync_limit group. Usage: python3 benches/ratios.py [TARGET_DIR]
"""
import json
import os
import sys

target = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CARGO_TARGET_DIR", "target")
root = os.path.join(target, "criterion")


def mean_ns(group, function):
    path = os.path.join(root, group, function, "new", "estimates.json")
    with open(path) as f:
        return json.load(f)["mean"]["point_estimate"]


def per_iter(group, function):
    path = os.path.join(root, group, function, "new", "benchmark.json")
    with open(path) as f:
        tp = json.load(f).get("throughput") or {}
    return tp.get("Elements", 1)


groups = ["enqueue_1", "cycle_1", "cycle_1_ack_next", "cycle_batch_100",
          "cycle_concurrent_4x4", "cycle_concurrent_16x16"]
print("| group | sqlite jobs/s | leaseq jobs/s | leaseq / sqlite |")
print("|---|---|---|---|")
for g in groups:
    try:
        n = per_iter(g, "leaseq")
        s = n / (mean_ns(g, "sqlite") / 1e9)
        q = n / (mean_ns(g, "leaseq") / 1e9)
    except FileNotFoundError:
        continue
    print(f"| `{g}` | {s:,.0f} | {q:,.0f} | {q / s:.2f}x |")
try:
    f = 1e9 / mean_ns("fsync_limit", "fsync")
    fo = 1e9 / mean_ns("fsync_limit", "fsync_overwrite")
    e = 1e9 / mean_ns("enqueue_1", "leaseq")
    print()
    print(f"fsync_limit: append+sync_data {f:,.0f}/s, overwrite+sync_data {fo:,.0f}/s; "
          f"enqueue_1/leaseq = {e / f:.2f}x fsync (append), {e / fo:.2f}x fsync (overwrite)")
except FileNotFoundError:
    pass
