"""Text run -> token ids, exact with the `tokenizers` BPE but several times faster (ENCODING.md §1.4).

Prompt encoding spends most of its time in `Tokenizer.encode` on the text runs between special
tokens, and there almost all of it in the pre-tokenizer, not the BPE merges: the V4.1 tokenizer
splits text with three `Split` regexes in a row, each one over the pieces of the one before, and
`tokenizers` tracks offsets through every step. Here the three splits are one regex pass of the
`regex` module (the same segmentation, §1.4 gives the argument) and each piece's BPE ids come
from a memo, so the `tokenizers` BPE runs once per distinct piece.

Exactness rests on the two regex engines classifying characters alike (`\\p{L}`, `\\p{N}`, ...),
which they do for every character Unicode 14 assigns and not for some assigned since (their
Unicode versions differ). Text holding a character unassigned in this Python's Unicode database
(or any non-ASCII text when that database is not 14.0.0) is encoded by `tokenizers` itself, as is
all text of a tokenizer whose normalizer, pre-tokenizer or model differ from V4.1's.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from itertools import chain
from typing import TYPE_CHECKING

import regex

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# The V4.1 tokenizer's pre-tokenizer: Split(\p{N}{1,3}), Split(CJK runs), Split(words), all
# "Isolated", then ByteLevel without its own regex; no normalizer.
_CJK = "一-龥぀-ゟ゠-ヿ"
# (Its \r and \n are the characters themselves, as in tokenizer.json.)
_WORDS = (
    r'''[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^''' "\r\n" r"\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[" "\r\n" r"]*|\s*[" "\r\n" r"]+|\s+(?!\S)|\s+"
)
V41_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": f"[{_CJK}]+"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": _WORDS}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}
V41_NORMALIZER = {"type": "Sequence", "normalizers": []}
V41_MODEL_FLAGS = {
    "type": "BPE",
    "dropout": None,
    "unk_token": None,
    "continuing_subword_prefix": None,
    "end_of_word_suffix": None,
    "fuse_unk": False,
    "byte_fallback": False,
}

# The three splits as one pass (ENCODING.md §1.4). The first two cut the text into digit groups
# and maximal runs of the CJK ranges (minus digits) and of everything else; the word regex then
# splits each run on its own. So: digit groups; the word regex with every class cut down to the
# CJK ranges (no spaces or line breaks there); the word regex with every class minus digits and
# those ranges, its lookahead `(?!\S)` also true before them (the run ended there); and gaps (a
# run's characters no alternative matches, which `Split` keeps as a piece), one per kind of run.
_OTHER = rf"[^\p{{N}}{_CJK}]"
_ALTERNATIVES = (
    rf"\p{{N}}{{1,3}}"
    rf"|[[^" "\r\n" rf"\p{{L}}\p{{P}}\p{{S}}]&&[{_CJK}]]?[[\p{{L}}\p{{M}}]&&[{_CJK}]]+"
    rf"|[[\p{{P}}\p{{S}}]&&[{_CJK}]]+"
    r'''|[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+'''
    rf"|[[^" "\r\n" rf"\p{{L}}\p{{P}}\p{{S}}]&&{_OTHER}]?[[\p{{L}}\p{{M}}]&&{_OTHER}]+"
    rf"| ?[[\p{{P}}\p{{S}}]&&{_OTHER}]+[" "\r\n" r"]*"
    rf"|\s*[" "\r\n" rf"]+|\s+(?![^\s\p{{N}}{_CJK}])|\s+"
)
PIECES = regex.compile(
    rf"{_ALTERNATIVES}|(?:(?!{_ALTERNATIVES})[{_CJK}])+|(?:(?!{_ALTERNATIVES}){_OTHER})+", regex.V1
)
# The same restricted to ASCII text, for Python's `re` (several times faster than `regex` with
# Unicode classes): in ASCII, \p{N} is 0-9, \p{L} is A-Za-z, \p{M} and the CJK ranges are empty,
# \p{P} and \p{S} are the printable non-alphanumerics, and White_Space (which `\s` means in
# the pre-tokenizer, not `re`'s \s: no \x1c-\x1f) is \t-\r and the space.
_ASCII_ALTERNATIVES = (
    r"[0-9]{1,3}"
    r'''|[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+'''
    "|[^\r\n0-9A-Za-z!-/:-@\\[-`{-~]?[A-Za-z]+"
    "| ?[!-/:-@\\[-`{-~]+[\r\n]*"
    "|[\t-\r ]*[\r\n]+|[\t-\r ]+(?![^\t-\r 0-9])|[\t-\r ]+"
)
ASCII_PIECES = re.compile(rf"{_ASCII_ALTERNATIVES}|(?:(?!{_ASCII_ALTERNATIVES})[\x00-\x7f])+")
# No piece spans a line break followed by a printable ASCII character (ENCODING.md §1.4), so text
# can be cut there and its parts split, and encoded, each on its own.
_CUTS = re.compile("(?<=\n)(?=[!-~])")
VERIFIED_UNICODE = "14.0.0"  # unicodedata's version the exhaustive test compared (tests/encoding)

SHORT_TEXT = 64  # texts up to this many characters are memoised whole (template fragments)
MEMO_SIZE = 1 << 17


def _byte_level_table() -> dict[int, str]:
    """Byte value -> its GPT-2 byte-level stand-in character, as a `str.translate` table over
    the Latin-1 decoding of the UTF-8 bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_LEVEL = _byte_level_table()


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def _unassigned_cp(cp: int) -> bool:
    return unicodedata.category(chr(cp)) in ("Cn", "Cs")


@functools.cache
def _unassigned_bmp() -> re.Pattern[str]:
    """A class of the BMP code points this Python's Unicode database leaves unassigned, or
    surrogates (`re` matches a BMP-only class from a bitmap; astral ranges would make it slow)."""
    ranges = []
    start = None
    for cp in range(0x10000):
        if _unassigned_cp(cp):
            start = cp if start is None else start
        elif start is not None:
            ranges.append((start, cp - 1))
            start = None
    return re.compile("[" + "".join(f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges) + "]")


def segmentation_is_ours(text: str) -> bool:
    """Whether `PIECES` splits `text` as the `tokenizers` pre-tokenizer does (module docstring)."""
    if text.isascii():
        return True
    if unicodedata.unidata_version != VERIFIED_UNICODE or _unassigned_bmp().search(text) is not None:
        return False
    return not any(_unassigned_cp(ord(ch)) for ch in set(_ASTRAL.findall(text)))


def parts(text: str) -> list[tuple[str, re.Pattern[str] | regex.Pattern[str] | None]]:
    """`text` cut into parts that split on their own, adjacent ones of one kind joined, each with
    the pattern that splits it (None: `tokenizers` must)."""
    if text.isascii():
        return [(text, ASCII_PIECES)]
    found: list[tuple[str, re.Pattern[str] | regex.Pattern[str] | None]] = []
    run: list[str] = []
    kind = None
    for line in _CUTS.split(text):
        line_kind = ASCII_PIECES if line.isascii() else PIECES if segmentation_is_ours(line) else None
        if run and line_kind is not kind:
            found.append(("".join(run), kind))
            run = []
        run.append(line)
        kind = line_kind
    found.append(("".join(run), kind))
    return found


def pieces(text: str) -> list[str]:
    """The pre-tokenizer's pieces of `text`, where `parts` has a pattern for all of it."""
    out: list[str] = []
    for part, pattern in parts(text):
        if pattern is None:
            raise ValueError("text the two regex engines may split differently")
        out += pattern.findall(part)
    return out


def is_v41_like(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` normalizes, pre-tokenizes and runs BPE exactly as V4.1's does."""
    spec = json.loads(tokenizer.to_str())
    model = spec.get("model") or {}
    return (
        spec.get("normalizer") in (None, V41_NORMALIZER)
        and spec.get("pre_tokenizer") == V41_PRE_TOKENIZER
        and all(model.get(key) == value for key, value in V41_MODEL_FLAGS.items())
        and not model.get("ignore_merges", False)
    )


class TextEncoder:
    """Plain text -> ids with `text_tokenizer` (a tokenizer without added vocabulary)."""

    def __init__(self, text_tokenizer: Tokenizer) -> None:
        self._tokenizer = text_tokenizer
        self._fast = is_v41_like(text_tokenizer)
        self._model = text_tokenizer.model
        self._piece = functools.lru_cache(maxsize=MEMO_SIZE)(self._piece_ids)
        self._short = functools.lru_cache(maxsize=MEMO_SIZE)(self._encode)

    def encode(self, text: str) -> tuple[int, ...]:
        if not text:
            return ()
        if len(text) <= SHORT_TEXT:
            return self._short(text)
        return self._encode(text)

    def _encode(self, text: str) -> tuple[int, ...]:
        if not self._fast:
            return tuple(self._tokenizer.encode(text, add_special_tokens=False).ids)
        ids: list[int] = []
        for part, pattern in parts(text):
            if pattern is None:
                ids += self._tokenizer.encode(part, add_special_tokens=False).ids
            else:
                ids += chain.from_iterable(map(self._piece, pattern.findall(part)))
        return tuple(ids)

    def _piece_ids(self, piece: str) -> tuple[int, ...]:
        mapped = piece.encode("utf-8").decode("latin-1").translate(_BYTE_LEVEL)
        return tuple(token.id for token in self._model.tokenize(mapped))
