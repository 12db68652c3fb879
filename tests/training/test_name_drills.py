"""Name drills (`training/name_drills.py`): the corpus's call turns, cut from the question on, with
every name a drilled word written as a call writes it."""

import random
import re

from sglang_ds41.encoding.prompt_ids import text_tokenizer
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.training.corpus import pools as P
from sglang_ds41.training.drills import DRILL_LENGTH, drill_batch
from sglang_ds41.training.name_drills import name_drill
from sglang_ds41.training.spelling import spelt_words

VALUE = re.compile(r'string="true">([^<]*)</')  # a DSML string parameter's value
NAME = re.compile(r"[A-Z][a-z]+( [A-Z][a-z]+)?")


def _cuts(sample):
    """(asked ids, learnt ids) of each cut of a drill, split where learning starts and stops."""
    ids, learn, out, k = sample.ids, sample.learn, [], 1
    while k < len(ids):
        start = k
        while not learn[k]:
            k += 1
        asked = ids[start:k]
        while k < len(ids) and learn[k]:
            k += 1
        out.append((asked, ids[len(asked) + start : k]))
    return out


def test_a_name_drill_is_questions_and_their_turns_without_the_system_text():
    tokenizer = text_tokenizer()
    rng, kinds = random.Random(2), set()
    for _ in range(40):
        sample = name_drill(rng, 0, DRILL_LENGTH)
        assert sample.ids[0] == 0 and not sample.learn[0]
        cuts = _cuts(sample)
        assert len(sample) <= DRILL_LENGTH or len(cuts) == 1  # a long cut stands alone
        for asked, learnt in cuts:
            # one user turn, then the generation header; the tools' system text is left out
            assert asked[0] == Special.USER.id and asked.count(Special.USER.id) == 1
            assert Special.ASSISTANT.id in asked and "<｜DSML｜" not in tokenizer.decode(list(asked))
            assert learnt[-1] == Special.EOS.id and Special.USER.id not in learnt
            kinds.add("call" if "invoke" in tokenizer.decode(list(learnt)) else "answer")
    assert kinds == {"call", "answer"}  # tool calls and JSON answers both


def test_every_name_a_call_writes_is_a_drilled_word_from_the_question():
    tokenizer = text_tokenizer()
    words = {source for source, _ in spelt_words()}
    rng, names = random.Random(3), []
    for _ in range(60):
        for asked, learnt in _cuts(name_drill(rng, 0, DRILL_LENGTH)):
            question = tokenizer.decode(list(asked))
            for value in VALUE.findall(tokenizer.decode(list(learnt))):
                if NAME.fullmatch(value):  # a name, not a code or a sentence
                    names.append(value)
                    assert value in question
    assert len(names) > 20
    cities = set(P.split_cities(P.TRAIN))  # a drilled word may name a city, but rarely
    assert sum(name in cities for name in names) < 0.1 * len(names)
    for name in names:  # every part opens with a word the spelling drills teach
        for part in name.split():
            assert tokenizer.encode(" " + part, add_special_tokens=False).ids[0] in words, name


def test_pools_without_real_names_draw_every_name_from_the_drilled_words():
    tokenizer = text_tokenizer()
    words = {source for source, _ in spelt_words()}
    cities = set(P.split_cities(P.TRAIN))

    def draws(pools: P.Pools) -> list[str]:
        rng = random.Random(4)
        return [pools.city(rng) for _ in range(300)] + [pools.person(rng) for _ in range(300)]

    drilled, corpus = draws(P.Pools(P.TRAIN, 1.0, real_names=False)), draws(P.Pools(P.TRAIN, 1.0))
    first = lambda part: tokenizer.encode(" " + part, add_special_tokens=False).ids[0]  # noqa: E731
    assert all(first(part) in words for name in drilled for part in name.split())
    # a word of the vocabulary may be a city's name too, but no longer 60% of the time
    assert sum(c in cities for c in drilled[:300]) < 30 < 120 < sum(c in cities for c in corpus[:300])


def test_a_drill_step_has_name_drills_in_the_share_set_beside_the_spelling_drills():
    from sglang_ds41.assets import TOKENIZER_JSON
    from sglang_ds41.engram.hashing import EngramHasher
    from sglang_ds41.training.settings import Settings

    hasher = EngramHasher.for_tokenizer(Settings().config(), TOKENIZER_JSON)
    words = {source for source, _ in spelt_words()}

    def kinds(spelling: float, names: float) -> list[str]:
        batch = drill_batch(0, 11, 4096, hasher, 0, 0.5, spelling, names=names)
        starts = batch.lengths.cumsum(0) - batch.lengths
        second = [int(batch.ids[s + 1]) for s in starts]  # the id after each drill's BOS
        return ["name" if i == Special.USER.id else "spell" if i in words else "copy" for i in second]

    assert set(kinds(0.0, 1.0)) == {"name"}
    mixed = kinds(0.5, 0.5)
    assert "copy" not in mixed and 0.25 < mixed.count("name") / len(mixed) < 0.75
    assert "name" not in kinds(1.0, 0.0)


def test_train_tiny_refuses_spelling_and_name_drills_over_the_whole(tmp_path, capsys):
    from sglang_ds41 import cli

    run = tmp_path / "a"
    argv = ["train-tiny", str(run), "--spelling-drills", "0.7", "--name-drills", "0.5", "--threads", "1"]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert "--spelling-drills, --name-drills" in error and "got 0.7 + 0.5" in error
    assert not run.exists()
