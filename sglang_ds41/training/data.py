"""The corpus as a reproducible stream of batches.

Conversation i of a run is drawn by `random.Random(f"{seed}:{i}")`, so the stream is a pure
function of (seed, i): a resumed run continues at the next i and sees exactly what an
uninterrupted one would. Batches are packed from a window of samples sorted by length (less
padding in the blocked attention), each within a token budget, and hashed for Engram with the
production hasher.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from sglang_ds41.engram.hashing import EngramHasher

from .corpus.pools import Pools
from .corpus.samples import Sample, samples
from .corpus.tasks import COPY_FIRST, draw
from .forward import Batch

IGNORE = -100  # target of a position without loss


def sample_stream(
    seed: int, start: int, copy_first: int = 0, split: str = "train", vocabulary_names: float = 0.0
) -> Iterator[tuple[int, Sample]]:
    """(index of the conversation, sample) from conversation `start` on; the first `copy_first`
    conversations are drawn with the copy-heavy mix (`tasks.COPY_FIRST`); `vocabulary_names` is
    the pools' share of names that open with a capitalised word (`Pools.vocabulary_names`)."""
    pools = Pools(split, vocabulary_names)
    i = start
    while True:
        weights = COPY_FIRST if i < copy_first else None
        for sample in samples(draw(random.Random(f"{seed}:{i}"), pools, weights=weights)):
            yield i, sample
        i += 1


@dataclass
class Packed:
    batch: Batch
    window_start: int  # the first conversation of the window this batch was packed from
    in_window: int  # the batch's place in that window
    n_samples: int


def batches(
    seed: int,
    tokens: int,
    max_len: int,
    hasher: EngramHasher,
    start: tuple[int, int] = (0, 0),
    window: int = 64,
    copy_first: int = 0,
    vocabulary_names: float = 0.0,
) -> Iterator[Packed]:
    """Batches of at most `tokens` padded tokens (longest x count), from windows of about
    `window` samples (whole conversations) sorted by length; samples longer than `max_len` are
    skipped. `start` = (window_start, in_window) of the first batch to yield, as a checkpoint
    recorded it: the batches are a pure function of the seed (and `copy_first` and
    `vocabulary_names`, see `sample_stream`)."""
    first, skip = start
    while True:
        group_of: list[Sample] = []
        nxt = first
        for i, s in sample_stream(seed, first, copy_first, vocabulary_names=vocabulary_names):
            if len(group_of) >= window and i != nxt:
                break
            nxt = i
            if len(s) <= max_len:
                group_of.append(s)
        group_of.sort(key=len)
        packed: list[list[Sample]] = [[]]
        for s in group_of:
            if packed[-1] and len(s) * (len(packed[-1]) + 1) > tokens:
                packed.append([])
            packed[-1].append(s)
        for j, group in enumerate(packed):
            if j >= skip and group:
                yield Packed(make_batch(group, hasher), first, j, len(group))
        first, skip = nxt + 1, 0


def make_batch(group: list[Sample], hasher: EngramHasher) -> Batch:
    ids = [torch.tensor(s.ids, dtype=torch.int64) for s in group]
    targets = []
    for s, x in zip(group, ids, strict=True):
        learn = torch.tensor(s.learn[1:], dtype=torch.bool)
        t = torch.full_like(x, IGNORE)
        t[:-1] = torch.where(learn, x[1:], IGNORE)  # position p predicts ids[p + 1]
        targets.append(t)
    return Batch(
        ids=torch.cat(ids),
        lengths=torch.tensor([len(x) for x in ids]),
        engram_rows=torch.cat([hasher.hash_sequence(x) for x in ids]),
        targets=torch.cat(targets),
    )
