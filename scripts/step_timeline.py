#!/usr/bin/env python3
"""A recorded step's kernels, lane by lane, from `mla bench-model ... --activity` JSON.

Usage:
  mla bench-model --random-weights deepseek-v2-lite --platform cuda --dtype bf16 --kv-dtype bf16 \
      --context 1024 --overlap --prefill 0 --batch 1 --activity > step.json
  python3 scripts/step_timeline.py step.json [--batch B] [--from NAME] [--nth N] [--count C] [--top T]

Prints the kernels of one stretch of the step in start order (start and end in µs from the first
kernel, duration, the lane, the name), one column of lane marks per stream, so it shows which lane
waited for which: by default from the 10th start of a kernel whose name holds "add_rmsnorm" to the
12th (about one layer of a decode step). Then the TOP kernel names by time summed over the step.
A step replayed from a CUDA graph gives each captured node's stream its own id: a lane is one
stream id within a layer, not across layers.
"""
import argparse
import json
import sys
from collections import defaultdict


def activity(doc, batch):
    rows = [r for r in doc.get("rows", []) if "activity" in r]
    if batch is not None:
        rows = [r for r in rows if r.get("kind") == "decode" and r.get("batch") == batch]
    if not rows:
        sys.exit("step_timeline: no row with an activity record" + (f" at batch {batch}" if batch else ""))
    a = rows[0]["activity"]
    if "timeline" not in a:
        sys.exit("step_timeline: the activity record has no timeline (a bench-model from before it)")
    return rows[0], a


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--batch", type=int, default=None, help="the decode row of this batch (default: the first row recorded)")
    ap.add_argument("--from", dest="name", default="add_rmsnorm", help="the kernel whose starts mark the stretch")
    ap.add_argument("--nth", type=int, default=10, help="start at this start of --from (0-based)")
    ap.add_argument("--count", type=int, default=2, help="stretch over this many starts of --from")
    ap.add_argument("--top", type=int, default=15, help="kernel names by summed time")
    o = ap.parse_args()
    with open(o.json) as f:
        row, a = activity(json.load(f), o.batch)
    tl = sorted(a["timeline"], key=lambda k: k[0])
    if not tl:
        sys.exit("step_timeline: no kernel in the record")
    t0 = tl[0][0]
    marks = [k[0] for k in tl if o.name in k[3]]
    lo = marks[o.nth] if o.nth < len(marks) else tl[0][0]
    hi = marks[o.nth + o.count] if o.nth + o.count < len(marks) else tl[-1][0] + 1
    what = f"{row.get('kind', '')} b{row.get('batch', '')}".strip()
    print(f"{what}: {len(tl)} kernels over {tl[-1][0] + tl[-1][1] - t0:.1f} µs; "
          f"stretch {lo - t0:.1f} → {hi - t0:.1f} µs")
    lanes = []
    for start, dur, stream, name in tl:
        if lo <= start < hi:
            if stream not in lanes:
                lanes.append(stream)
            col = lanes.index(stream)
            print(f"{start - t0:9.1f} {start - t0 + dur:9.1f} {dur:6.1f}  {'   ' * col}L{col}  {name[:70]}")
    total = defaultdict(lambda: [0, 0.0])
    for _, dur, _, name in tl:
        total[name][0] += 1
        total[name][1] += dur
    print(f"\n{'kernel':<60} {'calls':>6} {'µs':>9} {'each':>7}")
    for name, (n, us) in sorted(total.items(), key=lambda kv: -kv[1][1])[: o.top]:
        print(f"{name[:60]:<60} {n:>6} {us:>9.1f} {us / n:>7.2f}")


if __name__ == "__main__":
    main()
