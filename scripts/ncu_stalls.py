#!/usr/bin/env python3
"""Where a kernel's warps wait, from an Nsight Compute report's source view.

Usage (on the GPU machine, where ncu is):
  ncu --set full --import-source no -k regex:NAME --launch-count 1 -o rep BINARY ARGS...
  ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv
  python3 scripts/ncu_stalls.py src.csv [TOP]

For each kernel in the CSV: its stall samples summed by reason over every instruction, the share
on global stores (STG), and the TOP instructions (default 30) with the most samples and their
reasons. The sums answer "what kind of wait holds this kernel"; the lines say where.
"""
import csv
import sys


def num(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def tables(rows):
    """(kernel name, header, rows) for each source table: a header row starting Address, Source."""
    i = 0
    while i < len(rows):
        row = rows[i]
        if len(row) >= 3 and row[0] == "Address" and row[1] == "Source":
            j = i + 1
            while j < len(rows) and len(rows[j]) == len(row):
                j += 1
            name = rows[i - 1][1] if i > 0 and len(rows[i - 1]) > 1 else "?"
            yield name, row, rows[i + 1:j]
            i = j
        else:
            i += 1


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: ncu_stalls.py SOURCE_CSV [TOP]")
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(sys.argv[1], newline="") as f:
        rows = list(csv.reader(f))
    found = False
    for name, hdr, table in tables(rows):
        found = True
        ci = hdr.index("Warp Stall Sampling (All Samples)")
        reasons = [k for k, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
        total = sum(num(t[ci]) for t in table) or 1.0
        print(f"== {name[:100]}: {len(table)} instructions, {total:.0f} samples")
        sums = sorted(((hdr[k], sum(num(t[k]) for t in table)) for k in reasons), key=lambda x: -x[1])
        print("   by reason: " + ", ".join(f"{h} {v:.0f} ({100 * v / total:.1f} %)" for h, v in sums if v > 0))
        stg = sum(num(t[ci]) for t in table if "STG" in t[1])
        print(f"   on global stores (STG): {stg:.0f} ({100 * stg / total:.1f} %)")
        for t in sorted(table, key=lambda t: -num(t[ci]))[:top]:
            why = ", ".join(f"{hdr[k]} {t[k]}" for k in reasons if num(t[k]) > 0)
            print(f"{t[0]:>18} {num(t[ci]):7.0f} {100 * num(t[ci]) / total:5.1f} %  {t[1][:64]:64s} {why[:200]}")
    if not found:
        sys.exit("ncu_stalls.py: no source table (a row starting Address,Source) in " + sys.argv[1])


if __name__ == "__main__":
    main()
