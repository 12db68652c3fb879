"""`benchmarks/spelling.py` (docs/TRAINING.md §7): the words it teaches are spelt by the real
tokenizer without their space, its sequences take the loss on the spelling only, and the held-out
words stay out of training."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

from sglang_ds41.assets import v41_tokenizer
from sglang_ds41.training.data import IGNORE
from sglang_ds41.training.settings import Settings
from sglang_ds41.training.trainer import Run

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "spelling.py"


def _benchmark():
    spec = importlib.util.spec_from_file_location("spelling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_words_are_one_id_with_the_space_and_other_ids_without_it():
    tokenizer = v41_tokenizer()
    words = _benchmark().spelt_words(seed=0, n_words=200)
    assert len(words) == 200
    for source, pieces in words:
        token = tokenizer.id_to_token(source)
        assert token.startswith("Ġ") and token[1].isupper()
        assert tokenizer.decode(list(pieces)) == token[1:]
        assert source not in pieces
    several = [pieces for _, pieces in words if len(pieces) > 1]
    assert several, "some capitalised words split into several pieces without their space"


def test_sequences_learn_the_spelling_and_the_close_only(tmp_path):
    bench = _benchmark()
    run = Run.create(tmp_path / "run", Settings(steps=1))
    words = bench.spelt_words(seed=1, n_words=50)
    spelling = bench.Spelling(run, words, held_out=0.2)
    assert len(spelling.held) == 10 and len(spelling.trained) == 40
    batch = spelling.batch(words, None)  # every word once, in order
    ids, targets = batch.ids.tolist(), batch.targets.tolist()
    learnt = [t for t in targets if t != IGNORE]
    assert learnt == [i for _, pieces in words for i in (*pieces, spelling.close)]
    for at, target in enumerate(targets):
        if target != IGNORE:
            assert ids[at + 1] == target  # the next id, within one sequence
    assert all(n <= bench.SEQUENCE_TOKENS for n in batch.lengths.tolist())
    drawn = spelling.batch(spelling.trained, random.Random(0))
    held_sources = {source for source, _ in spelling.held}
    assert not held_sources & set(drawn.ids.tolist())



def test_a_gap_puts_lower_case_words_between_a_word_and_its_spelling(tmp_path):
    bench = _benchmark()
    tokenizer = v41_tokenizer()
    run = Run.create(tmp_path / "run", Settings(steps=1))
    words = bench.spelt_words(seed=3, n_words=20)
    spelling = bench.Spelling(run, words, held_out=0.0, gap=3)
    ids = spelling.batch(words[:1], None).ids.tolist()
    source, pieces = words[0]
    assert ids[1] == source and ids[5] == spelling.open and ids[6:-1] == list(pieces)
    assert all(tokenizer.id_to_token(i)[1:].islower() for i in ids[2:5])
