"""Spelling drills (`training/spelling.py`): every capitalised word of the real vocabulary, its
spelling without the space as the tokenizer writes it, learnt after a value's opening."""

import random
import re

from sglang_ds41.assets import v41_tokenizer
from sglang_ds41.training.drills import DRILL_LENGTH, drill_batch, spelling_filler
from sglang_ds41.training.spelling import (
    delimiter_ids,
    spelling_drill,
    spelling_pair,
    spelt_words,
    tail_pieces,
)


def test_every_capitalised_word_is_spelt_as_the_tokenizer_writes_it_without_its_space():
    tokenizer = v41_tokenizer()
    vocab = tokenizer.get_vocab()
    words = spelt_words()
    assert len(words) == sum(1 for t in vocab if re.fullmatch(r"Ġ[A-Z][a-z]*", t)) > 12_000
    for source, pieces in words:
        token = tokenizer.id_to_token(source)
        assert tokenizer.decode(list(pieces)) == token[1:]
    # the call writes "Richmond" as these ids: the drill teaches exactly them
    richmond = dict(words)[vocab["ĠRichmond"]]
    assert richmond == tuple(tokenizer.encode("Richmond", add_special_tokens=False).ids)
    assert vocab["ĠRichmond"] not in richmond


def test_a_drill_learns_the_spelling_and_its_closing_after_the_opening_only():
    words, filler = dict(spelt_words()), spelling_filler(0)
    openings = {a for a, _ in delimiter_ids()}
    closings = {b for _, b in delimiter_ids()}
    rng = random.Random(3)
    for _ in range(50):
        sample = spelling_drill(rng, 0, DRILL_LENGTH, filler)
        ids, learn = sample.ids, sample.learn
        assert ids[0] == 0 and len(ids) <= DRILL_LENGTH
        i = 1
        while i < len(ids):  # pairs: word, fillers, opening, spelling, closing
            source = ids[i]
            spelling = words[source]
            j = i + 1
            while ids[j] not in openings:
                assert ids[j] in filler and not learn[j]
                j += 1
            end = j + 1 + len(spelling)
            assert ids[j + 1 : end] == spelling and ids[end] in closings
            assert not any(learn[i : j + 1]) and all(learn[j + 1 : end + 1])
            i = end + 1


def test_with_a_lead_the_word_sits_among_fillers_and_only_its_spelling_is_learnt():
    words, filler = dict(spelt_words()), spelling_filler(0)
    openings = {a for a, _ in delimiter_ids()}
    rng, leads = random.Random(4), []
    for _ in range(30):
        sample = spelling_drill(rng, 0, DRILL_LENGTH, filler, lead=6)
        ids, learn = sample.ids, sample.learn
        for j, i in enumerate(ids):
            if i not in openings or learn[j]:
                continue
            start = j - 1  # back over the gap to the word, then over the lead to the last closing
            while ids[start] in filler:
                start -= 1
            assert ids[start] in words and not any(learn[start:j + 1])
            lead = start - 1
            while lead > 0 and ids[lead] in filler:
                assert not learn[lead]
                lead -= 1
            leads.append(start - 1 - lead)
            assert ids[j + 1 : j + 1 + len(words[ids[start]])] == words[ids[start]]
    assert max(leads) == 6 and min(leads) == 0


def test_a_drill_step_spells_in_the_share_set():
    from sglang_ds41.assets import TOKENIZER_JSON
    from sglang_ds41.engram.hashing import EngramHasher
    from sglang_ds41.training.settings import Settings

    hasher = EngramHasher.for_tokenizer(Settings().config(), TOKENIZER_JSON)
    words = {source for source, _ in spelt_words()}

    def first_ids(share: float) -> list[int]:
        batch = drill_batch(0, 11, 4096, hasher, 0, 0.5, share)
        starts = batch.lengths.cumsum(0) - batch.lengths
        return [int(batch.ids[s + 1]) for s in starts]  # the id after each drill's BOS

    assert all(i in words for i in first_ids(1.0))
    assert sum(i in words for i in first_ids(0.0)) < len(first_ids(0.0)) // 2


def test_a_longer_gap_puts_the_word_as_far_back_as_set():
    filler, openings = spelling_filler(0), {a for a, _ in delimiter_ids()}
    rng, gaps, fillers = random.Random(5), [], set(filler)
    for _ in range(40):
        ids = spelling_drill(rng, 0, DRILL_LENGTH, filler, max_gap=48).ids
        for j, i in enumerate(ids):
            if i in openings:
                start = j - 1
                while ids[start] in fillers:
                    start -= 1
                gaps.append(j - 1 - start)
    assert max(gaps) > 40 and max(gaps) <= 48 and min(gaps) == 0


def test_a_tail_follows_the_word_and_is_copied_after_its_spelling():
    tokenizer, filler = v41_tokenizer(), spelling_filler(0)
    words, tails, lengths = spelt_words(), set(tail_pieces()), set()
    # a spelling's later ids, never a spaced word: "Antalya" is `Ant`, `al`, `ya`
    assert not any(tokenizer.id_to_token(i).startswith("Ġ") for i in tails) and not tails & set(filler)
    rng = random.Random(6)
    for _ in range(200):
        word = rng.choice(words)
        ids, learn = spelling_pair(rng, word, filler, gap=5, tail=3)
        source, spelling = word
        n = (len(ids) - 8 - len(spelling)) // 2  # word, rest, 5 fillers, opening, spelling, rest, closing
        rest = ids[1 : 1 + n]
        lengths.add(len(rest))
        assert ids[0] == source and all(i in tails for i in rest)
        assert ids[-1 - len(rest) - len(spelling) : -1] == [*spelling, *rest]
        assert learn == [False] * (len(ids) - len(spelling) - len(rest) - 1) + [True] * (
            len(spelling) + len(rest) + 1
        )
    assert lengths == {0, 1, 2, 3}
