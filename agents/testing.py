"""A scripted OpenAI-compatible server on 127.0.0.1 for tests, examples and benchmarks.

It serves `/v1/chat/completions` (plain and streamed) from a script of `Reply`s and records
every request body, so a test can check what a client sent. With `validate=True` each request is
first rendered by `sglang_ds41.encoding` exactly as our server would, and refused with HTTP 400
when the DeepSeek renderer refuses it (unanswered calls, bad roles, ...). A `Reply(raw=...)` is
model output text (`reasoning</think>content` plus DSML calls) run through the real output
parser with the request's parsing options, so the DSML path is exercised end to end.

Every request's handling time is recorded in `timings` (`Timing`: perf_counter start/end and the
handler thread's CPU time), so a benchmark can subtract the server's own work (JSON decoding of
the growing transcript, rendering when validating, encoding the reply) from a client's step time.

This stands in for a real SGLang server with scripted output; the runner does not know which
of the two it talks to.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted completion. `tool_calls` items are `(name, arguments)`; arguments are a dict
    (sent as compact JSON) or the exact arguments text. `finish_reason` defaults to tool_calls
    when there are calls, else stop."""

    content: str = ""
    reasoning_content: str | None = None
    tool_calls: Sequence[tuple[str, Any]] = ()
    finish_reason: str | None = None
    raw: str | None = None
    usage: dict[str, int] | None = None
    status: int = 200
    error: str = "scripted error"
    drop: bool = False  # close the connection without an answer (a transport error)
    drop_mid_stream: bool = False  # streamed: send some chunks, then close
    delay_s: float = 0.0
    call_ids: Sequence[str] | None = None  # the calls' ids as sent (a server that omits or reuses them)


Script = Sequence[Reply] | Callable[[dict[str, Any], int], Reply]


def by_turn(replies: Sequence[Reply]) -> Callable[[dict[str, Any], int], Reply]:
    """Pick the reply by the number of assistant turns already in the request.

    The answer then depends only on the conversation, not on how many requests came before, so a
    run that crashed and resumed gets the same replies as an uninterrupted one.
    """

    def pick(body: dict[str, Any], _: int) -> Reply:
        turn = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        if turn >= len(replies):
            return Reply(status=500, error=f"script has no reply for turn {turn}")
        return replies[turn]

    return pick


@dataclass
class Recorded:
    body: dict[str, Any]
    prompt: str | None = None  # the rendered prompt, when validate=True


@dataclass(frozen=True)
class Timing:
    """One request as the server saw it, from its parsed request line to the last byte written.

    `cpu_s` is the handler thread's own CPU time: unlike `end - start` it leaves out time spent
    waiting for the GIL while an in-process client ran, which is the client's work, not ours.
    """

    path: str
    start: float  # time.perf_counter()
    end: float
    cpu_s: float

    @property
    def wall_s(self) -> float:
        return self.end - self.start


@dataclass
class ScriptedServer:
    script: Script
    validate: bool = False
    requests: list[Recorded] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._timed = threading.Condition(self._lock)
        self._count = 0
        self._httpd: ThreadingHTTPServer | None = None

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> ScriptedServer:
        owner = self

        class Handler(_Handler):
            server_owner = owner

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests]

    def wait_for_timings(self, count: int, timeout_s: float = 5.0) -> list[Timing]:
        """The first `count` timings, once recorded.

        A handler records its timing after the last byte went out, so a client that already
        has its response can still be ahead of that record; this waits for it (bounded).
        """
        with self._timed:
            if not self._timed.wait_for(lambda: len(self.timings) >= count, timeout=timeout_s):
                raise TimeoutError(f"{len(self.timings)} of {count} requests timed after {timeout_s} s")
            return list(self.timings[:count])

    # ---- one request ----------------------------------------------------------------------

    def next_reply(self, body: dict[str, Any]) -> tuple[Reply, int, Recorded]:
        with self._lock:
            index = self._count
            self._count += 1
            recorded = Recorded(body)
            self.requests.append(recorded)
        if callable(self.script):
            reply = self.script(body, index)
        elif index < len(self.script):
            reply = self.script[index]
        else:
            reply = Reply(status=500, error=f"script exhausted after {len(self.script)} replies")
        return reply, index, recorded

    def completion(
        self, body: dict[str, Any], reply: Reply, index: int, recorded: Recorded
    ) -> dict[str, Any]:
        """The message fields of a reply: (content, reasoning, calls, finish)."""
        rendered = None
        if self.validate or reply.raw is not None:
            from sglang_ds41.encoding import render_request  # only tests that ask for it pay for it

            rendered = render_request(_renderable(body))  # EncodingError -> HTTP 400 (handler)
            recorded.prompt = rendered.prompt.text
        if reply.raw is not None:
            from sglang_ds41.encoding import parse_text

            finish = reply.finish_reason or "stop"
            parsed = parse_text(
                reply.raw, rendered.parsing, finish, tool_call_id=lambda i: f"call_{_turn(body)}_{i}"
            )
            calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in parsed.tool_calls]
            reasoning = parsed.reasoning_content if rendered.conversation.thinking else None
            return {
                "content": parsed.content,
                "reasoning": reasoning,
                "calls": calls,
                "finish": parsed.finish_reason,
            }
        calls = [
            {
                "id": reply.call_ids[i] if reply.call_ids is not None else f"call_{_turn(body)}_{i}",
                "name": name,
                "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
            }
            for i, (name, args) in enumerate(reply.tool_calls)
        ]
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        return {
            "content": reply.content,
            "reasoning": reply.reasoning_content,
            "calls": calls,
            "finish": finish,
        }


def _turn(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")


def _renderable(body: dict[str, Any]) -> dict[str, Any]:
    # Transport-only fields the renderer has no business with.
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}


def _usage(reply: Reply) -> dict[str, int]:
    return dict(reply.usage or {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110})


class _Handler(BaseHTTPRequestHandler):
    server_owner: ScriptedServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid the 40 ms ACK stall

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def parse_request(self) -> bool:
        # The request line was just read: from here on the time is the server's own work.
        self._start, self._cpu = time.perf_counter(), time.thread_time()
        return super().parse_request()

    def _timed(self, handle: Callable[[], None]) -> None:
        try:
            handle()
        finally:
            timing = Timing(
                self.path, self._start, time.perf_counter(), time.thread_time() - self._cpu
            )
            with self.server_owner._timed:
                self.server_owner.timings.append(timing)
                self.server_owner._timed.notify_all()

    def do_GET(self) -> None:
        self._timed(self._get)

    def do_POST(self) -> None:
        self._timed(self._post)

    def _get(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": "DeepSeek-V4.1-Flash", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def _post(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        owner = self.server_owner
        reply, index, recorded = owner.next_reply(body)
        if reply.delay_s:
            time.sleep(reply.delay_s)
        if reply.drop:
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if reply.status != 200:
            self._json(reply.status, {"error": {"message": reply.error, "type": "scripted"}})
            return
        try:
            out = owner.completion(body, reply, index, recorded)
        except Exception as error:  # the renderer refused the request, as a real server would
            self._json(400, {"error": {"message": str(error), "type": "invalid_request_error"}})
            return
        if body.get("stream"):
            self._stream(body, reply, out)
        else:
            self._json(200, _completion_object(body, out, _usage(reply)))

    def _json(self, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, body: dict[str, Any], reply: Reply, out: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        chunks = list(_chunks(out))
        if reply.drop_mid_stream:
            chunks = chunks[: max(1, len(chunks) // 2)]
        for delta, finish in chunks:
            self._event(_chunk_object(body, delta, finish))
        if reply.drop_mid_stream:
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({**_chunk_object(body, None, None), "choices": [], "usage": _usage(reply)})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, obj: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")


def _pieces(text: str, n: int = 3) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _chunks(out: dict[str, Any]):
    """(delta, finish_reason) pairs: role, reasoning and content in pieces, calls piecewise."""
    yield {"role": "assistant", "content": ""}, None
    for piece in _pieces(out["reasoning"] or ""):
        yield {"reasoning_content": piece}, None
    for piece in _pieces(out["content"]):
        yield {"content": piece}, None
    for index, call in enumerate(out["calls"]):
        yield (
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": ""},
                    }
                ]
            },
            None,
        )
        for piece in _pieces(call["arguments"]):
            yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, None
    yield {}, out["finish"]


def _chunk_object(body: dict[str, Any], delta: dict[str, Any] | None, finish: str | None) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": body.get("model", ""),
        "choices": choices,
    }


def _completion_object(body: dict[str, Any], out: dict[str, Any], usage: dict[str, int]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": out["content"]}
    if out["reasoning"] is not None:
        message["reasoning_content"] = out["reasoning"]
    if out["calls"]:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in out["calls"]
        ]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", ""),
        "choices": [{"index": 0, "message": message, "finish_reason": out["finish"]}],
        "usage": usage,
    }
