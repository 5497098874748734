#!/usr/bin/env python3
"""Expected token ids from Hugging Face `tokenizers` for the tokenizer tests (tests/test_tokenizer.cpp).

  python3 scripts/text_fixtures.py --v3 .cache/tokenizers/deepseek_v3 --out tests/data/text

1. Trains the tiny byte-level BPE tokenizer (vocab 512) on tests/data/text/tiny_train.txt with
   DeepSeek-V3's exact normalizer, pre-tokenizer and decoder (copied from its tokenizer.json) and
   the DeepSeek special tokens; writes tiny_tokenizer.json (+ tiny_tokenizer_config.json).
2. For DeepSeek-V3, the tiny tokenizer and each variant of tests/data/text/variants.json (a patch
   over one of them), encodes every text of tests/data/text/corpus.jsonl with and without
   add_special_tokens and decodes the ids (with and without skip_special_tokens); writes
   expected_<name>.json. (Not transformers' AutoTokenizer: transformers 5 rebuilds DeepSeek-V3's
   tokenizer as a Llama one and gives other ids for most texts.)

--tiny FILE reuses a trained tiny tokenizer instead of training one; --variants FILE names another
variant list (tests/data/text/variants_pending.json: variants whose expectations are still to be
made on a machine with HF tokenizers).
"""
import argparse
import copy
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, processors

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "text")

SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
            "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
            "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
            "<｜tool▁sep｜>"]


def train_tiny(v3_json):
    base = Tokenizer(models.BPE())
    j = json.loads(base.to_str())
    for key in ("normalizer", "pre_tokenizer", "decoder"):
        j[key] = v3_json[key]
    tok = Tokenizer.from_str(json.dumps(j))
    trainer = trainers.BpeTrainer(vocab_size=512, min_frequency=1, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    lines = open(os.path.join(DATA, "tiny_train.txt"), encoding="utf-8").read().splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer=trainer)
    bos = SPECIALS[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def apply_patch(j, patch):
    j = copy.deepcopy(j)
    for key, value in patch.items():
        if key.startswith("model."):
            j["model"][key[len("model."):]] = value
        elif key == "added_tokens_flags":
            for t in j["added_tokens"]:
                t.update(value.get(t["content"], {}))
        elif key == "added_tokens_extra":
            for t in value:
                j["added_tokens"].append(dict(t))
        else:
            j[key] = value
    return j


def expected(tok, texts):
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        with_sp = tok.encode(text, add_special_tokens=True).ids
        case = {"ids": ids}
        # ids_special as prefix + ids + suffix when it is that (it always is for these post-processors).
        done = False
        for p in range(len(with_sp) - len(ids) + 1):
            if with_sp[p:p + len(ids)] == ids:
                case["prefix"], case["suffix"] = with_sp[:p], with_sp[p + len(ids):]
                done = True
                break
        if not done:
            case["ids_special"] = with_sp
        case["decoded"] = tok.decode(with_sp, skip_special_tokens=False)
        case["decoded_skip"] = tok.decode(with_sp, skip_special_tokens=True)
        cases.append(case)
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--v3", required=True, help="folder with DeepSeek-V3's tokenizer.json + tokenizer_config.json")
    ap.add_argument("--out", default=DATA)
    ap.add_argument("--tiny", help="an already trained tiny_tokenizer.json (default: train one)")
    ap.add_argument("--variants", default=os.path.join(DATA, "variants.json"))
    ap.add_argument("--only-variants", action="store_true", help="write the variants' files alone")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    texts = [json.loads(l) for l in open(os.path.join(DATA, "corpus.jsonl"), encoding="utf-8")]
    v3_json = json.load(open(os.path.join(a.v3, "tokenizer.json"), encoding="utf-8"))

    tiny = Tokenizer.from_file(a.tiny) if a.tiny else train_tiny(v3_json)
    tiny.save(os.path.join(a.out, "tiny_tokenizer.json"))
    tiny_config = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[1], "add_bos_token": True, "add_eos_token": False,
                   "tokenizer_class": "LlamaTokenizerFast", "model_max_length": 4096}
    with open(os.path.join(a.out, "tiny_tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tiny_config, f, ensure_ascii=False, indent=2)
    tiny_json = json.load(open(os.path.join(a.out, "tiny_tokenizer.json"), encoding="utf-8"))

    bases = {"v3": v3_json, "tiny": tiny_json}
    runs = [] if a.only_variants else [("v3", v3_json, None), ("tiny", tiny_json, None)]
    for v in json.load(open(a.variants, encoding="utf-8")):
        runs.append((v["name"], apply_patch(bases[v["base"]], v["patch"]), v))
    for name, j, variant in runs:
        tok = Tokenizer.from_str(json.dumps(j))
        if variant and "added_tokens_extra" in variant["patch"]:
            variant = copy.deepcopy(variant)  # the ids HF gave the extra tokens
            for t in variant["patch"]["added_tokens_extra"]:
                t["id"] = tok.token_to_id(t["content"])
        doc = {"name": name, "tokenizers_version": tokenizers.__version__, "cases": expected(tok, texts)}
        if variant:
            doc["base"], doc["patch"] = variant["base"], variant["patch"]
        with open(os.path.join(a.out, f"expected_{name}.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        print(f"{name}: {sum(len(c['ids']) for c in doc['cases'])} ids", file=sys.stderr)


if __name__ == "__main__":
    main()
