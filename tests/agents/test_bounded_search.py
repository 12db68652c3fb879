"""Pattern checks on model output stay bounded (agents/bounded_search.py, ecma_regex.py) and
never crash on text UTF-8 cannot hold."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from typing import Annotated

import pydantic
import pytest
from sglang_ds41.agents import bounded_search, function_tool
from sglang_ds41.agents.ecma_regex import search
from sglang_ds41.agents.validation import NotJSON, SchemaValidator, loads_strict

from tests.examples.commands import REPO

NESTED = "^(a+)+$"  # exponential on a near-miss in any backtracking engine
NEAR_MISS = "a" * 40 + "!"  # ~2**40 steps: days
SLOW = "could not be checked against '^(a+)+$': the pattern took longer than 0.3 s on 41 characters"


@pytest.fixture(autouse=True)
def short_timeout(monkeypatch):
    monkeypatch.setattr(bounded_search, "TIMEOUT_S", 0.3)


def problems(schema, instance) -> list[str]:
    return [p.message for p in SchemaValidator.compile(schema, "t").problems(instance)]


def test_ecma_semantics_are_kept():
    assert search("^\\d+$", "123") and not search("^\\d+$", "\u0661")  # ECMA's \d is ASCII only
    assert search("\\p{Letter}", "é") and search("b", "abc") and not search("^b", "abc")


def test_a_backtracking_pattern_on_a_near_miss_is_refused_in_bounded_time():
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": NESTED}}}
    started = time.monotonic()
    assert problems(schema, {"s": NEAR_MISS}) == [f"{NEAR_MISS!r} {SLOW}"]
    assert time.monotonic() - started < 10
    assert problems(schema, {"s": "aaaa"}) == []  # the search process was replaced and answers


@pytest.mark.parametrize("wrapper", ["not", "oneOf", "if"])
def test_a_search_given_up_cannot_become_a_pass(wrapper):
    """Inside `not`, `oneOf` or `if` a failing subschema counts for the instance: a timeout read
    as "does not match" there would have let the value through."""
    pattern = "^(?:(a+)+!|.*ok)$"  # matches: the first branch backtracks before the second
    text = "a" * 40 + "ok"
    inner = {"pattern": pattern}
    schema = {
        "not": {"not": inner},  # it matches, so the value is refused
        "oneOf": {"oneOf": [inner, {"type": "integer"}]},
        "if": {"if": inner, "then": {"type": "integer"}},  # it matches, so it must be an integer
    }[wrapper]
    (problem,) = problems(schema, text)
    assert "could not be checked against" in problem


def test_many_near_misses_cost_one_timeout():
    schema = {"type": "array", "items": {"type": "string", "pattern": NESTED}}
    started = time.monotonic()
    assert len(problems(schema, [NEAR_MISS] * 20)) == 1
    assert time.monotonic() - started < 10  # one 0.3 s timeout, not twenty


def test_a_pattern_property_key_that_cannot_be_checked_refuses_the_object():
    schema = {"patternProperties": {NESTED: {"type": "integer"}}, "additionalProperties": False}
    assert problems(schema, {NEAR_MISS: "not an integer"}) == [f"{NEAR_MISS!r} {SLOW}"]


def test_a_tool_with_a_backtracking_pattern_tells_the_model_and_runs_nothing():
    ran = []

    @function_tool
    def save(name: Annotated[str, pydantic.Field(pattern="^(a+)+$")]) -> str:
        """Save.

        Args:
            name: The name.
        """
        ran.append(name)
        return "saved"

    message = save.prepare("c", f'{{"name": "{NEAR_MISS}"}}')
    assert isinstance(message, str) and SLOW in message and ran == []


def test_lone_surrogates_are_refused_as_json_and_never_crash_a_pattern_check():
    with pytest.raises(NotJSON, match="lone surrogate U\\+D800 at index 1"):
        loads_strict('{"code": "A\\ud800B"}')
    with pytest.raises(NotJSON, match="lone surrogate U\\+DC00"):
        loads_strict('{"\\udc00": 1}')
    assert loads_strict('{"code": "\\ud83d\\ude00"}') == {"code": "\U0001f600"}  # a pair is a character
    reason = "'A\\ud800' has a lone surrogate at index 1; no pattern can read it"
    assert problems({"type": "string", "pattern": "^A"}, "A\ud800") == [reason]
    assert problems({"not": {"pattern": "^B"}}, "A\ud800") == [reason]  # no pass by not matching


def test_an_interrupted_search_leaves_no_answer_behind(monkeypatch):
    """The answer to a search given up half-way must not be read as the next search's."""
    assert search("^a", "abc")
    real = bounded_search._readline

    def interrupted(stream, timeout_s):
        monkeypatch.setattr(bounded_search, "_readline", real)
        raise KeyboardInterrupt

    monkeypatch.setattr(bounded_search, "_readline", interrupted)
    with pytest.raises(KeyboardInterrupt):
        search("^a", "abc")  # its "1" is left in the pipe of the process that was stopped
    assert not search("^b", "abc")


def test_searches_work_with_descriptors_past_1023():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this machine allows {hard} open files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    bounded_search._child._stop()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert search("^a", "abc") and not search("^b", "abc")  # a new child, on high descriptors
    finally:
        for fd in held:
            os.close(fd)
        bounded_search._child._stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_forked_process_searches_with_its_own_child_even_if_the_lock_was_held():
    assert search("^a", "abc")
    with bounded_search._child._lock:  # as if another thread were searching at the fork
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child reports through its exit status)
            signal.alarm(20)
            os._exit(0 if search("^a", "abc") and not search("^b", "abc") else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert search("^a", "abc")  # the parent's still answers


def test_a_child_that_cannot_start_is_a_reason_not_a_crash(monkeypatch, tmp_path):
    bounded_search._child._stop()
    monkeypatch.setattr(bounded_search, "CHILD", tmp_path / "missing.py")
    (problem,) = problems({"pattern": "^a"}, "abc")
    assert "could not be checked against '^a': the pattern search process did not start" in problem
    assert "missing.py" in problem  # python's own message, from the child's stderr
    monkeypatch.undo()
    assert search("^a", "abc")


def test_the_child_of_a_killed_parent_ends_by_its_cpu_limit():
    """SIGKILL runs no atexit: the search process, left mid-search, stops at its CPU limit."""
    program = textwrap.dedent(
        f"""
        import os, threading, time
        from sglang_ds41.agents import bounded_search
        from sglang_ds41.agents.ecma_regex import search
        bounded_search.TIMEOUT_S = 1.0
        search("^a", "a")
        print(bounded_search._child._process.pid, flush=True)
        threading.Thread(target=search, args=({NESTED!r}, {NEAR_MISS!r}), daemon=True).start()
        time.sleep(0.3)
        os.kill(os.getpid(), 9)
        """
    )
    command = [sys.executable, "-c", program]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    child = int(done.stdout.split()[0])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.2)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False
