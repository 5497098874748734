#!/usr/bin/env python3
"""Language cases for the Jinja interpreter (tests/test_jinja.cpp): each template snippet rendered
by jinja2 in the environment transformers uses for chat templates (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, its tojson / raise_exception), written with its text or
the fact that it raised to tests/data/text/jinja_cases.json.

    python3 scripts/jinja_cases.py
"""
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "text", "jinja_cases.json")

CTX = {
    "s": "Hello World", "n": 7, "f": 2.5, "b": True, "z": None, "e": "", "l": [3, 1, 2], "el": [],
    "d": {"b": 1, "a": [1, 2], "c": {"x": "y"}}, "u": "héllo wörld ✓ 日本",
    "msgs": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
             {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": {"k": 1}}}]},
             {"role": "user", "content": " U2 "}],
}

CASES = [
    # output, literals, str() of values
    "plain text", "{{ s }}", "{{ n }} {{ f }} {{ b }} {{ z }} {{ e }}|", "{{ l }} {{ el }} {{ d }}",
    "{{ 'a' 'b' }}{{ \"q\\\"x\" }}{{ 'it\\'s' }}", "{{ '\\n\\t\\x41\\u00e9\\U0001F600\\\\' }}", "{{ '\\q' }}",
    "{{ 1_000 }} {{ 1.5e3 }} {{ 1e16 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 1e22 }} {{ 123456789.0 }} {{ -0.0 }}",
    "{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}, (1,), (1, 2), ()] }}", "{{ {'a': 'x\"y', 'b': 'x\\'y'} }}",
    "{{ ['\\n', '\\x00', '\\u00a0', 'é', '\\u200b', '日'] }}", "{{ true }}{{ True }}{{ none }}{{ None }}",
    # arithmetic and operators
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}",
    "{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % -2 }} {{ 1 + 2.0 }} {{ true + 1 }} {{ 3 * 'ab' }} {{ [1] * 3 }} {{ 'ab' * 0 }}",
    "{{ 'a' ~ 1 ~ none ~ undefined_thing ~ 2.0 ~ [1] }}", "{{ [1, 2] + [3] }} {{ (1,) + (2,) }} {{ -n }} {{ +f }} {{ - -3 }}",
    "{{ 1 == 1.0 }} {{ 1 == true }} {{ 'a' == 'a' }} {{ [1] == [1] }} {{ none == none }} {{ 1 != 2 }} {{ 'a' < 'b' }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2 }} {{ 1 <= 0 }}",
    "{{ 'ell' in s }} {{ 2 in l }} {{ 'a' in d }} {{ 'zz' not in d }} {{ 5 not in l }} {{ 'x' in undefined_thing }}",
    "{{ n and s }} {{ z or 'dflt' }} {{ e and 1 }} {{ not e }} {{ not not n }} {{ 0 or '' or [] }}|",
    "{{ 'yes' if b else 'no' }} {{ 'yes' if z else 'no' }} {{ 'only' if false }}| {{ 1 if 0 else 2 if 0 else 3 }}",
    "{{ (1 + 2) * 3 }} {{ 1 + 2 * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 1 ~ 2 * 3 }}", "{{ 1 ~ 2 + 3 }}",
    # subscripts, attributes, slices
    "{{ d['a'][1] }} {{ d.a[0] }} {{ d.c.x }} {{ d['c']['x'] }} {{ l[-1] }} {{ l.0 }} {{ s[0] }} {{ u[1] }} {{ u[-1] }}",
    "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ s[:5] }} {{ s[-5:] }} {{ u[::-1] }} {{ l[5:] }} {{ s[2:1] }}|",
    "{{ d.missing }}|{{ d['missing'] }}|{{ l[10] }}|{{ s[99] }}|{{ z.attr }}|{{ z['k'] }}|",
    "{{ d.missing is defined }} {{ d.a is defined }} {{ l[10] is undefined }} {{ msgs[2].content is none }}",
    "{{ msgs[2]['tool_calls'][0]['function']['name'] }}",
    # methods
    "[{{ '  x y  '.strip() }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\\n\\t a \\u3000'.strip() }}]",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'a b  c'.split(none, 1) }}",
    "{{ s.startswith('Hell') }} {{ s.endswith('x') }} {{ s.startswith(('x', 'He')) }} {{ ''.startswith('') }}",
    "{{ s.upper() }} {{ s.lower() }} {{ u.upper() }} {{ 'hello wORLD x2y'.title() }} {{ 'hELLO'.capitalize() }}",
    "{{ s.replace('o', '0') }} {{ s.replace('o', '', 1) }} {{ 'ab'.replace('', '-') }} {{ s.find('W') }} {{ u.find('w') }} {{ s.count('o') }}",
    "{{ ', '.join(['a', 'b']) }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ ''.isdigit() }}",
    "{{ d.get('b') }} {{ d.get('q') }} {{ d.get('q', 'dflt') }} {{ d.keys() }} {{ d.values() }} {{ d.items() }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{% for k in d %}{{ k }}{% endfor %}",
    # filters
    "[{{ '  t  ' | trim }}][{{ 'xtx' | trim('x') }}] {{ l | length }} {{ s | length }} {{ u | count }} {{ d | length }} {{ undefined_thing | length }}",
    "{{ l | tojson }} {{ d | tojson }} {{ u | tojson }} {{ 'a\"b\\\\c\\n\\x01\\x7f' | tojson }} {{ [1.0, 2.5e-7, none, true] | tojson }}",
    "{{ d | tojson(indent=2) }}", "{{ d | tojson(sort_keys=true) }} {{ d | tojson(separators=(',', ':')) }}",
    "{{ {'a': []} | tojson(indent=4) }} {{ u | tojson(ensure_ascii=true) }} {{ '😀' | tojson(ensure_ascii=true) }}",
    "{{ d | tojson(indent='\\t') }}", "{{ n | string }}{{ z | string }}{{ l | string }}{{ undefined_thing | string }}|",
    "{{ l | first }} {{ l | last }} {{ s | first }} {{ s | last }} {{ el | first }}| {{ d | first }}",
    "{{ l | join }} {{ l | join('-') }} {{ msgs | join(', ', attribute='role') }} {{ [none, 1] | join(',') }}",
    "{{ undefined_thing | default('x') }} {{ z | default('x') }} {{ e | default('x') }}|{{ e | default('x', true) }} {{ z | d('y', true) }}",
    "{{ s | upper }} {{ s | lower }} {{ 'ab cd' | title }} {{ 'aB' | capitalize }} {{ s | replace('l', 'L') }} {{ s | replace('l', 'L', 2) }}",
    "{{ s | list }} {{ d | list }} {{ undefined_thing | list }} {{ d | items | list }} {{ undefined_thing | items | list }}",
    "{{ '42' | int }} {{ ' 7 ' | int }} {{ '3.9' | int }} {{ 3.9 | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ true | int }} {{ '1e3' | int }}",
    "{{ '2.5' | float }} {{ 3 | float }} {{ 'q' | float }} {{ -3 | abs }} {{ -2.5 | abs }} {{ l | reverse | list }} {{ s | reverse }}",
    "{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}",
    "{{ msgs | rejectattr('content') | map(attribute='role') | join(',') }} {{ msgs | selectattr('tool_calls', 'defined') | list | length }}",
    "{{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 0, 2] | select | list }} {{ [1, 2] | reject('odd') | list }} {{ ['a', 'B'] | map('upper') | list }}",
    "{{ msgs | map(attribute='missing', default='D') | list }}", "{{ s | safe }}",
    # tests
    "{{ s is string }} {{ n is string }} {{ d is mapping }} {{ l is mapping }} {{ l is iterable }} {{ s is iterable }} {{ n is iterable }}",
    "{{ n is number }} {{ f is number }} {{ b is number }} {{ s is number }} {{ n is integer }} {{ f is float }} {{ b is boolean }}",
    "{{ z is none }} {{ z is not none }} {{ undefined_thing is defined }} {{ undefined_thing is undefined }} {{ n is not defined }}",
    "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ n is eq 7 }} {{ n is ne(7) }} {{ n is gt 3 }}",
    "{{ 1 is in [1, 2] }} {{ z is sameas none }} {{ b is true }} {{ b is false }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ l is sequence }}",
    "{{ range is callable }} {{ s is callable }} {{ not n is defined }}",
    # statements
    "{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}", "{% if z %}a{% elif e %}b{% endif %}|",
    "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in l %}{{ loop.previtem }}>{{ x }}<{{ loop.nextitem }} {% endfor %}", "{% for x in l %}{{ loop.cycle('a', 'b') }}{% endfor %}",
    "{% for x in el %}x{% else %}empty{% endfor %} {% for x in l if x > 5 %}x{% else %}none kept{% endfor %}",
    "{% for x in l if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}",
    "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }} {% endfor %}{% for (a, b) in [[5, 6]] %}{{ a * b }}{% endfor %}",
    "{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in [1, 2] %}{% for y in 'ab' %}{{ x }}{{ y }}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}",
    "{% for i in range(3) %}{{ i }}{% endfor %} {{ range(2, 8, 3) | list }} {{ range(5, 0, -2) | list }} {{ range(0) | list }}",
    "{% set x = 5 %}{{ x }}{% set y, w = 1, 2 %}{{ y }}{{ w }}{% set t = 1, 2 %}{{ t }}",
    "{% set y = 0 %}{% for i in [1, 2] %}{% set y = y + i %}[{{ y }}]{% endfor %}{{ y }}",
    "{% for i in [1, 2] %}{% if loop.first %}{% set k = 1 %}{% endif %}[{{ k }}]{% endfor %}[{{ k }}]",
    "{% set ns = namespace(c=0, s='') %}{% for i in l %}{% set ns.c = ns.c + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.c }} {{ ns.s }}",
    "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.zz is defined }}", "{{ dict(a=1, b='x') }} {{ dict({'q': 1}, r=2) }}",
    "{% set block %}in {{ n }} block{% endset %}[{{ block }}]",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }} [{{ greet() }}]",
    "{% macro outer(x) %}<{{ inner(x) }}>{% endmacro %}{% macro inner(y) %}{{ y * 2 }}{% endmacro %}{{ outer(4) }}",
    "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k }}*{{ fact(k - 1) }}{% endif %}{% endmacro %}{{ fact(4) }}",
    "{% raw %}{{ not parsed }}{% if %}{% endraw %}!", "a{# comment #}b{#- stripped -#}  c",
    # whitespace control, trim_blocks, lstrip_blocks
    "a\n  {% if true %}\n  b\n  {% endif %}\nc\n", "  {{ n }}  \n  {{- n -}}  \n", "x  {%- if true -%}  y  {%- endif -%}  z",
    "line\n    {%+ if true %}kept indent{% endif %}\n", "{% if true +%}\nkept newline{% endif %}",
    "  {# comment line #}\nafter", "<{% for x in l %}\n  {{ x }}\n{% endfor %}>", "{% if true %}  \n{% endif %}|",
    "a\r\nb\rc\n", "trailing newline dropped\n", "two trailing\n\n", "\t{% set q = 1 %}\ttab",
    "{%- if true %}\n\n{% endif %}", "{{ '{{' }} {{ '%}' }} {{ {'a': {'b': 1}} }}",
    # raise_exception and errors at render time
    "{{ raise_exception('bad ' ~ n) }}", "{{ 'a' + 1 }}", "{{ undefined_thing + 1 }}", "{{ undefined_thing.attr }}", "{{ d.missing.x }}",
    "{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ undefined_thing() }}", "{{ s() }}", "{% for x in n %}{% endfor %}", "{{ 'x' in none }}",
    "{{ n < 'a' }}", "{{ z | tojson }}{{ undefined_thing | tojson }}", "{{ l.append(1) }}", "{{ d.update({}) }}",
    "{% set n.x = 1 %}", "{{ 'abc'.split('') }}", "{{ l[1:2:0] }}", "{{ [1, 2] | first | upper }}",
]


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    out = []
    for src in CASES:
        case = {"template": src}
        try:
            case["text"] = env.from_string(src).render(**CTX)
        except Exception as e:
            case["error"] = "%s: %s" % (type(e).__name__, e)
        out.append(case)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"renderer": "jinja2 %s" % jinja2.__version__, "context": CTX, "cases": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("%d cases (%d raise) -> %s" % (len(out), sum("error" in c for c in out), os.path.relpath(OUT, ROOT)))


if __name__ == "__main__":
    main()
