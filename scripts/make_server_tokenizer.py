#!/usr/bin/env python3
"""Writes tests/data/server_tokenizer/: a byte-level tokenizer whose 256 ids fit tests/data/v3_tiny.

Ids 0..14 are DeepSeek's added tokens (0 = BOS and 1 = EOS, as v3_tiny's config says), taken from
tests/data/text/tiny_tokenizer.json with its pre-tokenizer, post-processor and decoder; ids 15..255
are single bytes (no merges): every byte that can occur in UTF-8 text except NUL and SOH. The chat
template is DeepSeek-V3's (tests/data/text/templates/deepseek_v3.jinja). The server's text and chat
tests run with it, so a random 256-token model can answer text prompts.
"""
import json
import os

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
src = json.load(open(os.path.join(root, "tests/data/text/tiny_tokenizer.json"), encoding="utf-8"))


def bytes_to_unicode():  # GPT-2's byte ↔ printable-character table, as the ByteLevel pre-tokenizer uses
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


added = src["added_tokens"]
assert [a["id"] for a in added] == list(range(15))
never_in_utf8 = {0xC0, 0xC1} | set(range(0xF5, 0x100))
kept = [b for b in range(256) if b not in never_in_utf8 and b not in (0x00, 0x01)]
assert len(kept) == 256 - 15
table = bytes_to_unicode()
vocab = {a["content"]: a["id"] for a in added}
for i, b in enumerate(kept):
    vocab[table[b]] = 15 + i
tok = dict(src)
tok["model"] = dict(src["model"], vocab=vocab, merges=[])
out = os.path.join(root, "tests/data/server_tokenizer")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(tok, f, ensure_ascii=False, indent=1)
    f.write("\n")
template = open(os.path.join(root, "tests/data/text/templates/deepseek_v3.jinja"), encoding="utf-8").read()
config = {
    "bos_token": "<｜begin▁of▁sentence｜>",
    "eos_token": "<｜end▁of▁sentence｜>",
    "add_bos_token": True,
    "add_eos_token": False,
    "tokenizer_class": "LlamaTokenizerFast",
    "model_max_length": 512,
    "chat_template": template,
}
with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, ensure_ascii=False, indent=1)
    f.write("\n")
