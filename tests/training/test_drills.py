"""Copy drills: every target is what an induction circuit predicts, from ids the corpus uses."""

import json
import random

import pytest

from sglang_ds41.assets import TOKENIZER_JSON
from sglang_ds41.training.drills import DRILL_LENGTH, drill, drill_vocabulary, is_drill_step


@pytest.mark.parametrize("periodic", [0.0, 0.5, 1.0])
def test_every_drill_target_copies_what_followed_the_previous_id_earlier(periodic):
    vocab = drill_vocabulary(0)
    rng = random.Random(7)
    for _ in range(200):
        sample = drill(rng, vocab, bos=0, periodic=periodic)
        ids = sample.ids
        assert len(ids) == DRILL_LENGTH and ids[0] == 0
        assert set(ids[1:]) <= set(vocab)
        learnt = [i for i, flag in enumerate(sample.learn) if flag]
        assert len(learnt) > DRILL_LENGTH // 5
        for i in learnt:
            earlier = [j for j in range(i - 1) if ids[j] == ids[i - 1]]
            assert any(ids[j + 1] == ids[i] for j in earlier), (ids, i)


def _is_periodic(ids: tuple[int, ...]) -> bool:
    body = ids[1:]
    return any(all(body[i] == body[i - p] for i in range(p, len(body))) for p in range(1, 17))


def test_the_periodic_share_is_the_setting():
    vocab = drill_vocabulary(0)
    for periodic, low, high in [(0.0, 0, 0), (0.5, 70, 130), (1.0, 200, 200)]:
        rng = random.Random(5)
        count = sum(_is_periodic(drill(rng, vocab, bos=0, periodic=periodic).ids) for _ in range(200))
        assert low <= count <= high, (periodic, count)


def test_the_drill_vocabulary_is_plain_text_ids_of_the_corpus():
    added = {t["id"] for t in json.loads(TOKENIZER_JSON.read_text(encoding="utf-8"))["added_tokens"]}
    vocab = drill_vocabulary(0)
    assert len(vocab) > 1000 and not added & set(vocab)
    assert drill_vocabulary(1) != vocab  # drawn from the run's own conversations


def test_drill_steps_are_the_warmup_then_every_nth():
    assert [is_drill_step(s, 2, 3) for s in range(8)] == [True, True, False, False, True, False, False, True]
    assert not any(is_drill_step(s, 0, 0) for s in range(10))
