"""Run policies as pluggable objects: limits, approval, transport retries, tool execution.

The runner consults these and nothing else, so changing behaviour means passing a different
object, not threading a new flag through the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import queue
import random
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import openai

from .errors import AgentConfigError, IncompleteStream
from .tools import PreparedCall, ToolContext, error_line, result_text, sendable
from .trust import Hold, UntrustedContent


def _transport_errors() -> tuple[type[BaseException], ...]:
    """TransportError of the HTTP library under the openai client: httpx2 from openai 3, httpx
    before (both may be installed)."""
    found = []
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            found.append(importlib.import_module(name).TransportError)
    return tuple(found)


_TRANSPORT_ERRORS = _transport_errors()

# --------------------------------------------------------------------------------------------
# Limits


@dataclass(frozen=True)
class Limits:
    """Hard bounds on one run. `None` disables a bound.

    * `max_steps`: model requests (a repair retry counts as a step).
    * `max_tool_calls`: calls the model makes, executed or answered with an error.
    * `wall_clock_s`: time for the whole run (measured per process: a resume starts a new clock).
    * `tool_timeout_s`: default per-call timeout; a tool may override it.
    * `max_total_tokens`: prompt + completion tokens over all requests, as the server reports them;
      each request's `max_tokens` is also capped by what is left.
    * `max_tool_result_chars`: longer tool results are cut, with a note saying so.
    """

    max_steps: int | None = 20
    max_tool_calls: int | None = 64
    wall_clock_s: float | None = 900.0
    tool_timeout_s: float = 60.0
    max_total_tokens: int | None = None
    max_tool_result_chars: int = 20_000
    parallel_tool_calls: bool = True


# --------------------------------------------------------------------------------------------
# Approval


class ApprovalPolicy(Protocol):
    """Decides whether a held-back call may run: a call of a tool marked `needs_approval`, or one
    the untrusted-content policy holds back. `why` says which rule and names the argument
    (`trust.Hold`); a policy whose `approve` takes only the name and the arguments works too."""

    def approve(self, tool_name: str, arguments: dict[str, Any], why: Hold) -> bool: ...


class DenyAll:
    """The default: nothing that needs approval runs."""

    def approve(self, tool_name: str, arguments: dict[str, Any], why: Hold | None = None) -> bool:
        return False


class ApproveCalls:
    """Grants exactly the listed calls: same tool name and equal arguments (key order ignored)."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self._granted = {(name, _canonical(args)) for name, args in calls}

    def approve(self, tool_name: str, arguments: dict[str, Any], why: Hold | None = None) -> bool:
        return (tool_name, _canonical(arguments)) in self._granted


class ApproveWith:
    """Asks a callback (e.g. a console prompt) for each call: `decide(tool_name, arguments)`, or
    `decide(tool_name, arguments, why)` to be told why the call is held back."""

    def __init__(self, decide: Callable[..., Any]) -> None:
        if not callable(decide):
            raise AgentConfigError(f"ApproveWith needs a callable, got {type(decide).__name__}")
        if inspect.iscoroutinefunction(decide):
            raise AgentConfigError(
                f"ApproveWith needs a plain function that returns True or False; {decide!r} is async"
            )
        self._decide = decide
        self._takes_why = _takes_why(decide)

    def approve(self, tool_name: str, arguments: dict[str, Any], why: Hold | None = None) -> bool:
        if why is not None and self._takes_why:
            return _answer(self._decide(tool_name, arguments, why), self._decide)
        return _answer(self._decide(tool_name, arguments), self._decide)


def ask(policy: ApprovalPolicy, tool_name: str, arguments: dict[str, Any], why: Hold) -> bool:
    """The policy's answer for this call; `why` is passed when its `approve` takes it."""
    if _takes_why(policy.approve):
        return _answer(policy.approve(tool_name, arguments, why), policy)
    return _answer(policy.approve(tool_name, arguments), policy)  # type: ignore[call-arg]


def _answer(answer: Any, source: Any) -> bool:
    """An approver's answer as a bool; an awaitable (an async approver) is an error, never a
    grant (a coroutine object is truthy)."""
    if inspect.isawaitable(answer):
        if inspect.iscoroutine(answer):
            answer.close()
        raise AgentConfigError(
            f"the approver {source!r} returned an awaitable; approvers must be synchronous"
        )
    return bool(answer)


def _takes_why(fn: Callable[..., Any]) -> bool:
    """Whether `fn` accepts a third positional argument."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: the two-argument form
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


def _canonical(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------------------------
# Transport retries


_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of a *model request* after transport errors, with exponential backoff and jitter.

    A retry re-sends the same request; tools only run after a complete response was received and
    logged, so a retry can never run a tool twice. `max_attempts` counts the first try.
    """

    max_attempts: int = 4
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    jitter: float = 0.5  # the fraction of each delay that is drawn at random

    def retryable(self, error: BaseException) -> bool:
        if isinstance(error, openai.APIStatusError):
            return error.status_code in _RETRY_STATUS
        return isinstance(error, (openai.APIConnectionError, IncompleteStream, *_TRANSPORT_ERRORS))

    def delay_s(
        self, attempt: int, error: BaseException | None = None, rng: random.Random | None = None
    ) -> float:
        """Delay before retry number `attempt` (1-based); a server's Retry-After wins if larger."""
        rng = rng or random
        cap = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        delay = cap * (1 - self.jitter) + rng.uniform(0, cap * self.jitter)
        return max(delay, _retry_after(error))


def _retry_after(error: BaseException | None) -> float:
    response = getattr(error, "response", None)
    header = response.headers.get("retry-after") if response is not None else None
    try:
        return min(float(header), 60.0) if header else 0.0
    except ValueError:
        return 0.0


# --------------------------------------------------------------------------------------------
# Tool execution


@dataclass(frozen=True)
class ToolOutcome:
    status: Literal["ok", "error", "timeout"]
    text: str


class ToolExecutor(Protocol):
    async def execute(self, call: PreparedCall, ctx: ToolContext, timeout_s: float) -> ToolOutcome: ...


def error_text(error: BaseException) -> str:
    """One short line for the model: the exception type and message, never a traceback."""
    return sendable(f"Error: {error_line(error)}"[:500])


class ThreadExecutor:
    """Runs the tool in a worker thread of this process.

    The tool shares memory with the caller (it may mutate Python objects), but Python cannot
    stop a thread: on timeout the model is told so and the run goes on, while the thread runs to
    completion in the background. Coroutine tools run on the event loop and are cancelled.
    """

    async def execute(self, call: PreparedCall, ctx: ToolContext, timeout_s: float) -> ToolOutcome:
        try:
            if inspect.iscoroutinefunction(call.tool.fn):
                value = await asyncio.wait_for(call.tool.invoke(call.kwargs, ctx), timeout_s)
            else:
                value = await asyncio.wait_for(
                    _in_daemon_thread(call.tool.invoke, call.kwargs, ctx), timeout_s
                )
            text = result_text(value)
        except TimeoutError:
            return ToolOutcome("timeout", f"Error: {call.tool.name} timed out after {timeout_s:g} s.")
        except Exception as error:
            return ToolOutcome("error", error_text(error))
        return ToolOutcome("ok", text)


class _DaemonWorkers:
    """Daemon threads that run tool functions, reused from call to call.

    Starting a thread per call costs a GIL hand-off (`Thread.start` waits for the new thread),
    which on a busy machine was milliseconds per call. A timed-out tool keeps its worker busy
    (Python cannot stop it), so a call that finds no idle worker starts a new one.
    """

    def __init__(self) -> None:
        self._reset()
        # A forked child has none of these threads: without a reset it would queue jobs for
        # workers it believes idle, and wait for them forever.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # that worker is now promised to this job
        self._jobs.put(job)
        if spawn:
            threading.Thread(target=self._work, name="tool", daemon=True).start()

    def _work(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1


_workers = _DaemonWorkers()


def _in_daemon_thread(fn: Any, *args: Any) -> asyncio.Future[Any]:
    """Like `asyncio.to_thread`, but in a daemon thread outside the loop's executor, so an
    abandoned (timed-out) tool keeps neither the event loop's shutdown nor the process waiting."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as exc:
            value, error = None, exc
        # RuntimeError: the loop is gone, so nobody waits for this result any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, error)

    _workers.submit(work)
    return future


class ProcessExecutor:
    """Runs each call in a forked child process and SIGKILLs it at the timeout.

    Isolation is something a tool declares (`isolation="process"`) or a run chooses
    (`Policies(executor=ProcessExecutor())`), never the default: it is the only way to really
    *stop* a stuck tool (a thread cannot be killed), but the tool's in-memory side effects stay in
    the child and are lost, so only tools that act through their return value or external state
    (files, network, databases) fit it; the result must be text or JSON-serialisable (it is
    converted in the child). Falls back to threads where `fork` does not exist.
    """

    async def execute(self, call: PreparedCall, ctx: ToolContext, timeout_s: float) -> ToolOutcome:
        if not hasattr(os, "fork"):
            return await ThreadExecutor().execute(call, ctx, timeout_s)
        # Fork from a worker thread: the child then has no running event loop of its own.
        return await asyncio.to_thread(_run_forked, call, ctx, timeout_s)


def _run_forked(call: PreparedCall, ctx: ToolContext, timeout_s: float) -> ToolOutcome:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: run, report, and leave without running any parent cleanup
        try:
            os.close(read_fd)
            try:
                value = call.tool.invoke(call.kwargs, ctx)
                if inspect.isawaitable(value):
                    value = asyncio.run(value)
                payload = {"status": "ok", "text": result_text(value)}
            except BaseException as error:
                payload = {"status": "error", "text": error_text(error)}
            data = json.dumps(payload).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view) :]
            os.close(write_fd)  # EOF now: the parent need not wait for this process's teardown
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return ToolOutcome(
                    "timeout", f"Error: {call.tool.name} timed out after {timeout_s:g} s and was stopped."
                )
            ready, _, _ = select.select([read_fd], [], [], remaining)
            if ready:
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(read_fd)
    if not chunks:
        _, status = os.waitpid(pid, 0)
        return ToolOutcome(
            "error", f"Error: {call.tool.name} crashed (exit status {status}) without a result."
        )
    _reap_later(pid)
    payload = json.loads(b"".join(chunks))
    return ToolOutcome(payload["status"], payload["text"])


_exiting: list[int] = []  # children that sent their result and may still be exiting
_exiting_lock = threading.Lock()


def _reap_later(pid: int) -> None:
    """Reap the children of earlier calls, not the one that just answered.

    Its exit (tearing down a copy of our address space) takes about as long as the fork did; it
    overlaps with the run going on, and the next call reaps it. So at most the latest child of
    each concurrent call is left as a zombie, and only until the next call.
    """
    with _exiting_lock:
        earlier = _exiting[:]
        _exiting[:] = [pid]
    for child in earlier:
        with contextlib.suppress(ChildProcessError):  # already reaped by someone else
            os.waitpid(child, 0)


def default_executor() -> ToolExecutor:
    """In-process: a tool's effects on Python objects are the effects the caller sees."""
    return ThreadExecutor()


# --------------------------------------------------------------------------------------------


class _Auto:
    """`Policies.untrusted`'s default: the policy is on exactly when a tool declares an effect."""

    def __repr__(self) -> str:
        return "AUTO"


AUTO: Any = _Auto()


@dataclass(frozen=True)
class Policies:
    """Everything about *how* a run is allowed to proceed, bundled for an Agent.

    `untrusted`: the untrusted-content policy (trust.py). AUTO (the default) turns it on for an
    agent any of whose tools declares an `effect`; `UntrustedContent()` turns it on for any agent,
    None off. Calls it holds back go to `approval` (DenyAll: fail closed).
    """

    limits: Limits = field(default_factory=Limits)
    approval: ApprovalPolicy = field(default_factory=DenyAll)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    executor: ToolExecutor = field(default_factory=default_executor)
    untrusted: UntrustedContent | None = AUTO

    def __post_init__(self) -> None:
        expected = {
            "limits": Limits,
            "retry": RetryPolicy,
        }
        for name, kind in expected.items():
            if not isinstance(getattr(self, name), kind):
                raise AgentConfigError(
                    f"Policies.{name} must be a {kind.__name__}, got {type(getattr(self, name)).__name__}"
                )
        if not callable(getattr(self.approval, "approve", None)):
            raise AgentConfigError(
                f"Policies.approval must have an approve(tool_name, arguments) method, got "
                f"{type(self.approval).__name__}"
            )
        if not callable(getattr(self.executor, "execute", None)):
            raise AgentConfigError(
                f"Policies.executor must have an async execute(call, ctx, timeout_s) method, got "
                f"{type(self.executor).__name__}"
            )
        if self.untrusted is not AUTO and not isinstance(self.untrusted, UntrustedContent | None):
            raise AgentConfigError(
                f"Policies.untrusted must be UntrustedContent(), None or AUTO, got {self.untrusted!r}"
            )

    def untrusted_policy(self, tools: Any) -> UntrustedContent | None:
        """The policy in force for an agent with these tools."""
        if self.untrusted is AUTO:
            return UntrustedContent() if any(t.effect is not None for t in tools) else None
        return self.untrusted

    def executor_for(self, isolation: str | None) -> ToolExecutor:
        if isolation == "thread":
            return ThreadExecutor()
        if isolation == "process":
            return ProcessExecutor()
        return self.executor
