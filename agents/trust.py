"""The untrusted-content policy: once text the user did not write is in the context, the model
may no longer act on the world on its own.

Why: a tool's output (an email, a web page, a file, a review) can carry instructions, and a model
may follow them. What the runner knows is where each piece of text came from, so the rule is
stated in those terms: the provenance of each argument value of a call.

What tools declare (`Tool.effect`, `trusted_output`, `destinations`, `content`, `private_output`):

* effect `read`: reads, changes nothing and sends nothing out. Always runs. `write`: changes state
  (files, calendars, passwords, accounts); undeclared tools count as this. `network`, `messages`,
  `payments`: egress, data or money leaves (fetching a URL counts: the URL can carry data out).
* `trusted_output`: whether the output can hold text a third party wrote (default: untrusted for
  `network` tools, trusted otherwise). Trusted text is the system and user messages and trusted
  tools' outputs, less what an output merely echoes of its own call's arguments (so neither a
  trusted tool nor a denial message launders a value the model passed in); the runner's own turns
  (repair prompts, errors) are not the user's words.
* `destinations`: the parameters that say where data, money or access goes (recipients, account
  numbers, URLs, channels, invitees, the merchant of a booking).
* `content`: the parameters that are prose (a message body, a file's text, a description).
  Every other parameter is a *name*: an id, a title, a place, an amount.
* `private_output`: the output is the user's secrets (identity documents, card numbers).

The rule, for every `write` or egress call while untrusted output is in the transcript (before
that nothing is checked). Each argument value (every string and number, list items one by one)
is compared as a run of whole words with the text it could have come from (decimal numbers by
value: the user's "10.00" is an output's 10.0); JSON outputs are read field by field and object
by object (records), any other output is one field.

1. *Destinations come from trusted text*: a destination value must occur in trusted text, or be a
   field of the one record that a trusted value picks out ("the participants of the
   'Introductory meeting'", "Sarah Baker's address": the user names the record, the record
   supplies the value). Never from untrusted text, nor made up by the model.
2. *Secrets stay in*: an egress call's other values may not carry a value of a private output
   that the user's messages do not name.
3. *Names are not quoted from untrusted text*: a name that occurs inside a longer field of an
   untrusted output (an email body, a page, a review, a file's text) and in no trusted text was
   introduced by that text: that is where an injected instruction puts the ids, names and
   phrases it wants used. A field of a record the user picked out (rule 1) may be used anyway.
4. *Fields are data*: a name equal to a whole field of an output (an id in a listing, a channel
   in a list, the address field of a record) is data the model selected, and may flow.
5. *Addresses come from trusted text*: every URL, domain, e-mail address or account number inside
   a content value, or inside a name that rule 4 did not accept, must be one trusted text names
   (or one rule 1 accepts). Content may otherwise quote untrusted text.

A value of fewer than three characters (an id such as 13) is never vouched for by trusted text
or a record (it occurs everywhere: "June 13"), and counts as quoted only where the text says what
it is ("file 13", "ID '13'"), right after a word of the parameter's name or "id" / "number".

A call any rule holds back needs the approval policy's grant for that exact call (`DenyAll`, the
default, grants nothing: fail closed); the approver is told why (`Hold`: the rule, and a sentence
naming the parameter and the value), and its answer is logged, so a resumed run does not ask
again. A refused call is answered with that sentence, and the run goes on.

What it cannot tell apart, and lets through:

* A task whose correct action is dictated by untrusted content ("do what this email says",
  "invite her, her address is on her page", "visit the links posted in the channel", "email
  everyone in the minutes") looks exactly like an injection under any provenance rule, so it is
  held back; the way out is an approver that knows the user's intent (`ApproveWith`). Tying a
  looked-up address to the name the user gave does not tell them apart either: the injection
  picks the name, and any word of the prompt will do ("invite 'webpage' at my address").
* Names reached by indirection: an injection that names a record by another attribute ("delete
  the sales report") lets the model look its id up, a field (rule 4). Destinations are immune
  (rule 1 asks for a trusted source, not for the absence of an untrusted one); names are not.
* A third party who writes two fields of one record (an email's subject and body) can put a name
  in one and the instruction in the other; one who authors a whole record the user will pick out
  (an invitation titled like the user's meeting) controls its destinations (rule 1).
* Content to a destination the user named: an injected instruction can choose what a legitimate
  recipient is sent, save secrets (rule 2) and addresses (rule 5).

On by default for an agent whose tools declare an effect; `Policies(untrusted=UntrustedContent())`
turns it on for any agent, `Policies(untrusted=None)` turns it off.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .tools import Tool

Effect = Literal["read", "write", "network", "messages", "payments"]
EFFECTS: tuple[str, ...] = ("read", "write", "network", "messages", "payments")
EGRESS = frozenset({"network", "messages", "payments"})

# Words: split at white space, quotes, brackets and list punctuation; sentence punctuation and
# bullets at a word's ends dropped. So "ID '13'." holds the word 13, and 2024-05-13 does not.
_SPLIT = re.compile(r"[\s\"'`\u2018\u2019\u201c\u201d()\[\]{}<>,;|]+")
_EDGES = ".:!?*-"
_DECIMAL = re.compile(r"-?\d{1,15}\.\d{1,15}")
# Addresses: where something can be sent or fetched.
_ADDRESS = re.compile(
    r"(?:https?://|www\.)[^\s\"'`<>()\[\]{},;|]+"  # URL
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # e-mail address
    r"|\b(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,}(?:/[^\s\"'`<>()\[\]{},;|]*)?"  # domain[/path]
    r"|\b(?=(?:[a-z]*\d){6})[a-z]{0,4}\d[a-z\d]{7,33}\b",  # account number (IBAN, card, ...)
    re.IGNORECASE,
)


def output_trusted(tool: Tool) -> bool:
    if tool.trusted_output is not None:
        return tool.trusted_output
    return tool.effect != "network"


def guarded(tool: Tool) -> bool:
    """Whether calls of this tool are checked once untrusted content is in the context."""
    return tool.effect != "read"


def words(text: str) -> str:
    """`text` as the words it is compared by (case folded, single spaces; a decimal number in its
    shortest form, so the user's "10.00" is the 10.0 of a JSON output)."""
    parts = (_number(part.strip(_EDGES)) for part in _SPLIT.split(text.casefold()))
    return " ".join(part for part in parts if part)


def _number(word: str) -> str:
    return repr(float(word)) if _DECIMAL.fullmatch(word) else word


def addresses(text: str) -> list[str]:
    """The URLs, domains, e-mail addresses and account numbers in `text`."""
    return [match.rstrip(".:!?") for match in _ADDRESS.findall(text)]


@dataclass(frozen=True)
class Record:
    """A JSON object in an untrusted output: its own fields and every field inside it (as words)."""

    own: frozenset[str]  # its scalar members, and the scalar items of its list members
    inside: frozenset[str]  # every key and scalar at any depth
    key: str  # the object as canonical JSON, to tell records apart


@dataclass(frozen=True)
class Output:
    """An untrusted tool output: its fields and its records (see `parse_output`)."""

    tool: str
    fields: tuple[str, ...]
    records: tuple[Record, ...] = ()


@dataclass(frozen=True)
class Sources:
    """The transcript's text split by where it came from, as words (see `words`)."""

    trusted: str  # " w w \n w ": trusted texts, padded, one per line
    untrusted: tuple[Output, ...]
    said: str = ""  # the system and user messages alone, likewise
    private: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (tool, the values of its output)

    @classmethod
    def of(
        cls,
        messages: Sequence[dict[str, Any]],
        tools: dict[str, Tool],
        runner_turns: Collection[int] = (),
    ) -> Sources:
        """`runner_turns`: positions of the runner's own user-role turns (`RunState.runner_turns`),
        which quote the model's output and so vouch for nothing."""
        # A result belongs to the latest call before it with its id (ids can repeat across turns).
        calls: dict[str, tuple[str, Any]] = {}
        trusted: list[str] = []
        said: list[str] = []
        untrusted: list[Output] = []
        private: list[tuple[str, tuple[str, ...]]] = []
        for position, message in enumerate(messages):
            role, text = message.get("role"), _text(message.get("content"))
            if role == "assistant":
                for call in message.get("tool_calls") or []:
                    function = call.get("function") or {}
                    calls[call.get("id", "")] = (function.get("name"), _arguments(function.get("arguments")))
            if role in ("system", "developer", "user") and position not in runner_turns:
                trusted.append(words(text))
                said.append(words(text))
            elif role == "tool":
                known = calls.get(message.get("tool_call_id", ""))
                if known is None:  # a result for no call we know of: nobody vouches for it
                    untrusted.append(Output("an earlier tool", (words(text),)))
                    continue
                name, arguments = known
                tool = tools.get(name)
                if tool is not None and tool.private_output:
                    private.append((name, tuple(words(v) for v in _leaf_values(text))))
                if tool is not None and not output_trusted(tool):
                    untrusted.append(parse_output(name, text))
                else:  # a trusted tool, or the runner's own answer (unknown tool)
                    trusted.append(_without(words(text), _echoes(arguments)))
        return cls(
            "".join(f" {text} \n" for text in trusted),
            tuple(untrusted),
            "".join(f" {text} \n" for text in said),
            tuple(private),
        )

    def vouched(self, needle: str) -> bool:
        """Whether trusted text holds this run of words (never for a value too short to tell)."""
        return len(needle) >= DISTINCT and f" {needle} " in self.trusted

    def quoted_by(self, needle: str, param: str = "") -> str | None:
        """The untrusted tool whose output has these words inside a longer field, if any.

        A value too short to tell (an id such as 13) counts only where the text says what it is:
        right after a word of the parameter's name or "id" / "number" / "no" ("file 13",
        "ID '13'"), not in "June 13" or "3. Foster communication".
        """
        names = _name_words(param) if len(needle) < DISTINCT else None
        for output in self.untrusted:
            for field in output.fields:
                if field == needle:
                    continue
                padded, at = f" {field} ", 0
                while (at := padded.find(f" {needle} ", at)) >= 0:
                    if names is None or names & set(padded[:at].split()[-2:]):
                        return output.tool
                    at += 1
        return None

    def is_field(self, needle: str) -> bool:
        """Whether these words are a whole field of an untrusted output."""
        return any(needle in output.fields for output in self.untrusted)

    def selected_by(self, needle: str) -> str | None:
        """A trusted value that picks out exactly one record, a record holding these words.

        "The participants of the 'Introductory meeting'", "Sarah Baker's address": the user names
        the record, the record supplies the value.
        """
        if len(needle) < DISTINCT:  # an id such as 13 names a record of every kind
            return None
        for output in self.untrusted:
            for record in output.records:
                if needle not in record.inside:
                    continue
                for value in record.own:
                    if value != needle and _names_a_record(value) and self.vouched(value):
                        holders = {r.key for o in self.untrusted for r in o.records if value in r.own}
                        if len(holders) == 1:
                            return value
        return None

    def secret_in(self, needle: str) -> tuple[str, str] | None:
        """(tool, value) for a value of a private output inside these words that the user's
        messages do not name."""
        padded = f" {needle} "
        for tool, values in self.private:
            for value in values:
                if len(value) >= DISTINCT and f" {value} " in padded and f" {value} " not in self.said:
                    return tool, value
        return None


DISTINCT = 3  # values with fewer characters (an id such as 13) occur anywhere: no source vouches


def _name_words(param: str) -> set[str]:
    """The words of a parameter's name (file_id, fileId: file, id) and the words for an id."""
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", param)
    return {w for w in re.split(r"[\W_]+", spaced.casefold()) if w} | {"id", "number", "no", "#"}


def _names_a_record(value: str) -> bool:
    return len(value) >= 4 and not value.replace(" ", "").isdigit()


def parse_output(tool: str, text: str) -> Output:
    """An untrusted output's fields: a JSON value's keys, strings and numbers, each one field;
    any other text is a single field. Its JSON objects are its records."""
    try:
        value = json.loads(text)
    except ValueError:
        return Output(tool, (words(text),))
    fields: list[str] = []
    records: list[Record] = []

    def walk(item: Any) -> list[str]:
        """Add `item`'s fields and records; return its fields."""
        if isinstance(item, dict):
            own: list[str] = []
            inside: list[str] = []
            for key, member in item.items():
                fields.append(words(str(key)))
                below = walk(member)
                inside += [words(str(key)), *below]
                if isinstance(member, list):
                    own += [words(x) for x in map(_scalar, member) if x is not None]
                elif not isinstance(member, dict):
                    own += below
            records.append(Record(frozenset(own), frozenset(inside), json.dumps(item, sort_keys=True)))
            return inside
        if isinstance(item, list):
            return [field for member in item for field in walk(member)]
        scalar = _scalar(item)
        if scalar is None:
            return []
        fields.append(words(scalar))
        return [words(scalar)]

    walk(value)
    return Output(tool, tuple(fields), tuple(records))


def _leaf_values(text: str) -> list[str]:
    """A JSON output's strings and numbers (not its keys), else the whole text."""
    try:
        value = json.loads(text)
    except ValueError:
        return [text]
    return [scalar for _, scalar in _values(value)]


def _scalar(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    if isinstance(item, int | float) and not isinstance(item, bool):
        return json.dumps(item)
    return None


Rule = Literal["needs approval", "untrusted", "destination", "private", "quoted name", "address"]


@dataclass(frozen=True)
class Hold:
    """Why a call needs approval, as the approver and the model are told: the rule that holds it
    back (`needs approval`: the tool's own flag; `untrusted`: provenance is not checked) and a
    sentence naming the parameter and the value."""

    rule: Rule
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class UntrustedContent:
    """The policy's settings; see the module docstring for the rule."""

    provenance: bool = True  # False: every guarded call needs approval once content is untrusted

    def review(self, tool: Tool, arguments: dict[str, Any], sources: Sources) -> Hold | None:
        """None when the call may run; else why it needs approval."""
        if not guarded(tool) or not sources.untrusted:
            return None
        kind = "egress" if tool.effect in EGRESS else "side-effecting"
        if not self.provenance:
            return Hold("untrusted", f"{tool.name} is {kind} and the context holds untrusted tool output")
        for param, value in _values(arguments):
            needle = words(value)
            if not needle:
                continue
            if param in tool.destinations:
                if not (sources.vouched(needle) or sources.selected_by(needle)):
                    return Hold(
                        "destination",
                        f"{tool.name} is {kind} and its destination {param}={value!r} is named by no "
                        "trusted text (the user's messages or a trusted tool's output)",
                    )
                continue
            secret = sources.secret_in(needle) if tool.effect in EGRESS else None
            if secret is not None:
                return Hold(
                    "private",
                    f"{tool.name} is egress and its argument {param} carries {secret[1]!r} from the "
                    f"private output of {secret[0]}, which the user's messages do not name",
                )
            if sources.vouched(needle):
                continue
            if param not in tool.content:
                origin, selected = sources.quoted_by(needle, param), sources.selected_by(needle)
                if origin is not None and selected is None:
                    return Hold(
                        "quoted name",
                        f"{tool.name} is {kind} and its argument {param}={value!r} is quoted from the "
                        f"output of {origin}, which is untrusted, not from the user",
                    )
                if selected is not None or sources.is_field(needle):
                    continue
            for address in addresses(value):
                needle = words(address)
                if not (sources.vouched(needle) or sources.selected_by(needle)):
                    return Hold(
                        "address",
                        f"{tool.name} is {kind} and its argument {param} holds the address "
                        f"{address!r}, which no trusted text names",
                    )
        return None


def _values(arguments: Any, param: str = "") -> Iterator[tuple[str, str]]:
    """(top-level parameter, value as text) for every string and number in the arguments."""
    if isinstance(arguments, dict):
        for key, item in arguments.items():
            yield from _values(item, param or str(key))
    elif isinstance(arguments, list | tuple):
        for item in arguments:
            yield from _values(item, param)
    elif (scalar := _scalar(arguments)) is not None:
        yield param, scalar


def _echoes(arguments: Any) -> set[str]:
    """What a call's output may repeat of the call itself: its values and the addresses in them."""
    echoes = set()
    for _, value in _values(arguments):
        echoes.add(words(value))
        echoes.update(words(address) for address in addresses(value))
    return echoes - {""}


def _without(text: str, echoes: set[str]) -> str:
    padded = f" {text} "
    for echo in sorted(echoes, key=len, reverse=True):
        while f" {echo} " in padded:
            padded = padded.replace(f" {echo} ", " \n ")
    return padded.strip(" ")


def _arguments(text: Any) -> Any:
    if not isinstance(text, str):
        return text or {}
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return {}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)
