#!/usr/bin/env python3
"""Prints the peer benchmark's results (benches/peers) as one table per peer, with ratios.

Reads <TARGET_DIR>/criterion/<peer>.<group>/<side>/new/{estimates,benchmark}.json (mean
point estimates, ns per iteration; the jobs per iteration each group declared) for every
peer run found there, and prints jobs/s per side and `leaseq / side` for every other side
of the same run (higher is better for leaseq; each ratio compares numbers of one process
run). Usage: python3 benches/peers/table.py [TARGET_DIR] (default: target/peers at the repository root)
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
target = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "target", "peers")
root = os.path.join(target, "criterion")
GROUPS = ["enqueue_1", "cycle_1", "cycle_batch_100", "cycle_concurrent_4x4",
          "cycle_concurrent_16x16"]


def jobs_per_s(directory):
    """Jobs per second from one criterion function directory, or None without results."""
    try:
        with open(os.path.join(directory, "new", "estimates.json")) as f:
            ns = json.load(f)["mean"]["point_estimate"]
        with open(os.path.join(directory, "new", "benchmark.json")) as f:
            per_iter = (json.load(f).get("throughput") or {}).get("Elements", 1)
    except FileNotFoundError:
        return None
    return per_iter / (ns / 1e9)


if not os.path.isdir(root):
    sys.exit(f"no results under {root}")
peers = sorted({d.split(".", 1)[0] for d in os.listdir(root) if "." in d})
for peer in peers:
    rows = {}
    sides = []
    for g in GROUPS:
        gdir = os.path.join(root, f"{peer}.{g}")
        if not os.path.isdir(gdir):
            continue
        rows[g] = {}
        for side in sorted(os.listdir(gdir)):
            if side == "report":
                continue
            v = jobs_per_s(os.path.join(gdir, side))
            if v is not None:
                rows[g][side] = v
                if side not in sides:
                    sides.append(side)
    if "leaseq" in sides:
        sides.remove("leaseq")
        sides.insert(0, "leaseq")
    others = [s for s in sides if s != "leaseq"]
    header = ["group"] + [f"{s} jobs/s" for s in sides] + [f"leaseq / {s}" for s in others]
    print(f"### {peer}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for g, r in rows.items():
        cells = [f"`{g}`"] + ["-" if s not in r else f"{r[s]:,.0f}" for s in sides]
        cells += ["-" if "leaseq" not in r or s not in r else f"{r['leaseq'] / r[s]:.2f}x"
                  for s in others]
        print("| " + " | ".join(cells) + " |")
    print()
