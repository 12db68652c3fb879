"""A hard cap on a V4.1 request's reasoning tokens, enforced where SGLang samples
(docs/ENCODING.md §4.4, "Thinking token budget").

The serving hook (`thinking.py`) writes a thinking request's `thinking_token_budget` (the
request's, else the server default) into `custom_params[BUDGET_PARAM]`. In the scheduler,
SGLang's `ReasonerGrammarObject` already counts the reasoning tokens of a request and, with
token filtering on, allows nothing but `</think>` once `max_think_tokens` are spent; upstream
turns that on only with `--enable-strict-thinking`, for every request at once, together with a
ban on EOS and the DSML token inside all reasoning. Two AROUND hooks on `GrammarManager` give
the cap to the budgeted requests alone, and the EOS ban to requests for a JSON answer alone
(`end_reasoning_first`: without it a model may end its turn while reasoning, with no answer):

* `_apply_request_reasoning_config`, which every request whose grammar is a
  `ReasonerGrammarObject` passes (a `response_format` / `tool_choice` grammar, from the cache or
  once compiled): token filtering on, `max_think_tokens` from the budget;
* `process_req_with_grammar`: a budgeted thinking request without a grammar gets a budget-only
  `ReasonerGrammarObject` (no inner grammar), built by the reasoner backend as upstream builds
  its strict-thinking objects.

The budget counts what usage reports as `reasoning_tokens`: the reasoning and its `</think>`.
So `max_think_tokens` is the budget less one, and the forced `</think>` is the budget's last
token. After it the request's own grammar (if any) constrains the answer, as after a
`</think>` the model wrote.

Why the grammar: it is where SGLang constrains sampling on both engines, and the one
constraint its speculative decoding honours. The verify step builds the mask along the draft
chain (or tree) by accepting each draft token into the grammar object, filling that
position's mask and rolling back (`spec_utils.generate_token_bitmask`, which DSPARK, EAGLE and
n-gram call), so at the budget's position the target's own masked sample is `</think>`: a
rejected draft is discarded without touching it, and the reasoning count rolls back with the
drafts (the object's match history). DSPARK does not apply custom logit processors to its
verify logits, so a logit processor could not force the token there.

The cost: a request with a budget is decoded as one with a `response_format` is, a vocabulary
mask per step while it reasons; on GPUs its batch leaves DSPARK's folded CUDA-graph accept for
the eager verify path, as any grammar does.
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.constrained.reasoner_grammar_backend import ReasonerGrammarBackend, ReasonerGrammarObject
from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
from xgrammar import apply_token_bitmask_inplace

from sglang_ds41.encoding.special_tokens import Special
from sglang_ds41.plugin.serving.thinking import BUDGET_PARAM

MANAGER = "sglang.srt.constrained.grammar_manager.GrammarManager"


def request_budget(req: Any) -> int | None:
    """The thinking token budget the serving hook gave `req` (None: none)."""
    params = req.sampling_params.custom_params
    budget = params.get(BUDGET_PARAM) if isinstance(params, dict) else None
    return budget if type(budget) is int and budget >= 1 else None


def _filters(backend: Any) -> bool:
    """The scheduler's grammar backend is SGLang's reasoner wrapper over one that can filter
    tokens (xgrammar; the serving hook refuses budgets on other backends)."""
    return isinstance(backend, ReasonerGrammarBackend) and backend.grammar_backend.is_support_token_filter


def cap(grammar: ReasonerGrammarObject, backend: ReasonerGrammarBackend, budget: int) -> None:
    """From now on `grammar` allows only `</think>` once `budget` - 1 reasoning tokens are spent."""
    grammar.max_think_tokens = budget - 1
    _filter_tokens(grammar, backend)


def answers_in_json(req: Any) -> bool:
    """Whether `req` asks for a JSON answer (`response_format`: a JSON-schema grammar)."""
    return req.sampling_params.json_schema is not None


def end_reasoning_first(grammar: ReasonerGrammarObject, backend: ReasonerGrammarBackend) -> None:
    """From now on `grammar` masks EOS inside the reasoning: a request that asked for a JSON
    answer gets one (or runs to its token limit), never a turn ended before `</think>` with no
    answer at all. Upstream bans EOS in reasoning only with `--enable-strict-thinking`, for
    every request (its ban, EOS and the DSML token, is kept when the server has it on)."""
    excluded = grammar.think_excluded_token_ids or []
    if Special.EOS.id not in excluded:
        grammar.think_excluded_token_ids = [*excluded, Special.EOS.id]
    _filter_tokens(grammar, backend)


def _filter_tokens(grammar: ReasonerGrammarObject, backend: ReasonerGrammarBackend) -> None:
    """Turn on `grammar`'s token filtering (the budget and the reasoning's banned tokens)."""
    grammar.enable_token_filter = True
    grammar.token_filter_fn = backend.grammar_backend.set_token_filter


def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
    """xgrammar's mask applied to `logits`: the xgrammar backend's own function, which in SGLang
    0.5.23 lacks the CPU branch its grammar objects have (so a budget-only object, which has
    no inner grammar to apply its mask, would stop the CPU engine's scheduler)."""
    if logits.device.type == "cpu":
        apply_token_bitmask_inplace(logits, vocab_mask, backend="cpu")
    else:
        XGrammarGrammarBackend.apply_vocab_mask(logits, vocab_mask)


def apply_request_reasoning_config(original, self, req, *args, **kwargs):
    """AROUND `GrammarManager._apply_request_reasoning_config`: cap a budgeted request's grammar;
    a JSON answer's reasoning cannot end the turn."""
    result = original(self, req, *args, **kwargs)
    budget = request_budget(req)
    backend = self.grammar_backend
    if isinstance(req.grammar, ReasonerGrammarObject) and _filters(backend):
        if budget is not None:
            cap(req.grammar, backend, budget)
        if answers_in_json(req):
            end_reasoning_first(req.grammar, backend)
    return result


def process_req_with_grammar(original, self, req, *args, **kwargs):
    """AROUND `GrammarManager.process_req_with_grammar`: a budgeted thinking request with no
    grammar of its own gets a budget-only one."""
    queued = original(self, req, *args, **kwargs)
    backend = self.grammar_backend
    if (
        req.grammar is None
        and not req.finished()
        and req.require_reasoning
        and _filters(backend)
        and request_budget(req) is not None
    ):
        grammar = backend._make_grammar_object(None, True)
        grammar.apply_vocab_mask_fn = apply_vocab_mask
        req.grammar = grammar
        self._apply_request_reasoning_config(req)
    return queued


HOOKS = {
    f"{MANAGER}._apply_request_reasoning_config": apply_request_reasoning_config,
    f"{MANAGER}.process_req_with_grammar": process_req_with_grammar,
}
