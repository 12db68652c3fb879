"""The real V4.1 backend served by `sglang-ds41 serve` on CPU, against the reference model.

Oracle: `reference.generate` (float64) on the same tiny checkpoint; the server computes in
float64 too (`SGLANG_DS41_DTYPE`), so greedy tokens must agree token for token however the
server schedules the work: one-shot or chunked prefill, radix prefix hits (page-aligned, so a
requested prefix that ends mid ratio-2 pair or mid Engram n-gram is cut back), batches.

Servers: the base checkpoint (FP8 Engram) with the radix cache on; the NVFP4 checkpoint with
NVFP4 Engram tables, a small `--chunked-prefill-size` and the radix cache off (`--tp 2`, with
converted MXFP4 Engram tables, is in test_backend_tp2.py). All run SGLang's sliding-window pool
(window KV held for the last window only; the tiny window is 8 tokens, so a prefix hit far
behind where a request ended is cut back to where its window is whole). (SGLang
wants the chunk size to be a multiple of the page size, so with `--page-size 2` server chunks
end at even positions; odd chunk boundaries are covered by `tests/backend/test_model.py`, and
every other decode step starts at an odd position, resuming the ratio-2 pending token.)
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import torch
from sglang_ds41.encoding import encode_prompt, render_request

from tests.integration.backend_served import PROMPTS, STEPS, serve_tiny

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread_per_module")]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory, "base", "fp8", [])


@pytest.fixture(scope="module")
def chunked(tmp_path_factory):
    args = ["--chunked-prefill-size", "6", "--disable-radix-cache"]
    yield from serve_tiny(tmp_path_factory, "nvfp4", "nvfp4", args)


# --- base checkpoint, radix cache on ------------------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS, ids=["22-tokens", "5-tokens", "42-tokens"])
def test_greedy_generate_equals_the_reference(base, prompt):
    out = base.generate(prompt)
    assert out["output_ids"] == base.expected(prompt)
    assert len(set(out["output_ids"])) > 1


def test_completions_with_token_id_prompt_equal_the_reference(base):
    from sglang_ds41.assets import v41_tokenizer

    prompt = PROMPTS[1]
    reply = base.client.completions.create(
        model="default", prompt=prompt, max_tokens=STEPS, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == STEPS
    assert reply.choices[0].text == v41_tokenizer().decode(base.expected(prompt), skip_special_tokens=True)


def test_chat_completions_equal_the_reference_on_our_rendered_prompt(base):
    from sglang_ds41.assets import v41_tokenizer

    messages = [{"role": "user", "content": "Name three colours."}]
    reply = base.client.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=STEPS,
        temperature=0,
        extra_body={"chat_template_kwargs": {"thinking": False}, "ignore_eos": True},
    )
    prompt = encode_prompt(
        render_request(
            {"model": "DeepSeek-V4.1-Flash", "messages": messages, "thinking": {"type": "disabled"}}
        ).prompt
    )
    assert reply.usage.prompt_tokens == len(prompt)
    expected = base.expected(prompt)
    assert reply.choices[0].message.content == v41_tokenizer().decode(expected, skip_special_tokens=True)


def test_prompt_logprobs_are_the_reference_log_softmax(base):
    prompt = PROMPTS[0]
    reply = base.client.completions.create(
        model="default", prompt=prompt, max_tokens=1, temperature=0, logprobs=1, echo=True
    )
    got = reply.choices[0].logprobs.token_logprobs[1 : len(prompt)]
    logits = base.reference(torch.tensor(prompt), base.reference.new_state())  # [P, vocab]
    expected = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(got, dtype=torch.float64), expected, atol=1e-4)


@pytest.mark.parametrize("shared", [40, 33, 27], ids=["page-aligned", "mid-ratio2-pair", "mid-4gram"])
def test_a_prefix_hit_resumes_exactly(base, shared):
    """The second request shares `shared` tokens with the first; the hit is cut back to the
    page (even), the rest is recomputed, and the tokens are the uncached reference's."""
    first = [0, *range(2000, 2044)]  # 45 tokens, fresh in the cache
    base.generate(first, steps=1)
    second = [*first[:shared], 7, 8, 9, 10, 11]
    out = base.generate(second)
    cached = out["meta_info"]["cached_tokens"]
    assert 0 < cached <= shared and cached % 2 == 0
    assert out["output_ids"] == base.expected(second)


def test_the_window_kv_lives_in_sglang_s_sliding_window_pool(base):
    log = base.server.log_path.read_text(errors="replace")
    assert re.search(r"SWAKVPool mem usage: .*swa size: \d+, full size: \d+", log)
    assert "hybrid_swa=True" in log


def test_a_repeated_prompt_hits_the_cache_and_continues_exactly(base):
    prompt = [0, *range(3000, 3030)]
    first = base.generate(prompt)
    again = base.generate(prompt)
    assert again["meta_info"]["cached_tokens"] >= len(prompt) - 2
    assert first["output_ids"] == again["output_ids"] == base.expected(prompt)


def test_a_concurrent_batch_of_different_lengths_equals_each_request_alone(base):
    prompts = [[0, *range(4000, 4000 + n)] for n in (3, 17, 30, 8)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(base.generate, prompts))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out["output_ids"] == base.expected(prompt)


# --- forced tool choice on random weights (the grammar alone makes the call) --------------------

SWITCH_SCHEMA = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "on": {"type": "boolean"}},
    "required": ["unit", "on"],
    "additionalProperties": False,
}
SWITCH_TOOL = {
    "type": "function",
    "function": {"name": "switch", "description": "Set a unit.", "strict": True, "parameters": SWITCH_SCHEMA},
}
CUT = 32  # inside the call: its name or its arguments, as the model's tokens fall
FORCED = {"required": "required", "named": {"type": "function", "function": {"name": "switch"}}}


def forced_call(base, choice: str, *, stream: bool, max_tokens: int) -> dict:
    """A forced tool choice, thinking off, as the plain client sends it; the message as seen."""
    kwargs = dict(
        model="default",
        messages=[{"role": "user", "content": "Switch to Fahrenheit."}],
        tools=[SWITCH_TOOL],
        tool_choice=FORCED[choice],
        parallel_tool_calls=False,
        reasoning_effort="none",
        temperature=0,
        max_tokens=max_tokens,
    )
    if not stream:
        choice_ = base.client.chat.completions.create(**kwargs).choices[0]
        extra = choice_.message.model_extra or {}
        calls = [(c.function.name, c.function.arguments) for c in choice_.message.tool_calls or []]
        return {
            "content": choice_.message.content or "",
            "calls": calls,
            "invalid": extra.get("invalid_tool_calls") or [],
            "finish": choice_.finish_reason,
        }
    content, calls, invalid, finish = [], {}, [], None
    for chunk in base.client.chat.completions.create(**kwargs, stream=True):
        for choice_ in chunk.choices:
            content.append(choice_.delta.content or "")
            invalid += (choice_.delta.model_extra or {}).get("invalid_tool_calls") or []
            for call in choice_.delta.tool_calls or []:
                name, arguments = calls.get(call.index, ("", ""))
                name += call.function.name or ""
                calls[call.index] = (name, arguments + (call.function.arguments or ""))
            finish = choice_.finish_reason or finish
    ordered = [calls[i] for i in sorted(calls)]
    return {"content": "".join(content), "calls": ordered, "invalid": invalid, "finish": finish}


@pytest.mark.parametrize("choice", sorted(FORCED))
def test_a_forced_tool_choice_on_random_weights_returns_a_call_the_schema_accepts(base, choice):
    """SGLang's own grammar lets a model spell the DSML tags as text, which then reached the
    client as `content`; compiled token-exact, whatever the model picks is a call."""
    message = forced_call(base, choice, stream=False, max_tokens=300)
    assert message["finish"] == "tool_calls", message
    assert message["content"] == "" and message["invalid"] == []
    [(name, arguments)] = message["calls"]
    assert name == "switch"
    jsonschema.validate(json.loads(arguments), SWITCH_SCHEMA)
    assert forced_call(base, choice, stream=True, max_tokens=300) == message


@pytest.mark.parametrize("choice", sorted(FORCED))
def test_a_forced_call_cut_by_max_tokens_arrives_flagged_with_clean_content(base, choice):
    message = forced_call(base, choice, stream=False, max_tokens=CUT)
    assert message["finish"] == "length"
    assert message["content"] == "" and message["calls"] == []
    [invalid] = message["invalid"]
    assert invalid["function"]["name"] and "switch".startswith(invalid["function"]["name"])
    assert "max_tokens" in invalid["error"]
    streamed = forced_call(base, choice, stream=True, max_tokens=CUT)
    assert [{**c, "id": ""} for c in streamed["invalid"]] == [{**c, "id": ""} for c in message["invalid"]]
    for key in ("content", "calls", "finish"):
        assert streamed[key] == message[key]


# --- NVFP4 experts + NVFP4 Engram, chunked prefill, no radix cache ------------------------------


@pytest.mark.parametrize("prompt", PROMPTS[::2], ids=["22-tokens", "42-tokens"])
def test_chunked_prefill_of_the_nvfp4_nvfp4_checkpoint_equals_the_reference(chunked, prompt):
    out = chunked.generate(prompt)
    assert out["meta_info"]["cached_tokens"] == 0
    assert out["output_ids"] == chunked.expected(prompt)
