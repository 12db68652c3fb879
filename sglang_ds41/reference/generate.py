"""Decoding with the reference model: prefill, then one token per step (greedy by default).

`selftest` is the end-to-end check of a loaded checkpoint, in the spirit of the official
reference's self-test: prefill a prompt, decode 22 steps, and verify that

* every decode step's logits equal the logits a one-shot forward over the extended sequence
  gives at that position (the per-request state is complete and causal),
* a prefill split at an odd boundary equals the one-shot prefill,
* every layer's residual stream and every logit is finite,
* greedy decoding is not degenerate (more than one distinct token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from sglang_ds41.errors import Ds41Error

from .model import Transformer

SELFTEST_STEPS = 22

# Largest accepted |difference| / max |logit| between chunked/decode and one-shot logits. Not
# 1e-5 in float32: a GEMM's rounding depends on its row count, and a 1e-7 change can flip one
# FP8 / FP4 fake-quant rounding of the KV (a 1/16 step of one element), which moves logits of
# the following window by ~1e-4 relative. A state bug moves them by O(1).
SELFTEST_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-2, torch.bfloat16: 5e-2}


class Constraint(Protocol):
    """A grammar over the output (`grammar.JsonAnswerGrammar`): masks each step's logits in
    place, then is told the token chosen."""

    def restrict(self, logits: torch.Tensor) -> None: ...

    def accept(self, token: int) -> None: ...


def next_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """logits [vocab] -> a token: argmax at temperature 0, else a sample of softmax(logits / T)."""
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def generate(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    stop_ids: tuple[int, ...] = (),
    seed: int = 0,
    image_embeds: torch.Tensor | None = None,
    constraint: Constraint | None = None,
) -> list[int]:
    """New token ids after `prompt_ids`, stopping after a stop id or the limit.

    `image_embeds` [n, D]: the input embeddings of the prompt's n image positions, in order
    (`vision.build_image_prompt`); None for a text-only prompt. The image token is never
    produced: its position would need image embeddings. `constraint`: a grammar each step's
    token must satisfy, as the server's sampler applies it."""
    if not prompt_ids:
        raise Ds41Error("generate: the prompt has no tokens")
    generator = torch.Generator().manual_seed(seed)
    state = model.new_state()
    logits = model(torch.tensor(prompt_ids), state, image_embeds)[-1]
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits[model.image_token_id] = float("-inf")
        if constraint is not None:
            constraint.restrict(logits)
        token = next_token(logits, temperature, generator)
        if constraint is not None:
            constraint.accept(token)
        out.append(token)
        if token in stop_ids or len(out) == max_new_tokens:
            break
        logits = model(torch.tensor([token]), state)[-1]
    return out


@dataclass
class SelftestReport:
    prompt_ids: list[int]
    token_ids: list[int]
    decode_max_diff: float  # decode vs one-shot logits, relative to max |logit|
    chunked_max_diff: float  # chunked vs one-shot prefill logits, relative
    tolerance: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def selftest(model: Transformer, prompt_ids: list[int], steps: int = SELFTEST_STEPS) -> SelftestReport:
    """Prefill + `steps` greedy decode steps, checked against one-shot forwards (module doc)."""
    if len(prompt_ids) < 2:
        raise Ds41Error("selftest: the prompt needs at least 2 tokens (one split point)")
    tolerance = SELFTEST_TOLERANCE.get(model.dtype, 5e-2)
    problems: list[str] = []
    nonfinite: list[int] = []
    hooks = [
        block.register_forward_hook(
            lambda mod, _, out: nonfinite.append(mod.layer) if not torch.isfinite(out[0]).all() else None
        )
        for block in model.layers
    ]
    try:
        state = model.new_state()
        logits = model(torch.tensor(prompt_ids), state)  # [P, vocab]
        rows, tokens = [logits[-1]], []
        for _ in range(steps):
            row = rows[-1].clone()
            row[model.image_token_id] = float("-inf")
            tokens.append(int(row.argmax()))
            rows.append(model(torch.tensor(tokens[-1:]), state)[-1])
        # One shot over prompt + every fed token: its last steps+1 rows are the decode rows.
        oneshot = model(torch.tensor(prompt_ids + tokens), model.new_state())
        decoded = torch.stack(rows)  # [steps + 1, vocab]
        scale = oneshot.abs().max().clamp(min=1e-30)
        decode_diff = float((decoded - oneshot[len(prompt_ids) - 1 :]).abs().max() / scale)
        split = len(prompt_ids) // 2 | 1  # an odd boundary: exercises the ratio-2 pending token
        state = model.new_state()
        chunked = torch.cat(
            [model(torch.tensor(ids), state) for ids in (prompt_ids[:split], prompt_ids[split:])]
        )
        chunked_diff = float((chunked - oneshot[: len(prompt_ids)]).abs().max() / scale)
    finally:
        for hook in hooks:
            hook.remove()
    if nonfinite:
        problems.append(f"non-finite residual stream after layers {sorted(set(nonfinite))}")
    if not (torch.isfinite(oneshot).all() and torch.isfinite(decoded).all()):
        problems.append("non-finite logits")
    if not decode_diff <= tolerance:
        problems.append(
            f"decode logits differ from the one-shot forward by {decode_diff:.3g} (> {tolerance:g})"
        )
    if not chunked_diff <= tolerance:
        problems.append(
            f"chunked prefill differs from the one-shot prefill by {chunked_diff:.3g} (> {tolerance:g})"
        )
    if len(set(tokens)) < 2:
        problems.append(f"greedy decoding is degenerate: {steps} steps all produced token {tokens[0]}")
    return SelftestReport(list(prompt_ids), tokens, decode_diff, chunked_diff, tolerance, problems)
