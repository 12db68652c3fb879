"""Incremental output parser: text or token-id pieces in, reasoning / content / tool-call deltas out.

The scanner reproduces the official parser's recognition rules (ENCODING.md §4.2): the output is
scanned one character at a time against a few literal markers per stage (KMP matchers), the
first marker to complete wins, and text that could still be the start of a marker is held back
until it is decided. Because every decision depends only on the characters seen, never on where
the pieces were cut, the final message is the same for every way of splitting the output;
`parse.py` is literally "feed everything, then finish".

Stages and their markers (D is `｜DSML｜`; in token mode `</think>` and D are sentinels that only
the special ids produce, see `token_text.py`):

    reasoning   "\\n"* "</think>" -> content;  "\\n"* "<D" -> block (tools only);  a leading "\\n" is dropped
    content     "\\n"* "<D" -> block (tools only);  "</think>" deleted;  a leading "\\n" is dropped
                token mode: a D without the "<" (or after a stray "</") opens the block too (reported;
                see `parse.py` 5.)
                json_object: "```json\\n" / "```\\n" / "{" / "[" -> json, other text becomes one space
    json        "\\n```" -> after-json (text there becomes one space; "<D" still opens a block)
    block       'invoke name="' -> name;  "</D calls>" / "</D tool_calls>" -> finished; other text ignored
    name        '"' -> invoke
    invoke      "parameter name=" -> param name;  "</D" -> block (closes the arguments)
    param name  " " -> param type (the name, quotes included, is copied as the JSON key)
    param type  'true">' / 'false">' -> value (text before them is skipped)
    value       "</D" -> invoke
    finished    everything is dropped
"""

from __future__ import annotations

import json
import random
import re
import secrets
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum, auto

from .conversation import ParsingOptions
from .errors import EncodingError
from .parsed import ParsedMessage, ParsedToolCall
from .special_tokens import Special
from .token_text import DSML_SENTINEL, THINK_END_SENTINEL, TokenTextDecoder, restore

# ---------------------------------------------------------------------------------------------
# Deltas


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class ToolCallEnd:
    """The invoke closed; a call cut off by the end of output never gets one."""

    index: int


Delta = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArgumentsDelta | ToolCallEnd

# ---------------------------------------------------------------------------------------------
# Tool-call ids

_ID_ALPHABET = string.ascii_letters + string.digits


def random_tool_call_id(index: int) -> str:
    """`call_{index:02d}_{24 random chars}`, the official parser's shape."""
    return f"call_{index:02d}_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def seeded_tool_call_ids(seed: int = 0) -> Callable[[int], str]:
    """Deterministic ids of the same shape, for tests and reproducible logs."""
    rng = random.Random(seed)
    return lambda index: f"call_{index:02d}_" + "".join(rng.choice(_ID_ALPHABET) for _ in range(24))


# ---------------------------------------------------------------------------------------------
# Matchers


def _failure_table(pattern: str) -> list[int]:
    table = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = table[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        table[i] = k
    return table


class _Literal:
    """Matches a literal; `held` is how many trailing characters may still be its start."""

    __slots__ = ("fail", "pos", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.fail = _failure_table(text)
        self.pos = 0

    def _advance(self, ch: str) -> int:
        pos, text = self.pos, self.text
        while pos and text[pos] != ch:
            pos = self.fail[pos - 1]
        return pos + 1 if text[pos] == ch else pos

    def step(self, ch: str) -> bool:
        self.pos = self._advance(ch)
        return self.pos == len(self.text)

    def held(self) -> int:
        return self.pos

    def reset(self) -> None:
        self.pos = 0


class _NewlinesThen(_Literal):
    """A literal together with the newlines right before it (they are swallowed with it)."""

    __slots__ = ("newlines",)

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.newlines = 0

    def step(self, ch: str) -> bool:
        if self.pos == 0 and ch == "\n":
            self.newlines += 1
            return False
        nxt = self._advance(ch)
        if nxt <= self.pos:
            self.newlines = 0
        self.pos = nxt
        return nxt == len(self.text)

    def held(self) -> int:
        return self.pos + self.newlines

    def reset(self) -> None:
        self.pos = self.newlines = 0


class _LeadingNewline:
    """Matches a newline that is the first character seen in a stage."""

    __slots__ = ("first", "matched")
    text = "\n"

    def __init__(self) -> None:
        self.first = True
        self.matched = False

    def step(self, ch: str) -> bool:
        self.matched = self.first and ch == "\n"
        self.first = False
        return self.matched

    def held(self) -> int:
        return int(self.matched)

    def reset(self) -> None:
        self.first = self.matched = False


# ---------------------------------------------------------------------------------------------
# Scanner


class Stage(Enum):
    CONTENT = auto()
    JSON = auto()
    AFTER_JSON = auto()
    BLOCK = auto()
    NAME = auto()
    INVOKE = auto()
    PARAM_NAME = auto()
    PARAM_TYPE = auto()
    VALUE = auto()
    UNTYPED_VALUE = auto()  # tolerant: a parameter without string="..."
    REASONING = auto()
    FINISHED = auto()


class Kind(Enum):
    """What a scanned segment is. Unmatched text gets the stage's kind; a marker its own."""

    REASONING = auto()
    RAW = auto()  # content text
    TO_SPACE = auto()  # json_object: text around the JSON value
    LABEL = auto()  # json_object: a bare "{" / "[" that starts the value (kept)
    SKIP = auto()  # markers and newlines that vanish
    BLOCK_BEGIN = auto()  # "<D" (with the newlines before it) opened a calls block
    THINK_END_IN_CONTENT = auto()  # a stray </think>, deleted
    BLOCK_TEXT = auto()  # ignored text in the calls block
    BLOCK_END = auto()
    AFTER_END = auto()  # output after the calls block, dropped
    CALL_BEGIN = auto()
    NAME = auto()
    NAME_END = auto()
    INVOKE_TEXT = auto()  # ignored text inside an invoke
    PARAM_BEGIN = auto()  # payload: "{" or ", "
    PARAM_NAME = auto()
    PARAM_NAME_END = auto()  # payload '": '
    TYPE_TEXT = auto()  # ignored text before true"> / false">
    TYPE_TRUE = auto()  # payload '"'
    TYPE_FALSE = auto()
    VALUE = auto()  # payload: True for string="true" (JSON-escaped)
    VALUE_END = auto()  # payload '"' or ''
    ARGS_END = auto()  # payload '{}' or '}'
    UNTYPED_NAME_END = auto()  # tolerant: '">' ended a parameter name with no string="..."
    UNTYPED_VALUE = auto()  # its value, decided at its end (JSON or text)
    UNTYPED_VALUE_END = auto()
    PIECE_END = auto()  # token mode: an added-token boundary (the official scanner's piece end)


@dataclass(frozen=True)
class _Markers:
    """The literal markers, spelled for text mode or for token mode, with the DSML spelling of
    the calls block they are in."""

    think_end: str
    dsml: str
    dsml_begin: str
    dsml_end: str
    calls_end: tuple[str, ...]
    bare_dsml: str | None  # token mode: the DSML id alone, which only a tag can mean

    @classmethod
    def for_mode(cls, token_mode: bool, dsml: str | None = None, tolerant: bool = False) -> _Markers:
        think = THINK_END_SENTINEL if token_mode else Special.THINK_END.value
        canonical = DSML_SENTINEL if token_mode else Special.DSML.value
        d = dsml or canonical
        calls_end = (f"</{d}tool_calls>", f"</{d} calls>")
        if tolerant:
            calls_end += (f"</{d} tool_calls>",)
        bare = canonical if token_mode else None
        return cls(think, d, "<" + d, "</" + d, calls_end, bare)


Branch = tuple[object, tuple[Stage, bool], Kind, object]
BARE_BLOCK_BEGIN = (
    "tool-call block opened by a ｜DSML｜ token that does not follow `<` (no `<`, or a stray `</`)"
)
# What a tolerant parse reads past (ENCODING.md §4.5), as `ParsedToolCall.repairs` names it.
REPAIR_ASCII = 'DSML written "|DSML|" (ASCII bars)'
REPAIR_DOUBLED = 'DSML written "｜｜DSML｜｜" (doubled bars)'
REPAIR_SPELLED = "DSML spelled in text pieces, not its token"
REPAIR_TOOL_CALLS = 'calls block named "tool_calls" (DeepSeek-V4) with V4.1 spacing'
REPAIR_BARE_INVOKE = "invoke without its calls block"
REPAIR_IN_REASONING = "calls block opened inside the reasoning"


def repair_untyped(name: str, as_json: bool) -> str:
    return f'parameter {name!r} without string="...": read as {"JSON" if as_json else "text"}'


@dataclass(frozen=True)
class _BlockOpen:
    """How a calls block opened: the DSML spelling its tags then use, the text of the opening
    tag still to come (`lead`), and what the opening says about the output."""

    dsml: str
    lead: str = ""
    repair: str | None = None
    problem: str | None = None
    in_reasoning: bool = False


def _dialects(token_mode: bool) -> list[tuple[str, _BlockOpen]]:
    """(opener, how it opens a block) for the DSML spellings a tolerant parse also reads."""
    ascii_bars, doubled, spelled = "|DSML|", "｜｜DSML｜｜", Special.DSML.value
    found = [
        ("<" + ascii_bars, _BlockOpen(ascii_bars, repair=REPAIR_ASCII)),
        ("<" + doubled, _BlockOpen(doubled, repair=REPAIR_DOUBLED)),
    ]
    if token_mode:
        # the DSML id with a bar written on each side; it completes with the id, before the bare id
        found.append(("<｜" + DSML_SENTINEL, _BlockOpen(f"｜{DSML_SENTINEL}｜", "｜", REPAIR_DOUBLED)))
        found.append(("<" + spelled, _BlockOpen(spelled, repair=REPAIR_SPELLED)))
    return found


def _branches(
    stage: Stage, flag: bool, options: ParsingOptions, m: _Markers
) -> tuple[list[Branch], Kind, object]:
    """The markers of one stage in priority order, and the kind of its unmatched text."""
    branches: list[Branch] = []

    def add(matcher, to: Stage, kind: Kind, payload: object = None, to_flag: bool = False) -> None:
        branches.append((matcher, (to, to_flag), kind, payload))

    def add_block_begin() -> None:
        if options.parse_tool_calls:
            in_reasoning = stage is Stage.REASONING
            if options.tolerant:
                for opener, how in _dialects(m.bare_dsml is not None):
                    how = _BlockOpen(how.dsml, how.lead, how.repair, in_reasoning=in_reasoning)
                    add(_NewlinesThen(opener), Stage.BLOCK, Kind.BLOCK_BEGIN, how)
            own = _BlockOpen(m.dsml, in_reasoning=in_reasoning)
            add(_NewlinesThen(m.dsml_begin), Stage.BLOCK, Kind.BLOCK_BEGIN, own)
            if m.bare_dsml is not None:  # after "<D", which wins when the "<" is there
                how = _BlockOpen(m.dsml, problem=BARE_BLOCK_BEGIN, in_reasoning=in_reasoning)
                for opener in (m.dsml_end, m.bare_dsml):  # a stray closing tag, or no "<"
                    add(_NewlinesThen(opener), Stage.BLOCK, Kind.BLOCK_BEGIN, how)

    if stage is Stage.CONTENT:
        if options.parse_json_output:
            for fence in ("```json\n", "```\n"):
                add(_Literal(fence), Stage.JSON, Kind.SKIP)
            for bracket in ("{", "["):
                add(_Literal(bracket), Stage.JSON, Kind.LABEL, bracket)
        add_block_begin()
        if flag:
            add(_LeadingNewline(), Stage.CONTENT, Kind.SKIP, to_flag=True)
        add(_Literal(m.think_end), Stage.CONTENT, Kind.THINK_END_IN_CONTENT)
        return branches, (Kind.TO_SPACE if options.parse_json_output else Kind.RAW), None
    if stage is Stage.REASONING:
        add_block_begin()
        if flag:
            add(_LeadingNewline(), Stage.REASONING, Kind.SKIP, to_flag=True)
        add(_NewlinesThen(m.think_end), Stage.CONTENT, Kind.SKIP, to_flag=True)
        return branches, Kind.REASONING, None
    if stage is Stage.JSON:
        add(_Literal("\n```"), Stage.AFTER_JSON, Kind.SKIP)
        return branches, Kind.RAW, None
    if stage is Stage.AFTER_JSON:
        add_block_begin()
        return branches, Kind.TO_SPACE, None
    if stage is Stage.BLOCK:
        add(_Literal('invoke name="'), Stage.NAME, Kind.CALL_BEGIN)
        for end in m.calls_end:
            repair = REPAIR_TOOL_CALLS if end.endswith(" tool_calls>") else None
            add(_Literal(end), Stage.FINISHED, Kind.BLOCK_END, repair)
        return branches, Kind.BLOCK_TEXT, None
    if stage is Stage.NAME:
        add(_Literal('"'), Stage.INVOKE, Kind.NAME_END, to_flag=True)
        return branches, Kind.NAME, None
    if stage is Stage.INVOKE:
        add(_Literal("parameter name="), Stage.PARAM_NAME, Kind.PARAM_BEGIN, "{" if flag else ", ")
        add(_Literal(m.dsml_end), Stage.BLOCK, Kind.ARGS_END, "{}" if flag else "}")
        return branches, Kind.INVOKE_TEXT, None
    if stage is Stage.PARAM_NAME:
        # The name, quotes included, runs to the first space and is copied as the JSON key.
        add(_Literal(" "), Stage.PARAM_TYPE, Kind.PARAM_NAME_END, ": ")
        if options.tolerant:  # `name="x">`: no string="..." attribute
            add(_Literal('">'), Stage.UNTYPED_VALUE, Kind.UNTYPED_NAME_END, '": ')
        return branches, Kind.PARAM_NAME, None
    if stage is Stage.PARAM_TYPE:
        add(_Literal('true">'), Stage.VALUE, Kind.TYPE_TRUE, '"', to_flag=True)
        add(_Literal('false">'), Stage.VALUE, Kind.TYPE_FALSE, to_flag=False)
        return branches, Kind.TYPE_TEXT, None
    if stage is Stage.VALUE:
        add(_Literal(m.dsml_end), Stage.INVOKE, Kind.VALUE_END, '"' if flag else "")
        return branches, Kind.VALUE, flag
    if stage is Stage.UNTYPED_VALUE:
        add(_Literal(m.dsml_end), Stage.INVOKE, Kind.UNTYPED_VALUE_END)
        return branches, Kind.UNTYPED_VALUE, None
    return branches, Kind.AFTER_END, None  # FINISHED


Segment = tuple[Kind, str, object]


class Scanner:
    """Splits output text into kinded segments; holds back text that may start a marker."""

    def __init__(self, options: ParsingOptions, token_mode: bool) -> None:
        self._options = options
        self._token_mode = token_mode
        self._markers = _Markers.for_mode(token_mode, tolerant=options.tolerant)
        if options.starts_in_tool_calls:
            start = (Stage.BLOCK, False)
        elif options.thinking and options.in_content:
            start = (Stage.CONTENT, False)
        elif options.thinking:
            start = (Stage.REASONING, not options.reasoning_started)
        else:
            start = (Stage.CONTENT, True)
        self._held = ""  # characters already fed to the matchers, not yet emitted
        self._enter(*start)

    @property
    def stage(self) -> Stage:
        return self._stage

    def _enter(self, stage: Stage, flag: bool) -> None:
        self._stage, self._flag = stage, flag
        self._branches, self._unmatched, self._unmatched_payload = _branches(
            stage, flag, self._options, self._markers
        )
        alphabet = {ch for branch in self._branches for ch in branch[0].text} | {"\n"}
        # A character outside every marker resets all matchers, so a run of them can be skipped.
        self._foreign = re.compile("[^" + "".join(re.escape(ch) for ch in sorted(alphabet)) + "]+")

    def _release(self, buf: str, start: int, end: int, out: list[Segment]) -> int:
        """Emit what no marker can still claim, as the official scanner does at a piece end."""
        keep = max((matcher.held() for matcher, *_ in self._branches), default=0)
        if end - keep > start:
            out.append((self._unmatched, buf[start : end - keep], self._unmatched_payload))
            start = end - keep
        return start

    def feed(self, text: str, cuts: Sequence[int] = ()) -> list[Segment]:
        """Scan `text`; `cuts` are offsets in it that end a piece (see `TokenTextDecoder.feed`)."""
        out: list[Segment] = []
        buf = self._held + text
        start = 0  # buf[start:i] is fed but not emitted
        i = base = len(self._held)
        n = len(buf)
        pending_cuts = iter(cuts)
        cut = next(pending_cuts, None)
        while i < n:
            while cut is not None and cut + base <= i:
                start = self._release(buf, start, i, out)
                out.append((Kind.PIECE_END, "", None))
                cut = next(pending_cuts, None)
            ch = buf[i]
            i += 1
            for matcher, (to_stage, to_flag), kind, payload in self._branches:
                if matcher.step(ch):
                    size = matcher.held()
                    if i - size > start:
                        out.append((self._unmatched, buf[start : i - size], self._unmatched_payload))
                    out.append((kind, buf[i - size : i], payload))
                    start = i
                    if kind is Kind.BLOCK_BEGIN and payload.dsml != self._markers.dsml:
                        tolerant = self._options.tolerant
                        self._markers = _Markers.for_mode(self._token_mode, payload.dsml, tolerant)
                    self._enter(to_stage, to_flag)
                    break
            else:
                run = self._foreign.match(buf, i - 1)
                if run is not None:
                    for matcher, *_ in self._branches:
                        matcher.reset()
                    end = run.end() if cut is None else min(run.end(), cut + base)
                    i = max(i, end)
        start = self._release(buf, start, n, out)
        if cut is not None:
            out.append((Kind.PIECE_END, "", None))
        self._held = buf[start:]
        return out

    def finish(self) -> list[Segment]:
        held, self._held = self._held, ""
        return [(self._unmatched, held, self._unmatched_payload)] if held else []


# ---------------------------------------------------------------------------------------------
# Parser


def _snippet(text: str, limit: int = 60) -> str:
    text = restore(text)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _json_escape(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _argument_problems(arguments: str) -> list[str]:
    duplicates: list[str] = []

    def pairs(items: list[tuple[str, object]]) -> dict:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                duplicates.append(key)
            seen.add(key)
        return dict(items)

    try:
        json.loads(arguments, object_pairs_hook=pairs, parse_constant=_reject_constant)
    except ValueError as error:
        return [f"arguments are not valid JSON ({error})"]
    except RecursionError:  # model output: a value nested past Python's recursion limit
        return ["arguments are nested too deeply to read as JSON"]
    return [f"duplicate parameter name {key!r}" for key in dict.fromkeys(duplicates)]


class _Call:
    def __init__(self, call_id: str, name: str) -> None:
        self.id = call_id
        self.name = name
        self.arguments: list[str] = []
        self.closed = False
        self.problems: list[str] = []
        self.gap: list[str] = []  # ignored text since the last marker inside the invoke
        self.leading_gap = True
        self.param_name: list[str] = []
        self.type_gap: list[str] = []
        self.untyped: list[str] = []  # tolerant: a value without string="...", until its end
        self.repairs: list[str] = []


class StreamParser:
    """Feed pieces of one completion; get deltas; `finish` returns the whole message.

    Text mode (`feed_text`) matches the special spellings anywhere in the text; token mode
    (`feed_ids`) recognises `</think>` and `｜DSML｜` only as their special ids. A parser uses one
    mode for its whole life.
    """

    def __init__(
        self,
        options: ParsingOptions | None = None,
        *,
        tokenizer=None,
        tool_call_id: Callable[[int], str] = random_tool_call_id,
    ) -> None:
        self.options = options if options is not None else ParsingOptions()
        self._tokenizer = tokenizer
        self._new_id = tool_call_id
        self._scanner: Scanner | None = None
        self._decoder: TokenTextDecoder | None = None
        self._token_mode = False
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[_Call] = []
        self._pending_name: list[str] | None = None
        self._space_run = False  # json_object: a run of blanked text already gave its space
        self._block_entered = self.options.starts_in_tool_calls
        self._block_closed = False
        self._block_complete = False
        self._dsml = _Markers.for_mode(False).dsml  # the block's DSML spelling (set when it opens)
        self._block_lead = ""
        self._block_repairs: list[str] = []
        self._bare_invokes = False  # tolerant: the block opened with an invoke, no calls tag
        self._block_gap: list[str] = []
        self._block_first_gap = True
        self._after_end: list[str] = []
        self._problems: list[str] = []
        self._flushed = False

    # -- input ---------------------------------------------------------------------------------

    def _scanner_for(self, token_mode: bool) -> Scanner:
        if self._scanner is None:
            self._token_mode = token_mode
            self._scanner = Scanner(self.options, token_mode)
            self._dsml = _Markers.for_mode(token_mode).dsml
        elif self._token_mode != token_mode:
            raise EncodingError("a StreamParser takes either text pieces or token ids, not both")
        if self._flushed:
            raise EncodingError("the StreamParser has already been finished")
        return self._scanner

    def feed_text(self, text: str) -> list[Delta]:
        if not isinstance(text, str):
            raise EncodingError(f"feed_text expects a str, got {type(text).__name__}")
        return self._apply(self._scanner_for(False).feed(text))

    def feed_ids(self, ids: Sequence[int]) -> list[Delta]:
        scanner = self._scanner_for(True)
        if self._decoder is None:
            self._decoder = TokenTextDecoder(self._tokenizer)
        text, cuts = self._decoder.feed(ids)
        return self._apply(scanner.feed(text, cuts))

    def flush(self) -> list[Delta]:
        """End of output: release held-back text. `finish` calls it if you did not."""
        if self._flushed:
            return []
        scanner = self._scanner_for(self._token_mode)
        self._flushed = True
        if self._decoder is not None and self._decoder.pending_bytes():
            self._problems.append(
                f"output ended inside a UTF-8 character; {self._decoder.pending_bytes()} byte(s) dropped"
            )
        return self._apply(scanner.finish())

    def finish(self, finish_reason: str = "stop") -> ParsedMessage:
        if finish_reason not in ("stop", "length", "content_filter"):
            raise EncodingError(
                f"finish_reason must be stop, length or content_filter, got {finish_reason!r}"
            )
        self.flush()
        assert self._scanner is not None
        truncated = finish_reason == "length"
        if self._block_entered and not self._block_closed:
            # A cut-off closing tag at the very end is part of the truncation, not stray text.
            gap = "".join(self._block_gap)
            cut = gap.rfind("<")
            self._check_block_gap(gap[:cut] if cut >= 0 else gap)
        problems = list(self._problems)
        if self._scanner.stage is Stage.REASONING:
            problems.append("output ended inside reasoning (no </think>)")
        if self._pending_name is not None:
            name = _snippet("".join(self._pending_name))
            problems.append(f"a tool call cut off inside its name was dropped: {name}")
        # Invokes without a calls tag end with the output (tolerant), unless it was cut off.
        self._block_complete = self._block_closed or (self._bare_invokes and not truncated)
        if self._block_entered and not self._block_complete:
            problems.append(
                "tool-call block not closed" + (" (output truncated at max_tokens)" if truncated else "")
            )
        after = "".join(self._after_end)
        if after.strip():
            problems.append(f"text after the tool-call block was discarded: {_snippet(after)}")
        calls = [self._parsed_call(call, truncated) for call in self._calls]
        if calls:
            finish_reason = "length" if truncated else "tool_calls"
        return ParsedMessage(
            reasoning_content="".join(self._reasoning),
            content="".join(self._content),
            tool_calls=tuple(calls),
            finish_reason=finish_reason,
            problems=tuple(dict.fromkeys(problems)),
            cut_call_name=None if self._pending_name is None else "".join(self._pending_name),
        )

    @property
    def calls_block_closed(self) -> bool:
        """The calls block has been closed: every call in it is final, nothing after it counts."""
        return self._block_closed

    @property
    def calls_block_complete(self) -> bool:
        """After `finish`: the calls block closed, or (tolerant) its invokes came without a calls
        tag and the output ended after them."""
        return self._block_complete

    def closed_calls(self) -> tuple[ParsedToolCall, ...]:
        """The calls whose invoke has closed so far, with their problems (all of them once
        `calls_block_closed`); lets a streaming consumer release calls before `finish`."""
        return tuple(self._parsed_call(call, False) for call in self._calls if call.closed)

    def _parsed_call(self, call: _Call, truncated: bool) -> ParsedToolCall:
        arguments = "".join(call.arguments)
        problems = list(call.problems)
        if not call.closed:
            problems.append("call truncated at max_tokens" if truncated else "unclosed invoke")
        problems += _argument_problems(arguments)
        repairs = tuple(dict.fromkeys([*self._block_repairs, *call.repairs]))
        return ParsedToolCall(call.id, call.name, arguments, tuple(problems), repairs)

    # -- segments -> deltas --------------------------------------------------------------------

    def _text(self, text: str) -> str:
        return restore(text) if self._token_mode else text

    def _check_block_gap(self, gap: str) -> None:
        if not gap:
            return
        d = re.escape(self._dsml)
        names = " calls|tool_calls| tool_calls" if self.options.tolerant else " calls|tool_calls"
        pattern = (
            rf"{re.escape(self._block_lead)}(?:(?:{names})>)?\s*(?:<{d} ?)?"
            if self._block_first_gap
            else rf" ?invoke>\s*(?:<{d} ?)?"
        )
        if not re.fullmatch(pattern, gap):
            self._problems.append(f"ignored text in the tool-call block: {_snippet(gap)}")

    def _note_block_opening(self, gap: str) -> None:
        """Tolerant: what the text between the block's opening and its first invoke says."""
        tag = gap[len(self._block_lead) :]
        if tag.startswith(" tool_calls>"):
            self._block_repairs.append(REPAIR_TOOL_CALLS)
        elif not tag.startswith((" calls>", "tool_calls>")):
            self._bare_invokes = True
            self._block_repairs.append(REPAIR_BARE_INVOKE)

    def _check_invoke_gap(self, call: _Call) -> None:
        gap = "".join(call.gap)
        call.gap.clear()
        d = re.escape(self._dsml)
        pattern = rf">\s*(?:<{d} ?)?" if call.leading_gap else rf" ?parameter>\s*(?:<{d} ?)?"
        call.leading_gap = False
        if not re.fullmatch(pattern, gap):
            call.problems.append(f"unexpected text inside the invoke: {_snippet(gap)}")

    def _apply(self, segments: list[Segment]) -> list[Delta]:
        deltas: list[Delta] = []
        for kind, text, payload in segments:
            if kind is not Kind.TO_SPACE:
                self._space_run = False
            if kind is Kind.REASONING:
                text = self._text(text)
                self._reasoning.append(text)
                deltas.append(ReasoningDelta(text))
            elif kind is Kind.RAW or kind is Kind.LABEL:
                text = self._text(text)
                self._content.append(text)
                deltas.append(ContentDelta(text))
            elif kind is Kind.TO_SPACE:
                if not self._space_run:
                    self._space_run = True
                    self._content.append(" ")
                    deltas.append(ContentDelta(" "))
            elif kind is Kind.SKIP or kind is Kind.THINK_END_IN_CONTENT or kind is Kind.PIECE_END:
                pass
            elif kind is Kind.BLOCK_BEGIN:
                self._block_entered = True
                self._dsml, self._block_lead = payload.dsml, payload.lead
                if payload.problem is not None:
                    self._problems.append(payload.problem)
                if self.options.tolerant:
                    notes = [payload.repair, REPAIR_IN_REASONING if payload.in_reasoning else None]
                    self._block_repairs += [note for note in notes if note is not None]
            elif kind is Kind.BLOCK_TEXT:
                self._block_gap.append(text)
            elif kind is Kind.CALL_BEGIN or kind is Kind.BLOCK_END:
                gap = "".join(self._block_gap)
                self._check_block_gap(gap)
                if self.options.tolerant and self._block_first_gap and kind is Kind.CALL_BEGIN:
                    self._note_block_opening(gap)
                self._block_gap.clear()
                self._block_first_gap = False
                if kind is Kind.CALL_BEGIN:
                    self._pending_name = []
                else:
                    self._block_closed = True
                    if payload is not None:
                        self._block_repairs.append(payload)
            elif kind is Kind.AFTER_END:
                self._after_end.append(text)
            elif kind is Kind.NAME:
                assert self._pending_name is not None
                self._pending_name.append(self._text(text))
            elif kind is Kind.NAME_END:
                assert self._pending_name is not None
                index = len(self._calls)
                call = _Call(self._new_id(index), "".join(self._pending_name))
                self._pending_name = None
                self._calls.append(call)
                deltas.append(ToolCallStart(index, call.id, call.name))
            else:
                deltas.extend(self._apply_call(kind, text, payload))
        return deltas

    def _apply_call(self, kind: Kind, text: str, payload: object) -> list[Delta]:
        """Segments inside an invoke: build the arguments text by concatenation."""
        call = self._calls[-1]
        index = len(self._calls) - 1
        if kind is Kind.INVOKE_TEXT:
            call.gap.append(text)
            return []
        piece = ""
        if kind is Kind.TYPE_TEXT:
            call.type_gap.append(text)
        if kind is Kind.PARAM_BEGIN or kind is Kind.ARGS_END:
            self._check_invoke_gap(call)
            piece = str(payload)
            if kind is Kind.PARAM_BEGIN:
                call.param_name.clear()
                call.type_gap.clear()
            else:
                call.closed = True
        elif kind is Kind.PARAM_NAME:
            piece = self._text(text)
            call.param_name.append(piece)
        elif kind is Kind.PARAM_NAME_END:
            piece = str(payload)
            name = "".join(call.param_name)
            if len(name) < 2 or name[0] != '"' or name[-1] != '"' or '"' in name[1:-1]:
                call.problems.append(f"parameter name {name!r} is not a quoted name followed by a space")
        elif kind is Kind.TYPE_TRUE or kind is Kind.TYPE_FALSE:
            gap = "".join(call.type_gap)
            if gap != 'string="':
                name = "".join(call.param_name)[1:-1]
                call.problems.append(f"unexpected attribute text in parameter {name!r}: {_snippet(gap)}")
            piece += str(payload or "")
        elif kind is Kind.VALUE:
            piece = self._text(text)
            if payload:
                piece = _json_escape(piece)
        elif kind is Kind.VALUE_END:
            piece = str(payload)
        elif kind is Kind.UNTYPED_NAME_END:
            name = "".join(call.param_name) + '"'
            if len(name) < 2 or name[0] != '"' or '"' in name[1:-1]:
                call.problems.append(f"parameter name {name!r} is not a quoted name")
            piece = str(payload)
        elif kind is Kind.UNTYPED_VALUE:
            call.untyped.append(self._text(text))
        elif kind is Kind.UNTYPED_VALUE_END:
            value = "".join(call.untyped)
            call.untyped.clear()
            as_json = not _argument_problems(value)
            call.repairs.append(repair_untyped("".join(call.param_name)[1:], as_json))
            piece = value if as_json else f'"{_json_escape(value)}"'
        deltas: list[Delta] = []
        if piece:
            call.arguments.append(piece)
            deltas.append(ToolCallArgumentsDelta(index, piece))
        if kind is Kind.ARGS_END:
            deltas.append(ToolCallEnd(index))
        return deltas


def stream_text(pieces: Iterable[str], options: ParsingOptions | None = None, **kwargs) -> StreamParser:
    """Convenience for tests and tools: a parser that has consumed `pieces` (not yet finished)."""
    parser = StreamParser(options, **kwargs)
    for piece in pieces:
        parser.feed_text(piece)
    return parser
