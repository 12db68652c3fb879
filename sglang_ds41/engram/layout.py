"""Engram table layout: primes, row offsets and hash multipliers (MODEL.md §5.3, §5.4, App. A).

How hash ids map to table rows — the contract shared by `hashing.py`, `table.py`, `gate.py`:

* Each Engram layer (in `engram_layer_ids` order, index `i`) has one table of
  `layout.layers[i].num_rows` rows (= `engram_num_embeddings[i]`; official 384,006,168 and
  384,016,682) of `engram_head_dim` (256) values each.
* The table is the concatenation of `n_columns = (max_ngram_size - 1) * n_heads` (official
  3 x 8 = 24) prime-sized ranges, one per *hash column* `c = (n - 2) * n_heads + h` for
  n-gram size `n = 2..max_ngram_size` and head `h = 0..n_heads-1`.
* `offsets[c]` is the prefix sum of the preceding primes, so column c owns rows
  `[offsets[c], offsets[c] + primes[c])`, and a hash `rho_n` lands on
  **global row id = offsets[c] + (rho_n mod primes[c])** — a row id within that layer's table.
* `hashing.py` returns exactly these global row ids: int64 tensors of shape
  `[..., n_engram_layers, n_columns]` (per token: 24 ids per Engram layer), columns in the
  order above. The gate concatenates the 24 looked-up rows in column order (§5.6).
* Tensor-parallel sharding on column boundaries uses `column_starts()` / `offsets`.

Everything here is a pure function of the config, so every rank computes the same layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from typing import TYPE_CHECKING

from sglang_ds41.errors import Ds41Error

if TYPE_CHECKING:
    import torch

    from sglang_ds41.config import TextConfig

# Seed of each layer's multiplier generator = SEED_FACTOR * layer id (not its index).
SEED_FACTOR = 10007
HEAD_DIM = 256  # values per row of the official tables (engram_head_dim)


@dataclass(frozen=True)
class EngramLayerLayout:
    """The constants of one Engram layer's hash and table."""

    layer_id: int
    n_heads: int
    max_ngram_size: int
    primes: tuple[int, ...]  # per hash column c = (n - 2) * n_heads + h
    offsets: tuple[int, ...]  # first row of each column's range
    multipliers: tuple[int, ...]  # mu[s] for look-back s = 0 .. max_ngram_size - 1

    @property
    def n_columns(self) -> int:
        return len(self.primes)

    @property
    def num_rows(self) -> int:
        return self.offsets[-1] + self.primes[-1]

    def column(self, n: int, head: int) -> int:
        """Hash column of n-gram size `n` (2..max_ngram_size) and head `head`."""
        if not 2 <= n <= self.max_ngram_size or not 0 <= head < self.n_heads:
            raise Ds41Error(
                f"Engram column: n-gram size {n} / head {head} out of range "
                f"(n in 2..{self.max_ngram_size}, head in 0..{self.n_heads - 1})"
            )
        return (n - 2) * self.n_heads + head

    def column_starts(self) -> tuple[int, ...]:
        """Row boundaries of the columns, `n_columns + 1` values from 0 to `num_rows`."""
        return (*self.offsets, self.num_rows)


@dataclass(frozen=True)
class EngramLayout:
    """The layouts of all Engram layers of a model, plus the shared hash parameters."""

    layers: tuple[EngramLayerLayout, ...]
    layer_ids: tuple[int, ...]
    n_heads: int
    max_ngram_size: int
    compressed_vocab_size: int

    @property
    def n_columns(self) -> int:
        return (self.max_ngram_size - 1) * self.n_heads

    def index_of(self, layer_id: int) -> int:
        """Position of backbone layer `layer_id` among the Engram layers."""
        try:
            return self.layer_ids.index(layer_id)
        except ValueError:
            raise Ds41Error(f"layer {layer_id} is not an Engram layer {list(self.layer_ids)}") from None

    @cached_property
    def _tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        import torch

        primes = torch.tensor([layer.primes for layer in self.layers], dtype=torch.int64)
        offsets = torch.tensor([layer.offsets for layer in self.layers], dtype=torch.int64)
        multipliers = torch.tensor([layer.multipliers for layer in self.layers], dtype=torch.int64)
        return primes, offsets, multipliers

    def primes_tensor(self) -> torch.Tensor:
        """int64 `[n_engram_layers, n_columns]`."""
        return self._tensors[0]

    def offsets_tensor(self) -> torch.Tensor:
        """int64 `[n_engram_layers, n_columns]`."""
        return self._tensors[1]

    def multipliers_tensor(self) -> torch.Tensor:
        """int64 `[n_engram_layers, max_ngram_size]`."""
        return self._tensors[2]

    @classmethod
    def from_config(cls, text_config: TextConfig) -> EngramLayout:
        """The layout of a text config; checks it against `engram_num_embeddings`. Computed once
        per process for the same fields (the manifest check, the hasher and the table loader ask)."""
        t = text_config
        return _checked_layout(
            tuple(t.engram_layer_ids),
            t.engram_vocab_size,
            t.engram_max_ngram_size,
            t.engram_n_heads,
            t.engram_compressed_vocab_size,
            tuple(t.engram_num_embeddings),
        )


@cache
def _checked_layout(
    layer_ids: tuple[int, ...],
    vocab_size: int,
    max_ngram_size: int,
    n_heads: int,
    compressed_vocab_size: int,
    num_embeddings: tuple[int, ...],
) -> EngramLayout:
    layout = build_layout(layer_ids, vocab_size, max_ngram_size, n_heads, compressed_vocab_size)
    got = tuple(layer.num_rows for layer in layout.layers)
    if num_embeddings != got:
        raise Ds41Error(
            f"config field text_config.engram_num_embeddings = {list(num_embeddings)} disagrees with "
            f"the prime layout computed from engram_vocab_size={vocab_size}, "
            f"engram_n_heads={n_heads}, engram_max_ngram_size={max_ngram_size}: {list(got)}"
        )
    return layout


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    d = 3
    while d * d <= n:
        if n % d == 0:
            return False
        d += 2
    return True


def hash_bound(compressed_vocab_size: int) -> int:
    """Exclusive bound of the random draws: keeps `id * multiplier` below 2**63."""
    return max(1, (2**63 - 1) // compressed_vocab_size // 2)


def multipliers_for(layer_id: int, max_ngram_size: int, compressed_vocab_size: int) -> tuple[int, ...]:
    """Odd multipliers `2 * v + 1`, v drawn by numpy's PCG64 seeded with 10007 * layer id."""
    import numpy as np

    rng = np.random.default_rng(SEED_FACTOR * layer_id)
    draws = rng.integers(0, hash_bound(compressed_vocab_size), size=max_ngram_size, dtype=np.int64)
    return tuple(2 * int(v) + 1 for v in draws)


def build_layout(
    layer_ids: Sequence[int],
    vocab_size: int,
    max_ngram_size: int,
    n_heads: int,
    compressed_vocab_size: int,
) -> EngramLayout:
    """Primes are handed out in (layer, n, head) order: each is the next unused prime
    >= `vocab_size`, so no two columns of the model share a modulus."""
    if max_ngram_size < 2 or n_heads < 1 or compressed_vocab_size < 1 or vocab_size < 2:
        raise Ds41Error(
            f"Engram layout needs engram_max_ngram_size >= 2, engram_n_heads >= 1, "
            f"engram_compressed_vocab_size >= 1, engram_vocab_size >= 2; got {max_ngram_size}, "
            f"{n_heads}, {compressed_vocab_size}, {vocab_size}"
        )
    candidate = vocab_size
    layers = []
    for layer_id in layer_ids:
        primes: list[int] = []
        for _ in range((max_ngram_size - 1) * n_heads):
            while not is_prime(candidate):
                candidate += 1
            primes.append(candidate)
            candidate += 1
        offsets = [0]
        for p in primes[:-1]:
            offsets.append(offsets[-1] + p)
        layers.append(
            EngramLayerLayout(
                layer_id=layer_id,
                n_heads=n_heads,
                max_ngram_size=max_ngram_size,
                primes=tuple(primes),
                offsets=tuple(offsets),
                multipliers=multipliers_for(layer_id, max_ngram_size, compressed_vocab_size),
            )
        )
    return EngramLayout(
        layers=tuple(layers),
        layer_ids=tuple(layer_ids),
        n_heads=n_heads,
        max_ngram_size=max_ngram_size,
        compressed_vocab_size=compressed_vocab_size,
    )
