# bench/gpu/compare_builds.py — the tables of compare_builds.sh.
#   compare_builds.py bench DIR      bench_{a,b}_{1,2}.json → one row per benchmark row (µs)
#   compare_builds.py sass A B       per-kernel SASS of the attention kernels: identical or not
import collections
import json
import os
import re
import subprocess
import sys


def bench_rows(path):
    try:
        j = json.load(open(path))
    except (OSError, ValueError):
        return {}, {}
    rows = {}
    for sec in ("mla_decode", "mha_prefill", "layer"):
        for r in j.get(sec, []):
            rows[f"{sec}: {r['name']}"] = r["us"]
    for r in j.get("rocm_vs_cuda", []):
        k = f"rocm_vs_cuda: {r['layer']} {r['rocm'].get('method', '')}"
        rows[k + " [cuda]"] = r["cuda"]["us"]
        rows[k + " [rocm]"] = r["rocm"]["us"]
    return j.get("ceilings", {}), rows


def bench(d):
    runs = {(v, i): bench_rows(os.path.join(d, f"bench_{v}_{i}.json")) for v in "ab" for i in (1, 2)}
    for k, (c, _) in sorted(runs.items()):
        print(f"ceilings {k[0]}{k[1]}: {c}")
    print("| row | A1 µs | A2 µs | B1 µs | B2 µs | noise % | B/A − 1 % |")
    print("|---|---|---|---|---|---|---|")
    spreads, deltas = [], []
    for k in runs[("a", 1)][1]:
        v = [runs[(x, i)][1].get(k) for x in "ab" for i in (1, 2)]
        if None in v:
            continue
        a, b = (v[0] + v[1]) / 2, (v[2] + v[3]) / 2
        noise = max(abs(v[0] - v[1]) / a, abs(v[2] - v[3]) / b) * 100
        spreads.append(noise)
        deltas.append(100 * (b / a - 1))
        cells = " | ".join(f"{x:.1f}" for x in v)
        print(f"| {k} | {cells} | {noise:.1f} | {deltas[-1]:+.1f} |")
    if deltas:
        spreads.sort()
        print(f"rows {len(deltas)}; median noise {spreads[len(spreads) // 2]:.1f} %; "
              f"mean B/A − 1 {sum(deltas) / len(deltas):+.2f} %; worst {max(deltas):+.1f} %")


def sass_functions(path):
    funcs, cur = {}, None
    for line in open(path, errors="replace"):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
        elif cur is not None:
            m = re.match(r"\s*/\*[0-9a-f]{4}\*/\s*(.*?)\s*;", line)
            if m:
                ins = m.group(1)
                funcs[cur].append(re.sub(r"0x[0-9a-f]+", "N", ins) if "BRA" in ins else ins)
    names = list(funcs)
    dem = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                         text=True).stdout.split("\n")
    out = {}
    for n, d in zip(names, dem):
        d = re.sub(r"\(anonymous namespace\)::|mla_decode::", "", d)
        d = d.replace("mla_wide_kernel", "mla_fast_kernel").replace("mla_decode_combine", "mla_fast_combine")
        out[d] = funcs[n]
    return out


def sass(pa, pb):
    a, b = sass_functions(pa), sass_functions(pb)
    same, diff = 0, []
    for k in sorted(set(a) | set(b)):
        if not re.search(r"mla_|mha_|merge|attend|combine", k):
            continue
        if k not in a or k not in b:
            diff.append(f"{k}: only in {'A' if k in a else 'B'}")
        elif a[k] == b[k]:
            same += 1
        else:
            ca = collections.Counter(i.split()[0] for i in a[k])
            cb = collections.Counter(i.split()[0] for i in b[k])
            delta = {op: cb[op] - ca[op] for op in set(ca) | set(cb) if cb[op] != ca[op]}
            diff.append(f"{k}: {len(a[k])} → {len(b[k])} instructions, opcode counts {delta}")
    print(f"SASS: {same} attention kernels identical, {len(diff)} differ")
    for d in diff:
        print("  " + d[:400])


if __name__ == "__main__":
    bench(sys.argv[2]) if sys.argv[1] == "bench" else sass(sys.argv[2], sys.argv[3])
