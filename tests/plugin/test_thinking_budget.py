"""The thinking token budget in the scheduler (`plugin/serving/thinking_budget.py`), on SGLang's own
grammar objects: its `GrammarManager` methods as hooked by `load_plugins()`, a real reasoner
backend over xgrammar with the V4.1 vocabulary, and the mask walk its speculative decoding
runs over a draft chain (`spec_utils.generate_token_bitmask`, what DSPARK's verify calls).

A GPU run with DSPARK is not possible here; what these tests pin is that the forced `</think>`
is a mask on the target's verify position (never a rewritten token) and that rejected drafts
roll the reasoning count back.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.checkpoint.scripted import LONG_REASONING, script_ids

VOCAB = 129280
THINK_END = Special.THINK_END.id
REASONING = script_ids(LONG_REASONING)
SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'
EVERY_ID = set(range(VOCAB))


@pytest.fixture(scope="module")
def backend():
    """SGLang's reasoner grammar backend over xgrammar, as a `deepseek-v41` server builds it."""
    from sglang.srt.constrained.reasoner_grammar_backend import ReasonerGrammarBackend
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
    from sglang.srt.parser.reasoning_parser import ReasoningParser
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import get_context

    from sglang_ds41.assets import TOKENIZER_DIR, v41_hf_tokenizer

    load_plugins()
    tokenizer = v41_hf_tokenizer()
    with get_context().override_server_args(model_path=str(TOKENIZER_DIR)):
        inner = XGrammarGrammarBackend(tokenizer, vocab_size=VOCAB, model_eos_token_ids=[Special.EOS.id])
        parser = ReasoningParser(model_type="deepseek-v41", stream_reasoning=False, tokenizer=tokenizer)
        yield ReasonerGrammarBackend(inner, parser, tokenizer, enable_strict_thinking=False)


def manager(backend):
    """SGLang's `GrammarManager` (hooked) with the state its request methods read."""
    from sglang.srt.constrained.grammar_manager import GrammarManager

    found = object.__new__(GrammarManager)
    found.grammar_backend = backend
    found._enable_strict_thinking = False
    found.grammar_queue = []
    found.scheduler = SimpleNamespace(model_config=SimpleNamespace())
    return found


def request(custom_params=None, require_reasoning=True, json_schema=None):
    params = SimpleNamespace(
        json_schema=json_schema, regex=None, ebnf=None, structural_tag=None, custom_params=custom_params
    )
    return SimpleNamespace(
        sampling_params=params, require_reasoning=require_reasoning, grammar=None, origin_input_ids=[0],
        finished=lambda: False,
    )  # fmt: skip


def allowed(grammar, mask=None, row: int = 0) -> set[int] | None:
    """The ids the grammar's mask allows next (None: every id, the row left as allocated)."""
    if mask is None:
        mask = grammar.allocate_vocab_mask(VOCAB, 1, "cpu")
        grammar.fill_vocab_mask(mask, 0)
    bits = mask[row]
    if bool((bits == -1).all()):
        return None
    ids = torch.arange(VOCAB)
    return set(ids[(bits[ids // 32] >> (ids % 32)) & 1 == 1].tolist())


@pytest.mark.parametrize("budget", [1, 2, 8])
def test_a_budget_alone_forces_think_end_as_its_last_reasoning_token(backend, budget):
    req = request({"thinking_token_budget": budget})
    manager(backend).process_req_with_grammar(req)
    grammar = req.grammar
    for token in REASONING[: budget - 1]:
        assert allowed(grammar) is None  # free reasoning
        grammar.accept_token(token)
    assert allowed(grammar) == {THINK_END}
    mask = grammar.allocate_vocab_mask(VOCAB, 1, "cpu")
    grammar.fill_vocab_mask(mask, 0)
    logits = torch.zeros(1, VOCAB)
    grammar.apply_vocab_mask(logits, mask)  # on the CPU engine's logits, as its sampler does
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [THINK_END]
    grammar.accept_token(THINK_END)
    assert allowed(grammar) is None  # the answer is free again


@pytest.mark.parametrize(
    "req",
    [
        request(),  # no budget
        request({"thinking_token_budget": 8}, require_reasoning=False),  # thinking off: nothing to cap
        request({"thinking_token_budget": "8"}),  # not a budget (the serving hook only writes ints)
    ],
)
def test_other_requests_get_no_grammar(backend, req):
    manager(backend).process_req_with_grammar(req)
    assert req.grammar is None


def test_a_request_grammar_is_capped_and_then_constrains_the_answer(backend):
    req = request({"thinking_token_budget": 3}, json_schema=SCHEMA)
    req.grammar = backend._init_value_dispatch(("json", SCHEMA), True)  # as compiled for the request
    manager(backend)._apply_request_reasoning_config(req)
    grammar = req.grammar
    for token in REASONING[:2]:
        assert allowed(grammar) == EVERY_ID - {Special.EOS.id}  # a JSON answer's reasoning: no EOS
        grammar.accept_token(token)
    assert allowed(grammar) == {THINK_END}
    grammar.accept_token(THINK_END)
    answer = allowed(grammar)
    assert answer is not None and THINK_END not in answer and script_ids("{")[0] in answer


def test_a_json_answer_cannot_be_skipped_by_ending_the_turn_inside_the_reasoning(backend):
    # no budget: the reasoning is free but for EOS, which only the answer's grammar allows
    req = request(json_schema=SCHEMA)
    req.grammar = backend._init_value_dispatch(("json", SCHEMA), True)
    manager(backend)._apply_request_reasoning_config(req)
    grammar = req.grammar
    for token in REASONING[:5]:
        assert allowed(grammar) == EVERY_ID - {Special.EOS.id}
        grammar.accept_token(token)
    grammar.accept_token(THINK_END)
    for token in script_ids('{"a": 1}'):
        assert Special.EOS.id not in allowed(grammar)
        grammar.accept_token(token)
    assert Special.EOS.id in allowed(grammar)  # the answer is whole: now the turn may end


def test_a_grammar_that_is_not_a_json_answer_keeps_eos_in_the_reasoning(backend):
    req = request(json_schema=None)
    req.grammar = backend._init_value_dispatch(("json", SCHEMA), True)
    manager(backend)._apply_request_reasoning_config(req)
    assert allowed(req.grammar) is None


def draft_mask(grammar, drafts: list[int]) -> torch.Tensor:
    """The verify mask SGLang's speculative decoding builds for one request over a linear draft
    chain (DSPARK's `GrammarTree.from_linear_chain`): column 0 is the last committed token,
    already accepted into the grammar; row i is the mask after drafts 1..i."""
    from sglang.srt.speculative.spec_utils import generate_token_bitmask

    chain = torch.tensor([drafts])
    length = chain.shape[1]
    next_token = torch.full((1, length), -1, dtype=torch.int64)
    next_token[:, :-1] = torch.arange(1, length)
    next_sibling = torch.full((1, length), -1, dtype=torch.int64)
    reqs = [SimpleNamespace(grammar=grammar)]
    return generate_token_bitmask(reqs, next_token, next_sibling, chain, VOCAB)[0]


def state(grammar) -> tuple[int, int, int]:
    return grammar.tokens_in_think, grammar.tokens_after_end, grammar._matched_think_end_tokens


def test_a_draft_chain_past_the_budget_gets_think_end_at_the_budget_and_rolls_back(backend):
    req = request({"thinking_token_budget": 6})  # 5 reasoning tokens, then </think>
    manager(backend).process_req_with_grammar(req)
    grammar = req.grammar
    for token in REASONING[:3]:
        grammar.accept_token(token)
    before = state(grammar)
    drafts = REASONING[2:9]  # the committed 3rd token, then drafts that keep reasoning
    mask = draft_mask(grammar, drafts)
    assert [allowed(grammar, mask, row) for row in range(3)] == [None, None, {THINK_END}]
    # the draft at the budget's position is refused there: the target samples </think>
    assert drafts[3] != THINK_END
    assert state(grammar) == before  # every draft rolled back


def test_a_draft_chain_that_ends_the_reasoning_in_time_is_followed_into_the_answer(backend):
    req = request({"thinking_token_budget": 4}, json_schema=SCHEMA)
    req.grammar = backend._init_value_dispatch(("json", SCHEMA), True)
    manager(backend)._apply_request_reasoning_config(req)
    grammar = req.grammar
    for token in REASONING[:2]:
        grammar.accept_token(token)
    before = state(grammar)
    brace = script_ids("{")[0]
    mask = draft_mask(grammar, [REASONING[1], REASONING[2], THINK_END, brace])
    assert allowed(grammar, mask, 0) == EVERY_ID - {Special.EOS.id}
    assert allowed(grammar, mask, 1) == {THINK_END}
    after_end = allowed(grammar, mask, 2)
    assert after_end is not None and THINK_END not in after_end and brace in after_end
    assert state(grammar) == before


def test_a_strict_thinking_servers_own_ban_is_kept_beside_eos(backend):
    # --enable-strict-thinking bans tokens inside all reasoning; the JSON answer's EOS ban adds to it
    dsml = Special.DSML.id
    req = request(json_schema=SCHEMA)
    req.grammar = backend._init_value_dispatch(("json", SCHEMA), True)
    req.grammar.think_excluded_token_ids = [dsml]
    manager(backend)._apply_request_reasoning_config(req)
    assert allowed(req.grammar) == EVERY_ID - {dsml, Special.EOS.id}
