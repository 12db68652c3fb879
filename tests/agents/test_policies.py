"""Every policy: limits, approval, transport retries, tool timeouts, retry budgets."""

from __future__ import annotations

import asyncio
import os
import random
import time

import httpx
import openai
import pytest
from sglang_ds41.agents import (
    Agent,
    AgentConfigError,
    ApproveCalls,
    ApproveWith,
    LimitExceeded,
    ModelRequestError,
    Policies,
    ProcessExecutor,
    RetryPolicy,
    Runner,
    ThreadExecutor,
    ToolContext,
    function_tool,
)
from sglang_ds41.agents.testing import Reply

from .conftest import fast_policies

RUNS: list[str] = []


@function_tool
def ping(tag: str) -> str:
    """Answer pong."""
    RUNS.append(tag)
    return f"pong {tag}"


@function_tool(needs_approval=True)
def delete_account(user: str) -> str:
    """Delete a user account."""
    RUNS.append(f"delete {user}")
    return "deleted"


@function_tool(max_retries=1)
def always_fails(x: int) -> str:
    """Raises."""
    raise ValueError(f"boom {x}")


@pytest.fixture(autouse=True)
def _reset():
    RUNS.clear()


def agent(**policy_kwargs) -> Agent:
    policies = policy_kwargs.pop("policies", None) or fast_policies(**policy_kwargs)
    return Agent(name="p", tools=[ping, delete_account, always_fails], policies=policies)


def loop_forever(tag: str = "x"):
    return lambda body, i: Reply(reasoning_content="r", tool_calls=[("ping", {"tag": f"{tag}{i}"})])


# ---- limits ---------------------------------------------------------------------------------


def test_max_steps_stops_the_run_and_keeps_the_transcript(serve):
    server = serve(loop_forever())
    with pytest.raises(
        LimitExceeded, match=r"max_steps reached: the run made 3 model requests \(limit 3\)"
    ) as info:
        Runner.run_sync(agent(max_steps=3), "go", base_url=server.base_url)
    assert len(server.requests) == 3
    assert sum(m["role"] == "tool" for m in info.value.messages) == 3


def test_max_tool_calls_refuses_a_batch_that_would_exceed_it(serve):
    server = serve([Reply(reasoning_content="r", tool_calls=[("ping", {"tag": str(i)}) for i in range(3)])])
    with pytest.raises(
        LimitExceeded, match=r"max_tool_calls reached: the model asked for 3 more calls after 0 \(limit 2\)"
    ):
        Runner.run_sync(agent(max_tool_calls=2), "go", base_url=server.base_url)
    assert RUNS == []


def test_wall_clock_limit(serve):
    server = serve(
        lambda body, i: Reply(reasoning_content="r", tool_calls=[("ping", {"tag": "t"})], delay_s=0.3)
    )
    start = time.monotonic()
    with pytest.raises(LimitExceeded, match="wall_clock_s"):
        Runner.run_sync(agent(wall_clock_s=0.5, max_steps=None), "go", base_url=server.base_url)
    assert time.monotonic() - start < 3


def test_token_budget_caps_max_tokens_and_stops_the_run(serve):
    usage = {"prompt_tokens": 300, "completion_tokens": 50, "total_tokens": 350}
    server = serve(
        lambda body, i: Reply(reasoning_content="r", tool_calls=[("ping", {"tag": "t"})], usage=usage)
    )
    with pytest.raises(
        LimitExceeded, match=r"max_total_tokens reached: the run used 700 tokens \(limit 600\)"
    ):
        Runner.run_sync(agent(max_total_tokens=600), "go", base_url=server.base_url)
    assert [b["max_tokens"] for b in server.bodies] == [600, 250]


# ---- approval -------------------------------------------------------------------------------


def test_calls_needing_approval_are_denied_by_default(serve):
    server = serve(
        [
            Reply(reasoning_content="r", tool_calls=[("delete_account", {"user": "bob"})]),
            Reply(reasoning_content="r", content="could not"),
        ]
    )
    result = Runner.run_sync(agent(), "go", base_url=server.base_url)
    assert RUNS == []
    assert result.messages[2]["content"].startswith("Denied: delete_account needs approval")


def test_approval_grants_only_the_exact_call(serve):
    server = serve(
        [
            Reply(
                reasoning_content="r",
                tool_calls=[("delete_account", {"user": "bob"}), ("delete_account", {"user": "eve"})],
            ),
            Reply(reasoning_content="r", content="done"),
        ]
    )
    policies = Policies(
        approval=ApproveCalls([("delete_account", {"user": "bob"})]), executor=ThreadExecutor()
    )
    result = Runner.run_sync(agent(policies=policies), "go", base_url=server.base_url)
    assert RUNS == ["delete bob"]
    contents = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert contents[0] == "deleted" and contents[1].startswith("Denied:")


# ---- transport retries ----------------------------------------------------------------------


def test_retry_delays_grow_exponentially_with_bounded_jitter():
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=8.0, jitter=0.5)
    rng = random.Random(0)
    for attempt, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        delays = [policy.delay_s(attempt, rng=rng) for _ in range(200)]
        assert all(cap * 0.5 <= d <= cap for d in delays)
        assert max(delays) - min(delays) > cap * 0.3  # actually jittered


def test_retry_after_header_is_respected():
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(429, headers={"retry-after": "3"}, request=request)
    error = openai.RateLimitError("slow down", response=response, body=None)
    assert RetryPolicy(base_delay_s=0.1).delay_s(1, error) == 3.0


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (401, False), (404, False), (408, True), (429, True), (500, True), (503, True)],
)
def test_which_errors_are_retried(status, retryable):
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    error = openai.APIStatusError("x", response=httpx.Response(status, request=request), body=None)
    assert RetryPolicy().retryable(error) is retryable
    assert RetryPolicy().retryable(openai.APIConnectionError(request=request))
    assert not RetryPolicy().retryable(ValueError("bug"))


def test_dropped_connection_is_retried_and_the_tool_runs_once(serve):
    server = serve(
        [
            Reply(reasoning_content="r", tool_calls=[("ping", {"tag": "a"})]),
            Reply(drop=True),
            Reply(status=503),
            Reply(reasoning_content="r", content="done"),
        ]
    )
    policies = Policies(retry=RetryPolicy(base_delay_s=0.01), executor=ThreadExecutor())
    result = Runner.run_sync(agent(policies=policies), "go", base_url=server.base_url)
    assert result.final_output == "done" and RUNS == ["a"]
    assert len(server.requests) == 4
    assert server.bodies[1] == server.bodies[3]  # the very same request was re-sent


def test_stream_broken_midway_is_retried_from_scratch(serve):
    server = serve(
        [
            Reply(reasoning_content="long reasoning", content="partial answer", drop_mid_stream=True),
            Reply(reasoning_content="r", content="full answer"),
        ]
    )
    policies = Policies(retry=RetryPolicy(base_delay_s=0.01), executor=ThreadExecutor())

    async def go():
        stream = Runner.run_streamed(agent(policies=policies), "go", base_url=server.base_url)
        events = [e async for e in stream]
        return stream.result, events

    result, events = asyncio.run(go())
    assert result.final_output == "full answer"
    assert [e.type for e in events].count("retry") == 1


def test_retries_give_up_after_max_attempts(serve):
    server = serve(lambda body, i: Reply(status=503, error="overloaded"))
    policies = Policies(retry=RetryPolicy(max_attempts=3, base_delay_s=0.01), executor=ThreadExecutor())
    with pytest.raises(ModelRequestError, match="failed after 3 attempts"):
        Runner.run_sync(agent(policies=policies), "go", base_url=server.base_url)
    assert len(server.requests) == 3


# ---- tool execution: timeouts and retry budgets ---------------------------------------------


@function_tool(timeout_s=0.5)
def stuck(path: str) -> str:
    """Writes its pid, then hangs."""
    with open(path, "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(60)
    return "never"


def test_process_executor_stops_a_stuck_tool(tmp_path):
    pid_file = tmp_path / "pid"
    call = stuck.prepare("c1", f'{{"path": "{pid_file}"}}')
    start = time.monotonic()
    outcome = asyncio.run(ProcessExecutor().execute(call, ToolContext("c1", "stuck"), 0.5))
    assert time.monotonic() - start < 5
    assert outcome.status == "timeout" and "was stopped" in outcome.text
    child = int(pid_file.read_text())
    assert child != os.getpid()
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(child, 0)


def test_process_executor_returns_results_and_exceptions_as_text():
    call = ping.prepare("c", '{"tag": "z"}')
    assert asyncio.run(ProcessExecutor().execute(call, ToolContext("c", "ping"), 10)).text == "pong z"
    bad = always_fails.prepare("c", '{"x": 3}')
    outcome = asyncio.run(ProcessExecutor().execute(bad, ToolContext("c", "always_fails"), 10))
    assert (outcome.status, outcome.text) == ("error", "Error: ValueError: boom 3")


def test_thread_executor_times_out_without_blocking_the_run():
    @function_tool
    def sleepy() -> str:
        """Sleeps."""
        time.sleep(1.5)
        return "late"

    start = time.monotonic()
    outcome = asyncio.run(
        ThreadExecutor().execute(sleepy.prepare("c", "{}"), ToolContext("c", "sleepy"), 0.2)
    )
    assert outcome.status == "timeout"
    assert time.monotonic() - start < 1.4


def _circular() -> list:
    value: list = []
    value.append(value)
    return value


def _nested(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


class _NoText:
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize("executor", [ThreadExecutor, ProcessExecutor])
@pytest.mark.parametrize(
    ("result", "problem"),
    [
        (_circular, "ValueError: Circular reference detected"),
        (lambda: _nested(5000), "RecursionError: maximum recursion depth exceeded"),
        (lambda: 10**5000, "ValueError: Exceeds the limit (4300 digits)"),
        (lambda: {"x": _NoText()}, "RuntimeError: no text"),
    ],
)
def test_a_result_json_cannot_hold_is_a_failed_call_not_a_crash(executor, result, problem):
    """The run went down with the serializer's exception (the thread executor's path)."""

    @function_tool
    def produce() -> object:
        """Returns a value."""
        return result()

    outcome = asyncio.run(executor().execute(produce.prepare("c", "{}"), ToolContext("c", "produce"), 10))
    assert outcome.status == "error"
    assert outcome.text.startswith(f"Error: ResultNotText: the result cannot be written as JSON ({problem}")


@pytest.mark.parametrize("executor", [ThreadExecutor, ProcessExecutor])
def test_an_exception_whose_message_cannot_be_made_is_still_a_failed_call(executor):
    @function_tool
    def fail() -> str:
        """Fails."""
        raise ValueError(10**5000)  # str() of it raises: more than 4,300 digits

    outcome = asyncio.run(executor().execute(fail.prepare("c", "{}"), ToolContext("c", "fail"), 10))
    assert (outcome.status, outcome.text) == ("error", "Error: ValueError")


def test_tool_failures_go_back_to_the_model_until_the_retry_budget_is_spent(serve):
    server = serve(lambda body, i: Reply(reasoning_content="r", tool_calls=[("always_fails", {"x": i})]))
    with pytest.raises(
        LimitExceeded, match=r"tool 'always_fails' failed 2 times \(retry budget 1\).*boom 1"
    ) as info:
        Runner.run_sync(agent(), "go", base_url=server.base_url)
    results = [m["content"] for m in info.value.messages if m["role"] == "tool"]
    assert results == ["Error: ValueError: boom 0", "Error: ValueError: boom 1"]
    assert len(server.requests) == 2


def test_thread_executor_serves_new_calls_while_a_timed_out_tool_still_runs():
    @function_tool
    def hang(seconds: float) -> str:
        """Sleeps."""
        time.sleep(seconds)
        return "late"

    async def go():
        ex = ThreadExecutor()
        first = await ex.execute(hang.prepare("a", '{"seconds": 1.5}'), ToolContext("a", "hang"), 0.1)
        start = time.monotonic()
        second = await ex.execute(ping.prepare("b", '{"tag": "q"}'), ToolContext("b", "ping"), 5)
        return first, second, time.monotonic() - start

    first, second, took = asyncio.run(go())
    assert first.status == "timeout"
    assert (second.status, second.text) == ("ok", "pong q")
    assert took < 1.0  # not queued behind the hung tool


def test_process_executor_leaves_no_children_behind():
    call = ping.prepare("c", '{"tag": "z"}')

    async def go():
        return [await ProcessExecutor().execute(call, ToolContext("c", "ping"), 10) for _ in range(10)]

    assert [o.text for o in asyncio.run(go())] == ["pong z"] * 10
    time.sleep(0.5)  # let the last child finish exiting
    unreaped = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if not pid:
            break
        unreaped += 1
    assert unreaped <= 1  # only the last call's child may still await its reaper


def test_an_approval_answers_only_its_own_call_even_when_a_server_reuses_call_ids(serve, monkeypatch):
    """Some servers number call ids per response ("call_0" every turn): a grant given for one
    turn's call must not run the next turn's call of the same id."""
    monkeypatch.setattr("sglang_ds41.agents.testing._turn", lambda body: 0)
    server = serve(
        [
            Reply(reasoning_content="r", tool_calls=[("delete_account", {"user": "bob"})]),
            Reply(reasoning_content="r", tool_calls=[("delete_account", {"user": "eve"})]),
            Reply(reasoning_content="r", content="done"),
        ]
    )
    asked = []

    def decide(name, arguments):
        asked.append(arguments["user"])
        return arguments["user"] == "bob"

    policies = Policies(approval=ApproveWith(decide), executor=ThreadExecutor())
    result = Runner.run_sync(agent(policies=policies), "go", base_url=server.base_url)
    assert asked == ["bob", "eve"] and RUNS == ["delete bob"]
    # The runner renames the repeated id (ids are unique in a run), and asks again.
    assert [(a["call_id"], a["granted"]) for a in result.approvals] == [
        ("call_0_0", True),
        ("call_1_0", False),
    ]


def test_an_async_approver_is_refused_at_setup_and_never_grants(serve):
    """A coroutine object is truthy: an async callback must never count as a grant."""

    async def decide(name, arguments):
        return False

    with pytest.raises(AgentConfigError, match="is async"):
        ApproveWith(decide)

    class AsyncPolicy:
        def approve(self, tool_name, arguments):
            return decide(tool_name, arguments)

    server = serve([Reply(reasoning_content="r", tool_calls=[("delete_account", {"user": "bob"})])])
    with pytest.raises(AgentConfigError, match="returned an awaitable"):
        Runner.run_sync(agent(policies=Policies(approval=AsyncPolicy())), "go", base_url=server.base_url)
    assert RUNS == []
