"""Copy drills: short id sequences whose later parts repeat earlier ones, to grow induction.

Copying a value from the prompt (a city, a number, a made-up name) needs an *induction* circuit:
attend to where the current id occurred before and predict the id that followed it there. On the
corpus alone it did not form in 1,500 steps (docs/TRAINING.md §7): copied spans are a few
percent of the learnt tokens, and each gives a weak gradient until the circuit half exists. A
drill is nothing but copy targets, so its gradient points at the circuit from the first step.

Two kinds, both over ids the corpus itself uses (no new embedding rows to ship), a share
`periodic` of them (a setting) periodic:

* periodic: a random segment of 3-16 ids repeated to the drill's length; every id from the
  second id of the second period on is predictable;
* spans: random runs of ids, and (about two thirds of the time) copies of 3-16 ids from
  anywhere earlier; each copied id after the copy's first is predictable, and a copy ends
  where nothing says it will, as a value copied from a prompt does.

A third kind, a share `spelling` of a drill step's drills (a setting, off by default), teaches
the space-free spelling of the vocabulary's capitalised words, which copying names into calls
needs (`spelling.py`); it adds embedding rows (those words and their pieces) to what is shipped.
A fourth, a share `names` (off by default), teaches the same spelling where a call writes it: the
corpus's own call turns with every name a drilled word (`name_drills.py`).

Measured (docs/TRAINING.md §7): at the learning rate of 3e-3 drills did not form the circuit;
at 1e-3 they did (drill loss 6.8 -> 3.9 in 2,000 steps), and the model then copied, but also
looped under greedy decoding ("The capital of Peru is Peru is Peru ..."), with or without the
periodic kind. The defaults are off: the shipped model was trained without drills.

A drill step's batch is a pure function of (seed, step), so a resumed run replays it exactly.
"""

from __future__ import annotations

import random
from functools import cache

from sglang_ds41.assets import v41_tokenizer
from sglang_ds41.engram.hashing import EngramHasher

from .corpus.pools import Pools
from .corpus.samples import Sample, samples
from .corpus.tasks import draw
from .data import make_batch
from .forward import Batch
from .name_drills import name_drill
from .spelling import GAP, filler_of, spelling_drill

DRILL_LENGTH = 128  # ids per drill: within the sliding window, so every layer sees all of it
VOCAB_CONVERSATIONS = 400  # conversations whose ids make up the drill vocabulary


def is_drill_step(step: int, warmup: int, every: int) -> bool:
    """Whether step `step` (0-based) trains on drills: the first `warmup` steps, then every
    `every`-th step (0 = never)."""
    return step < warmup or (every > 0 and (step - warmup) % every == every - 1)


@cache
def drill_vocabulary(seed: int) -> tuple[int, ...]:
    """The plain-text ids (no special or added tokens) of the run's first conversations."""
    added = set(v41_tokenizer().get_added_tokens_decoder())
    pools, seen = Pools("train"), set()
    for i in range(VOCAB_CONVERSATIONS):
        for sample in samples(draw(random.Random(f"{seed}:{i}"), pools)):
            seen.update(sample.ids)
    return tuple(sorted(seen - added))


@cache
def spelling_filler(seed: int) -> tuple[int, ...]:
    """The lower-case words of the drill vocabulary: what stands between a spelling drill's word
    and its spelling."""
    return filler_of(drill_vocabulary(seed))


def drill(
    rng: random.Random, vocab: tuple[int, ...], bos: int, periodic: float, length: int = DRILL_LENGTH
) -> Sample:
    """One drill of `length` ids (BOS first), periodic with probability `periodic`."""
    ids, learn = [bos], [False]
    if rng.random() < periodic:
        period = rng.randint(3, 16)
        segment = rng.choices(vocab, k=period)
        ids += (segment * (length // period + 1))[: length - 1]
        # from the second id of the second period on, the id before has occurred already
        return Sample("drill", tuple(ids), tuple(i > period + 1 for i in range(length)))
    while len(ids) < length:
        room = length - len(ids)
        if len(ids) > 8 and rng.random() < 0.65:
            start = rng.randrange(1, len(ids) - 2)
            span = ids[start : start + min(rng.randint(3, 16), room)]
            learn += [False] + [True] * (len(span) - 1)
        else:
            span = rng.choices(vocab, k=min(rng.randint(2, 8), room))
            learn += [False] * len(span)
        ids += span
    return Sample("drill", tuple(ids), tuple(learn))


def drill_batch(
    seed: int,
    step: int,
    tokens: int,
    hasher: EngramHasher,
    bos: int,
    periodic: float,
    spelling: float = 0.0,
    spelling_lead: int = 0,
    spelling_gap: int = GAP[1],
    spelling_tail: int = 0,
    names: float = 0.0,
) -> Batch:
    """The drill batch of step `step`: `tokens // DRILL_LENGTH` drills, a share `spelling` of
    them spelling drills (`spelling.py`: up to `spelling_lead` words before each word and up to
    `spelling_gap` after it, and up to `spelling_tail` pieces after the word and its spelling),
    a share `names` name drills (`name_drills.py`) and a share `periodic` of the others
    periodic."""
    rng = random.Random(f"{seed}:drill:{step}")
    vocab = drill_vocabulary(seed)

    def one() -> Sample:
        # no draw when both are off, and the same draw as before name drills existed when they
        # are off: older runs replay exactly
        kind = rng.random() if spelling > 0 or names > 0 else 1.0
        if kind < spelling:
            return spelling_drill(
                rng,
                bos,
                DRILL_LENGTH,
                spelling_filler(seed),
                lead=spelling_lead,
                max_gap=spelling_gap,
                tail=spelling_tail,
            )
        if kind < spelling + names:
            return name_drill(rng, bos, DRILL_LENGTH)
        return drill(rng, vocab, bos, periodic)

    return make_batch([one() for _ in range(max(1, tokens // DRILL_LENGTH))], hasher)
