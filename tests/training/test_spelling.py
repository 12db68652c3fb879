"""`benchmarks/spelling.py` (docs/TRAINING.md §7): it trains on the trainer's spelling pairs,
takes the loss on the spelling only, and keeps the held-out words out of training."""

from __future__ import annotations

import random

from sglang_ds41.training.data import IGNORE
from sglang_ds41.training.settings import Settings
from sglang_ds41.training.spelling import delimiter_ids
from sglang_ds41.training.trainer import Run
from tests.training._benchmarks import load_benchmark


def _benchmark():
    return load_benchmark("spelling")


def test_sequences_learn_the_spelling_and_the_closing_only(tmp_path):
    bench = _benchmark()
    run = Run.create(tmp_path / "run", Settings(steps=1))
    words = bench.words_of(seed=1, n_words=50)
    spelling = bench.Spelling(run, words, held_out=0.2, gap=3)
    assert len(spelling.held) == 10 and len(spelling.trained) == 40
    batch = spelling.batch(words, None)  # every word once, in order
    ids, targets = batch.ids.tolist(), batch.targets.tolist()
    learnt = [t for t in targets if t != IGNORE]
    closings = [b for _, b in delimiter_ids()]
    spelt = [t for t in learnt if t not in closings]
    assert spelt == [i for _, pieces in words for i in pieces]
    assert len(learnt) - len(spelt) == len(words)  # one closing each
    for at, target in enumerate(targets):
        if target != IGNORE:
            assert ids[at + 1] == target  # the next id, within one sequence
    assert all(n <= bench.SEQUENCE_TOKENS for n in batch.lengths.tolist())
    source, pieces = words[0]
    assert ids[1] == source and ids[5] in {a for a, _ in delimiter_ids()}  # 3 words between
    assert ids[6 : 6 + len(pieces)] == list(pieces)
    drawn = spelling.batch(spelling.trained, random.Random(0))
    assert not {source for source, _ in spelling.held} & set(drawn.ids.tolist())
