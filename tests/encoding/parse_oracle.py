"""Test helpers for the output parser: the official StreamProcessor as oracle, and id encoders."""

from __future__ import annotations

import json
from functools import cache

import deepseek_recipe as dr
from hypothesis import strategies as st
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.encoding.parsed import ParsedMessage
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.assets import TOKENIZER_JSON, v41_tokenizer

D = Special.DSML.value


@cache
def _recipe_tokenizer() -> dr.Tokenizer:
    return dr.Tokenizer.from_file(str(TOKENIZER_JSON))


def _generator() -> dr.ChatCompletionChunkGenerator:
    body = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "hi"}]}
    request = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
    return dr.ChatCompletionRequest.chunk_generator(request, "id", "m")


def recipe_options(options: ParsingOptions) -> dr.ParsingOptions:
    stage = None
    if options.thinking:
        stage = dr.ThinkingInitialStage.ReasoningStart
        if options.in_content:
            stage = dr.ThinkingInitialStage.ContentContinuation
        elif options.reasoning_started:
            stage = dr.ThinkingInitialStage.ReasoningContinuation
    return dr.ParsingOptions(
        parse_tool_calls=options.parse_tool_calls,
        starts_in_tool_calls=options.starts_in_tool_calls,
        parse_json_output=options.parse_json_output,
        thinking_initial_stage=stage,
    )


def recipe_parse(pieces, options: ParsingOptions, finish_reason: str = "stop", *, ids: bool = False):
    """(reasoning, content, [(name, arguments)], finish_reason) from the official parser."""
    processor = dr.StreamProcessor(_generator(), recipe_options(options), _recipe_tokenizer())
    response = dr.ChatCompletionResponse("id", "m", 0, 0, 0)
    reason = {"stop": dr.InferenceFinishReason.Stop, "length": dr.InferenceFinishReason.Length}[finish_reason]
    chunks = [dr.InferenceChunk.ready()]
    chunks += [dr.InferenceChunk.tokens(p) if ids else dr.InferenceChunk.text(p) for p in pieces]
    chunks.append(dr.InferenceChunk.finish(reason))
    for chunk in chunks:
        for out in processor.push(chunk):
            response.accumulate(out)
    for out in processor.finish():
        response.accumulate(out)
    choice = json.loads(response.to_json())["choices"][0]
    message = choice["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    return message["reasoning_content"], message["content"], calls, choice["finish_reason"]


def visible(message: ParsedMessage):
    """Our message in the oracle's shape."""
    calls = [(c.name, c.arguments) for c in message.tool_calls]
    return message.reasoning_content, message.content, calls, message.finish_reason


def plain_bpe(text: str) -> list[int]:
    """BPE without the added vocabulary: special spellings stay ordinary pieces."""
    tokenizer = v41_tokenizer()
    ids: list[int] = []
    for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text):
        ids += [token.id for token in tokenizer.model.tokenize(piece)]
    return ids


def model_ids(text: str) -> list[int]:
    """Ids as the model writes them: `</think>` and `｜DSML｜` as special ids, the rest plain BPE."""
    ids: list[int] = []
    rest = text
    while rest:
        hits = [(rest.find(s.value), s) for s in (Special.THINK_END, Special.DSML) if s.value in rest]
        if not hits:
            ids += plain_bpe(rest)
            break
        at, special = min(hits, key=lambda hit: hit[0])
        ids += [*plain_bpe(rest[:at]), special.id]
        rest = rest[at + len(special.value) :]
    return ids


# ---------------------------------------------------------------------------------------------
# Hypothesis: model outputs assembled from reasoning, content and DSML calls, with the marker
# fragments and near-misses that the parser must get right.

FRAGMENTS = [
    "a",
    "b",
    "Hello",
    " ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "<",
    ">",
    "/",
    '"',
    "`",
    "```json\n",
    "```\n",
    "\n```",
    "{",
    "}",
    "[",
    "]",
    "</think>",
    "<think>",
    D,
    "<" + D,
    "</" + D,
    "</thi",
    "<" + D[:3],
    "é",
    "猫",
    "🦜",
    "|DSML|",
    'invoke name="',
    'parameter name="',
    'true">',
    'false">',
    " calls>",
]
RAW_VALUES = ["1", "1E3", "-0", "1.50", "[1, 2]", '{"a": 1}', "true", "null", "NaN", "not json", '"s"', ""]

texts = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=8).map("".join)
names = st.text(alphabet="abcxyz_-.0", min_size=0, max_size=6) | st.sampled_from(["get_weather", "a&quot;b"])


@st.composite
def dsml_block(draw) -> str:
    """A calls block, usually well formed, sometimes with V4 tags, junk or missing closers."""
    v4 = draw(st.booleans()) and draw(st.booleans())
    calls_tag, invoke_tag, param_tag = (
        ("tool_calls", "invoke", "parameter") if v4 else (" calls", " invoke", " parameter")
    )
    sloppy = draw(st.integers(0, 5)) == 0

    def maybe(text: str) -> str:
        return draw(st.sampled_from(["", text, text, draw(texts)])) if sloppy else text

    invokes = []
    for _ in range(draw(st.integers(0, 3))):
        params = []
        for _ in range(draw(st.integers(0, 3))):
            key = draw(names)
            if draw(st.booleans()):
                value, kind = draw(texts), "true"
            else:
                value, kind = draw(st.sampled_from(RAW_VALUES)), "false"
            params.append(
                f'<{D}{param_tag} name="{key}" string="{kind}">{value}' + maybe(f"</{D}{param_tag}>")
            )
        body = "\n".join(params)
        invokes.append(
            f'<{D}{invoke_tag} name="{draw(names)}">{maybe(chr(10))}{body}\n' + maybe(f"</{D}{invoke_tag}>")
        )
    block = f"<{D}{calls_tag}>\n" + "\n".join(invokes) + maybe(f"\n</{D}{calls_tag}>")
    if draw(st.integers(0, 4)) == 0:
        block = block[len(f"<{D}{calls_tag}>\n") :]  # bare invokes
    return block


@st.composite
def model_outputs(draw) -> tuple[str, ParsingOptions, str]:
    """(completion text, parsing options, finish reason)."""
    thinking = draw(st.booleans())
    tools = draw(st.booleans())
    options = ParsingOptions(
        thinking=thinking,
        reasoning_started=thinking and draw(st.integers(0, 4)) == 0,
        in_content=thinking and draw(st.integers(0, 4)) == 0,
        parse_tool_calls=tools,
        starts_in_tool_calls=tools and draw(st.integers(0, 5)) == 0,
        parse_json_output=draw(st.integers(0, 5)) == 0,
    )
    text = ""
    if thinking and not options.in_content:
        text += draw(texts) + draw(st.sampled_from(["</think>", "\n\n</think>", "</think>\n\n", ""]))
    text += draw(texts)
    if draw(st.booleans()):
        text += draw(st.sampled_from(["\n\n", "", "\n"])) + draw(dsml_block())
        text += draw(st.sampled_from(["", "", draw(texts)]))
    finish = "stop"
    if draw(st.integers(0, 3)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
        finish = "length"
    return text, options, finish
