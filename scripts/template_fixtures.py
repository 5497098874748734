#!/usr/bin/env python3
"""Expected chat-template renderings: every template in tests/data/text/templates/ x every
conversation in tests/data/text/conversations.json, rendered by transformers' own
apply_chat_template(..., tokenize=False), written to tests/data/text/template_expected.json with
the text, or the error when the template raises.

    python3 scripts/template_fixtures.py              # transformers (the authority)
    python3 scripts/template_fixtures.py --jinja-only # jinja2 configured as transformers configures it
                                                      # (for iterating where transformers is missing)
    ... --cli-only        # only (re)write tests/data/text/cli/ from template_expected.json: the
                          # messages/tools files and the exact stdout of `mla chat-template` on them
    ... --tokenizer DIR   # also the ids of each deepseek_v3.jinja rendering, from DIR/tokenizer.json
                          # through PreTrainedTokenizerFast.encode(text, add_special_tokens=False)
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "text")
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"


def transformers_renderer(source):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                                  bos_token=BOS, eos_token=EOS, pad_token=EOS)
    tok.chat_template = source

    def render(messages, add_generation_prompt, tools, extra):
        return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                       tokenize=False, **extra)
    return render


def jinja_renderer(source):
    import jinja2
    import jinja2.ext
    from datetime import datetime
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    tmpl = env.from_string(source)

    def render(messages, add_generation_prompt, tools, extra):
        return tmpl.render(messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt,
                           bos_token=BOS, eos_token=EOS, pad_token=EOS, **extra)
    return render


CLI_CASES = ["system_user", "two_calls_consecutive_results", "unicode", "reasoning_in_content", "tool_call_with_content"]


def write_cli_cases():
    """Inputs and expected stdout for tests/cli_chat_template.sh, from the transformers renderings of
    deepseek_v3.jinja (text, and ids when recorded): `<name>.txt` is the plain output, `<name>.out.json`
    the --json line as the CLI writes it (compact JSON, UTF-8 kept)."""
    expected = json.load(open(os.path.join(DATA, "template_expected.json"), encoding="utf-8"))
    conversations = {c["name"]: c for c in json.load(open(os.path.join(DATA, "conversations.json"), encoding="utf-8"))}
    out = os.path.join(DATA, "cli")
    os.makedirs(out, exist_ok=True)
    for case in expected["cases"]:
        if case["template"] != "deepseek_v3.jinja" or case["conversation"] not in CLI_CASES:
            continue
        name, c = case["conversation"], conversations[case["conversation"]]
        json.dump(c["messages"], open(os.path.join(out, name + ".messages.json"), "w", encoding="utf-8"), ensure_ascii=False)
        if c.get("tools") is not None:
            json.dump(c["tools"], open(os.path.join(out, name + ".tools.json"), "w", encoding="utf-8"), ensure_ascii=False)
        with open(os.path.join(out, name + ".txt"), "w", encoding="utf-8", newline="") as f:
            f.write(case["text"])
        if "ids" in case:
            with open(os.path.join(out, name + ".out.json"), "w", encoding="utf-8", newline="") as f:
                f.write(json.dumps({"text": case["text"], "ids": case["ids"]}, ensure_ascii=False, separators=(",", ":")) + "\n")
        with open(os.path.join(out, name + ".args"), "w") as f:
            f.write(("--add-generation-prompt" if c["add_generation_prompt"] else "") + "\n")
    print("cli cases -> %s" % os.path.relpath(out, ROOT))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jinja-only", action="store_true")
    ap.add_argument("--out", default=os.path.join(DATA, "template_expected.json"))
    ap.add_argument("--tokenizer", help="folder with DeepSeek-V3's tokenizer.json: record ids of the V3 renderings")
    ap.add_argument("--cli-only", action="store_true")
    args = ap.parse_args()
    if args.cli_only:
        return write_cli_cases()
    if args.jinja_only:
        import jinja2
        renderer_of, who = jinja_renderer, "jinja2 %s (transformers' environment replicated)" % jinja2.__version__
    else:
        import transformers
        renderer_of, who = transformers_renderer, "transformers %s apply_chat_template" % transformers.__version__
    conversations = json.load(open(os.path.join(DATA, "conversations.json"), encoding="utf-8"))
    tdir = os.path.join(DATA, "templates")
    encode = None
    if args.tokenizer:
        from transformers import PreTrainedTokenizerFast
        hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(args.tokenizer, "tokenizer.json"))
        encode = lambda text: hf.encode(text, add_special_tokens=False)
    cases = []
    for name in sorted(os.listdir(tdir)):
        if not name.endswith(".jinja"):
            continue
        source = open(os.path.join(tdir, name), encoding="utf-8", newline="").read()
        render = renderer_of(source)
        for c in conversations:
            case = {"template": name, "conversation": c["name"]}
            try:
                case["text"] = render(c["messages"], c["add_generation_prompt"], c.get("tools"), c.get("extra", {}))
                if encode and name == "deepseek_v3.jinja":
                    case["ids"] = encode(case["text"])
            except Exception as e:  # the template raised: our interpreter must raise too
                case["error"] = "%s: %s" % (type(e).__name__, e)
            cases.append(case)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"renderer": who, "bos_token": BOS, "eos_token": EOS, "pad_token": EOS, "cases": cases}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in c for c in cases)
    print("%s: %d cases (%d errors) -> %s" % (who, len(cases), n_err, os.path.relpath(args.out, ROOT)))
    if args.out == os.path.join(DATA, "template_expected.json"):
        write_cli_cases()


if __name__ == "__main__":
    sys.exit(main())
