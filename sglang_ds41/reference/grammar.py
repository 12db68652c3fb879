"""The grammar a served JSON answer is decoded under, for the reference's greedy decode.

`sglang-ds41 serve` answers a request whose `response_format` is `json_schema` or `json_object`
under SGLang's default grammar backend, xgrammar, as its defaults build it: the schema
(`{"type": "object"}` for `json_object`; a `json_schema` whatever its `strict` says: SGLang
leaves a non-strict schema to the prompt alone only for the Kimi K3 renderer) compiled against
the tokenizer with the model's EOS as the stop token and any whitespace allowed, and, when the request
thinks, applied only from the token after `</think>` (SGLang's reasoner grammar decides that
from the thinking flag alone), the reasoning before it free but for EOS (the plugin masks EOS
there so that the turn cannot end without its answer, `thinking_budget.end_reasoning_first`).
The reference decodes under the same mask, so a served JSON answer and the reference's are one
computation that can be compared token for token (`training.evaluate.ReferenceCompleter`,
`benchmarks/tiny_eval.py`). Without it the reference
writes what the unconstrained model prefers, which may not be JSON at all.

Mirrored are SGLang's defaults only: a server started with other grammar flags
(`--grammar-backend`, `--constrained-json-disable-any-whitespace`) decodes under another mask,
and other constraints (a `regex` response format, SGLang's `regex` / `ebnf` / `structural_tag`
fields, a required or named `tool_choice`) are refused here rather than decoded unconstrained.
xgrammar comes with the `serve` extra (SGLang's pin).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import torch

from sglang_ds41.assets import v41_hf_tokenizer, v41_tokenizer
from sglang_ds41.encoding import RenderedRequest
from sglang_ds41.encoding.special_tokens import Special
from sglang_ds41.errors import Ds41Error

ANY_OBJECT = '{"type": "object"}'  # what SGLang constrains `json_object` to
UNMIRRORED_FIELDS = ("regex", "ebnf", "structural_tag")  # SGLang's own constraint fields


def schema_of(body: dict[str, Any]) -> str | None:
    """The JSON schema string SGLang constrains the request's answer to, or None when it
    constrains nothing; a constraint the reference does not mirror is refused by name."""
    constrained = [field for field in UNMIRRORED_FIELDS if body.get(field)]
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        constrained.append(f"tool_choice {json.dumps(choice)}")
    response_format = body.get("response_format") or {}
    kind = response_format.get("type", "text")
    if kind not in ("text", "json_object", "json_schema"):
        constrained.append(f"response_format {kind!r}")
    if constrained:
        raise Ds41Error(
            f"reference decode: the request constrains its output with {', '.join(constrained)}, "
            "which the reference does not mirror (it mirrors the server's JSON response formats only)"
        )
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if schema is None:
            raise Ds41Error("reference decode: response_format json_schema has no `json_schema.schema`")
        return json.dumps(schema)
    return None


class JsonAnswerGrammar:
    """The served grammar of one request's JSON answer, stepped along a greedy decode:
    `restrict` masks a step's logits in place, `accept` feeds it the token chosen."""

    def __init__(self, schema: str, in_reasoning: bool, vocab_size: int, eos_id: int):
        """`vocab_size`: the model's (SGLang hands xgrammar the model config's, not the
        tokenizer's); `eos_id`: the model's EOS, the grammar's stop token."""
        xgrammar = _xgrammar()
        self._apply = xgrammar.apply_token_bitmask_inplace
        compiled = _compiler(vocab_size, eos_id).compile_json_schema(schema, any_whitespace=True)
        self._matcher = xgrammar.GrammarMatcher(compiled)
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self._accepted: list[int] = []
        self._eos = eos_id
        self.active = not in_reasoning

    @classmethod
    def for_request(
        cls, body: dict[str, Any], rendered: RenderedRequest, vocab_size: int, eos_id: int
    ) -> JsonAnswerGrammar | None:
        """The request's grammar, or None when it asks for no JSON answer."""
        schema = schema_of(body)
        if schema is None:
            return None
        return cls(schema, rendered.parsing.thinking, vocab_size, eos_id)

    def restrict(self, logits: torch.Tensor) -> None:
        """logits [vocab]: every token the grammar does not allow next set to -inf; inside the
        reasoning only EOS, as the server masks it (`thinking_budget.end_reasoning_first`)."""
        if not self.active:
            logits[self._eos] = float("-inf")
            return
        self._matcher.fill_next_token_bitmask(self._bitmask)
        blocked = torch.zeros(1, logits.shape[-1], dtype=torch.float32)
        self._apply(blocked, self._bitmask)
        logits.masked_fill_(blocked[0].isinf(), float("-inf"))

    def accept(self, token: int) -> None:
        if not self.active:
            self.active = token == Special.THINK_END.id
            return
        if not self._matcher.accept_token(token):
            decode = v41_tokenizer().decode
            raise Ds41Error(
                f"JSON answer grammar: token {token} ({decode([token])!r}) cannot follow "
                f"{decode(self._accepted)!r} (were the logits restricted first?)"
            )
        self._accepted.append(token)


def _xgrammar():
    try:
        import xgrammar
    except ImportError as e:
        raise Ds41Error(
            "reference decode of a JSON answer needs xgrammar, the grammar library SGLang decodes it "
            "with: pip install 'sglang-ds41[serve]'"
        ) from e
    return xgrammar


@functools.cache
def _compiler(vocab_size: int, eos_id: int):
    xgrammar = _xgrammar()
    tokenizer = v41_hf_tokenizer()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=[eos_id])
    return xgrammar.GrammarCompiler(info)
