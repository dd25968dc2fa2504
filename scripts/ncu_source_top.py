"""Print the SASS instructions where one kernel's warps were sampled most, with their top stall reasons.

    python3 scripts/ncu_source_top.py source.csv [--top 40]

Reads `ncu --import REP --page source --csv --print-source sass` output (one row per SASS
instruction, PC-sampling columns per stall reason) and prints, for the instructions that hold
the most samples, the share of all samples and the three largest reasons: where the time goes,
per instruction, which the per-kernel stall ratios of profile-stalls.sh cannot say.
"""

from __future__ import annotations

import argparse
import csv
import sys


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    with open(args.csv, newline="") as fh:
        lines = [ln for ln in fh if ln.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        print("no CSV rows in", args.csv)
        return 1
    while rows and "Source" not in rows[0]:  # a "Kernel Name" line comes first
        rows = rows[1:]
    if not rows:
        print("no header row with a Source column in", args.csv)
        return 1
    header, body = rows[0], rows[1:]
    low = [h.lower() for h in header]
    src = next((i for i, h in enumerate(low) if h == "source"), None)
    total_col = next((i for i, h in enumerate(low) if "sampling (all" in h), None)
    if src is None or total_col is None:
        print("unexpected columns:", header)
        return 1
    reason_cols = [i for i, h in enumerate(low) if h.startswith("stall_") and "(not issued)" not in h]
    total = sum(number(r[total_col]) for r in body if len(r) > total_col) or 1.0
    print(f"{len(body)} instructions, {total:.0f} samples; reason columns: {len(reason_cols)}")
    ranked = sorted((r for r in body if len(r) > total_col), key=lambda r: -number(r[total_col]))
    for r in ranked[: args.top]:
        reasons = sorted(((number(r[i]), header[i]) for i in reason_cols), reverse=True)[:3]
        why = ", ".join(f"{name} {val / max(number(r[total_col]), 1):.0%}" for val, name in reasons if val > 0)
        addr = r[0]
        print(f"{number(r[total_col]) / total:6.2%}  {addr:>6}  {r[src][:60]:<60}  {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
