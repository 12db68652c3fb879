"""The requests of one forward, flattened (varlen), and where their rows sit in a layer's pool.

A forward runs the new tokens of B requests as one batch of T rows: request b's tokens are rows
`offsets[b] .. offsets[b+1] - 1`, at positions `starts[b] .. ends[b] - 1` (contiguous). The
reference feeds one request at a time (B = 1); the backend a whole SGLang batch.

The attention phases (`attention.py`) address a layer's state as rows of one *logical pool* per
forward, request after request (MODEL.md §4.3):

* window rows: request b's window KV at positions `[window_starts[b], ends[b])`, the part of
  the window its new tokens read (`window_starts = max(0, starts - (window - 1))`);
* then compressed entries: request b's entries `0 .. ends[b] // ratio - 1` of its KV source
  (all a token of the chunk may see, the ones this forward completes included).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class Chunks:
    starts: torch.Tensor  # [B] int64: position of each request's first new token
    lengths: torch.Tensor  # [B] int64: its new tokens (>= 1)

    @classmethod
    def of(cls, starts: Sequence[int], lengths: Sequence[int]) -> Chunks:
        as_tensor = lambda values: torch.tensor(list(values), dtype=torch.int64)  # noqa: E731
        return cls(as_tensor(starts), as_tensor(lengths))

    @property
    def size(self) -> int:
        return self.starts.numel()

    @cached_property
    def ends(self) -> torch.Tensor:
        return self.starts + self.lengths

    @cached_property
    def offsets(self) -> torch.Tensor:
        """[B + 1]: request b's rows of the flattened batch are offsets[b] .. offsets[b+1] - 1."""
        return _offsets(self.lengths)

    @cached_property
    def request(self) -> torch.Tensor:
        """[T]: the request of each row."""
        return torch.repeat_interleave(torch.arange(self.size), self.lengths)

    @cached_property
    def positions(self) -> torch.Tensor:
        """[T]: the absolute position of each row."""
        b = self.request
        return self.starts[b] + torch.arange(b.numel()) - self.offsets[b]

    # ---- the logical pool ------------------------------------------------------------------
    # Every layer of a forward asks for these with its window or ratio: each is computed once
    # per argument and shared (callers never write into them).

    @cached_property
    def _memo(self) -> dict[tuple[str, int], torch.Tensor]:
        return {}

    def memo(self, name: str, arg: int, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`compute()`, once per (name, arg) for these chunks."""
        found = self._memo.get((name, arg))
        if found is None:
            found = self._memo[name, arg] = compute()
        return found

    def window_starts(self, window: int) -> torch.Tensor:
        """[B]: the first position of each request's window rows."""
        return self.memo("window_starts", window, lambda: (self.starts - (window - 1)).clamp(min=0))

    def window_offsets(self, window: int) -> torch.Tensor:
        """[B + 1]: request b's window rows are pool rows window_offsets[b] .. window_offsets[b+1] - 1."""
        return self.memo("window_offsets", window, lambda: _offsets(self.ends - self.window_starts(window)))

    def entry_counts(self, ratio: int) -> torch.Tensor:
        """[B]: compressed entries of each request once this forward's are in (ends // ratio)."""
        return self.memo("entry_counts", ratio, lambda: torch.div(self.ends, ratio, rounding_mode="floor"))

    def entry_offsets(self, ratio: int) -> torch.Tensor:
        """[B + 1]: request b's entries are entry rows entry_offsets[b] .. entry_offsets[b+1] - 1
        (after the window rows in the pool)."""
        return self.memo("entry_offsets", ratio, lambda: _offsets(self.entry_counts(ratio)))

    def new_entries(self, ratio: int) -> torch.Tensor:
        """[G]: the entry rows this forward completes (entries starts // ratio .. ends // ratio - 1
        of each request), in the order the compressor emits them."""
        return self.memo("new_entries", ratio, lambda: self._new_entries(ratio))

    def _new_entries(self, ratio: int) -> torch.Tensor:
        first = torch.div(self.starts, ratio, rounding_mode="floor")
        count = self.entry_counts(ratio) - first
        base = self.entry_offsets(ratio)[:-1] + first
        b = torch.repeat_interleave(torch.arange(self.size), count)
        offsets = _offsets(count)
        return base[b] + torch.arange(b.numel()) - offsets[b]

    def row_blocks(self, rows: int):
        """The batch as blocks of at most ~`rows` query rows, each [B', tb] token rows of the B'
        requests that still have tokens (request b's tokens i0 .. i0 + tb - 1; -1 past its
        end), with B' the number of those requests: per-request padding, so each request's
        rows meet its own keys in one batched matmul. Yields (requests [B'], rows [B', tb])."""
        longest = int(self.lengths.max())
        tb = max(1, min(longest, rows // self.size))
        for i0 in range(0, longest, tb):
            requests = torch.nonzero(self.lengths > i0).flatten()
            local = i0 + torch.arange(tb)
            block = self.offsets[requests, None] + local[None, :]
            yield requests, block.masked_fill(local[None, :] >= self.lengths[requests, None], -1)


def _offsets(counts: torch.Tensor) -> torch.Tensor:
    """[B] counts -> [B + 1] running starts (0, c0, c0 + c1, ...)."""
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])
