#!/usr/bin/env python3
"""bench/cuda/ab_table.py — the rows of interleaved mla_decode_test runs side by side.

Input: lines of `mla_decode_test --no-test` output, each prefixed with "VARIANT rROUND " (the run's
binary and round), as bench/cuda/ab_run.sh writes them.
Output: one line per row, for each variant its rounds' times (the lower of each run's two queued
passes, us), FAIL where a run's check against the reference failed.
"""
import collections
import re
import sys

LINE = re.compile(r'(\S+) r(\d+) +(.+?) +([\d.]+) us \(again +([\d.]+), from idle +([\d.]+)\).*'
                  r'\[splits (\d+).*relL2 (\S+) lse (\S+) (\w+)\]')


def main(path):
    rows = collections.OrderedDict()
    variants = []
    for line in open(path):
        m = LINE.match(line)
        if not m:
            continue
        v, name = m.group(1), m.group(3)
        t = min(float(m.group(4)), float(m.group(5)))
        rows.setdefault(name, collections.OrderedDict()).setdefault(v, []).append((t, m.group(10) == 'ok'))
        if v not in variants:
            variants.append(v)
    print(f"{'row':46s}" + "".join(f"{v:>18s}" for v in variants))
    for name, runs in rows.items():
        cells = []
        for v in variants:
            xs = runs.get(v, [])
            cell = " / ".join(f"{t:.1f}" for t, _ in xs)
            cells.append(cell + ("" if all(ok for _, ok in xs) else " FAIL"))
        print(f"{name:46s}" + "".join(f"{c:>18s}" for c in cells))


if __name__ == '__main__':
    main(sys.argv[1])
