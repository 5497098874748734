#!/usr/bin/env python3
"""A real-size checkpoint with random weights, made and saved by transformers, and transformers'
own greedy ids on it (bf16, and f32 with the top-1/top-2 margin of every step).

  python3 scripts/hf_random_checkpoint.py CKPT_DIR OUT.json [--wait-for FILE]

CKPT_DIR must hold a config.json (e.g. `mla shape deepseek-v2-lite > CKPT_DIR/config.json`). The
model is initialised on the GPU in bf16 (transformers' own init) and saved in 5 GB shards. With
--wait-for, the greedy runs start only once FILE exists (so they do not disturb a benchmark).
"""
import argparse
import json
import os
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("--wait-for")
    ap.add_argument("--new-tokens", type=int, default=16)
    a = ap.parse_args()
    torch.manual_seed(0)
    t = time.time()
    with torch.device("cuda"):
        m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(a.ckpt), torch_dtype=torch.bfloat16)
    m.eval()
    m.save_pretrained(a.ckpt, max_shard_size="5GB")
    r = {"make_and_save_s": time.time() - t, "prompt": PROMPT}
    if a.wait_for:
        while not os.path.exists(a.wait_for):
            time.sleep(1)
    ids = torch.tensor([PROMPT], device="cuda")
    with torch.no_grad():
        r["hf_bf16_ids"] = m.generate(ids, max_new_tokens=a.new_tokens, do_sample=False)[0, len(PROMPT):].tolist()
        m = m.float()
        g = m.generate(ids, max_new_tokens=a.new_tokens, do_sample=False, output_scores=True,
                       return_dict_in_generate=True)
        r["hf_f32_ids"] = g.sequences[0, len(PROMPT):].tolist()
        r["hf_f32_margin"] = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in g.scores]
    json.dump(r, open(a.out, "w"))


if __name__ == "__main__":
    main()
