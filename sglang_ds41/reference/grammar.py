"""The grammar a served JSON answer is decoded under, for the reference's greedy decode.

`sglang-ds41 serve` answers a request whose `response_format` is `json_schema` or `json_object`
under SGLang's default grammar backend, xgrammar: the schema (`{"type": "object"}` for
`json_object`) compiled against the tokenizer with EOS as the stop token and any whitespace
allowed (SGLang's defaults), and, where the turn starts in reasoning, applied only from the
token after `</think>` (SGLang's reasoner grammar). The reference decodes under the same mask,
so a served JSON answer and the reference's are one computation that can be compared token for
token (`training.evaluate.ReferenceCompleter`, `benchmarks/tiny_eval.py`). Without it the
reference writes what the unconstrained model prefers, which may not be JSON at all.

xgrammar comes with the `serve` extra (SGLang's pin); it is imported only when a request asks
for a JSON answer.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import torch

from sglang_ds41.assets import TOKENIZER_DIR
from sglang_ds41.encoding import RenderedRequest
from sglang_ds41.encoding.special_tokens import Special
from sglang_ds41.errors import Ds41Error

ANY_OBJECT = '{"type": "object"}'  # what SGLang constrains `json_object` to


def schema_of(body: dict[str, Any]) -> str | None:
    """The JSON schema string SGLang constrains the request's answer to, or None."""
    response_format = body.get("response_format") or {}
    kind = response_format.get("type")
    if kind == "json_schema":
        return json.dumps(response_format["json_schema"]["schema"])
    if kind == "json_object":
        return ANY_OBJECT
    return None


class JsonAnswerGrammar:
    """The served grammar of one request's JSON answer, stepped along a greedy decode:
    `restrict` masks a step's logits in place, `accept` feeds it the token chosen."""

    def __init__(self, schema: str, in_reasoning: bool, vocab_size: int):
        """`vocab_size`: the model's (SGLang hands xgrammar the model config's, not the tokenizer's)."""
        import xgrammar

        self._xgrammar = xgrammar
        compiled = _compiler(vocab_size).compile_json_schema(schema, any_whitespace=True)
        self._matcher = xgrammar.GrammarMatcher(compiled)
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self.active = not in_reasoning

    @classmethod
    def for_request(
        cls, body: dict[str, Any], rendered: RenderedRequest, vocab_size: int
    ) -> JsonAnswerGrammar | None:
        """The request's grammar, or None when it asks for no JSON answer."""
        schema = schema_of(body)
        if schema is None:
            return None
        parsing = rendered.parsing
        return cls(schema, parsing.thinking and not parsing.in_content, vocab_size)

    def restrict(self, logits: torch.Tensor) -> None:
        """logits [vocab]: every token the grammar does not allow next set to -inf."""
        if not self.active:
            return
        self._matcher.fill_next_token_bitmask(self._bitmask)
        blocked = torch.zeros(1, logits.shape[-1], dtype=torch.float32)
        self._xgrammar.apply_token_bitmask_inplace(blocked, self._bitmask)
        logits.masked_fill_(blocked[0].isinf(), float("-inf"))

    def accept(self, token: int) -> None:
        if not self.active:
            self.active = token == Special.THINK_END.id
            return
        if not self._matcher.accept_token(token):
            raise Ds41Error(f"JSON answer grammar: token {token} is not allowed here (unrestricted logits?)")


@functools.cache
def _compiler(vocab_size: int):
    import xgrammar
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(TOKENIZER_DIR))
    info = xgrammar.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=[Special.EOS.id]
    )
    return xgrammar.GrammarCompiler(info)
