"""One V4.1 choice as the server hands it out, parsed by our token-aware parser.

`ServedOutput` wraps `encoding.StreamParser` in token mode (`</think>` and `｜DSML｜` are
recognised only as their special ids, never by their spelling; string arguments are copied
byte for byte) with what a server needs around it; it imports nothing of SGLang, so the
serving hooks (`plugin/serving/parsers.py`) stay thin and this part is tested on its own:

* **Calls are released whole, once they are final.** A call is handed out when its calls block
  closes (every call in it is then known, nothing after the block counts) or when the output
  ends. Streaming therefore gives each call in one piece, and the streamed calls equal the
  one-shot ones for every way the ids are chunked.
* **Malformed calls are never ordinary calls.** A call with a problem (arguments that are not
  JSON, e.g. broken `string="false"` text; unexpected attributes or text in its tags; cut off
  by `max_tokens`; an invoke that never closed) goes to `invalid_calls` with its problems. When
  the calls block itself never closed, every call in it is invalid (the output ended before
  the model finished its calls), and a call cut off inside its name is reported too (with the
  name written so far). The DSML never reaches `content`, nor does the cut-off start of a
  calls block (the newlines and `<` before `｜DSML｜`) when `max_tokens` ends the output there.
* **Stops stay the engine's.** The engine matches stop strings on its own text and stop ids on
  its ids; ids a stop string may still begin in are held back until the engine rules the stop
  out, and `finish` cuts the matched stop (unless it is to be kept) before parsing it.
* **Tolerant, when the options say so** (every served parse does): the call spellings of
  docs/ENCODING.md §4.5 are calls with their `repairs`; with the request's declared tool
  parameters (`declared`) a spurious `{"arguments": ...}` wrapper is unwrapped too.
* **Reasoning routing as SGLang's request fields ask**: `separate_reasoning=False` returns the
  reasoning as content, `stream_reasoning=False` holds it back until the answer starts.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from sglang_ds41.encoding import wrapped_arguments
from sglang_ds41.encoding.conversation import ParsingOptions
from sglang_ds41.encoding.parsed import ParsedToolCall
from sglang_ds41.encoding.prompt_ids import text_tokenizer_of
from sglang_ds41.encoding.stream import ContentDelta, ReasoningDelta, StreamParser

BLOCK_NOT_CLOSED = "tool-call block not closed"
_CUT_BLOCK_START = re.compile(r"\n*(?:</?)?\Z")  # what the parser holds back before a DSML id
CUT_IN_NAME = "call cut off inside its name"
# The response formats whose answer the server reads as JSON output (`parse_json_output`), as
# upstream's DeepSeek-recipe adapter decides: both JSON formats, where the official renderer's
# own parsing options say so for `json_object` alone (`encoding.parsing_options`). It keeps a
# `</think>` written inside the JSON as text instead of deleting it (docs/ENCODING.md §4.4).
JSON_RESPONSE_FORMATS = ("json_object", "json_schema")
# A stop match ends on the last id; the ids it covers decode to at least one character each,
# except pieces of a character split over several byte-level ids (at most 4 per character).
_STOP_SCAN_IDS_PER_CHAR = 4


def _encode_text_runs(tokenizer, text: str) -> list[int]:
    return text_tokenizer_of(tokenizer).encode(text, add_special_tokens=False).ids if text else []


def _without_cut_block_start(held: list) -> list:
    """The parser's last deltas less a trailing cut-off calls-block start (a block can open in
    the reasoning as in the content)."""
    if held and isinstance(held[-1], ContentDelta | ReasoningDelta):
        text = _CUT_BLOCK_START.sub("", held[-1].text)
        return [*held[:-1], type(held[-1])(text)] if text else held[:-1]
    return held


def reads_json_output(response_format_type: str | None) -> bool:
    """Whether the server reads the answer to a request whose `response_format` has this type
    (None: no response format) as JSON output."""
    return response_format_type in JSON_RESPONSE_FORMATS


@dataclass(frozen=True, kw_only=True)
class ServedCall(ParsedToolCall):
    """One invoke of the output and its `position` among all the output's calls (the server
    gives the ids: `id` is empty)."""

    position: int

    @classmethod
    def of(cls, call: ParsedToolCall, position: int, more_problems: Sequence[str] = ()) -> ServedCall:
        problems = tuple(dict.fromkeys((*call.problems, *more_problems)))
        return cls(**{**vars(call), "id": "", "problems": problems}, position=position)


@dataclass
class Step:
    """What one `feed` / `finish` adds to the choice."""

    reasoning: str = ""
    content: str = ""
    calls: list[ServedCall] = field(default_factory=list)
    invalid_calls: list[ServedCall] = field(default_factory=list)


def served_finish_reason(engine_reason: str, step: Step) -> str:
    """The choice's `finish_reason` from the engine's: `tool_calls` when the turn stopped with a
    valid call; a turn cut at the token limit stays `length`, calls or not (OpenAI's rule)."""
    return "tool_calls" if step.calls and engine_reason == "stop" else engine_reason


class ServedOutput:
    """The parse of one choice, fed the engine's output ids.

    `tokenizer` is the served `tokenizers.Tokenizer`; `stops` are the request's stop strings;
    `encode_text` turns plain text back into ids without the added vocabulary (only used to
    re-encode the few characters before a matched stop string; by default the tokenizer's own
    text runs, ENCODING.md §1.3); `declared` maps the request's tools to their declared
    parameters, for a tolerant parse's unwrapping of `{"arguments": ...}` (`wrapped_arguments`).
    """

    def __init__(
        self,
        options: ParsingOptions,
        *,
        tokenizer,
        separate_reasoning: bool = True,
        stream_reasoning: bool = True,
        stops: Sequence[str] = (),
        encode_text: Callable[[str], list[int]] | None = None,
        declared: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._declared = declared or {}
        self._encode_text = encode_text or functools.partial(_encode_text_runs, tokenizer)
        # Ids come from the server's own id scheme; the parser's are not used.
        self._parser = StreamParser(options, tokenizer=tokenizer, tool_call_id=lambda index: "")
        self._reasoning_as_content = not separate_reasoning
        self._hold_reasoning = separate_reasoning and not stream_reasoning
        self._held_reasoning: list[str] = []
        self._hold_chars = max((len(s) for s in stops), default=1) - 1
        self._pending: list[int] = []
        self._released = False  # the calls have been handed out (block closed or output ended)
        self.finished = False
        self.num_consumed_tokens = 0

    # -- input ---------------------------------------------------------------------------------

    def feed(self, ids: Sequence[int]) -> Step:
        """Ids the engine produced since the last call (the output goes on)."""
        self.num_consumed_tokens += len(ids)
        if self.finished:
            return Step()
        self._pending += ids
        ready = self._release_pending()
        step = self._step(self._parser.feed_ids(ready) if ready else [], final=False)
        if not self._released and self._parser.calls_block_closed:
            self._released = True
            self._add_calls(step, self._parser.closed_calls(), block_closed=True, cut_name=None)
        return step

    def finish(
        self,
        ids: Sequence[int],
        finish_type: str,
        matched: int | str | None = None,
        *,
        keep_matched_stop: bool = False,
    ) -> Step:
        """The engine's last ids and its finish reason (`stop`, `length`, `abort`, ...; `matched`
        is the stop string or stop id it matched). A finish sent again changes nothing."""
        self.num_consumed_tokens += len(ids)
        if self.finished:
            return Step()
        self.finished = True
        ids = self._pending + list(ids)
        self._pending = []
        if isinstance(matched, str) and matched:
            ids = self._cut_at_stop(ids, matched, keep=keep_matched_stop)
        elif isinstance(matched, int) and not keep_matched_stop and ids and ids[-1] == matched:
            ids = ids[:-1]
        truncated = finish_type == "length"
        deltas = self._parser.feed_ids(ids) if ids else []
        held = self._parser.flush()
        if truncated and self._parser.options.parse_tool_calls:
            # Text held back to the end as the possible start of a calls block ("\n\n<" or "</"
            # before `｜DSML｜`) that the cut-off output never finished is neither content nor
            # reasoning. Only the text held back can be that, whatever the chunking (text
            # released earlier stays).
            held = _without_cut_block_start(held)
        message = self._parser.finish("length" if truncated else "stop")
        step = self._step(deltas + held, final=True)
        if not self._released:
            self._released = True
            closed = self._parser.calls_block_complete
            why = BLOCK_NOT_CLOSED + (" (output truncated at max_tokens)" if truncated else "")
            self._add_calls(step, message.tool_calls, block_closed=closed, cut_name=message.cut_call_name,
                            why=why, truncated=truncated)
        return step

    # -- internals -----------------------------------------------------------------------------

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def _release_pending(self) -> list[int]:
        """The pending ids no stop string can still begin in: all but the shortest tail that
        decodes to at least `_hold_chars` characters."""
        if self._hold_chars <= 0:
            ready, self._pending = self._pending, []
            return ready
        keep_from = len(self._pending)
        while keep_from > 0 and len(self._decode(self._pending[keep_from:])) < self._hold_chars:
            keep_from -= 1
        ready, self._pending = self._pending[:keep_from], self._pending[keep_from:]
        return ready

    def _cut_at_stop(self, ids: list[int], stop: str, *, keep: bool) -> list[int]:
        """`ids` up to the matched stop string (through it when `keep`). The match ends on the
        last id, so it starts in the latest id whose text onwards contains it; the text of
        that tail before the stop is re-encoded as plain text."""
        lowest = max(0, len(ids) - _STOP_SCAN_IDS_PER_CHAR * (len(stop) + 1))
        for start in range(len(ids) - 1, lowest - 1, -1):
            text = self._decode(ids[start:])
            at = text.find(stop)
            if at >= 0:
                head = text[: at + len(stop)] if keep else text[:at]
                return ids[:start] + self._encode_text(head)
        return ids  # the engine's match is not in the ids: parse them as they are

    def _step(self, deltas: list, *, final: bool) -> Step:
        step = Step()
        reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
        content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
        if self._reasoning_as_content:
            reasoning, content = "", reasoning + content
        if self._hold_reasoning:
            self._held_reasoning.append(reasoning)
            reasoning = ""
            if content or final or self._parser.calls_block_closed or self._released:
                reasoning = "".join(self._held_reasoning)
                self._held_reasoning.clear()
        step.reasoning, step.content = reasoning, content
        return step

    def _add_calls(
        self,
        step: Step,
        calls: Sequence[ParsedToolCall],
        *,
        block_closed: bool,
        cut_name: str | None,
        why: str = BLOCK_NOT_CLOSED,
        truncated: bool = False,
    ) -> None:
        if self._hold_reasoning and self._held_reasoning:
            step.reasoning += "".join(self._held_reasoning)
            self._held_reasoning.clear()
        extra = () if block_closed else (why,)
        if self._declared:
            calls = [wrapped_arguments.unwrap(call, self._declared) for call in calls]
        served = [ServedCall.of(call, i, extra) for i, call in enumerate(calls)]
        if cut_name is not None:
            cut = CUT_IN_NAME + (" at max_tokens" if truncated else "")
            served.append(ServedCall("", cut_name, "", (cut, *extra), position=len(served)))
        step.calls += [c for c in served if c.valid]
        step.invalid_calls += [c for c in served if not c.valid]
