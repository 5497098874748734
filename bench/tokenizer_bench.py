#!/usr/bin/env python3
"""Tokenizer speed: `mla tokenize --bench` against Hugging Face `tokenizers`, same texts, same machine.

  python3 bench/tokenizer_bench.py --mla build/bin/mla --tokenizer .cache/tokenizers/deepseek_v3

Texts: tests/data/text/corpus.jsonl and ~4 MB of generated English prose (fixed seed). For each:
ours single thread and on all cores (mla tokenize --jsonl FILE --bench SECONDS), HF encode_batch on
one thread (RAYON_NUM_THREADS=1, a separate process) and on all cores, and a check that our ids
equal HF's on every text. Prints one JSON line per text set.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORDS = ("the of and to in is was that for it with as he on be at by had not are but from or have an they which one "
         "you were her all she there would their we him been has when who will more no if out so said what up its about "
         "into than them can only other new some could time these two may then do first any my now such like our over man "
         "me even most made after also did many before must through back years where much your way well down should "
         "because each just those people how too little state good very make world still own see men work long get here "
         "between both life being under never day same another know while last might us great old year off come since "
         "against go came right used take three tokenizer model attention latent engine throughput memory sequence "
         "university government information development international understanding approximately").split()


def prose(n_bytes, seed=1234):
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_bytes:
        sents = []
        for _ in range(rng.randint(2, 6)):
            w = [rng.choice(WORDS) for _ in range(rng.randint(5, 22))]
            w[0] = w[0].capitalize()
            if rng.random() < 0.2:
                w.insert(rng.randrange(len(w)), str(rng.randint(1, 99999)))
            if rng.random() < 0.3:
                k = rng.randrange(1, len(w))
                w[k] = w[k] + ","
            sents.append(" ".join(w) + rng.choice([".", ".", ".", "?", "!"]))
        line = " ".join(sents)
        lines.append(line)
        size += len(line.encode()) + 1
    return lines


HF_SINGLE = r"""
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1]); texts = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
n = sum(len(t.encode()) for t in texts); secs = float(sys.argv[3])
tok.encode_batch(texts, add_special_tokens=False)
reps, t0 = 0, time.perf_counter()
while True:
    tok.encode_batch(texts, add_special_tokens=False); reps += 1
    el = time.perf_counter() - t0
    if el >= secs: break
print(json.dumps({"MBps": n * reps / el / 1e6}))
"""


def hf_rate(tokfile, jsonl, secs, threads):
    env = dict(os.environ)
    if threads == 1:
        env["RAYON_NUM_THREADS"] = "1"
    else:
        env.pop("RAYON_NUM_THREADS", None)
    env["TOKENIZERS_PARALLELISM"] = "true"
    out = subprocess.run([sys.executable, "-c", HF_SINGLE, tokfile, jsonl, str(secs)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["MBps"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mla", required=True)
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--prose-mb", type=float, default=4.0)
    a = ap.parse_args()
    from tokenizers import Tokenizer
    tokfile = os.path.join(a.tokenizer, "tokenizer.json")
    tok = Tokenizer.from_file(tokfile)
    tmp = tempfile.mkdtemp()
    sets = {"corpus": os.path.join(HERE, "..", "tests", "data", "text", "corpus.jsonl")}
    p = os.path.join(tmp, "prose.jsonl")
    with open(p, "w", encoding="utf-8") as f:
        for line in prose(int(a.prose_mb * 1e6)):
            f.write(json.dumps(line) + "\n")
    sets["prose"] = p
    for name, path in sets.items():
        texts = [json.loads(l) for l in open(path, encoding="utf-8")]
        hf_ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        ours = subprocess.run([a.mla, "tokenize", "--tokenizer", a.tokenizer, "--jsonl", path], check=True,
                              capture_output=True, text=True).stdout.splitlines()
        mismatches = sum(json.loads(o) != h for o, h in zip(ours, hf_ids)) + abs(len(ours) - len(hf_ids))
        b = json.loads(subprocess.run([a.mla, "tokenize", "--tokenizer", a.tokenizer, "--jsonl", path, "--bench",
                                       str(a.seconds)], check=True, capture_output=True, text=True).stdout)
        res = {"set": name, "texts": len(texts), "bytes": b["bytes"], "tokens": b["tokens"], "id_mismatches": mismatches,
               "ours_1t_MBps": round(b["single_thread_MBps"], 2), "hf_1t_MBps": round(hf_rate(tokfile, path, a.seconds, 1), 2),
               "ours_all_MBps": round(b["batch_MBps"], 2), "hf_all_MBps": round(hf_rate(tokfile, path, a.seconds, 0), 2),
               "threads": b["batch_threads"]}
        res["speedup_1t"] = round(res["ours_1t_MBps"] / res["hf_1t_MBps"], 2)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
