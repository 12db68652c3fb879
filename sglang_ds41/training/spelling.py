"""Spelling drills: the vocabulary's capitalised words written again without their space.

A name in a question carries its space (`in Richmond` holds the one id `ĠRichmond`); the same
name as a tool call's argument or a JSON string does not (`">`, `Rich`, `mond`, `</`), so a
copying circuit cannot write it: the model must know how the word is spelt without its space
(docs/TRAINING.md §7). For over 90% of the corpus's held-out names (cities 97%, made-up names
94%, people 91%) only the first id differs between the two spellings and the rest are the same
ids, so knowing the space-free spelling of the first id and copying the rest writes the name. A
spelling drill teaches exactly that table, for every capitalised word of the vocabulary (`Ġ` + a
capital and lower-case letters, or none: 12,744 ids), as vocabulary knowledge, the same for every word
whether or not the corpus ever names it:

    BOS  ĠWord  <0-12 lower-case words>  ">  W o rd  </   ĠOther ... Ġ"  Other  "}  ...

With a lead (`--spelling-lead N`), up to N lower-case words come before each word too, so the
word is not where the last pair ended and must be found by what it is; with a tail
(`--spelling-tail N`), up to N pieces follow the word and again its spelling, as the rest of a
longer name does (`ĠAnt al ya` / `Ant al ya`). Only the spelling, the tail and the closing id
are learnt. The words between a word and its spelling make
the model read it through attention, as a call reads a name from the question; the opening and
closing ids are the DSML parameter's and a JSON string's (`DELIMITERS`).

Measured (`benchmarks/spelling.py`, docs/TRAINING.md §7): the trained model's shape learns the
whole table (its first run: 99.75% of 11,446 words spelt exactly after 300 steps of adjacent
pairs alone) and none of the words it was not shown: it is a table, which is why it covers every
word. The trainer learns it only where pairs are dense (`--spelling-drills 1.0`: ~900 pairs a
step; at 0.3 the run measured had not), adjacent pairs first and then gaps and leads so it is
read from further back; with tails the rest of a name is copied after the spelling. In these
drills' own layout the table did not carry into calls; beside name drills (`name_drills.py`),
which lay the same words out as calls, it did (docs/TRAINING.md §7).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from functools import cache

from sglang_ds41.assets import v41_tokenizer

from .corpus.samples import Sample, packed

WORD = re.compile(r"Ġ[A-Z][a-z]*")  # a capitalised word or capital letter with its space
FILLER = re.compile(r"Ġ[a-z]+")  # lower-case words with their space
# (opening, closing) text around a value: a DSML string parameter, a JSON string in an object
DELIMITERS = (('">', "</"), ('Ġ"', '"}'), ('Ġ"', '",'))
GAP = (0, 12)  # lower-case words between a word and its spelling, inclusive (the default)


@cache
def spelt_words() -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(the word's id with its space, the ids of the word without it), in id order."""
    tokenizer = v41_tokenizer()
    words = sorted((i, t) for t, i in tokenizer.get_vocab().items() if WORD.fullmatch(t))
    spell = lambda text: tuple(tokenizer.encode(text, add_special_tokens=False).ids)  # noqa: E731
    return tuple((i, spell(token[1:])) for i, token in words)


@cache
def tail_pieces() -> tuple[int, ...]:
    """The ids that continue a spelling (every id of a spelt word after its first), in id order:
    what follows a name's first id in a question and again in the call (`ĠAnt al ya` /
    `Ant al ya`), so a pair with a tail teaches the copying of the rest of a name too."""
    return tuple(sorted({i for _, spelling in spelt_words() for i in spelling[1:]}))


def filler_of(ids: tuple[int, ...]) -> tuple[int, ...]:
    """The lower-case words among `ids` (a drill draws its fillers from ids the corpus uses, so
    they add no embedding rows to ship)."""
    tokenizer = v41_tokenizer()
    return tuple(i for i in ids if FILLER.fullmatch(tokenizer.id_to_token(i) or ""))


@cache
def delimiter_ids() -> tuple[tuple[int, int], ...]:
    tokenizer = v41_tokenizer()
    return tuple((tokenizer.token_to_id(a), tokenizer.token_to_id(b)) for a, b in DELIMITERS)


def spelling_pair(
    rng: random.Random,
    word: tuple[int, tuple[int, ...]],
    filler: tuple[int, ...],
    gap: int | None = None,
    lead: int = 0,
    max_gap: int = GAP[1],
    tail: int = 0,
) -> tuple[list[int], list[bool]]:
    """Up to `lead` ids of `filler` (none drawn when 0), one word, `gap` ids of `filler` (when
    None, drawn from GAP[0]..`max_gap`), a value's opening, the spelling and the closing; and
    which of those ids are learnt. With a lead the word is not where the last pair ended, so it
    is found by what it is (the one capitalised word since), as a call finds the question's
    name; a longer gap reaches as far back as a call's value is from the question's name (~30
    ids in a call without thinking). With `tail`, up to that many pieces (`tail_pieces`) follow
    the word and its spelling alike, as the rest of a longer name does (none drawn when 0)."""
    source, pieces = word
    before = rng.choices(filler, k=rng.randint(0, lead)) if lead else []
    rest = rng.choices(tail_pieces(), k=rng.randint(0, tail)) if tail else []
    gap = rng.randint(GAP[0], max_gap) if gap is None else gap
    opening, closing = rng.choice(delimiter_ids())
    ids = [*before, source, *rest, *rng.choices(filler, k=gap), opening, *pieces, *rest, closing]
    learnt = len(pieces) + len(rest) + 1
    return ids, [False] * (len(ids) - learnt) + [True] * learnt


def spelling_drill(
    rng: random.Random,
    bos: int,
    length: int,
    filler: tuple[int, ...],
    words: Sequence[tuple[int, tuple[int, ...]]] | None = None,
    gap: int | None = None,
    lead: int = 0,
    max_gap: int = GAP[1],
    tail: int = 0,
) -> Sample:
    """BOS, then pairs of random words (of `words`, default every spelt word) until the next
    would pass `length` ids (`packed`)."""
    words = spelt_words() if words is None else words

    def pair() -> tuple[list[int], list[bool]]:
        return spelling_pair(rng, rng.choice(words), filler, gap, lead, max_gap, tail)

    return packed("spelling", bos, length, pair)
