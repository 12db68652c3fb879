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
  tools' outputs, less every value the model has passed to a tool so far (so a trusted store, an
  address book or a notes file, does not launder what the model wrote into it, nor a trusted
  tool what it merely echoes); what the runner writes itself (repair prompts, denials, argument
  errors, the answer for a tool that does not exist) vouches for nothing.
* `destinations`: the parameters that say where data, money or access goes (recipients, account
  numbers, URLs, channels, invitees, the merchant of a booking).
* `content`: the parameters that are prose (a message body, a file's text, a description).
  Every other parameter is a *name*: an id, a title, a place, an amount.
* `private_output`: the output is the user's secrets (identity documents, card numbers).

* `actions`: the words a user asks for the tool's effect with ("delete", "remove"); default:
  the first word of the tool's name (its verb by convention) and, for egress, its kind's verbs.

The rule, for every `write` or egress call while untrusted output is in the transcript (before
that nothing is checked). Each argument value (every string and number, list items one by one)
is compared as a run of whole words with the text it could have come from (decimal numbers by
value: the user's "10.00" is an output's 10.0); JSON outputs are read field by field and object
by object (records), any other output is one field.

1. *Destinations come from trusted text*: a destination value must occur in trusted text, or be
   an own field of the one record that a trusted value of its own picks out ("the participants
   of the 'Introductory meeting'", "Sarah Baker's address": the user names the record, the
   record supplies the value, a mapping of its own included, such as a file's `shared_with`;
   not a field of the records in a list inside it, nor picked out by a link, and never a link
   to fetch: "visit the links on the page" is the injection's
   request). Never from untrusted text, nor made up by the model; a destination of punctuation
   alone ("*") is held.
2. *Secrets stay in*: an egress call's other values may not carry a value of a private output
   that the user's messages do not name (of prose, its id-like words and digit runs; an id or
   number also reformatted: "4111 1111 1111 1111" is 4111111111111111).
3. *Names are not quoted from untrusted text*: a name that occurs inside a longer field of an
   untrusted output (an email body, a page, a review, a file's text) and in no trusted text was
   introduced by that text: that is where an injected instruction puts the ids, names and
   phrases it wants used. A field of a record the user picked out (rule 1) may be used anyway.
4. *Fields are data*: a name equal to a whole field of an output (an id in a listing, a channel
   in a list, the address field of a record) is data the model selected, and may flow.
5. *Addresses come from trusted text*: every URL, domain (of any script), IP address, e-mail
   address or account number inside a content value, or inside a name that rule 4 did not
   accept, must be one trusted text names (or one rule 1 accepts); text is read as a resolver
   would (NFKC, ideographic dots as ".", zero-width characters dropped). Content may otherwise
   quote untrusted text.

6. *The action is the user's* (class 2: injected intent with legitimate values): the call's
   kind must be one the user's own messages ask for, one of the tool's `actions` words
   (inflected: "deleting", "deleted"), else it is held ("unrequested") however trusted its
   values are ("delete file 13" when the listing shows 13). This is CaMeL's point (control
   flow comes from the trusted query, never from data) and Progent's (privileges are scoped
   to the task), as a lexical check a runner over any OpenAI-compatible model can make: no
   second model, no plan. A user who hands the choice of action to a document ("follow the
   instructions in ...", "do the actions in the mail from ...", "do the tasks on my TODO list")
   is asked by the words of that document: an output of a call whose arguments the user named,
   or a record a value the user wrote picks out; the names it holds count as the user's (rules
   3 and 8), and so they do when the user hands it only the values of an action they name
   ("update my address accordingly"). A fetch (a network tool without content) carries
   only its URL, which rule 1 decides, so it is not bound.
7. *Values are compared in canonical form too* (class 1: disguised values): rule 3 and
   trusted text also match a value after NFKC and case folding, number words as digits ("one
   three", "thirteen": 13), punctuation and the words that spell it ("(at)", "[.]", "dot")
   dropped, words joined or split ("Intro+with+Mark"), at word edges. A title of several words
   with a word that no text of the run holds in any spelling was dictated out of sight and is
   held ("unsourced"); dates, times, numbers and single words are left out (the model computes
   or writes them itself).
8. *The object is the user's* (class 2 on a requested kind: "delete the largest file", and the
   injection wants another one deleted): a name of a bound call (rule 6) that is an item's field
   in a listing of any output, trusted or not (data the model selected), must be named by the
   user's messages or picked out by their request (selection.py: a whole field or a word of
   theirs that only that item holds among its siblings, or the extreme they ask for, "largest",
   "fewest", in a numeric member or in what reads of each item measured), else it is held
   ("unselected"). A number, a date or a time counts only as an id (by the parameter's or the
   listing's key); a parameter with a closed set of values (an enum: a permission level) is a
   mode, not an object.

Outputs are read by structure whatever their serialisation: JSON, or YAML (a mapping of two keys
or more, or a list; read as plain text, aliases refused), as AgentDojo's and many CLIs' tools
write it; any other text is one field.

Values are every string and number of the arguments, and the keys of objects inside them (a
grantee named by a key of `permissions`). A value of fewer than three characters (an id such as
13) is never vouched for by trusted text or a record (it occurs everywhere: "June 13"), and
counts as quoted only where the text says what it is ("file 13", "ID '13'"), right after a word
of the parameter's name or "id" / "number".

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
  the sales report") lets the model look its id up, a field (rule 4); rule 8 holds it for a
  bound call unless the user's request picks that record. Destinations are immune (rule 1 asks
  for a trusted source, not for the absence of an untrusted one), save one the trusted text
  names for another purpose (a contact of the user's the injection picks).
* A third party who writes two fields of one record (an email's subject and body) can put a name
  in one and the instruction in the other; one who authors a whole record the user will pick out
  (an invitation titled like the user's meeting) controls its destinations (rule 1).
* Content to a destination the user named: an injected instruction can choose what a legitimate
  recipient is sent, save secrets (rule 2) and addresses (rule 5).
* A transcript carried into a new run (`Runner.run(agent, result.messages + [...])`) loses
  which of its messages the runner wrote (the run's state and log keep it, the messages do not):
  its denials then read as trusted tools' output and its repair prompts as the user's words.
* A trusted tool that computes from its arguments (a calculator, a converter) returns a value the
  model chose in another form: an injection can have it compute an account number. Declare such
  a tool `trusted_output=False`. Numbers are compared by value only in plain decimal form
  ("$12,000" is not 12000), so an id or amount reformatted escapes rule 3 (not rule 1).

* Rules 6 and 8 are lexical: a delegating user lets the document they named (and whoever wrote
  into it) choose the action and its names; a user whose words happen to include a tool's verb
  grants that tool; an item the user's request picks by a word of theirs, or by an extreme, may
  be the injection's target when it happens to be the one the words or the extreme pick ("delete
  the largest file" when the injection wants the largest one gone, or a file named with a word
  of the prompt); an object that is no item of a listing (a name the model writes from memory)
  is not bound; quantities (amounts, dates) are not objects, and an injection can change how much
  goes to a destination the user named. Rule 7 knows English number words and the common
  address disguises, not arithmetic ("six plus seven") or a reference the model resolves ("the
  file the budget is in"): those values are fields or trusted, and rules 6 and 8 hold the call.
* An egress tool that declares no `destinations`: its recipient is a name, and a name equal to a
  whole field of an untrusted output is data (rule 4), so an output that is the address alone
  (`"evil@attacker.example"`, or a record holding it) supplies it; rule 1 applies only to the
  parameters declared.

On by default for an agent whose tools declare an effect; `Policies(untrusted=UntrustedContent())`
turns it on for any agent, `Policies(untrusted=None)` turns it off.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any, Literal

import yaml

from .selection import Listing, Request, is_id, key_words, listings

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
# Addresses: where something can be sent or fetched. Labels are letters of any script (an IDN,
# a homograph); text is first normalised (`_normal`), so fullwidth forms and ideographic dots
# read as the ASCII a resolver sees.
_PATH = r"(?::\d{1,5})?(?:/[^\s\"'`<>()\[\]{},;|]*)?"  # [:port][/path]
# In order: a URL (any scheme, or www.), an e-mail address (or one @[IP literal]), an IPv6
# literal, an IPv4 address, a domain, an account number (IBAN, card, ...). Each alternative can
# start only where a fixed prefix or a word boundary is, and repeats boundedly, so a long run of
# text costs linear time.
_ADDRESS = re.compile(
    "|".join(
        (
            r"(?:(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,15}://(?:\[[^\]\s]{0,64}\])?|www\.)[^\s\"'`<>()\[\]{},;|]*",
            r"(?<![\w.+-])[\w.+-]{1,64}@(?:[\w-]{1,63}(?:\.[\w-]{1,63}){1,8}|\[[^\]\s]{1,64}\])",
            r"\[[0-9a-f]{0,4}:[0-9a-f:.]{0,40}\]" + _PATH,
            r"\b\d{1,3}(?:\.\d{1,3}){3}\b" + _PATH,
            r"(?<![\w-])(?:[^\W_](?:[\w-]{0,61}[^\W_])?\.){1,8}"
            r"(?:[^\W\d_]{2,63}|xn--[a-z0-9-]{1,59})\b" + _PATH,
            r"\b(?=(?:[a-z]{0,33}\d){6})[a-z]{0,4}\d[a-z\d]{7,33}\b",
        )
    ),
    re.IGNORECASE,
)
_DOTS = {0x3002: ".", 0xFF61: ".", 0xFF0E: "."}  # ideographic full stops a resolver reads as "."


def _normal(text: str) -> str:
    """NFKC, ideographic dots as ".", invisible format characters (zero-width space) dropped:
    what a browser or mail client makes of the text."""
    if text.isascii():  # nothing to change
        return text
    text = unicodedata.normalize("NFKC", text).translate(_DOTS)
    return "".join(c for c in text if unicodedata.category(c) != "Cf")


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
    parts = (_number(part.strip(_EDGES)) for part in _SPLIT.split(_normal(text).casefold()))
    return " ".join(part for part in parts if part)


def _number(word: str) -> str:
    return repr(float(word)) if _DECIMAL.fullmatch(word) else word


# A sentence typed with no space after its full stop, the stop right after an address: "post them
# to www.our-company.com.They sent ...": a stop after a lower-case word (or label), before a
# capitalised word of three letters or more that is no top-level domain, and another word.
# "docs.Python.org", "www.Example.Com is" and "acme.co.Uk today" do not match.
_RUN_ON = re.compile(
    r"(?<![\w-])[a-z0-9-]+\.(?=(?!(?:Com|Net|Org|Edu|Gov|Mil|Int|Info|Biz|App|Dev)\b)[A-Z][a-z]{2,}\s+[a-z])"
)


def _said_words(text: str) -> str:
    """A trusted message as words; where a sentence runs on after an address ("...company.com.They
    sent"), the message is read a second time with the break put in, so the address the user
    wrote is vouched for as well as the run-on word (this only ever vouches for more of what
    the user typed)."""
    plain = words(text)
    broken = _RUN_ON.sub(r"\g<0> ", text)
    return plain if broken == text else f"{plain} \n {words(broken)}"


def addresses(text: str) -> list[str]:
    """The URLs, domains, e-mail addresses and account numbers in `text`."""
    return [match.rstrip(".:!?") for match in _ADDRESS.findall(_normal(text))]


@dataclass(frozen=True)
class Record:
    """A JSON object in an untrusted output: its own fields (as words)."""

    # its scalar members, the scalar items of its list members, and the keys and scalar values
    # of its object members (not the fields of a record in a list inside it)
    own: frozenset[str]
    key: str  # the object as canonical JSON, to tell records apart


@dataclass(frozen=True)
class Output:
    """An untrusted tool output: its fields and its records (see `parse_output`)."""

    tool: str
    fields: tuple[str, ...]
    records: tuple[Record, ...] = ()
    runner: bool = False  # the runner's answer (a denial, an error): not searched for disguises

    @cached_property
    def canonical(self) -> tuple[Canonical, ...]:
        """Its fields in canonical form (`Canonical`), computed once."""
        return tuple(Canonical.of(field) for field in self.fields)


_DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen"]
_TEENS += ["eighteen", "nineteen"]
_NUMBERS = {word: str(n) for n, word in enumerate(_DIGITS + _TEENS)}
_TENS = {w: n for n, w in enumerate(["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty"], 2)}
_TENS["ninety"] = 9
# Words that spell punctuation out: "name (at) site (dot) com", "one point five". Dropped, as
# punctuation is: canonical forms are letters and digits alone.
_SPELLED = frozenset({"at", "dot", "point"})
_ALNUM = re.compile(r"[^\W_]+")


@dataclass(frozen=True)
class Canonical:
    """Text as the value it spells, whatever its disguise: NFKC and case folded, number words as
    digits ("one three" and "thirteen" read 13, "twenty-one" 21; "point" is dropped, so "one
    point five" reads 15, as "1.5" does), punctuation and the words that
    spell it ("at", "dot", "point") dropped, and the rest run together, so "Intro+with+Mark",
    "intro with mark" and "IntroWithMark", or "mark (at) x (dot) com" and "mark@x.com", are
    one form. `starts`: where each word begins in `compact` (a match must start and end at a
    word's edge, so "13" is not found in "2013")."""

    compact: str
    starts: tuple[int, ...]
    tokens: tuple[str, ...]

    @classmethod
    def of(cls, text: str) -> Canonical:
        tokens: list[str] = []
        tens = False  # the last token was a tens word ("twenty"), which a unit may complete
        spelled = False  # the last token was a digit word, which a digit word continues
        for token in _ALNUM.findall(_normal(text).casefold()):
            if tens and token in _DIGITS[1:]:
                tokens[-1] = str(int(tokens[-1]) + int(_NUMBERS[token]))  # "twenty one": 21
                tens = False
                continue
            spelled_digit = token in _DIGITS and spelled
            spelled = token in _DIGITS
            tens = token in _TENS
            if tens:
                tokens.append(str(10 * _TENS[token]))
            elif spelled_digit:
                tokens[-1] += _NUMBERS[token]  # digits spelled one by one: "one three" is 13
            elif token in _NUMBERS:
                tokens.append(_NUMBERS[token])
            elif token not in _SPELLED:
                tokens.append(token)
        starts, at = [], 0
        for token in tokens:
            starts.append(at)
            at += len(token)
        return cls("".join(tokens), tuple(starts), tuple(tokens))

    def finds(self, value: Canonical, names: set[str] | None = None) -> bool:
        """Whether `value` occurs here from a word's start to a word's end, not as all of it;
        with `names`, only right after one of these words ("id one three")."""
        needle = value.compact
        if not needle or needle == self.compact:
            return False
        edges = {*self.starts, len(self.compact)}
        at = self.compact.find(needle)
        while at >= 0:
            if at in edges and at + len(needle) in edges:
                index = self.starts.index(at)
                if names is None or names & set(self.tokens[max(index - 2, 0) : index]):
                    return True
            at = self.compact.find(needle, at + 1)
        return False


@dataclass(frozen=True)
class Sources:
    """The transcript's text split by where it came from, as words (see `words`)."""

    trusted: str  # " w w \n w ": trusted texts, padded, one per line
    untrusted: tuple[Output, ...]
    said: str = ""  # the system and user messages alone, likewise
    private: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (tool, the values of its output)
    asked: str = ""  # the user's messages alone, likewise: what the user asked for
    # the words of outputs of calls whose every argument the user's messages name, when those
    # messages hand the choice of action to a document ("follow the instructions in the file
    # 'notices.txt'", "do the tasks on my list at www.todo.example"), one per line
    delegated: str = ""
    listings: tuple[Listing, ...] = ()  # every output's listings (selection.py), trusted or not
    # (value, tool, n): a read whose one argument was the value returned a list of n items ("the
    # channel with the fewest members": how many get_users_in_channel listed for each channel)
    measures: tuple[tuple[str, str, float], ...] = ()

    @cached_property
    def said_compact(self) -> str:
        """The system and user messages as letters and digits alone (`_compact`), once."""
        return _compact(self.said)

    @cached_property
    def trusted_canonical(self) -> tuple[Canonical, ...]:
        """Each trusted text in canonical form (`Canonical`), once."""
        return tuple(Canonical.of(line) for line in self.trusted.split(" \n") if line.strip())

    @cached_property
    def asked_stems(self) -> frozenset[str]:
        """The stems (`_stem`) of the words of the user's messages, once."""
        return frozenset(_stem(word) for word in _ALNUM.findall(self.asked))

    @cached_property
    def words_seen(self) -> frozenset[str]:
        """Every canonical word of the run's texts, trusted or not, once."""
        texts = [*self.trusted_canonical, *(c for o in self.untrusted for c in o.canonical)]
        return frozenset(token for text in texts for token in text.tokens)

    def made_up(self, needle: str) -> bool:
        """Whether a name of several words (a title) has a word that no text of the run holds in
        any spelling: the model did not read it anywhere, so it was dictated in a form no
        comparison recognises. Dates, times and numbers are left out (the model computes them),
        and so is a single word (the model's own "Trip", "ok")."""
        if _NUMERIC.fullmatch(needle):
            return False
        tokens = [token for token in Canonical.of(needle).tokens if not token.isdigit()]
        return len(tokens) >= 2 and any(len(t) >= DISTINCT and t not in self.words_seen for t in tokens)

    def requested(self, tool: Tool) -> bool:
        """Whether the user's messages ask for this tool's kind of action (one of its words), or
        hand the choice to a document they name (`delegated`) that asks for it."""
        stems = {_stem(word) for word in actions_of(tool)}
        return bool(stems & self.asked_stems) or bool(stems & self.delegated_stems)

    @cached_property
    def documents(self) -> str:
        """When the user hands the choice of action, or of an action's values, to a document
        (`_delegation`): the words of that document, an output of a call whose arguments the
        user named (`delegated`) or a record of an output that a value the user wrote picks out;
        else nothing."""
        if not _delegation(self.asked):
            return ""
        texts = [self.delegated]
        for output in self.untrusted:
            for record in output.records:
                if any(_names_a_record(v) and f" {v} " in self.asked for v in record.own):
                    texts.append(" \n ".join(record.own))
        return "".join(f" {text} \n" for text in texts)

    @cached_property
    def delegated_stems(self) -> frozenset[str]:
        """The stems of the words of the documents the user delegates the choice of action to
        (`documents`)."""
        if _delegation(self.asked) != "actions":
            return frozenset()
        return frozenset(_stem(word) for word in _ALNUM.findall(self.documents))

    def named(self, needle: str, param: str = "") -> bool:
        """Whether the user's messages, or a document they delegate to (`documents`), name these
        words, in any spelling; a value too short to tell (13) only where the text says what it
        is ("file 13", "ID 13"), as in `quoted_by`."""
        if len(needle) >= DISTINCT and any(f" {needle} " in text for text in (self.said, self.documents)):
            return True
        value = Canonical.of(needle)
        names = _name_words(param) if len(value.compact) < DISTINCT else None
        return any(text.compact == value.compact or text.finds(value, names) for text in self.said_canonical)

    @cached_property
    def said_canonical(self) -> tuple[Canonical, ...]:
        """The system and user messages, and the documents the user delegates to, each in
        canonical form, once."""
        lines = [*self.said.split(" \n"), *self.documents.split(" \n")]
        return tuple(Canonical.of(line) for line in lines if line.strip())

    @cached_property
    def request(self) -> Request:
        """What the user's request picks items of a listing with (selection.py)."""
        text = f"{self.asked} {self.documents}"
        measures: dict[str, list[tuple[str, float]]] = {}
        for value, tool, n in self.measures:
            measures.setdefault(value, []).append((tool, n))
        return Request.of(text, lambda field: self.named(field) and _names_a_record(field), measures)

    def unselected(self, needle: str, param: str) -> bool:
        """Whether these words are an item's field in a listing (data the model selected) that
        the user's request neither names nor picks out (selection.py). A number, a date or a
        time counts only as an id (the parameter's or the listing's key says so): an amount is
        what the model computes, not the thing it acts on."""
        quantity = _NUMERIC.fullmatch(needle) is not None and not is_id(param)
        holders = [
            (listing, i)
            for listing in self.listings
            for i, item in enumerate(listing)
            if needle in (item.ids if quantity else item.own)
        ]
        if not holders or self.named(needle, param):
            return False
        return not any(self.request.picks(listing, index) for listing, index in holders)

    @classmethod
    def of(
        cls,
        messages: Sequence[dict[str, Any]],
        tools: dict[str, Tool],
        runner_turns: Collection[int] = (),
        unreached: Collection[int] | None = None,
    ) -> Sources:
        """`runner_turns`: positions of what the runner wrote itself (`RunState.runner_turns`):
        repair prompts, and tool results no tool returned as its answer (denials, argument
        errors, answers for unknown tools, errors, timeouts). They quote the model's output, so
        they vouch for nothing. `unreached` (`RunState.unreached`): the results of calls that
        never reached their tool; None: every call may have."""
        # A result belongs to the latest call before it with its id (ids can repeat across turns).
        calls: dict[str, tuple[str, set[str]]] = {}  # id -> (tool name, the call's echoes)
        values_of: dict[str, list[str]] = {}  # id -> the call's argument values, as words
        named_outputs: list[tuple[str, list[str]]] = []  # (output, its call's argument values)
        ran = _calls_that_ran(messages, unreached)
        sent: set[str] = set()  # every value the model has passed to a write or egress tool
        trusted: list[str] = []
        said: list[str] = []
        asked: list[str] = []
        untrusted: list[Output] = []
        private: list[tuple[str, tuple[str, ...]]] = []
        found: list[Listing] = []
        measures: list[tuple[str, str, float]] = []
        for position, message in enumerate(messages):
            role, text = message.get("role"), _text(message.get("content"))
            if role == "assistant":
                for call in message.get("tool_calls") or []:
                    function = call.get("function") or {}
                    name, echoes = function.get("name"), _echoes(_arguments(function.get("arguments")))
                    calls[call.get("id", "")] = (name, echoes)
                    arguments = _arguments(function.get("arguments"))
                    values_of[call.get("id", "")] = [words(v) for _, v in _values(arguments, keys=False)]
                    tool = tools.get(name)
                    if tool is not None and guarded(tool) and (position, call.get("id", "")) in ran:
                        sent |= echoes
            if role in ("system", "developer", "user") and position not in runner_turns:
                trusted.append(_said_words(text))
                said.append(trusted[-1])
                if role == "user":
                    asked.append(trusted[-1])
            elif role == "tool":
                known = calls.get(message.get("tool_call_id", ""))
                if known is None:  # a result for no call we know of: nobody vouches for it
                    untrusted.append(Output("an earlier tool", (words(text),)))
                    continue
                name, echoes = known
                tool = tools.get(name)
                if tool is None:  # the runner's answer for a tool that does not exist
                    continue
                if tool.private_output and position not in runner_turns:
                    private.append((name, _secrets(text)))
                if position not in runner_turns:
                    found += _listings(text)
                    arguments = values_of.get(message.get("tool_call_id", ""), [])
                    listed = structure(text)
                    if not guarded(tool) and len(arguments) == 1 and isinstance(listed, list):
                        measures.append((arguments[0], name, float(len(listed))))
                if not output_trusted(tool):
                    output = parse_output(name, text)
                    if position in runner_turns:  # a denial or an error, quoting the model's call
                        output = replace(output, runner=True)
                    untrusted.append(output)
                    if position not in runner_turns and not binds_action(tool):  # a read, a fetch
                        named_outputs.append((text, values_of.get(message.get("tool_call_id", ""), [])))
                elif position not in runner_turns:
                    # What the model passed to this call, or to any write that ran before (a
                    # call of the same turn included), a trusted output may only echo: a store
                    # (contacts, notes) returns what it was given, in whole or in part.
                    trusted.append(_without(_trusted_words(text), sent | echoes))
        asked_text = "".join(f" {text} \n" for text in asked)
        delegated: list[str] = []  # see `documents`
        if _delegation(asked_text):
            for text, arguments in named_outputs:
                if arguments and all(len(a) >= DISTINCT and f" {a} " in asked_text for a in arguments):
                    delegated.append(words(text))
        return cls(
            "".join(f" {text} \n" for text in trusted),
            tuple(untrusted),
            "".join(f" {text} \n" for text in said),
            tuple(private),
            asked_text,
            " \n ".join(delegated),
            tuple(found),
            tuple(measures),
        )

    def vouched(self, needle: str) -> bool:
        """Whether trusted text holds this run of words (never for a value too short to tell)."""
        return len(needle) >= DISTINCT and f" {needle} " in self.trusted

    def vouched_canonically(self, needle: str) -> bool:
        """Whether trusted text holds these words in canonical form ("Intro+with+Mark" for the
        user's "intro with mark"); never for a value too short to tell."""
        value = Canonical.of(needle)
        return len(value.compact) >= DISTINCT and any(
            text.compact == value.compact or text.finds(value) for text in self.trusted_canonical
        )

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
        # The same in canonical form: a value disguised in the text ("ID one three",
        # "Intro+with+Mark", "mark (at) x (dot) com") that the model writes back in normal form.
        if _DECIMAL.fullmatch(needle):
            return None  # an amount: its digits run together would be another number
        value = Canonical.of(needle)
        names = _name_words(param) if len(value.compact) < DISTINCT else None
        for output in self.untrusted:
            if not output.runner and any(field.finds(value, names) for field in output.canonical):
                return output.tool
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
                if needle not in record.own:  # its own field, not one of a record inside it
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
        padded, compact = f" {needle} ", _compact(needle)
        for tool, values in self.private:
            for value in values:
                if len(value) >= DISTINCT and f" {value} " in padded and f" {value} " not in self.said:
                    return tool, value
                if _id_like(value) and value in compact and value not in self.said_compact:
                    return tool, value  # a compact form: the secret reformatted
        return None


DISTINCT = 3  # values with fewer characters (an id such as 13) occur anywhere: no source vouches


# A user who hands the choice of action to a document: a verb of doing followed by a noun of
# things to do ("follow the instructions", "do the actions specified in the email", "do all the
# tasks on my TODO list"); not a list of tasks the prompt itself gives ("perform the following
# tasks"), not a negation ("do not take any action"), not someone else's doing ("the TODO list
# ... the task they need to execute"). "Accordingly" hands over only the values (`_delegation`).
_DELEGATE_VERBS = frozenset({"follow", "do", "perform", "complet", "carry", "execut"})
_DELEGATE_NOUNS = frozenset({"instruction", "action", "todo"})
_DELEGATE_REACH = 8  # words from the verb to its noun


@lru_cache(maxsize=64)
def _delegation(asked: str) -> str:
    """What the user's messages hand to a document: "actions" (which actions, and their values),
    "values" (only the values of an action the user names: "update my address accordingly";
    "reply accordingly" hands over no deletion the mail asks for), or "" (nothing)."""
    handed = ""
    for line in asked.split("\n"):
        stems = [_stem(word) for word in _ALNUM.findall(line)]
        for at, stem in enumerate(stems):
            after = stems[at + 1 : at + 1 + _DELEGATE_REACH]
            if stem in _DELEGATE_VERBS and after[:1] != ["not"] and _DELEGATE_NOUNS & set(after):
                return "actions"
        if "accordingly" in stems:
            handed = "values"
    return handed


def binds_action(tool: Tool) -> bool:
    """Whether a call must be of a kind the user asked for: every guarded tool but a fetch (a
    network tool with no content to send), which carries only its URL, and rule 1 decides that."""
    return guarded(tool) and not (tool.effect == "network" and not tool.content)


# The verbs a user asks for egress of each kind with, whatever the tool is called.
_KIND_WORDS: dict[str, tuple[str, ...]] = {
    "messages": ("send", "tell", "say", "reply", "answer", "forward", "mail", "email", "message", "write"),
    "payments": ("pay", "paid", "send", "transfer", "refund"),
    "network": ("post", "upload", "publish", "submit"),
}


def actions_of(tool: Tool) -> tuple[str, ...]:
    """The words a user asks for this tool's effect with: its declared `actions`, else the
    first word of its name, its verb by convention (delete_file: "delete"; sendEmail: "send"),
    and, for egress, the verbs of its kind (a `messages` tool: "tell", "reply", "forward",
    ...). Not the name's nouns: "list my files" asks for no delete_file."""
    if tool.actions is not None:
        return tool.actions
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", tool.name)
    named = [w for w in re.split(r"[\W\d_]+", spaced.casefold()) if w][:1]
    kind = _KIND_WORDS.get(tool.effect or "", ())
    return tuple(dict.fromkeys([*named, *kind])) or (tool.name.casefold(),)


def _stem(word: str) -> str:
    """A word without its inflection, roughly ("deleting", "deleted", "deletes", "delete":
    "delet"), so that the user's form of a verb matches the tool's."""
    word = word.casefold()
    for suffix in ("ing", "ed", "es", "s", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _name_words(param: str) -> set[str]:
    """The words of a parameter's name (file_id, fileId: file, id) and the words for an id."""
    return {*key_words(param), "id", "number", "no", "#"}


def _names_a_record(value: str) -> bool:
    """A title, a name, a file name or a sender can say which record the user means; a number
    cannot, nor a link: a page's own URL picks out the page, and with it every address on it."""
    return len(value) >= 4 and not value.replace(" ", "").isdigit() and not _is_link(value)


_LINK = re.compile(r"://|(?<![\w-])www\.", re.IGNORECASE)


def _is_link(text: str) -> bool:
    """A URL with a scheme, or a www. address: something to fetch."""
    return _LINK.search(text) is not None


class _PlainYAML(yaml.BaseLoader):
    """YAML as text: every scalar a string as written (no dates or numbers read into objects),
    and no aliases (an alias repeats a node without copying it: a few lines could stand for
    millions of fields)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("aliases are not read")
        return super().compose_node(parent, index)


_NOT_PARSED = object()


@lru_cache(maxsize=512)
def structure(text: str) -> Any:
    """A tool output's structure, whichever way it was serialised: a JSON value, or YAML that
    is a mapping of two keys or more or a list (AgentDojo's tools, many CLIs); `_NOT_PARSED`
    for prose (a one-line "Note: ..." is prose, not a mapping; a one-line "- item" is a list of
    one). Cached: a run reviews the same outputs on every call."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
        pass
    if "\n" not in text.strip() and not text.startswith("- "):
        return _NOT_PARSED
    try:
        value = yaml.load(text, Loader=_PlainYAML)
    except (yaml.YAMLError, RecursionError):
        return _NOT_PARSED
    if isinstance(value, list) or (isinstance(value, dict) and len(value) >= 2):
        return value
    return _NOT_PARSED


@lru_cache(maxsize=512)
def _listings(text: str) -> tuple[Listing, ...]:
    """A tool output's listings (selection.py), whichever way it was serialised (`structure`)."""
    value = structure(text)
    return () if value is _NOT_PARSED else tuple(listings(value, words))


def parse_output(tool: str, text: str) -> Output:
    """An untrusted output's fields: a structured value's (`structure`: JSON, YAML) keys,
    strings and numbers, each one field; any other text is a single field. Its objects are its
    records."""
    value = structure(text)
    if value is _NOT_PARSED:
        return Output(tool, (words(text),))
    fields = tuple(words(item) for item in _keys_and_values(value))
    records = tuple(
        Record(frozenset(_own_fields(obj)), json.dumps(obj, sort_keys=True)) for obj in _objects(value)
    )
    return Output(tool, fields, records)


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in `value`, inner ones first."""
    members = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for member in members:
        yield from _objects(member)
    if isinstance(value, dict):
        yield value


def _own_fields(obj: dict[str, Any]) -> Iterator[str]:
    """A record's own fields as words: its scalar members, the scalar items of its list members,
    and the keys and scalar values of its object members (shared_with {address: role})."""
    for member in obj.values():
        if isinstance(member, dict):
            yield from (words(str(key)) for key in member)
            members: Any = member.values()
        else:
            members = member if isinstance(member, list) else (member,)
        yield from (words(x) for x in map(_scalar, members) if x is not None)


def _calls_that_ran(
    messages: Sequence[dict[str, Any]], unreached: Collection[int] | None
) -> set[tuple[int, str]]:
    """(position of the assistant message, call id) of every call that may have reached its
    tool: a denied or invalid call did not, so nothing it carried can come back from one."""
    latest: dict[str, int] = {}
    ran: set[tuple[int, str]] = set()
    for position, message in enumerate(messages):
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                latest[call.get("id", "")] = position
                if unreached is None:
                    ran.add((position, call.get("id", "")))
        elif message.get("role") == "tool" and unreached is not None and position not in unreached:
            at = latest.get(message.get("tool_call_id", ""))
            if at is not None:
                ran.add((at, message.get("tool_call_id", "")))
    return ran


def _trusted_words(text: str) -> str:
    """A trusted output as words: a structured output's (`structure`) keys and values one per
    line (decoded, so an escaped quote is the quote it stands for), any other text as a whole."""
    value = structure(text)
    if not isinstance(value, dict | list):
        return words(text)
    return " \n ".join(words(item) for item in _keys_and_values(value))


def _keys_and_values(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _keys_and_values(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _keys_and_values(item)
    elif (scalar := _scalar(value)) is not None:
        yield scalar


# In prose, what tells a secret: a run of at least eight digits, spaces or dashes between them
# ("4111 1111 1111 1111"), or a word of six or more characters with four digits or more
# ("XK-4471902"); dates and times are left out.
_DIGIT_RUN = re.compile(r"\d(?:[ \-]?\d){7,}")
_NUMERIC = re.compile(r"[-+$€£]?[\d.,: /%-]+")  # an amount, a date, a time
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2})?)?|\b\d{1,2}:\d{2}(?::\d{2})?\b")


def _secrets(text: str) -> tuple[str, ...]:
    """A private output's values as words: a structured output's (`structure`) strings and
    numbers, any other text (prose, or JSON cut short) its id-like words and digit runs; each
    also in compact form (`_compact`), so a reformatted secret is still found."""
    value = structure(text)
    if value is not _NOT_PARSED:
        values = [scalar for _, scalar in _values(value, keys=False)]
    else:
        text = _DATE_TIME.sub(" ", text)  # a date or a time is no secret
        values = [w for w in words(text).split() if _id_like(_compact(w))]
        values += _DIGIT_RUN.findall(text)
    found = [words(v) for v in values]
    found += [c for c in map(_compact, found) if _id_like(c)]
    return tuple(dict.fromkeys(v for v in found if v))


def _id_like(value: str) -> bool:
    return value.isalnum() and len(value) >= 6 and sum(c.isdigit() for c in value) >= 4


def _compact(text: str) -> str:
    """Letters and digits alone: the form a reformatted number or id is compared in."""
    return "".join(c for c in text.casefold() if c.isalnum())


def _scalar(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    if isinstance(item, int | float) and not isinstance(item, bool):
        return json.dumps(item)
    return None


Rule = Literal[
    "needs approval",
    "untrusted",
    "unrequested",
    "unselected",
    "destination",
    "private",
    "quoted name",
    "unsourced",
    "address",
]


@dataclass(frozen=True)
class Hold:
    """Why a call needs approval, as the approver and the model are told: the rule that holds it
    back (`needs approval`: the tool's own flag; `untrusted`: provenance is not checked), a
    sentence naming the parameter and the value, and the top-level parameter itself (None when
    the whole call is held), so an approver can tell which argument is in question."""

    rule: Rule
    message: str
    parameter: str | None = None

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class UntrustedContent:
    """The policy's settings; see the module docstring for the rule."""

    provenance: bool = True  # False: every guarded call needs approval once content is untrusted
    bind_actions: bool = True  # False: a call need not be of a kind the user's messages ask for

    def review(self, tool: Tool, arguments: dict[str, Any], sources: Sources) -> Hold | None:
        """None when the call may run; else why it needs approval (the first value held back)."""
        return next(self.holds(tool, arguments, sources), None)

    def holds(self, tool: Tool, arguments: dict[str, Any], sources: Sources) -> Iterator[Hold]:
        """Every value (or address in one) that holds the call back, one reason each, in
        argument order."""
        if not guarded(tool) or not sources.untrusted:
            return
        kind = "egress" if tool.effect in EGRESS else "side-effecting"
        if not self.provenance:
            yield Hold("untrusted", f"{tool.name} is {kind} and the context holds untrusted tool output")
            return
        bound = self.bind_actions and binds_action(tool)
        shape, grants = _declared_words(tool), tool.destinations
        for param, value in _values(arguments, schema=tool.parameters, spelled=shape, grants=grants):
            needle = words(value)
            if param in tool.destinations:
                if not value.strip():
                    continue  # an empty destination names nobody; punctuation alone ("*") is held
                if _normal(value) != value:
                    yield Hold(
                        "destination",
                        f"{tool.name} is {kind} and its destination {param}={value!r} is written with "
                        "invisible or look-alike characters, so no text can vouch for it",
                        param,
                    )
                    continue
                # A link to fetch is never a record's field: "visit the links on the page the
                # user named" is the injection's own request.
                picked = not _is_link(value) and sources.selected_by(needle)
                if not (needle and (sources.vouched(needle) or picked)):
                    yield Hold(
                        "destination",
                        f"{tool.name} is {kind} and its destination {param}={value!r} is named by no "
                        "trusted text (the user's messages or a trusted tool's output)",
                        param,
                    )
                continue
            if not needle:
                continue
            secret = sources.secret_in(needle) if tool.effect in EGRESS else None
            if secret is not None:
                yield Hold(
                    "private",
                    f"{tool.name} is egress and its argument {param} carries {secret[1]!r} from the "
                    f"private output of {secret[0]}, which the user's messages do not name",
                    param,
                )
                continue
            vouched = sources.vouched(needle) or sources.vouched_canonically(needle)
            name = param not in tool.content
            selected = sources.selected_by(needle) if name and not vouched else None
            if name and not vouched and selected is None and not sources.named(needle, param):
                origin = sources.quoted_by(needle, param)
                if origin is not None:
                    yield Hold(
                        "quoted name",
                        f"{tool.name} is {kind} and its argument {param}={value!r} is quoted from the "
                        f"output of {origin}, which is untrusted, not from the user",
                        param,
                    )
                    continue
            if bound and name and not _closed(tool, param) and sources.unselected(needle, param):
                yield Hold(
                    "unselected",
                    f"{tool.name} is {kind} and its argument {param}={value!r} is an item of a tool's "
                    "listing that the user's request neither names nor picks out",
                    param,
                )
                continue
            if vouched:
                continue
            if name:
                if selected is not None or sources.is_field(needle):
                    continue
                if sources.made_up(needle):
                    yield Hold(
                        "unsourced",
                        f"{tool.name} is {kind} and its argument {param}={value!r} has words that no "
                        "text of the run holds, in any spelling, so it was dictated out of sight",
                        param,
                    )
                    continue
            for address in addresses(value):
                needle = words(address)
                if not (sources.vouched(needle) or sources.selected_by(needle)):
                    yield Hold(
                        "address",
                        f"{tool.name} is {kind} and its argument {param} holds the address "
                        f"{address!r}, which no trusted text names",
                        param,
                    )
        if bound and not sources.requested(tool):
            named = ", ".join(repr(w) for w in actions_of(tool))
            yield Hold(
                "unrequested",
                f"{tool.name} is {kind} and the user's messages ask for no such action (none of "
                f"{named}), so the request for it came from tool output",
            )


def _values(
    arguments: Any,
    param: str = "",
    keys: bool = True,
    schema: Any = None,
    root: Any = None,
    spelled: frozenset[str] = frozenset(),
    grants: Collection[str] = (),
) -> Iterator[tuple[str, str]]:
    """(top-level parameter, value as text) for every string and number in the arguments, and
    (with `keys`) every key of an object below the top level that its schema (`schema`, the
    tool's parameters) does not declare as a property, nor its declaration spell out (`spelled`:
    an open object whose description says 'a field "file_id"'), unless it is below one of
    `grants` (destinations: a key there names a grantee however it is spelled):
    `permissions={address: "reader"}` names its grantee by a key, `{"email": ..., "name": ...}`
    names nobody by its keys."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if isinstance(arguments, dict):
        declared = schema.get("properties", {}) if isinstance(schema, dict) else {}
        extra = schema.get("additionalProperties") if isinstance(schema, dict) else None
        for key, item in arguments.items():
            if param and keys and key not in declared and key not in spelled:
                yield param, str(key)
            below = declared.get(key, extra if isinstance(extra, dict) else None)
            inner = frozenset() if not param and key in grants else spelled
            yield from _values(item, param or str(key), keys, below, root, inner)
    elif isinstance(arguments, list | tuple):
        items = schema.get("items") if isinstance(schema, dict) else None
        for item in arguments:
            yield from _values(item, param, keys, items, root, spelled)
    elif (scalar := _scalar(arguments)) is not None:
        yield param, scalar


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _declared_words(tool: Tool) -> frozenset[str]:
    """The identifiers the tool's declaration (its description and parameters' schema) spells:
    the keys it tells the model to write are part of the call's shape, not values anyone chose."""
    return frozenset(_IDENTIFIER.findall(f"{tool.description} {json.dumps(tool.parameters)}"))


def _closed(tool: Tool, param: str) -> bool:
    """Whether a parameter takes one of a closed set of values (an enum, a constant, a boolean):
    a mode of the action (a permission level), not a thing it acts on."""
    schema = _resolve((tool.parameters.get("properties") or {}).get(param), tool.parameters)
    if not isinstance(schema, dict):
        return False
    return "enum" in schema or "const" in schema or schema.get("type") == "boolean"


def _resolve(schema: Any, root: Any) -> Any:
    """A schema with its in-document `$ref` (to `#/$defs/...` or `#/definitions/...`) followed,
    and a union's properties gathered."""
    for _ in range(8):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            break
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        schema = target
    if isinstance(schema, dict) and "properties" not in schema:
        branches = [_resolve(b, root) for b in schema.get("anyOf", schema.get("oneOf", []))]
        merged = {k: v for b in branches if isinstance(b, dict) for k, v in b.get("properties", {}).items()}
        if merged:  # Optional[Model], a union of models: what any branch declares
            return {**schema, "properties": merged}
    return schema


def _echoes(arguments: Any) -> set[str]:
    """What a call's output may repeat of the call itself: its values, the addresses in them,
    and its argument names (an error names an unexpected argument)."""
    echoes = {words(str(key)) for key in arguments} if isinstance(arguments, dict) else set()
    for _, value in _values(arguments):
        echoes.add(words(value))
        echoes.update(words(address) for address in addresses(value))
    return echoes - {""}


def _without(text: str, echoes: set[str]) -> str:
    """`text` (lines of words) less every echo in it, and less every line that is part of one."""
    padded_echoes = [f" {echo} " for echo in echoes]
    lines = [line for line in text.split(" \n ") if not any(f" {line.strip()} " in e for e in padded_echoes)]
    text = " \n ".join(lines)
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
    except (ValueError, RecursionError):
        return {}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)
