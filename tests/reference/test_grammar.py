"""The served JSON-answer grammar as the reference's decode applies it: what it allows at each
step of a real answer, that it waits for the reasoning's end, and that `generate` keeps to it.
(That it is the *server's* grammar, token for token, is tests/integration/test_trained_tiny.py.)"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from sglang_ds41.encoding import render_request
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.assets import v41_tokenizer
from sglang_ds41.errors import Ds41Error
from sglang_ds41.reference.generate import generate
from sglang_ds41.reference.grammar import ANY_OBJECT, JsonAnswerGrammar, schema_of

VOCAB = 129280
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "count": {"type": "integer"}},
    "required": ["city", "count"],
    "additionalProperties": False,
}


def _body(response_format: dict | None, thinking: bool = True) -> dict:
    body = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "Give me the record."}]}
    if response_format is not None:
        body["response_format"] = response_format
    if not thinking:
        body["thinking"] = {"type": "disabled"}
    return body


def _grammar(body: dict) -> JsonAnswerGrammar | None:
    return JsonAnswerGrammar.for_request(body, render_request(body), VOCAB, Special.EOS.id)


def _off() -> dict:
    return {"thinking": {"type": "disabled"}}


def _json_schema() -> dict:
    return {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}


def _allowed(grammar: JsonAnswerGrammar) -> torch.Tensor:
    logits = torch.zeros(VOCAB, dtype=torch.float64)
    grammar.restrict(logits)
    return logits == 0


def test_the_schema_is_what_sglang_constrains_each_response_format_to():
    assert json.loads(schema_of(_body(_json_schema()))) == SCHEMA
    assert schema_of(_body({"type": "json_object"})) == ANY_OBJECT
    assert schema_of(_body({"type": "text"})) is None and schema_of(_body(None)) is None


def test_a_valid_answer_is_allowed_token_by_token_and_then_only_its_end():
    grammar = JsonAnswerGrammar(json.dumps(SCHEMA), False, VOCAB, Special.EOS.id)
    answer = v41_tokenizer().encode('{"city": "Oslo", "count": 3}', add_special_tokens=False).ids
    words = v41_tokenizer().encode("Sure, here it is", add_special_tokens=False).ids
    first = _allowed(grammar)
    assert first[answer[0]] and not first[words[0]] and not first[Special.EOS.id]
    for token in answer:
        assert _allowed(grammar)[token], token
        grammar.accept(token)
    end = _allowed(grammar)
    assert end[Special.EOS.id] and not end[answer[0]]


def test_a_token_the_grammar_forbids_is_refused_by_name():
    grammar = JsonAnswerGrammar(json.dumps(SCHEMA), False, VOCAB, Special.EOS.id)
    grammar.accept(v41_tokenizer().encode("{", add_special_tokens=False).ids[0])
    with pytest.raises(Ds41Error, match=r"token \d+ \('Sure'\) cannot follow '\{'"):
        grammar.accept(v41_tokenizer().encode("Sure", add_special_tokens=False).ids[0])


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"regex": "[a-z]+"}, "regex"),
        ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}]},
         "tool_choice"),
        ({"response_format": {"type": "regex", "regex": "[a-z]+"}}, "response_format 'regex'"),
    ],
)
def test_a_constraint_the_reference_does_not_mirror_is_refused_not_ignored(extra, named):
    with pytest.raises(Ds41Error, match=f"constrains its output with {named}"):
        schema_of({**_body(None), **extra})


def _all_but_eos(allowed: torch.Tensor) -> bool:
    others = torch.ones_like(allowed)
    others[Special.EOS.id] = False
    return bool((allowed == others).all())


def test_the_reasoning_is_free_but_for_eos_until_its_end_token():
    # the server masks EOS inside a JSON answer's reasoning (plugin/serving/thinking_budget.py)
    rendered = render_request(_body(_json_schema()))
    grammar = JsonAnswerGrammar.for_request(_body(_json_schema()), rendered, VOCAB, Special.EOS.id)
    words = v41_tokenizer().encode("I will write the record.", add_special_tokens=False).ids
    for token in words:
        assert _all_but_eos(_allowed(grammar))
        grammar.accept(token)
    grammar.accept(Special.THINK_END.id)
    assert not _allowed(grammar)[words[0]]
    off = _body(_json_schema(), thinking=False)
    assert not _allowed(_grammar(off))[words[0]]
    assert _grammar(_body(None)) is None


def test_a_continued_answer_in_a_thinking_request_waits_for_the_reasoning_end_as_the_server_does():
    """SGLang's reasoner grammar starts from the request's thinking flag alone, so a thinking
    request that continues its answer (`prefix`) is not constrained until a `</think>`."""
    body = _body(_json_schema())
    body["messages"].append({"role": "assistant", "content": '{"city": ', "prefix": True})
    words = v41_tokenizer().encode("Oslo", add_special_tokens=False).ids
    assert _all_but_eos(_allowed(_grammar(body)))
    assert render_request(body).parsing.in_content and not _allowed(_grammar({**body, **_off()}))[words[0]]


def test_generate_under_the_grammar_writes_only_what_the_schema_allows(load):
    """A random tiny model under the grammar: what it writes opens the JSON object (no prose
    first), and an answer it finishes validates."""
    model = load(dtype=torch.float32)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    grammar = JsonAnswerGrammar(json.dumps(schema), False, model.text.vocab_size, model.config.eos_token_id)
    prompt = v41_tokenizer().encode("Answer in JSON.", add_special_tokens=False).ids
    out = generate(model, prompt, 40, stop_ids=(Special.EOS.id,), constraint=grammar)
    text = v41_tokenizer().decode([t for t in out if t != Special.EOS.id])
    assert text.lstrip().startswith("{"), text
    if out[-1] == Special.EOS.id:
        jsonschema.validate(json.loads(text), schema)
