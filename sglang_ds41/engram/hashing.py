"""Engram n-gram hash ids (MODEL.md §5.5) and the per-request hash state (§5.6).

Output contract (see `layout.py`): int64 row ids of shape `[..., n_engram_layers, n_columns]`,
column `c = (n - 2) * n_heads + h`, each id already offset into its layer's table.

The only state a request needs between forward calls is its last `max_ngram_size - 1`
compressed ids (oldest first). We store *compressed* ids, with `BLOCKED = -1` for DEAD
tokens (image span, padding, multimodal pad ids) and for positions before the sequence
start; blocking propagates to every older look-back when the window is hashed, so the
history needs no position counter. A fresh request's history is all `BLOCKED`, which is
exactly "pad at sequence start" with absolute positions.

Everything is vectorised over tokens and requests; the only Python loop runs over the
n-gram order (at most `max_ngram_size` steps), never over tokens.
"""

from __future__ import annotations

import torch

from sglang_ds41.engram.layout import EngramLayout
from sglang_ds41.errors import Ds41Error

BLOCKED = -1


class EngramHasher:
    """Config-bound hashing: the compressed token map plus the layout constants.

    `token_map` maps raw token ids to compressed ids (`< compressed_vocab_size`). Raw ids
    that are negative, `>= len(token_map)` (e.g. SGLang multimodal pad ids) or equal to
    `image_token_id` are DEAD.
    """

    def __init__(
        self,
        layout: EngramLayout,
        token_map: torch.Tensor,
        pad_token_id: int,
        image_token_id: int | None,
        device: torch.device | str | None = None,
    ) -> None:
        token_map = torch.as_tensor(token_map).to(device=device, dtype=torch.int64)
        if token_map.ndim != 1 or token_map.numel() == 0:
            raise Ds41Error(
                f"Engram token map must be a non-empty 1-D tensor, got shape {tuple(token_map.shape)}"
            )
        lo, hi = int(token_map.min()), int(token_map.max())
        if lo < 0 or hi >= layout.compressed_vocab_size:
            raise Ds41Error(
                f"Engram token map values must lie in [0, engram_compressed_vocab_size="
                f"{layout.compressed_vocab_size}), got [{lo}, {hi}]"
            )
        if not 0 <= pad_token_id < token_map.numel():
            raise Ds41Error(
                f"engram_pad_token_id {pad_token_id} is outside the token map (size {token_map.numel()})"
            )
        self.layout = layout
        self.token_map = token_map
        self.pad = int(token_map[pad_token_id])
        self.image_token_id = image_token_id
        self.max_ngram_size = layout.max_ngram_size
        self.history_len = layout.max_ngram_size - 1
        self.primes = layout.primes_tensor().to(token_map.device)  # [L, C]
        self.offsets = layout.offsets_tensor().to(token_map.device)  # [L, C]
        self.multipliers = layout.multipliers_tensor().to(token_map.device)  # [L, N]

    @classmethod
    def from_config(
        cls, config, token_map: torch.Tensor, device: torch.device | str | None = None
    ) -> EngramHasher:
        """From a `V41Config` (checks the layout against `engram_num_embeddings`)."""
        return cls(
            EngramLayout.from_config(config.text),
            token_map,
            pad_token_id=config.text.engram_pad_token_id,
            image_token_id=config.image_token_id,
            device=device,
        )

    @classmethod
    def for_tokenizer(
        cls,
        config,
        tokenizer_json,
        cache_dir=None,
        device: torch.device | str | None = None,
    ) -> EngramHasher:
        """The production hasher: the map of a real tokenizer (cached; refused unless its size
        equals `engram_compressed_vocab_size`) plus the config's layout."""
        from sglang_ds41.engram.token_map import load_token_map

        token_map = load_token_map(
            tokenizer_json, expected_size=config.text.engram_compressed_vocab_size, cache_dir=cache_dir
        )
        return cls.from_config(config, torch.from_numpy(token_map), device=device)

    @property
    def device(self) -> torch.device:
        return self.token_map.device

    # --- pure functions ------------------------------------------------------------------------

    def compress(self, ids: torch.Tensor) -> torch.Tensor:
        """Raw ids -> compressed ids (int64), `BLOCKED` where the token is DEAD."""
        ids = torch.as_tensor(ids, device=self.device).to(torch.int64)
        live = (ids >= 0) & (ids < self.token_map.numel())
        if self.image_token_id is not None:
            live &= ids != self.image_token_id
        mapped = self.token_map[torch.where(live, ids, 0)]
        return torch.where(live, mapped, BLOCKED)

    def hash_windows(self, windows: torch.Tensor) -> torch.Tensor:
        """Row ids of compressed windows `[..., N]` (s = 0 is the token itself, `BLOCKED`
        allowed anywhere) -> `[..., n_engram_layers, n_columns]` int64."""
        n = self.max_ngram_size
        if windows.shape[-1] != n:
            raise Ds41Error(f"Engram windows must have {n} look-backs, got shape {tuple(windows.shape)}")
        # Once a look-back is blocked, every older one is too.
        blocked = torch.cummax((windows < 0).to(torch.int8), dim=-1).values.bool()
        c = torch.where(blocked, self.pad, windows)
        products = c.unsqueeze(-2) * self.multipliers  # [..., L, N]; < 2**63 by construction
        rho = products[..., 0]
        per_order = []
        for s in range(1, n):
            rho = torch.bitwise_xor(rho, products[..., s])
            per_order.append(rho)
        rho_cols = torch.stack(per_order, dim=-1).repeat_interleave(self.layout.n_heads, dim=-1)
        return torch.remainder(rho_cols, self.primes) + self.offsets

    def windows_after(
        self, history: torch.Tensor, compressed: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """Windows of a ragged batch of chunks, each continuing its request's history.

        `history [R, N-1]` (oldest first), `compressed [T]` (the chunks concatenated),
        `lengths [R]` (sum = T) -> `[T, N]`.
        """
        req, k = self._token_coords(lengths, compressed.numel())
        h = self.history_len
        back = torch.arange(self.max_ngram_size, device=self.device)
        src = k.unsqueeze(1) - back  # in-chunk index of look-back s; < 0 reaches into history
        token_index = torch.arange(compressed.numel(), device=self.device).unsqueeze(1) - back
        from_chunk = compressed[token_index.clamp(min=0)]
        from_history = history.to(torch.int64)[req.unsqueeze(1), (h + src).clamp(0, h - 1)]
        return torch.where(src >= 0, from_chunk, from_history)

    def history_after(
        self, history: torch.Tensor, compressed: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """The last `N-1` compressed ids of `history ++ chunk` per request, `[R, N-1]`."""
        h = self.history_len
        lengths = lengths.to(device=self.device, dtype=torch.int64)
        starts = torch.cumsum(lengths, 0) - lengths
        m = lengths.unsqueeze(1) + torch.arange(h, device=self.device)  # index into history ++ chunk
        in_chunk = m >= h
        padded = torch.cat([compressed, compressed.new_full((1,), BLOCKED)])  # last entry: a safe target
        chunk_index = torch.where(in_chunk, starts.unsqueeze(1) + m - h, compressed.numel())
        from_history = history.to(torch.int64).gather(1, m.clamp(max=h - 1))
        return torch.where(in_chunk, padded[chunk_index], from_history).to(history.dtype)

    def _token_coords(self, lengths: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = lengths.to(device=self.device, dtype=torch.int64)
        if lengths.ndim != 1 or bool((lengths < 0).any()) or int(lengths.sum()) != total:
            raise Ds41Error(
                f"Engram chunk lengths {lengths.tolist()} must be non-negative and sum to the "
                f"number of tokens ({total})"
            )
        req = torch.repeat_interleave(torch.arange(lengths.numel(), device=self.device), lengths)
        starts = torch.cumsum(lengths, 0) - lengths
        k = torch.arange(total, device=self.device) - starts[req]
        return req, k

    # --- whole sequences ------------------------------------------------------------------------

    def empty_history(self, n_requests: int = 1, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        """History of requests at position 0: every look-back is before the start."""
        return torch.full((n_requests, self.history_len), BLOCKED, dtype=dtype, device=self.device)

    def hash_sequence(self, ids: torch.Tensor) -> torch.Tensor:
        """Row ids of whole sequences starting at position 0: `[T]` -> `[T, L, C]`, or
        `[B, T]` -> `[B, T, L, C]` (right padding: use a negative id, it is DEAD)."""
        compressed = self.compress(ids)
        pad = torch.full((*compressed.shape[:-1], self.history_len), BLOCKED, device=self.device)
        padded = torch.cat([pad, compressed], dim=-1)
        # windows[..., t, s] = padded[..., t + h - s]
        windows = padded.unfold(-1, self.max_ngram_size, 1).flip(-1)
        return self.hash_windows(windows)

    def history_of(self, prefixes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Histories after ragged prefixes (concatenated ids, `lengths [R]`), for a prefix-cache hit."""
        compressed = self.compress(prefixes).reshape(-1)
        return self.history_after(self.empty_history(lengths.numel()), compressed, lengths)

    def extend(
        self, history: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hash a ragged batch of chunks (prefill chunks, decode steps: length 1, draft
        blocks) continuing `history [R, N-1]`; returns `(row ids [T, L, C], new history)`."""
        compressed = self.compress(ids).reshape(-1)
        lengths = torch.as_tensor(lengths, device=self.device)
        if history.shape != (lengths.numel(), self.history_len):
            raise Ds41Error(
                f"Engram history must have shape ({lengths.numel()}, {self.history_len}), "
                f"got {tuple(history.shape)}"
            )
        rows = self.hash_windows(self.windows_after(history, compressed, lengths))
        return rows, self.history_after(history, compressed, lengths)
