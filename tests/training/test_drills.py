"""Copy drills: every target is what an induction circuit predicts, from ids the corpus uses."""

import json
import random

from sglang_ds41.assets import TOKENIZER_JSON
from sglang_ds41.training.drills import DRILL_LENGTH, drill, drill_vocabulary, is_drill_step


def test_every_drill_target_copies_what_followed_the_previous_id_earlier():
    vocab = drill_vocabulary(0)
    rng = random.Random(7)
    for _ in range(200):
        sample = drill(rng, vocab, bos=0)
        ids = sample.ids
        assert len(ids) == DRILL_LENGTH and ids[0] == 0
        assert set(ids[1:]) <= set(vocab)
        learnt = [i for i, flag in enumerate(sample.learn) if flag]
        assert len(learnt) > DRILL_LENGTH // 5
        for i in learnt:
            earlier = [j for j in range(i - 1) if ids[j] == ids[i - 1]]
            assert any(ids[j + 1] == ids[i] for j in earlier), (ids, i)


def test_the_drill_vocabulary_is_plain_text_ids_of_the_corpus():
    added = {t["id"] for t in json.loads(TOKENIZER_JSON.read_text(encoding="utf-8"))["added_tokens"]}
    vocab = drill_vocabulary(0)
    assert len(vocab) > 1000 and not added & set(vocab)
    assert drill_vocabulary(1) != vocab  # drawn from the run's own conversations


def test_drill_steps_are_the_warmup_then_every_nth():
    assert [is_drill_step(s, 2, 3) for s in range(8)] == [True, True, False, False, True, False, False, True]
    assert not any(is_drill_step(s, 0, 0) for s in range(10))
