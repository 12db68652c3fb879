"""Pattern checks on model output stay bounded (agents/bounded_search.py, ecma_regex.py) and
never crash on text UTF-8 cannot hold."""

from __future__ import annotations

import os
import time
from typing import Annotated

import pydantic
import pytest
from sglang_ds41.agents import function_tool
from sglang_ds41.agents.bounded_search import TIMEOUT_S
from sglang_ds41.agents.ecma_regex import search
from sglang_ds41.agents.validation import NotJSON, SchemaValidator, loads_strict

NESTED = "^(a+)+$"  # exponential on a near-miss in any backtracking engine
NEAR_MISS = "a" * 40 + "!"  # ~2**40 steps: days


def test_ecma_semantics_are_kept():
    assert search("^\\d+$", "123") and not search("^\\d+$", "\u0661")  # ECMA's \d is ASCII only
    assert search("\\p{Letter}", "é") and search("b", "abc") and not search("^b", "abc")


def test_a_backtracking_pattern_on_a_near_miss_is_refused_in_bounded_time():
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": NESTED}}}
    validator = SchemaValidator.compile(schema, "t")
    started = time.monotonic()
    (problem,) = validator.problems({"s": NEAR_MISS})
    assert time.monotonic() - started < TIMEOUT_S + 5
    assert f"could not be checked against {NESTED!r}: the pattern took longer than" in problem.message
    assert validator.problems({"s": "aaaa"}) == []  # the search process was replaced and still answers


def test_a_pattern_property_key_that_cannot_be_checked_refuses_the_object():
    schema = {"type": "object", "patternProperties": {NESTED: {"type": "integer"}}}
    validator = SchemaValidator.compile(schema, "t")
    problems = validator.problems({NEAR_MISS: "not an integer"})
    assert [p.message for p in problems] == [
        f"{NEAR_MISS!r} could not be checked against {NESTED!r}: the pattern took longer than "
        f"{TIMEOUT_S:g} s on 41 characters"
    ]


def test_a_tool_with_a_backtracking_pattern_tells_the_model_and_runs_nothing():
    ran = []

    @function_tool
    def save(name: Annotated[str, pydantic.Field(pattern=NESTED)]) -> str:
        """Save.

        Args:
            name: The name.
        """
        ran.append(name)
        return "saved"

    message = save.prepare("c", f'{{"name": "{NEAR_MISS}"}}')
    assert isinstance(message, str) and "could not be checked" in message and ran == []


def test_lone_surrogates_are_refused_as_json_and_never_crash_a_pattern_check():
    with pytest.raises(NotJSON, match="lone surrogate U\\+D800 at index 1"):
        loads_strict('{"code": "A\\ud800B"}')
    with pytest.raises(NotJSON, match="lone surrogate U\\+DC00"):
        loads_strict('{"\\udc00": 1}')
    assert loads_strict('{"code": "\\ud83d\\ude00"}') == {"code": "\U0001f600"}  # a pair is a character
    assert not search(".", "\ud800")  # the UTF-8 engine cannot read it: no match, no exception
    validator = SchemaValidator.compile({"type": "string", "pattern": "^A"}, "t")
    assert [p.message for p in validator.problems("A\ud800")] == ["'A\\ud800' does not match '^A'"]


def test_a_forked_process_searches_with_its_own_child():
    assert search("^a", "abc")  # the parent's search process exists
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through its exit status)
        os._exit(0 if search("^a", "abc") and not search("^b", "abc") else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert search("^a", "abc")  # the parent's still answers
