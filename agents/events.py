"""Run events, and the run state rebuilt from them.

The runner never changes its state directly: it records an event (logging it first when the
run is persisted) and applies it. Resuming applies the same events read back from the log, so
a resumed run is in exactly the state the crashed one had reached.

Persisted events (the log): `run_started`, `message` (a reminder or repair turn the runner
added), `model_response`, `approval` (the approval policy's answer for a held-back call, with
the rule that held it), `tool_started`, `tool_finished`, `run_finished`, `run_failed`,
`run_resumed`. Stream-only events (never logged): `reasoning_delta`, `content_delta`,
`tool_call_delta`, `retry`, `warning`, `step_started` (before each model request).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import RunLogError
from .result import Usage

# `message` events whose user-role turn the runner wrote itself (output and tool-call repairs).
RUNNER_TURN_REASONS = frozenset({"repair", "tool_call_repair"})

PERSISTED = frozenset(
    {
        "run_started",
        "message",
        "model_response",
        "approval",
        "tool_started",
        "tool_finished",
        "run_finished",
        "run_failed",
        "run_resumed",
    }
)
STREAM_ONLY = frozenset(
    {"reasoning_delta", "content_delta", "tool_call_delta", "retry", "warning", "step_started"}
)
# Tool outcomes of calls that never reached the tool (an error, a timeout or an interruption
# may come after the tool did its work).
UNREACHED = frozenset({"denied", "invalid_arguments", "unknown_tool", "truncated"})
# Tool outcomes that use up the tool's retry budget.
FAILURES = frozenset({"error", "timeout", "invalid_arguments"})


@dataclass(frozen=True)
class Event:
    type: str
    data: dict[str, Any]
    seq: int | None = None  # position in the log (1-based); None for stream-only events

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "type": self.type, **self.data}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Event:
        data = {k: v for k, v in obj.items() if k not in ("seq", "type")}
        return cls(obj["type"], data, obj.get("seq"))


@dataclass
class PendingCall:
    id: str
    name: str
    arguments: str
    started: bool = False
    approval: bool | None = None  # the approval policy's answer, once asked (never asked twice)
    status: str | None = None
    result: str | None = None


@dataclass
class RunState:
    messages: list[dict[str, Any]] = field(default_factory=list)
    # positions in `messages` of what the runner wrote itself: its user-role turns (repair
    # prompts) and the tool results no tool returned (denials, argument errors, unknown tools,
    # errors, timeouts, interruptions). They quote the model's output, so they vouch for
    # nothing (`trust.Sources.of`)
    runner_turns: set[int] = field(default_factory=set)
    # positions of the results of calls that reached no tool (denied, invalid arguments, unknown
    # tool, cut off): nothing they carried can be in any store (`trust.Sources.of`)
    unreached: set[int] = field(default_factory=set)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    tool_calls: int = 0
    repairs: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    pending: list[PendingCall] = field(default_factory=list)
    # every `approval` event's data (call_id, name, arguments, rule, parameter, reason, granted), in order
    approvals: list[dict[str, Any]] = field(default_factory=list)
    invalid_calls: list[dict[str, Any]] = field(default_factory=list)  # flagged, awaiting a repair turn
    last_finish_reason: str = "stop"
    finished: bool = False
    output: Any = None
    content: str = ""
    failed: str | None = None
    warnings: list[str] = field(default_factory=list)

    def apply(self, event: Event) -> None:
        d = event.data
        kind = event.type
        if kind == "run_started":
            self.messages = [dict(m) for m in d["messages"]]
            self.fingerprint = d.get("fingerprint", {})
        elif kind == "message":
            if d.get("reason") in RUNNER_TURN_REASONS:
                self.runner_turns.add(len(self.messages))
            self.messages.append(d["message"])
            self.repairs += d.get("reason") == "repair"
            if d.get("reason") == "tool_call_repair":
                for name in d.get("names", []):  # a malformed call uses up its tool's retry budget
                    self.failures[name] = self.failures.get(name, 0) + 1
                self.invalid_calls = []
        elif kind == "model_response":
            message = d["message"]
            self.messages.append(message)
            self.steps += 1
            self.usage.add(d.get("usage"))
            self.last_finish_reason = d.get("finish_reason") or "stop"
            self.pending = [
                PendingCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                for c in message.get("tool_calls") or []
            ]
            self.warnings.extend(d.get("warnings", []))
            self.invalid_calls = list(d.get("invalid_tool_calls", []))
        elif kind == "approval":
            self.approvals.append({"parameter": None, **d})  # older logs lack the parameter
            self._call(d["call_id"]).approval = bool(d["granted"])
        elif kind == "tool_started":
            self._call(d["call_id"]).started = True
        elif kind == "tool_finished":
            call = self._call(d["call_id"])
            call.status, call.result = d["status"], d["result"]
            self.tool_calls += 1
            if d["status"] in FAILURES:
                self.failures[call.name] = self.failures.get(call.name, 0) + 1
            if all(c.result is not None for c in self.pending):
                # Results go back in call order, whatever order the tools finished in.
                start = len(self.messages)
                for i, c in enumerate(self.pending):
                    if c.status != "ok":
                        self.runner_turns.add(start + i)
                    if c.status in UNREACHED:
                        self.unreached.add(start + i)
                self.messages.extend(
                    {"role": "tool", "tool_call_id": c.id, "content": c.result} for c in self.pending
                )
                self.pending = []
        elif kind == "run_finished":
            self.finished = True
            self.output = d.get("output")
            self.content = d.get("content", "")
            self.failed = None
        elif kind == "run_failed":
            self.failed = d.get("error")
        elif kind == "run_resumed":
            self.failed = None
        elif kind not in STREAM_ONLY:
            raise RunLogError(f"event log: unknown event type {kind!r} (seq {event.seq})")

    def _call(self, call_id: str) -> PendingCall:
        for call in self.pending:
            if call.id == call_id:
                return call
        raise RunLogError(f"event log: result for call {call_id!r}, which is not awaiting one")

    @classmethod
    def replay(cls, events: list[Event]) -> RunState:
        if not events or events[0].type != "run_started":
            first = events[0].type if events else "no event at all"
            raise RunLogError(f"event log: the first event must be run_started, got {first}")
        state = cls()
        for event in events:
            state.apply(event)
        return state
