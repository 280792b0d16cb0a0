#!/usr/bin/env python3
"""Builds the chat-template test data in tests/data/chat_templates/ with Python's jinja2.

Renders with the environment transformers' apply_chat_template uses:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and a {% generation %} tag, transformers' tojson override (json.dumps,
ensure_ascii=False), raise_exception() and strftime_now(). strftime_now formats a FIXED
date (stored as "now" in the output) so that the C++ test can pin its clock to the same one.

Writes:
  smollm2.jinja    the default model's template, read from its GGUF (tokenizer.chat_template);
                   kept as is when the model file is absent.
  reference.json   {"now", "cases": [{template, name, context, expected | error}]}: every
                   *.jinja template here rendered for a set of conversations (system + user,
                   multi-turn, no system, with and without the generation prompt, unicode,
                   braces and quotes, whitespace, and each family's tools / reasoning paths).
  snippets.json    {"now", "context", "snippets": [{template, expected | error[, error_line]}]}:
                   small templates rendered with one shared context, checking expression,
                   filter, test and whitespace semantics, runtime errors and syntax errors.

The other *.jinja files are the chat templates of the families dhisparse supports, written out
by hand (Llama-2, Llama-3.1, Llama-3.2, Mistral v0.3, Qwen2.5, Qwen3, ChatML, Gemma 2/3).

Usage: python3 scripts/make_chat_template_reference.py [--model GGUF] [--out DIR]
Needs: jinja2 (pip); gguf for reading the model's template.
"""
import argparse
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime(2024, 9, 5, 14, 30, 0)


class GenerationTag(Extension):
    """transformers' AssistantTracker, minus the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, context):
    """Returns {"expected": text} or {"error": message[, "error_line": n]}."""
    try:
        return {"expected": env.from_string(source).render(**context)}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": e.message or str(e), "error_kind": "syntax", "error_line": e.lineno}
    except jinja2.exceptions.TemplateError as e:
        kind = "raise" if type(e) is jinja2.exceptions.TemplateError else "runtime"
        return {"error": str(e), "error_kind": kind}
    except Exception as e:  # TypeError, ZeroDivisionError, ... from the expression itself
        return {"error": f"{type(e).__name__}: {e}", "error_kind": "runtime"}


# --- conversations -------------------------------------------------------------------

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! How are you?"}
A1 = {"role": "assistant", "content": "I'm fine, thanks. How can I help?"}
U2 = {"role": "user", "content": "What's 2 + 2?"}
UNICODE = [
    {"role": "user", "content": "Grüße aus Zürich — 你好，世界 🌍 Ελληνικά ÇA"},
    {"role": "assistant", "content": "¡Hola! Привет 👋"},
    {"role": "user", "content": "日本語で答えて"},
]
BRACES = {"role": "user",
          "content": "Render {{ this }} and {% that %} literally: {'a': \"b\"}, it's \\n not a newline\\"}
WHITESPACE = {"role": "user", "content": "  \n  padded with whitespace \t\n\n"}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                       "required": ["a", "b"]},
        "return": {"type": "number"}}},
]
WEATHER_Q = {"role": "user", "content": "What's the weather in Zürich?"}
TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call12345", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
               "content": "{\"temperature\": 21.5, \"condition\": \"sunny\"}"}
TWO_CALLS = {"role": "assistant", "content": "Let me check both.", "tool_calls": [
    {"id": "call12345", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
    {"id": "call67890", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3.5}}}]}
TWO_RESULTS = [
    {"role": "tool", "tool_call_id": "call12345", "content": "21.5 C"},
    {"role": "tool", "tool_call_id": "call67890", "content": "5.5"},
]
FINAL = {"role": "assistant", "content": "It is 21.5 °C and sunny in Zürich."}

TOKENS = {
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "chatml": ("<|im_start|>", "<|im_end|>"),
    "llama2": ("<s>", "</s>"),
    "llama3.1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistral_v0.3": ("<s>", "</s>"),
    "qwen2.5": (None, "<|im_end|>"),
    "qwen3": (None, "<|im_end|>"),
    "gemma2": ("<bos>", "<eos>"),
    "gemma3": ("<bos>", "<eos>"),
}

GENERIC = [
    ("system_user", [SYS, U1], True, {}),
    ("multi_turn_gen", [SYS, U1, A1, U2], True, {}),
    ("multi_turn_nogen", [SYS, U1, A1, U2], False, {}),
    ("no_system", [U1, A1, U2], True, {}),
    ("single_user_nogen", [U1], False, {}),
    ("unicode", UNICODE, True, {}),
    ("braces_quotes", [SYS, BRACES], True, {}),
    ("whitespace", [WHITESPACE], False, {}),
]

SPECIFIC = {
    "llama3.1": [
        ("tools_in_user", [SYS, WEATHER_Q], True, {"tools": TOOLS}),
        ("tools_in_system", [WEATHER_Q], True, {"tools": TOOLS, "tools_in_user_message": False}),
        ("tool_roundtrip", [SYS, WEATHER_Q, TOOL_CALL, TOOL_RESULT, FINAL], False, {"tools": TOOLS}),
        ("date_string", [U1], True, {"date_string": "01 Jan 2025"}),
        ("builtin_tools", [WEATHER_Q, {"role": "assistant", "tool_calls": [
            {"function": {"name": "brave_search", "arguments": {"query": "weather Zürich"}}}]},
            {"role": "ipython", "content": {"result": "sunny"}}], True,
         {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}),
        ("two_calls_raise", [WEATHER_Q, TWO_CALLS], False, {"tools": TOOLS}),
        ("tools_no_user_raise", [], True, {"tools": TOOLS}),
    ],
    "llama3.2": [
        ("tools_in_user", [SYS, WEATHER_Q], True, {"tools": TOOLS}),
        ("tool_roundtrip", [WEATHER_Q, TOOL_CALL, TOOL_RESULT], True, {"tools": TOOLS}),
        ("date_string", [U1], True, {"date_string": "01 Jan 2025"}),
    ],
    "qwen2.5": [
        ("tools", [SYS, WEATHER_Q], True, {"tools": TOOLS}),
        ("tools_default_system", [WEATHER_Q], True, {"tools": TOOLS}),
        ("tool_roundtrip", [WEATHER_Q, TOOL_CALL, TOOL_RESULT, FINAL], False, {"tools": TOOLS}),
        ("two_calls", [WEATHER_Q, TWO_CALLS] + TWO_RESULTS, True, {"tools": TOOLS}),
        ("system_later", [U1, {"role": "system", "content": "Be brief."}, U2], True, {}),
    ],
    "qwen3": [
        ("tools", [SYS, WEATHER_Q], True, {"tools": TOOLS}),
        ("tools_no_system", [WEATHER_Q], True, {"tools": TOOLS}),
        ("two_calls", [WEATHER_Q, TWO_CALLS] + TWO_RESULTS + [FINAL], False, {"tools": TOOLS}),
        ("reasoning_field", [U1, {"role": "assistant", "content": "Fine.", "reasoning_content": "\nThink.\n"}],
         False, {}),
        ("think_in_content", [U1, {"role": "assistant", "content": "<think>\nPlan it.\n</think>\n\nDone."}, U2,
                              {"role": "assistant", "content": "<think>\nAgain.\n</think>\n\nFour."}], False, {}),
        ("history_think_dropped", [U1, {"role": "assistant", "content": "<think>\nold\n</think>\n\nOld."}, U2],
         True, {}),
        ("enable_thinking_false", [U1], True, {"enable_thinking": False}),
        ("enable_thinking_true", [U1], True, {"enable_thinking": True}),
        ("multi_step_tool", [WEATHER_Q, TOOL_CALL, TOOL_RESULT,
                             {"role": "assistant", "content": "<think>\ncheck\n</think>\n\nSunny."}], False,
         {"tools": TOOLS}),
        ("string_arguments", [WEATHER_Q, {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]}], True, {}),
    ],
    "mistral_v0.3": [
        ("tools", [SYS, U1, A1, WEATHER_Q], False, {"tools": TOOLS}),
        ("tool_roundtrip", [WEATHER_Q, TOOL_CALL, TOOL_RESULT, FINAL], False, {"tools": TOOLS}),
        ("bad_call_id_raise", [WEATHER_Q, {"role": "assistant", "tool_calls": [
            {"id": "short", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]}], False, {}),
        ("not_alternating_raise", [U1, U2], False, {}),
    ],
    "llama2": [
        ("not_alternating_raise", [U1, U2], False, {}),
    ],
    "gemma3": [
        ("content_parts", [{"role": "system", "content": [{"type": "text", "text": "Sys parts."}]},
                           {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe. "}]}],
         True, {}),
    ],
}


def build_cases(env, out_dir):
    cases = []
    for fname in sorted(os.listdir(out_dir)):
        if not fname.endswith(".jinja"):
            continue
        family = fname[: -len(".jinja")]
        with open(os.path.join(out_dir, fname), encoding="utf-8", newline="") as f:
            source = f.read()
        bos, eos = TOKENS[family]
        for name, messages, agp, extra in GENERIC + SPECIFIC.get(family, []):
            context = {"messages": messages, "tools": None, "documents": None,
                       "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos}
            context.update(extra)
            case = {"template": fname, "name": name, "context": context}
            case.update(render(env, source, json.loads(json.dumps(context))))
            cases.append(case)
    return cases


# --- snippets ------------------------------------------------------------------------

SNIPPET_CONTEXT = {
    "x": [1, 2, 3, 4],
    "d": {"a": 1, "b": "two", "items": "key-items"},
    "users": [{"name": "ann", "age": 31}, {"name": "Bob", "age": 25}, {"name": "cy", "age": 40}],
    "msgs": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
             {"role": "assistant", "content": "A1", "tool_calls": [{"function": {"name": "f"}}]},
             {"role": "user", "content": "U2"}],
    "data": [{"a": {"b": 1}}, {"a": {"b": 2}}],
    "name": "World",
    "n": 0,
    "s": "Hello",
    "c": "<think>\nreason\n</think>\n\nanswer",
    "f": 2.5,
    "e": [],
    "nested": {"l": [{"k": [10, 20]}]},
}

SNIPPETS = [
    # whitespace control (trim_blocks + lstrip_blocks, -, +, comments, raw, newlines)
    "a\n  {% if true %}\n  b\n  {% endif %}\nc\n",
    "  {{ 'x' }}\n  {# c #}\n  y",
    "{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n",
    "x  {%- if true %} y {% endif -%}  z",
    "{{- ' a ' -}}  \n b",
    "a {#- comment -#} b",
    "a {#- comment #}\nb {# c2 -#}   \n  d",
    "{% raw %}{{ not evaluated }} {% if %}{% endraw %}",
    "  {% raw -%}  x  {%- endraw %}\ny",
    "line1\r\nline2\r\n{% if true %}\r\nx\r\n{% endif %}\r\nend",
    "  {%+ if true %}kept{% endif %}",
    "{% if true +%}\nnext{% endif %}",
    "text\n",
    "text\n\n",
    "{% for x in [1] %}  {% if true %}{{ x }}{% endif %}\n{% endfor %}",
    "{{ 'a' }}\n{{ 'b' }}\n",
    "  {{- 'x' }}",
    "<{% if true %}\n\n{% endif %}>",
    "{% if true %}   \t\n{% endif %}|",
    "a\n    {%- if true %}b{% endif %}",
    # literals and printing
    "{{ 1 }} {{ 1.5 }} {{ 1e3 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 2.0 }} {{ -0.0 }} {{ 123456789.125 }}",
    "{{ none }} {{ None }} {{ true }} {{ False }} {{ True }}",
    "{{ [1, 'a', none, true, 1.5] }} {{ {'k': 'v', 'n': [1, 2]} }}",
    "{{ (1,) }} {{ (1, 2) }} {{ () }} {{ [] }} {{ {} }}",
    "{{ ['it\\'s', 'a\"b', 'a\\nb', 'both\\'\"', 'tab\\t', 'é'] }}",
    "{{ \"a\\tb\\u00e9\\x41\\\\\" }} {{ 'a' 'b' \"c\" }}",
    "{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 10.5e1 }}",
    "{{ undefined_var }}|{{ d }}",
    "{{ 'multi\nline' }}",
    # arithmetic and operators
    "{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    "{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ 'ab' * 3 }} {{ [1] * 3 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 3 * 'x' }}",
    "{{ 1 ~ 2 ~ 'x' ~ none ~ undefined_var ~ [1] }}",
    "{{ -x[0]|abs }} {{ -x|length if false else 0 }} {{ - 2 ** 2 }} {{ -x[0] }} {{ 10 / 4 * 2 }} {{ 3 - 2 - 1 }} {{ 2 ** 3 ** 2 }}",
    "{{ true + 1 }} {{ 1 + 1.5 }} {{ 6 / 3 }} {{ 1e308 * 10 }}",
    "{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'b' >= 'a' }} {{ none == none }} {{ 1 != '1' }}",
    "{{ 'a' in 'cat' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 'x' not in 'abc' }} {{ 1 in (1, 2) }} {{ 'z' in undefined_var }}",
    "{{ {'a': 1, 'b': [1]} == {'b': [1], 'a': 1} }} {{ [1, 2] == (1, 2) }} {{ msgs[1] == msgs[1] }}",
    # logic and conditionals
    "{{ 1 and 'x' }} {{ 0 and 'x' }} {{ '' or 'default' }} {{ none or 0 }} {{ not 0 }} {{ not 'a' }} {{ [] or [1] }}",
    "{{ 'yes' if n else 'no' }} [{{ 'a' if false }}] {{ 'a' if true else 'b' if true else 'c' }}",
    "{{ not undefined_var is defined }} {{ s is not none and s }} {{ not s == 'Hello' }}",
    "{% if n %}A{% elif s == 'Hello' %}B{% else %}C{% endif %}{% if [] %}D{% else %}E{% endif %}",
    # tests
    "{{ s is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} {{ 1 is number }} {{ 1.0 is float }} {{ 1 is integer }} {{ true is boolean }}",
    "{{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ [] is sequence }} {{ none is string }} {{ d is iterable }}",
    "{{ undefined_var is sequence }} {{ undefined_var is iterable }} {{ true is number }} {{ true is integer }} {{ 1.0 is integer }} {{ d is sequence }}",
    "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }}",
    "{{ 'a' is eq 'a' }} {{ 2 is gt 1 }} {{ 2 is lessthan 1 }} {{ 'a' is in ['a'] }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'Ab' is lower }} {{ none is sameas none }}",
    "{{ raise_exception is callable }} {{ 'x' is callable }} {{ s.upper is callable }} {{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }}",
    "{{ msgs[0].content is string }} {{ msgs[2].tool_calls is defined }} {{ msgs[0].tool_calls is defined }} {{ x is mapping or x is iterable }}",
    "{{ 2 is ge 2 }} {{ 2 is ne 3 }} {{ 'a' is equalto 'b' }} {{ 1 is le 0 }} {{ 5 is greaterthan 2 }} {{ 3 is lt(4) }}",
    # filters
    "[{{ '  a b \n'|trim }}] [{{ 'xxaxx'|trim('x') }}] [{{ ' \u00a0x\u3000'|trim }}]",
    "{{ 'héllo'|length }} {{ [1,2,3]|length }} {{ {'a':1}|count }} {{ undefined_var|length }} {{ ''|length }}",
    "{{ 'hello WORLD'|upper }} {{ 'Hello'|lower }} {{ 'hello WORLD'|capitalize }} {{ 'hello world-wide (test) [x] <y>'|title }} {{ \"it's\"|title }}",
    "{{ 'éçà ß straße'|upper }} {{ 'ÉÇÀ ΣΟΦΟΣ'|lower }} {{ 'привет мир'|title }} {{ 'ǅx'|length }}",
    "{{ undefined_var|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }} {{ ''|d('e', boolean=true) }} {{ 0|default(5) }} {{ undefined_var|d }}|",
    "{{ [1, 2, 3]|join(', ') }} {{ ['a','b']|join }} {{ users|join(', ', attribute='name') }} {{ 'abc'|join('-') }}",
    "{{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ []|first }}] {{ {'a': 1, 'b': 2}|first }}",
    "{{ 'abc'|list }} {{ {'a': 1, 'b': 2}|list }} {{ 12|string ~ 'x' }} {{ [1]|string }} {{ none|string }} {{ (1,2)|list }}",
    "{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ -3.9|int }} {{ '0x1A'|int(base=16) }} {{ ' 12 '|int }} {{ '1_000'|int }} {{ true|int }}",
    "{{ '3.5'|float }} {{ 2|float }} {{ 'a'|float }} {{ none|int }} {{ ' 1e3 '|float }} {{ 'nan'|float }} {{ '-inf'|float }} {{ 'a'|float(1.5) }}",
    "{{ {'a': [1, 2.5, 'x'], 'b': none, 'c': true, 'é': 'ü\n\"\\\\'}|tojson }}",
    "{{ {'a': [1, {'b': []}], 'c': {}}|tojson(indent=2) }}",
    "{{ [1,[2, {'k': 'v'}]]|tojson(indent=4) }}|{{ 'x'|tojson }}|{{ (1, 'a')|tojson }}|{{ 1e20|tojson }}|{{ 0.5|tojson }}",
    "{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ [1,[2]]|tojson(separators=(',', ':')) }} {{ {'a': 1}|tojson(indent=0) }}",
    "{{ '\u2028<>&\\'\x01\x7f'|tojson }} {{ 'é😀'|tojson(ensure_ascii=true) }} {{ {1: 'int key', true: 'b'}|tojson }}",
    "{{ {'a': 1}|tojson(indent='\t') }}|{{ none|tojson }}|{{ true|tojson }}|{{ [1, 2]|tojson(indent=1, separators=(', ', ' = ')) }}",
    "{% for k, v in {'a': 1, 'b': 2}|items %}{{ k }}={{ v }};{% endfor %}{{ undefined_var|items|list }}",
    "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }} {{ 'abc'|replace('', '-', 2) }} {{ 1.5|replace('.', ',') }}",
    "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('|') }} {{ msgs|rejectattr('role', 'eq', 'user')|list|length }}",
    "{{ msgs|selectattr('tool_calls')|list|length }} {{ msgs|selectattr('role', 'in', ['user', 'system'])|map(attribute='role')|join }} {{ msgs|rejectattr('tool_calls', 'defined')|list|length }}",
    "{{ ['a','b']|map('upper')|join }} {{ msgs|map(attribute='missing', default='?')|join }} {{ [' a ', 'b ']|map('trim')|list }} {{ [1, 2]|map('string')|join('+') }}",
    "{{ data|map(attribute='a.b')|list }} {{ [[1,2],[3,4]]|map(attribute='0')|list }} {{ nested|attr('l') }}|{{ [['a', 'b']]|map('join', '-')|list }}",
    "{{ [1, 0, 2, none]|select|list }} {{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('even')|list }} {{ [1,5,10]|select('gt', 3)|list }} {{ ['a', 1, 'b']|select('string')|list }}",
    "{{ '<a href=\"x\">&\\'</a>'|escape }} {{ '<b>'|safe }} {{ '<b>'|e }} {{ 5|e }} {{ undefined_var|e }}|",
    "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 42.55|round(1, 'floor') }} {{ 42.51|round(0, 'ceil') }} {{ 3|round }} {{ -3|abs }} {{ -2.5|abs }} {{ 0.125|round(2) }} {{ -0.5|round }}",
    "{{ ['a', 'A', 'b', 'a']|unique|list }} {{ ['a', 'A']|unique(case_sensitive=true)|list }} {{ users|unique(attribute='age')|list|length }} {{ [1, 1.0, true, 2]|unique|list }}",
    "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'a', 'C']|sort }} {{ ['b', 'A', 'a', 'C']|sort(case_sensitive=true) }} {{ [3,1,2]|sort(reverse=true) }} {{ [(2, 'b'), (1, 'z'), (2, 'a')]|sort }}",
    "{{ users|sort(attribute='age')|map(attribute='name')|join }} {{ users|sort(attribute='name')|map(attribute='name')|join }} {{ users|sort(attribute='age', reverse=true)|first }}",
    "{{ 'abc'|reverse }} {{ [1,2,3]|reverse|list }} {{ 'héllo'|reverse }} {{ {'a': 1, 'b': 2}|reverse|list }}",
    "{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(width='>', blank=true) }}|{{ 'a\n'|indent }}|{{ ''|indent(first=true) }}|",
    "{{ {'b': 1, 'A': 2, 'c': 0}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }}",
    "{{ [3, 1, 2]|max }} {{ ['b', 'A']|min }} {{ ['b', 'A']|max }} {{ [1, 2.5]|sum }} {{ users|sum(attribute='age') }} {{ users|max(attribute='age') }} [{{ []|max }}] {{ [[1], [2]]|sum(start=[]) }}",
    "{{ 'hello big  world-wide'|wordcount }} [{{ 'ab'|center(7) }}] [{{ 'abc'|center(2) }}] {{ [1,2,3,4,5]|batch(2)|list }} {{ [1,2,3]|batch(2, 'x')|list }}",
    "{{ 'a' + ' b '|trim }} {{ ('a' ~ 'b')|upper }} {{ s|lower|replace('l', 'L')|length }} {{ s|attr('upper') is callable }} {{ d|attr('a') }}|",
    # methods
    "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x\n\n'.rstrip('\n') }}|{{ 'ab'.rstrip('b').lstrip('a') }}|",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'a\nb\r\nc'.splitlines() }} {{ ''.split() }} {{ ' a b c '.split(none, 1) }}",
    "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'hello'.startswith('l', 2) }} {{ 'hello'.endswith('') }} {{ 'héllo'.startswith('hé') }}",
    "{{ 'Hello World'.upper() }} {{ 'Hello'.lower() }} {{ \"hello world's 1st\".title() }} {{ 'hELLO'.capitalize() }}",
    "{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} {{ 'banana'.find('an') }} {{ 'banana'.rfind('an') }} {{ 'banana'.count('a') }} {{ 'héllo'.find('l') }} {{ 'x'.find('y') }}",
    "{{ ', '.join(['a', 'b']) }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ '  '.isspace() }} {{ ''.isdigit() }} {{ 'a1'.isalnum() }} {{ 'abc'.islower() }} {{ '7'.zfill(3) }}",
    "{% for k, v in d.items() %}{{ k }}:{{ v }} {% endfor %}{{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }}",
    "{{ [1,2,3].index(2) }} {{ [1,1,2].count(1) }} {{ d['items'] }} {{ d.items is callable }} {{ 'abc'.removeprefix('a') }} {{ 'abc'.removesuffix('c') }}",
    "{{ c.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') }}|{{ c.split('</think>')[-1].lstrip('\n') }}",
    # subscripts and slices
    "{{ x[0] }} {{ x[-1] }} {{ x[1:] }} {{ x[:-1] }} {{ x[::-1] }} {{ x[::2] }} {{ x[5:] }} {{ x[-10:2] }} {{ x[3:1:-1] }} {{ x[1:3][0] }}",
    "{{ 'hello'[1:3] }} {{ 'héllo'[::-1] }} {{ 'hello'[-1] }} [{{ 'abc'[10] }}] {{ 'héllo'[1] }} {{ (1, 2, 3)[1:] }}",
    "{{ d['a'] }} {{ d.a }} [{{ d['missing'] }}] {{ d.missing is defined }} {{ x.0 }} {{ nested.l[0].k[1] }} {{ nested['l'][0]['k'][-1] }}",
    "{{ msgs[0].content }} {{ msgs[0]['role'] }} {{ msgs[-1].content }} {{ (msgs|last).role }} {{ msgs[1:]|length }}",
    # loops
    "{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }} {% endfor %}",
    "{% for x in [] %}x{% else %}empty{% endfor %} {% for x in undefined_var %}x{% else %}none{% endfor %}",
    "{% for x in range(10) if x is odd %}{{ x }}{{ ',' if not loop.last }}{% endfor %} {% for x in range(10) if x > 7 %}{{ loop.index }}/{{ loop.length }} {% endfor %}",
    "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }} {% endfor %}{% for (a, b) in [[5, 6]] %}{{ a * b }}{% endfor %}",
    "{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %} {% for c in 'héy' %}[{{ c }}]{% endfor %}",
    "{% for i in [1,2] %}{% set outer = loop %}{% for j in [1,2] %}{{ outer.index }}{{ loop.index }} {% endfor %}{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in [1,2,3] %}{{ loop.previtem|default('-') }}{{ loop.nextitem|default('-') }}{{ loop.cycle('a', 'b') }} {% endfor %}",
    "{% set v = 1 %}{% for i in [1,2] %}{% set v = v + 1 %}{{ v }}{% endfor %}{{ v }}",
    "{% for i in [1,2,3] %}{% if i > 1 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}[{{ y }}]",
    "{% set ns = namespace(count=0, found=false) %}{% for i in [1,2,3] %}{% set ns.count = ns.count + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}",
    "{% set ns = namespace() %}{% set ns.items = [] %}{% for m in msgs %}{% set ns.items = ns.items + [m.role] %}{% endfor %}{{ ns.items|join(',') }}",
    "{% if true %}{% set z = 3 %}{% endif %}{{ z }} {% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t = 1, 2 %}{{ t }}",
    "{% set body %}Hello {{ name }}{% endset %}[{{ body }}] {% set sb | upper | trim %} abc {% endset %}[{{ sb }}]",
    "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }}",
    "{% for m in msgs|reverse %}{{ m.role[0] }}{% endfor %} {% for m in msgs[::-1] %}{{ loop.index0 }}{% endfor %}",
    "{{ loop }}|{% for i in [1] %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}",
    "{% for m in msgs %}{% if m.role == 'user' %}{% set last_user = loop.index0 %}{% endif %}{% endfor %}[{{ last_user }}]",
    # macros, call, filter blocks, with
    "{% macro greet(who, greeting='Hello') %}{{ greeting }}, {{ who }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', greeting='Hi') }} {{ greet(who='X') }}",
    "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}",
    "{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner {{ s }}{% endcall %}",
    "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(v) each([1,2]) %}[{{ v }}]{% endcall %}",
    "{% set g = 'G' %}{% macro m() %}{{ g }}{{ s }}{% endmacro %}{{ m() }} {% macro opt(a) %}[{{ a }}]{% endmacro %}{{ opt() }}",
    "{% macro render_args(args) %}{% for k, v in args|items %}{{ k }}={{ v|tojson }}{{ ', ' if not loop.last }}{% endfor %}{% endmacro %}f({{ render_args({'a': 1, 'b': 'x'}) }})",
    "{% filter upper %}hello {{ 'x' }}{% endfilter %} {% filter replace('a', 'o') | title %}banana{% endfilter %}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]",
    "{% generation %}gen {{ s }}{% endgeneration %}|{% for i in [1, 2] %}{% generation %}{{ i }}{% endgeneration %}{% endfor %}",
    "{% generation %}{% set g = 1 %}[{{ g }}]{% endgeneration %}[{{ g }}]",
    # globals
    "{{ strftime_now('%Y-%m-%d %H:%M %A %b %d %B %j %a %p') }}",
    "{{ strftime_now('%d %b %Y') }} {{ strftime_now('') }}|",
    "{{ dict(a=1, b='x') }} {{ dict(d, c=3)|length }} {{ namespace(a=1).a }} {{ namespace(d).b }}",
    "{% set j = joiner(', ') %}{% for v in [1,2,3] %}{{ j() }}{{ v }}{% endfor %}",
    "{{ '%s=%r' % ('a', 'b') }} {{ '[%5s|%-4d|%.2f|%03d|%x|%.1s]' % ('ab', 7, 3.14159, 5, 255, 'xyz') }} {{ '%(k)s!' % {'k': 'v'} }} {{ 'n=%d' % 2.9 }}",
    # undefined behaviour that renders
    "{{ undefined_var }}|{{ undefined_var|default('x') }}|{{ undefined_var is defined }}|{{ undefined_var ~ 'a' }}|{{ undefined_var == none }}|{{ undefined_var|length }}|{{ undefined_var|list }}",
    "[{{ x[10] }}] [{{ {'a': 1}.b }}] [{{ none.foo }}] [{{ s.nothing }}] [{{ undefined_var|string }}] [{{ undefined_var|trim }}]",
    "{{ d.missing|default('fallback') }} {{ (d.missing or 'or-fallback') }} {{ undefined_var if undefined_var is defined else 'u' }}",
    "[{{ undefined_var|upper }}|{{ undefined_var|join(',') }}|{{ undefined_var|first }}|{{ undefined_var|last }}|{{ undefined_var|max }}|{{ undefined_var|replace('a', 'b') }}|{{ undefined_var|sort }}|{{ undefined_var|unique|list }}]",
    "[{{ undefined_var|selectattr('x')|list }}|{{ undefined_var|map('upper')|list }}|{{ undefined_var|count }}|{{ undefined_var|capitalize }}|{{ undefined_var|title }}|{{ undefined_var|wordcount }}|{{ undefined_var|batch(2)|list }}|{{ undefined_var|min }}|{{ undefined_var|sum }}]",
    "{{ undefined_var|indent }}",
    "[{{ undefined_var|center(4) }}]",
    "{{ undefined_var|int }}",
    "{{ undefined_var|float }}",
    "{{ undefined_var|attr('x') }}",
    "{{ undefined_var|abs }}",
    "{{ undefined_var|round }}",
    "{{ undefined_var|dictsort }}",
    "{{ '}}' }} {{ '{%' }} {{ {'a': {'b': 1}} }} {% set y = {'a': {'b': 1}} %}{{ y.a.b }} a { b } c {# {{ not a tag }} #}",
    "{{ '%.2f'|format(3.14159) }} {{ '%s and %s'|format('a', 'b') }} {{ '%(x)s'|format(x='kw') }}",
    "{{ namespace(a=1) }} {{ {'a': 1}|items|list }} {{ {'a': 1}|dictsort|first }} {{ [1, 2.5]|sum }} {{ 1/3 }} {{ 0.1|string }} {{ 10|string|length }}",
    "{{ [1, 2]|map('int')|list }} {{ ['3', 'x']|map('int', 9)|list }} {{ x|first is number }} {{ [0.5, 1]|map('round')|list }}",
    "{% macro m(a, b) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}|{{ m(b=2, a=1) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(z=1) }}",
    "{% for k, v in {'x': [1, 2]}.items() %}{% for i in v %}{{ k }}{{ i }}{{ loop.last }}{% endfor %}{% endfor %}",
    "{%- for m in msgs -%}\n  {{- m.role -}}\n  {%- if not loop.last %}, {% endif -%}\n{%- endfor %}",
    "{% for m in msgs %}\n    {% if m.role == 'user' %}\n        U:{{ m.content }}\n    {% else %}\n        O\n    {% endif %}\n{% endfor %}",
    "{{ 'Ünïcödé'|upper }} {{ 'ÀÉÎ'|lower }} {{ 'straße'|upper }} {{ 'ΟΔΟΣ ΣΑΣ'|lower }} {{ 'ÿ'|upper }} {{ 'Ǆ'|length }}",
    "{{ [3, 'a']|sort }}",
    "{{ {'a': 1} < {'b': 2} }}",
    # errors
    "{{ undefined_var.attr }}",
    "{{ undefined_var + 1 }}",
    "{{ undefined_var() }}",
    "{{ undefined_var[0] }}",
    "{{ 'a' + 1 }}",
    "{{ 1 / 0 }}",
    "{{ 1 // 0 }}",
    "{{ undefined_var|tojson }}",
    "{{ raise_exception('boom: ' ~ s) }}",
    "{% if s == 'Hello' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}",
    "{% for v in 5 %}{% endfor %}",
    "{% for v in none %}{% endfor %}",
    "{% set a, b = [1] %}",
    "{% set a, b = [1, 2, 3] %}",
    "{{ 'a' < 1 }}",
    "{% set ns = 3 %}{% set ns.a = 1 %}",
    "{{ 'abc'|nosuchfilter }}",
    "{{ 1 is nosuchtest }}",
    "{{ s.append('x') }}",
    "{{ x.append(5) }}",
    "{{ range(1000000)|length }}",
    "{{ 'x'|tojson(indent=none, nosuch=1) }}",
    "{{ 'a'.split('') }}",
    "{{ x[::0] }}",
    "{{ -'a' }}",
    "{{ '%d%%' % 1 }}",
    # syntax errors (jinja2's line numbers are checked)
    "{% if s %}no end",
    "line1\n{{ 1 + }}",
    "{% for %}{% endfor %}",
    "{% endif %}",
    "a\nb\n{{ s",
    "{% unknowntag %}",
    "x\n{# unterminated comment",
    "{{ 'unterminated }}",
    "{% set %}",
    "{{ (1, 2 }}",
    "{% break %}",
    "{% macro m( %}{% endmacro %}",
    "{% for x in y %}\n{% endif %}",
    "{{ x | }}",
    "{{ }}",
    "{% if %}{% endif %}",
    "{{ a b }}",
    "{% set x = 1 %}\n\n{% elif %}",
    "{{ 1 is is defined }}",
    "{{ x.1a }}",
    "{% extends 'base.html' %}",
]


def build_snippets(env):
    out = []
    for src in SNIPPETS:
        item = {"template": src}
        item.update(render(env, src, json.loads(json.dumps(SNIPPET_CONTEXT))))
        out.append(item)
    return out


def read_gguf_template(path):
    from gguf import GGUFReader
    reader = GGUFReader(path)
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(root, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "chat_templates"))
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    if os.path.exists(args.model):
        with open(os.path.join(args.out, "smollm2.jinja"), "w", encoding="utf-8", newline="") as f:
            f.write(read_gguf_template(args.model))
    else:
        print(f"note: {args.model} not found; keeping smollm2.jinja as it is")

    env = make_env()
    now = FIXED_NOW.isoformat()
    cases = build_cases(env, args.out)
    with open(os.path.join(args.out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump({"now": now, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    snippets = build_snippets(env)
    with open(os.path.join(args.out, "snippets.json"), "w", encoding="utf-8") as f:
        json.dump({"now": now, "context": SNIPPET_CONTEXT, "snippets": snippets}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    s_err = sum(1 for s in snippets if "error" in s)
    print(f"{len(cases)} template cases ({n_err} expected errors), "
          f"{len(snippets)} snippets ({s_err} expected errors) -> {args.out}")


if __name__ == "__main__":
    main()
