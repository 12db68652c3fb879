"""`IncrementalEncoder` gives every request the official renderer's ids (and refuses what it
refuses), whether it reuses an earlier request's ids or encodes from the start."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from sglang_ds41.encoding import EncodingError, encode_prompt, render_request
from sglang_ds41.encoding.incremental import IncrementalEncoder

from tests.encoding.oracle import wheel
from tests.encoding.strategies import Request, sessions

MODEL = "DeepSeek-V4.1-Flash"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def encoder() -> IncrementalEncoder:
    """One encoder for all generated sessions, as one server sees all its clients."""
    return IncrementalEncoder()


def _wire(request: Request):
    return request.text() if request.has_raw() else request.body


def _extends(request: Request, earlier: Request | None) -> bool:
    """`request` has `earlier`'s settings and begins with all of its messages."""
    if earlier is None:
        return False
    settings, before = dict(request.body), dict(earlier.body)
    messages, old = settings.pop("messages"), before.pop("messages")
    return settings == before and len(messages) >= len(old) and messages[: len(old)] == old


def _dropped(message: dict) -> bool:
    """A system message the renderer drops, writing nothing (ENCODING.md §2.1)."""
    return message["role"] == "system" and message["content"] in ("", [], [{"type": "text", "text": ""}])


def check_session(encoder: IncrementalEncoder, session: list[Request]) -> None:
    """Each request's ids equal the wheel's and those of our own encoding from the start, and
    its rejections are the wheel's; a request that extends the last one accepted reuses ids."""
    accepted = None
    for request in session:
        body = _wire(request)
        expected = wheel(body)
        try:
            got = encoder.encode(body)
        except EncodingError as error:
            assert expected.rejected, f"the wheel accepts what we refused: {error}"
            assert error.status_code == expected.status, (expected.error, str(error))
            continue
        assert not expected.rejected, f"the wheel refuses: {expected.error}"
        assert tuple(got.ids) == expected.ids
        assert got.ids == encode_prompt(render_request(body))
        assert got.reused < len(got.ids)
        if _extends(request, accepted) and any(not _dropped(m) for m in accepted.body["messages"]):
            assert got.reused > 0
        accepted = request


@settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(sessions())
def test_generated_sessions_get_the_official_ids(encoder, session):
    check_session(encoder, session)


@pytest.mark.slow
@settings(max_examples=2500, deadline=None, suppress_health_check=list(HealthCheck))
@given(sessions())
def test_many_generated_sessions_get_the_official_ids(encoder, session):
    check_session(encoder, session)


def test_a_small_cache_evicts_and_stays_exact():
    """A cache of 64 KiB holds a few short conversations at most; the rest are encoded again."""
    small = IncrementalEncoder(max_bytes=64 << 10)
    turns = [agent_turns(rounds=12, seed=seed) for seed in range(4)]
    for bodies in turns:
        for body in bodies:
            assert small.encode(body).ids == encode_prompt(render_request(body))
            assert small.cached_bytes <= small.max_bytes
    first = turns[0][-1]
    assert small.encode(first).reused == 0  # evicted by the later conversations


def agent_turns(rounds: int, seed: int = 0, system: str = "You are a coding agent.") -> list[dict]:
    """The requests of an agent loop: each adds the model's call and the tool's result."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Task {seed}: fix it."}]
    bodies = []
    for n in range(rounds):
        call = {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/m{n}.py"})},
        }
        reply = {"role": "assistant", "content": "", "reasoning_content": f"See {n}", "tool_calls": [call]}
        source = f"def f{n}():\n    return {n * seed}\n" * 8
        result = {"role": "tool", "tool_call_id": f"call_{n}", "content": source}
        messages = [*messages, reply, result]
        bodies.append({"model": MODEL, "messages": messages, "tools": TOOLS})
    return bodies


def test_each_turn_of_an_agent_loop_reuses_the_turns_before():
    """Turn n+1 reuses every id of turn n up to the tool result it held back (that result joins
    no later block here, but the writer cannot know it yet)."""
    fresh = IncrementalEncoder()
    bodies = agent_turns(rounds=6)
    previous = None
    for body in bodies:
        got = fresh.encode(body)
        assert got.ids == encode_prompt(render_request(body))
        if previous is None:
            assert got.reused == 0
        else:
            held_back = len(previous) - previous[::-1].index(1)  # up to the last end of turn (EOS)
            assert got.reused == held_back
        previous = got.ids


def test_nothing_is_reused_across_different_settings_or_earlier_messages():
    fresh = IncrementalEncoder()
    for body in agent_turns(rounds=3):
        fresh.encode(body)
    last = agent_turns(rounds=4)[-1]
    assert fresh.encode(last).reused > 0
    other_system = agent_turns(rounds=4, system="You are a coding agent!")[-1]
    assert fresh.encode(other_system).reused == 0
    no_thinking = {**last, "thinking": {"type": "disabled"}}
    assert fresh.encode(no_thinking).reused == 0
    edited = json.loads(json.dumps(last))
    edited["messages"][3]["content"] = edited["messages"][3]["content"].replace("return", "yield", 1)
    got = fresh.encode(edited)
    assert got.ids == encode_prompt(render_request(edited))
    assert got.reused == 0


def test_a_bad_new_message_gets_the_whole_requests_error():
    fresh = IncrementalEncoder()
    bodies = agent_turns(rounds=2)
    fresh.encode(bodies[0])
    stray_result = {"role": "tool", "tool_call_id": "x", "content": ""}
    stray = {**bodies[1], "messages": [*bodies[1]["messages"], stray_result]}
    with pytest.raises(EncodingError) as ours:
        fresh.encode(stray)
    with pytest.raises(EncodingError) as whole:
        render_request(stray)
    assert str(ours.value) == str(whole.value)
    assert "Messages with role 'tool' must be a response" in str(ours.value)


def test_nothing_may_follow_a_continued_turn():
    fresh = IncrementalEncoder()
    continued = {"role": "assistant", "content": "He", "prefix": True}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}, continued]}
    assert fresh.encode(body).ids == encode_prompt(render_request(body))
    longer = {**body, "messages": [*body["messages"], {"role": "user", "content": "again"}]}
    with pytest.raises(EncodingError, match="prefix set true with message which is not final"):
        fresh.encode(longer)


@pytest.mark.parametrize(
    "odd", [float("nan"), float("inf"), ("a",), 2**64], ids=["nan", "inf", "tuple", "big-int"]
)
def test_a_message_is_reused_only_for_the_same_json_value(odd):
    """A value JSON cannot hold, or holds only as another value (NaN written as null, a tuple
    as an array), never matches the cached message it serializes like: the request is refused
    or encoded as `render_request` does it."""
    fresh = IncrementalEncoder()
    first = agent_turns(rounds=2)[-1]
    fresh.encode(first)
    normal = {**first["messages"][-1], "metadata": None if odd != ("a",) else ["a"]}
    fresh.encode({**first, "messages": [*first["messages"][:-1], normal]})
    changed = {**first, "messages": [*first["messages"][:-1], {**normal, "metadata": odd}]}
    try:
        expected = encode_prompt(render_request(changed))
    except EncodingError as error:
        with pytest.raises(EncodingError) as ours:
            fresh.encode(changed)
        assert str(ours.value) == str(error)
        return
    got = fresh.encode(changed)
    assert got.ids == expected
