"""Token-exact V4.1 tool-call grammars (plugin/serving/call_grammar.py, plugin/serving/grammar_compile.py).

The tags are SGLang's own, built as the server builds them (`DeepSeekV41Detector.get_structural_tag`,
serialised like the sampling parameters), compiled by `TokenExactCompiler` over the real V4.1
vocabulary, and checked by feeding token ids to an xgrammar matcher: calls our encoder renders
are accepted to the end; spelled DSML, special tokens inside values and schema violations are
refused; random walks through the grammar always parse, with our token-level parser, as calls
of the declared tools (valid ones when the walk finished, flagged ones when it was cut off).
Negative control: SGLang's tag compiled as upstream compiles it accepts the spelled block.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
from sglang_ds41.encoding import parse_ids
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.encoding.prompt_ids import encode_text
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.checkpoint import scripted
from sglang_ds41.plugin.serving import call_grammar
from sglang_ds41.plugin.serving.grammar_compile import TokenExactCompiler, dispatch_structural_tag

xgrammar = pytest.importorskip("xgrammar")

VOCAB = 129280
DSML, EOS = Special.DSML.id, Special.EOS.id
OPTIONS = ParsingOptions(thinking=False, parse_tool_calls=True)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city"],
}
OPTIONAL_ONLY = {
    "type": "object",
    "properties": {"flag": {"type": "boolean"}, "note": {"type": "string"}},
}
NESTED = {
    "type": "object",
    "properties": {
        "where": {"$ref": "#/$defs/place"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "label": {"type": ["string", "null"]},
    },
    "required": ["where", "tags", "label"],
    "$defs": {"place": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}},
}
MIXED = {
    "type": "object",
    "properties": {
        "level": {"enum": [1, 2, "max"]},
        "mode": {"anyOf": [{"const": "on"}, {"const": "off"}]},
        "when": {"$ref": "#/$defs/slot"},
    },
    "required": ["level", "mode"],
    "$defs": {
        "slot": {"type": "object", "properties": {"at": {"$ref": "#/$defs/hour"}}},
        "hour": {"type": "integer"},
    },
}
TOOLS = {
    "mixed": {"strict": True, "parameters": MIXED},
    "get_weather": {"strict": True, "parameters": WEATHER},
    "toggle": {"strict": True, "parameters": OPTIONAL_ONLY},
    "locate": {"strict": True, "parameters": NESTED},
    "echo": {"parameters": {"type": "object"}},  # not strict: any arguments
}


def tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": "test", **TOOLS[name]}}


def upstream_tag(names, tool_choice="required", *, thinking=False, parallel=True) -> str:
    """The structural tag SGLang puts in the sampling parameters for these tools."""
    from sglang.srt.entrypoints.openai.protocol import Tool, ToolChoice
    from sglang.srt.function_call.deepseekv41_detector import DeepSeekV41Detector

    if isinstance(tool_choice, dict):
        tool_choice = ToolChoice(**tool_choice)
    tag = DeepSeekV41Detector().get_structural_tag(
        tools=[Tool(**tool(n)) for n in names],
        tool_choice=tool_choice,
        thinking_mode=thinking,
        parallel_tool_calls=parallel,
    )
    return json.dumps(tag.model_dump(by_alias=True))


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


@pytest.fixture(scope="module")
def vocabulary():
    from sglang_ds41.assets import v41_hf_tokenizer

    return xgrammar.TokenizerInfo.from_huggingface(v41_hf_tokenizer(), vocab_size=VOCAB, stop_token_ids=[EOS])


@pytest.fixture(scope="module")
def compiler(vocabulary) -> TokenExactCompiler:
    return TokenExactCompiler(vocabulary)


def feed(grammar, ids: list[int]) -> tuple[int | None, bool]:
    """(index of the first refused id or None, whether the grammar then accepts the stop token)."""
    matcher = xgrammar.GrammarMatcher(grammar)
    for k, token in enumerate(ids):
        if not matcher.accept_token(token):
            return k, False
    return None, matcher.accept_token(EOS) and matcher.is_terminated()


def calls(*pairs: tuple[str, dict]) -> list[int]:
    """Our encoder's ids for an answer of only these calls (from after `</think>`)."""
    return scripted.rendered_ids(scripted.RenderedCalls("", tuple(pairs)))


SPELLED_TAGS = " a</b>\n<｜DSML｜ parameter>x</｜DSML｜ calls>\t"
ACCEPTED = {
    "all declared": [("get_weather", {"city": "Paris", "days": 3, "unit": "f"})],
    "required only": [("get_weather", {"city": "Paris"})],
    "raw string with tags spelled": [("get_weather", {"city": SPELLED_TAGS})],
    "empty string": [("get_weather", {"city": ""})],
    "all optional, none given": [("toggle", {})],
    "all optional, the second": [("toggle", {"note": "n"})],
    "ref, array, string or null": [("locate", {"where": {"lat": 1.5}, "tags": ["a", "b"], "label": None})],
    "string of a string-or-null": [("locate", {"where": {"lat": -2}, "tags": [], "label": "x"})],
    "any arguments": [("echo", {"v": [1, {"k": None}], "s": "<｜User｜> spelled", "n": -0.5})],
    "two calls": [("get_weather", {"city": "a"}), ("echo", {"x": 1})],
    "enum member that is a number": [("mixed", {"level": 2, "mode": "on"})],
    "enum member that is a string": [("mixed", {"level": "max", "mode": "off"})],
    "ref to a ref": [("mixed", {"level": 1, "mode": "on", "when": {"at": 9}})],
}
ALL_TOOLS = list(TOOLS)


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_calls_our_encoder_renders_are_accepted_to_the_end(compiler, case):
    grammar = compiler.compile(upstream_tag(ALL_TOOLS))
    assert feed(grammar, calls(*ACCEPTED[case])) == (None, True)


ADVERSARIAL = (*scripted.ADVERSARIAL_STRINGS, *scripted.ADVERSARIAL_VALUES, scripted.LONG_TEXT)


@pytest.mark.parametrize("value", ADVERSARIAL, ids=[f"value-{i}" for i in range(len(ADVERSARIAL))])
def test_the_adversarial_arguments_of_the_served_tests_are_accepted(compiler, value):
    grammar = compiler.compile(upstream_tag(["echo"], named("echo")))
    assert feed(grammar, calls(("echo", {"value": value}))) == (None, True)


def test_a_named_choice_takes_that_tool_once(compiler):
    grammar = compiler.compile(upstream_tag(ALL_TOOLS, named("get_weather")))
    assert feed(grammar, calls(("get_weather", {"city": "a"}))) == (None, True)
    assert feed(grammar, calls(("echo", {"x": 1})))[0] is not None
    assert feed(grammar, calls(("get_weather", {"city": "a"}), ("get_weather", {"city": "b"})))[0] is not None


REFUSED = {
    "enum": [("get_weather", {"city": "Paris", "unit": "k"})],
    "integer given as string": [("get_weather", {"city": "Paris", "days": "3"})],
    "missing required": [("get_weather", {"days": 3})],
    "declared order": [("get_weather", {"days": 3, "city": "x"})],
    "undeclared key": [("get_weather", {"city": "x", "extra": 1})],
    "number where an object is": [("locate", {"where": 1, "tags": [], "label": None})],
    "undeclared tool": [("nope", {})],
    "a string outside a mixed enum": [("mixed", {"level": "min", "mode": "on"})],
    "a number outside a mixed enum": [("mixed", {"level": 3, "mode": "on"})],
    "a string outside anyOf consts": [("mixed", {"level": 1, "mode": "auto"})],
    "a wrong type behind two refs": [("mixed", {"level": 1, "mode": "on", "when": {"at": "9"}})],
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_arguments_the_strict_schema_refuses_are_refused(compiler, case):
    grammar = compiler.compile(upstream_tag(ALL_TOOLS))
    refused_at, _ = feed(grammar, calls(*REFUSED[case]))
    assert refused_at is not None


@pytest.mark.parametrize("tool_choice", ["required", named("get_weather")], ids=["required", "named"])
def test_spelled_dsml_is_refused_where_upstream_s_own_compile_accepts_it(compiler, vocabulary, tool_choice):
    key = upstream_tag(ALL_TOOLS, tool_choice)
    spelled = encode_text('\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="get_weather">\n')
    assert Special.DSML.id not in spelled
    refused_at, _ = feed(compiler.compile(key), spelled)
    assert refused_at is not None and refused_at <= 3  # at the first piece of the spelling
    # Negative control: the same tag as SGLang compiles it takes the spelling for the tags.
    upstream = xgrammar.GrammarCompiler(vocabulary, cache_enabled=False).compile_structural_tag(key)
    assert feed(upstream, spelled)[0] is None


def opened(value_start: str) -> list[int]:
    """A named `echo` call opened up to (and into) a parameter value."""
    ids = [*encode_text("\n\n<"), DSML, *encode_text(" calls>\n<"), DSML]
    ids += [*encode_text(' invoke name="echo">\n<'), DSML]
    return [*ids, *encode_text(f' parameter name="s" {value_start}')]


@pytest.mark.parametrize("token", [DSML, EOS, Special.THINK_END.id, Special.USER.id], ids=str)
@pytest.mark.parametrize("value_start", ['string="true">ab', 'string="false">[1, '], ids=["raw", "json"])
def test_no_special_token_inside_a_raw_or_json_value(compiler, token, value_start):
    grammar = compiler.compile(upstream_tag(["echo"], named("echo")))
    prefix = opened(value_start)
    assert feed(grammar, prefix)[0] is None
    assert feed(grammar, [*prefix, token])[0] == len(prefix)


def test_the_reasoning_prefix_ends_at_the_think_token_not_its_spelling(compiler):
    grammar = compiler.compile(upstream_tag(["get_weather"], "required", thinking=True))
    answer = calls(("get_weather", {"city": "x"}))
    reasoning = encode_text("thinking about </think> spelled")
    assert feed(grammar, [*reasoning, Special.THINK_END.id, *answer]) == (None, True)
    assert feed(grammar, [*encode_text("r </think>"), *answer])[1] is False


def test_strict_auto_keeps_free_text_and_takes_calls_only_from_the_token(compiler):
    grammar = compiler.compile(upstream_tag(ALL_TOOLS, "auto"))
    text = encode_text("Let me check.")
    assert feed(grammar, text) == (None, True)
    assert feed(grammar, text + calls(("get_weather", {"city": "x"}))) == (None, True)
    assert feed(grammar, text + calls(("get_weather", {"city": "x", "unit": "k"})))[0] is not None
    # Spelled, the block is text (and parses as content).
    assert feed(grammar, encode_text('<｜DSML｜ calls>\n<｜DSML｜ invoke name="nope">'))[0] is None


def test_strict_auto_calls_without_the_free_lt_still_parse_as_calls(compiler):
    """The `<` before the DSML token is free text the grammar cannot require; a model that leaves
    it out still gets a constrained block, and the token-level parser takes it as the calls."""
    grammar = compiler.compile(upstream_tag(ALL_TOOLS, "auto"))
    block = calls(("get_weather", {"city": "x", "unit": "c"}))
    at = block.index(DSML)
    assert block[at - 1] == encode_text("<")[0]
    ids = encode_text("Let me check.") + block[: at - 1] + block[at:]
    assert feed(grammar, ids) == (None, True)
    message = parse_ids(ids, OPTIONS)
    assert [(c.name, json.loads(c.arguments), c.valid) for c in message.tool_calls] == [
        ("get_weather", {"city": "x", "unit": "c"}, True)
    ]
    assert message.content == "Let me check." and "DSML" not in message.content


# ---- random walks ----------------------------------------------------------------------------


def allowed_ids(matcher, mask) -> torch.Tensor:
    matcher.fill_next_token_bitmask(mask)
    bits = (mask[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:VOCAB].nonzero().flatten()


# Tokens that end what is open (raw text, strings, brackets), tried first half of the time.
CLOSERS = (DSML, *(encode_text(t)[0] for t in ("</", '"', "}", "]")))


def walk(grammar, rng: random.Random, budget: int) -> tuple[list[int], bool]:
    """Tokens the grammar allows, picked at random (half the time the first allowed closer,
    else often the smallest allowed id, else any); stops as soon as the grammar may end."""
    matcher = xgrammar.GrammarMatcher(grammar)
    mask = xgrammar.allocate_token_bitmask(1, VOCAB)
    ids: list[int] = []
    for _ in range(budget):
        allowed = allowed_ids(matcher, mask)
        choices = set(allowed.tolist())
        if EOS in choices:
            return ids, True
        closers = [t for t in CLOSERS if t in choices]
        if closers and rng.random() < 0.5:
            token = closers[0]
        elif rng.random() < 0.5:
            token = int(allowed[0])
        else:
            token = int(allowed[rng.randrange(len(allowed))])
        assert matcher.accept_token(token)
        ids.append(token)
    return ids, False


@pytest.mark.parametrize(
    ("names", "tool_choice"),
    [(ALL_TOOLS, "required"), (["get_weather"], named("get_weather")), (["echo"], named("echo"))],
    ids=["required", "named-strict", "named-free"],
)
def test_whatever_the_grammar_lets_through_parses_as_calls_of_the_tools(compiler, names, tool_choice):
    grammar = compiler.compile(upstream_tag(names, tool_choice))
    rng = random.Random(f"{names}{tool_choice}")
    finished = 0
    for _ in range(16):
        ids, done = walk(grammar, rng, budget=200)
        message = parse_ids(ids, OPTIONS, "stop" if done else "length")
        assert Special.DSML.value not in (message.content or "")
        assert not (message.content or "").strip()
        if done:
            finished += 1
            assert message.tool_calls and not [c for c in message.tool_calls if not c.valid]
            for call in message.tool_calls:
                assert call.name in names
                spec = TOOLS[call.name]
                if spec.get("strict"):
                    jsonschema.validate(json.loads(call.arguments), spec["parameters"])
        else:
            assert all(c.valid or "max_tokens" in "; ".join(c.problems) for c in message.tool_calls)
    assert finished >= 4


# ---- where the rewrite applies ---------------------------------------------------------------


class Backend:
    """What the hook uses of SGLang's XGrammarGrammarBackend: its vocabulary and `_from_context`."""

    def __init__(self, info) -> None:
        self._tokenizer_info = info

    def _from_context(self, compiled, key_string, stats):
        return ("token-exact", compiled)


def upstream_compile(backend, key_string):
    return ("upstream", key_string)


def test_the_hook_compiles_v41_call_tags_token_exact_on_the_v41_vocabulary(vocabulary):
    from sglang_ds41.plugin.serving.grammar_compile import serves_v41_vocabulary

    assert serves_v41_vocabulary(vocabulary.decoded_vocab)
    key = upstream_tag(["get_weather"], named("get_weather"))
    kind, compiled = dispatch_structural_tag(upstream_compile, Backend(vocabulary), key)
    assert kind == "token-exact"
    assert feed(compiled, calls(("get_weather", {"city": "a"}))) == (None, True)
    assert feed(compiled, encode_text('\n\n<｜DSML｜ calls>'))[0] is not None


def test_another_vocabulary_and_unknown_shapes_go_to_upstream(vocabulary):
    key = upstream_tag(["get_weather"], named("get_weather"))
    other = xgrammar.TokenizerInfo([b"a", b"b", "｜DSML｜".encode()])
    assert dispatch_structural_tag(upstream_compile, Backend(other), key) == ("upstream", key)
    tag = json.loads(key)
    recursive = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    tag["format"]["elements"][1]["content"]["json_schema"] = recursive
    odd = json.dumps(tag)
    assert dispatch_structural_tag(upstream_compile, Backend(vocabulary), odd) == ("upstream", odd)
    open_schema = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True}
    tag["format"]["elements"][1]["content"]["json_schema"] = open_schema  # a free key could repeat "a"
    odd = json.dumps(tag)
    assert dispatch_structural_tag(upstream_compile, Backend(vocabulary), odd) == ("upstream", odd)
    tag["format"]["elements"][1]["content"] = {"type": "sequence"}  # malformed: a KeyError inside
    odd = json.dumps(tag)
    assert dispatch_structural_tag(upstream_compile, Backend(vocabulary), odd) == ("upstream", odd)



def test_other_tags_are_left_to_upstream(compiler):
    json_answer = json.dumps({"type": "structural_tag", "format": {"type": "json_schema", "json_schema": {}}})
    seen = []

    def original(backend, key):
        seen.append(key)
        return "upstream"

    assert dispatch_structural_tag(original, object(), json_answer) == "upstream"
    legacy = json.dumps({"structures": [], "triggers": ["<｜DSML｜ calls>"]})
    assert dispatch_structural_tag(original, object(), legacy) == "upstream"
    assert seen == [json_answer, legacy]


def test_a_tag_of_an_unknown_shape_is_refused_by_name():
    tag = {
        "type": "structural_tag",
        "format": {"type": "qwen_xml_parameter", "json_schema": {}, "note": "<｜DSML｜ calls>"},
    }
    with pytest.raises(call_grammar.UnsupportedTag, match="qwen_xml_parameter"):
        call_grammar.token_exact(tag, {Special.DSML.value: DSML})
