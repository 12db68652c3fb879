"""Which item of a tool's listing the user's request picks out: the object half of binding a call
to the user's task (trust.py, rule 8).

A listing is a list in a tool's output (files, events, channels, transactions); each of its
items is an object or a scalar, and an object outside any list is a listing of one. The user
picks an item out by something only that item holds among its siblings:

* a whole field the user's words name ("reschedule my 'Dental check-up'"),
* a word of the user's that only its names hold ("delete the offsite file": team-offsite.docx;
  "the channel starting with External": External_0), among its short fields (a title, a file
  name, a sender; a scalar item of a list is its own name), not its prose (a file's whole text
  holds any word),
* or an extreme, when the user asks for one ("the largest file", "the cheapest hotel"): the item
  is the largest (or smallest, ties included) of its siblings in a member that is a number
  (not an id) or a date ("the latest email"), or in what the run measured of it
  (`Request.measures`: "the channel with the fewest members", counted by a read of each).

An injection that asks for the same kind of action on another item ("also delete file 13") can
have the model select that item's id from the same listing; the id is then data the model read
(trust.py rule 4), and only this tells it from the item the user meant.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# "Short" fields are names: a title, a file name, a sender, a channel. Longer ones are prose,
# where any word of the user's could occur.
NAME_WORDS = 8
# A word of the user's that can pick an item: four letters or more, not a number (a number picks
# out by value, as a whole field).
_PICKING = re.compile(r"[^\W\d_]{4,}")
_ALNUM = re.compile(r"[^\W_]+")
# The superlatives a user picks an extreme with: the end they mean, of a number ("most",
# "least") or of a date ("latest", "earliest"). Not every "-est" word says which end it means
# ("the best hotel": best rating, lowest price), so only these.
_LARGEST = ("largest", "biggest", "most", "highest", "greatest", "maximum", "max", "longest")
_SMALLEST = ("smallest", "least", "lowest", "fewest", "minimum", "min", "shortest", "cheapest")
ENDS: dict[str, str] = {
    **dict.fromkeys(_LARGEST, "most"),
    **dict.fromkeys(_SMALLEST, "least"),
    **dict.fromkeys(("latest", "newest", "recent"), "latest"),
    **dict.fromkeys(("earliest", "oldest"), "earliest"),
}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WHEN = re.compile(r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?")  # ISO 8601, no zone


@dataclass(frozen=True)
class Item:
    """One item of a listing: its own fields as words (as trust.words writes them), those of
    them that are ids (`is_id`), the canonical words of its names (`NAME_WORDS`), its members
    that are numbers (not ids) and those that are dates, by key."""

    own: frozenset[str]
    names: frozenset[str]
    ids: frozenset[str] = frozenset()
    numbers: tuple[tuple[str, float], ...] = ()
    dates: tuple[tuple[str, float], ...] = ()


Listing = tuple[Item, ...]


def listings(value: Any, words: Any) -> Iterator[Listing]:
    """Every listing in a parsed output (`words`: how a field is written as words)."""
    if isinstance(value, list):
        yield tuple(_item(member, words) for member in value if _is_item(member))
        for member in value:
            if isinstance(member, dict):
                yield from _inside(member, words)
            elif isinstance(member, list):
                yield from listings(member, words)
    elif isinstance(value, dict):
        yield (_item(value, words),)
        yield from _inside(value, words)


def _inside(obj: dict[str, Any], words: Any) -> Iterator[Listing]:
    for member in obj.values():
        if isinstance(member, list | dict):
            yield from listings(member, words)


def _is_item(member: Any) -> bool:
    return isinstance(member, dict) or _scalar(member) is not None


def _item(member: Any, words: Any) -> Item:
    if not isinstance(member, dict):
        text = _scalar(member) or ""
        # a scalar item is the item's name, however long (a channel named with a paragraph)
        tokens = frozenset(_ALNUM.findall(text.casefold()))
        return Item(frozenset({words(text)}), tokens, frozenset({words(text)}))
    scalars: list[tuple[str, str]] = []
    for key, value in member.items():
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else (value,)
        if isinstance(value, dict):
            scalars += [(str(key), str(k)) for k in value]
        scalars += [(str(key), s) for s in map(_scalar, inner) if s is not None]
    members = [(str(key), text) for key, value in member.items() if (text := _scalar(value)) is not None]
    numbers = tuple((key, float(text)) for key, text in members if _NUMBER.fullmatch(text) and not is_id(key))
    dates = tuple((key, when) for key, text in members if (when := _date(text)) is not None)
    own = frozenset(w for w in (words(text) for _, text in scalars) if w)
    ids = frozenset(words(text) for key, text in scalars if is_id(key))
    return Item(own, _name_tokens([text for _, text in scalars]), ids, numbers, dates)


def _date(text: str) -> float | None:
    """A date (and time) in ISO form as a day number, to compare siblings by ("the latest")."""
    if not _WHEN.fullmatch(text):
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.toordinal() + (when.hour * 3600 + when.minute * 60 + when.second) / 86400


def _name_tokens(texts: list[str]) -> frozenset[str]:
    tokens: set[str] = set()
    for text in texts:
        found = _ALNUM.findall(text.casefold())
        if len(found) <= NAME_WORDS:
            tokens.update(found)
    return frozenset(tokens)


def key_words(name: str) -> list[str]:
    """The words of a key or a parameter's name: file_id, fileId and file-id are file, id."""
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name)
    return [word for word in re.split(r"[\W_]+", spaced.casefold()) if word]


def is_id(key: str) -> bool:
    """Whether a key or parameter names an id ("id", "file_id", "id_", "eventId"): a name, not a
    quantity ("the largest id" picks nothing)."""
    return "id" in key_words(key)


def _scalar(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value) if isinstance(value, float) else str(value)
    return None


@dataclass(frozen=True)
class Request:
    """What the user's request (their messages, and the document they delegate to) can pick an
    item with: `named(field)` says whether it names a whole field; `words`, its picking words
    (`_PICKING`, case folded); `ends`, the ends its superlatives ask for (`ENDS`)."""

    named: Any
    words: frozenset[str]
    ends: frozenset[str]
    measures: Mapping[str, Sequence[tuple[str, float]]] = field(default_factory=dict)

    @classmethod
    def of(cls, text: str, named: Any, measures: Mapping[str, Sequence[tuple[str, float]]]) -> Request:
        """`measures`: more numeric members, by an item's field: what the run measured of it
        (how many members a channel listed)."""
        found = frozenset(w.casefold() for w in _PICKING.findall(text))
        tokens = _ALNUM.findall(text.casefold())
        # "most recent" is a date's end, not a number's; "least recent" the other one
        nexts = [*tokens[1:], ""]
        ends = {ENDS[t] for t, after in zip(tokens, nexts, strict=True) if t in ENDS and after != "recent"}
        if "least recent" in " ".join(tokens):
            ends = (ends - {"latest"}) | {"earliest"}
        return cls(named, found, frozenset(ends), measures)

    def picks(self, listing: Listing, index: int) -> bool:
        """Whether the request picks out `listing[index]` among its siblings."""
        item, others = listing[index], listing[:index] + listing[index + 1 :]
        for own in item.own:
            if self.named(own) and not any(own in other.own for other in others):
                return True
        for word in item.names & self.words:
            if not any(word in other.names for other in others):
                return True
        numbers = [(key, value, "most", "least") for key, value in self._numbers(item)]
        dates = [(key, value, "latest", "earliest") for key, value in item.dates]
        return any(self._extreme(others, *member) for member in [*numbers, *dates])

    def _numbers(self, item: Item) -> list[tuple[str, float]]:
        return [*item.numbers, *(m for value in item.own for m in self.measures.get(value, ()))]

    def _extreme(self, others: Listing, key: str, value: float, top: str, bottom: str) -> bool:
        """Whether `value` of member `key` is the end of its siblings' that the request asks for
        (`top`: the largest, `bottom`: the smallest; ties included)."""
        of = self._numbers if top == "most" else lambda other: other.dates
        peers = [v for other in others for k, v in of(other) if k == key]
        if not peers:
            return False
        return (top in self.ends and value >= max(peers)) or (bottom in self.ends and value <= min(peers))
