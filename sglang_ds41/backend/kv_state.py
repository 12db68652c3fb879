"""V4.1's per-token state in buffers indexed by SGLang's KV slot ids (docs/SGLANG_CPU.md §3.4, §6).

SGLang hands every new token a KV slot (`forward_batch.out_cache_loc`) and lists a request's
slots in `req_to_token[req_pool_idx, :seq_len]`; the radix cache keeps a prefix's slots alive
and gives them to the next request that shares the prefix. So everything a later token needs
and that is a function of the prefix alone is stored *at the slot of the token it belongs to*,
and a prefix hit, a continuing chunk and a decode step all read it back the same way, exactly:

* `full[slot]`, the slot's full-side row (`FullRowLayout`): its token id (the Engram hash
  history is rebuilt from the last n-1 of them), then its share of each KV source's entries;
* `window[layer][row]`: the layer's window KV of that token, 528 B per token of a 512-dim
  layer. Served by `sglang-ds41 serve`, the rows are SGLang's hybrid sliding-window (SWA) pool
  slots (`row = full_to_swa[slot]`): SGLang frees a request's window rows once no later token
  can read them and keeps the last window of every cached prefix, cutting a prefix hit back
  to where that window is whole, so window memory is bounded per request, not per context
  token. Without that pool (`--disable-hybrid-swa-memory`, tests) the row is the slot itself;
* compressed entry g of a KV source (latent + index key, 288 B + 68 B of the official dims)
  lives in the rows of its ratio-token group, the slots of positions g*ratio .. g*ratio+ratio-1:
  a ratio-2 entry is split in halves over the pair's two slots. Those are `2k, 2k+1` only when
  SGLang pages are even-sized (slot % page == position % page), hence `--page-size 2` (checked
  by the model);
* `pending[source][req_pool_idx]`: the ratio-2 (a, z) rows of an even token whose partner has
  not arrived. Only a continuing chunk or decode step of the same request starts at an odd
  position (radix hits are page-aligned, so even), so a per-request-slot ring is enough; the
  position it was written for is kept beside it and checked.

Rows are stored packed in the model's own KV formats (`kv_codec`: FP8 window, FP4 latents and
index keys), which is lossless because the model fake-quantises every one of them before use.
Served, the rows *are* SGLang's pool: `launch_hooks` gives its hybrid pool one K row per token
of exactly these bytes (894 B full side, 528 B window per layer, no V), so its memory sizing
counts what is stored, and `PoolViews` hands the K buffers here (layer 0, SGLang's one "full"
layer, keeps its window rows in a buffer of ours: 528 B per SWA slot that SGLang does not count).
Nothing is freed here: a row is rewritten by the forward that owns its slot, and reading a
window row SGLang has released is refused by name, never served stale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_ds41.config import TextConfig
from sglang_ds41.errors import Ds41Error
from sglang_ds41.model.attention import AttentionState, CompressedKV
from sglang_ds41.model.roles import LayerRole, layer_role

from .kv_codec import index_codec, latent_codec, window_codec


class SlotStateError(Ds41Error):
    """The slot-indexed state cannot serve this batch (layout or scheduling assumption broken)."""


@dataclass(frozen=True)
class Span:
    """One request's part of a forward batch: new tokens [start, start + length) at rows
    [offset, offset + length) of the flattened batch; `slots` = its KV slots of positions 0..end-1."""

    row: int  # req_pool_idx
    start: int
    length: int
    offset: int
    slots: torch.Tensor  # [start + length] int64

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def new_slots(self) -> torch.Tensor:
        return self.slots[self.start :]


def kv_bytes_per_token(cfg: TextConfig) -> dict[str, float]:
    """Bytes of state per token this layout stores, by part (tests, benchmarks); the same in
    every compute dtype, since rows are stored packed. `window` is per token *in the window
    pool* (at most the last window of each request / cached prefix under SGLang's SWA pool);
    `compressed` + `token_id` are per token of context."""
    window = cfg.num_hidden_layers * window_codec(cfg.head_dim).row_bytes
    entry = latent_codec(cfg.head_dim).row_bytes + index_codec(cfg.index_head_dim).row_bytes
    compressed = sum(entry / cfg.compress_ratios[s] for s in cfg.kv_source_layer_ids)
    return {"window": window, "compressed": compressed, "token_id": 4, "total": window + compressed + 4}


TOKEN_BYTES = 4  # the int32 token id at the start of every full-side row


@dataclass(frozen=True)
class FullRowLayout:
    """The bytes of one KV slot's full-side row: its token id, then for every KV source its
    share of a compressed entry (latent + index key). A ratio-r entry is cut into r pieces, one
    in each slot of its r-token group (slots r*k .. r*k+r-1: SGLang's even pages keep a pair's
    slots together), so every slot holds the same bytes and a row maps to one pool token."""

    latent_bytes: int
    entry_bytes: int
    pieces: dict[int, tuple[int, int]]  # KV source -> (first byte, bytes per slot of its group)
    row_bytes: int


def full_row_layout(cfg: TextConfig) -> FullRowLayout:
    latent, index = latent_codec(cfg.head_dim).row_bytes, index_codec(cfg.index_head_dim).row_bytes
    entry, pieces, offset = latent + index, {}, TOKEN_BYTES
    for s in cfg.kv_source_layer_ids:
        ratio = cfg.compress_ratios[s]
        piece = -(-entry // ratio)
        pieces[s] = (offset, piece)
        offset += piece
    return FullRowLayout(latent, entry, pieces, offset)


def pool_row_bytes(cfg: TextConfig) -> tuple[int, int]:
    """(bytes per full-pool token, bytes per window row of one layer): the geometry SGLang's
    hybrid sliding-window pool is given for V41 (`launch_hooks`), so its buffers are our rows."""
    return full_row_layout(cfg).row_bytes, window_codec(cfg.head_dim).row_bytes


@dataclass(frozen=True)
class PoolViews:
    """SGLang's pool buffers seen as bytes: `full` [rows, >= full row bytes] (the full layer's
    K buffer) and `window` {layer: [window rows, >= window row bytes]} (the SWA layers' K)."""

    full: torch.Tensor
    window: dict[int, torch.Tensor]

    @classmethod
    def of_k_buffers(cls, full: torch.Tensor, window: dict[int, torch.Tensor]) -> PoolViews:
        """From SGLang's K buffers [slots, heads, head_dim], of any dtype: their bytes per slot."""

        def rows(buffer: torch.Tensor) -> torch.Tensor:
            return buffer.view(torch.uint8).reshape(buffer.shape[0], -1)

        return cls(rows(full), {layer: rows(buffer) for layer, buffer in window.items()})


class SlotState:
    """The model-owned slot-indexed buffers of one model replica (see the module docstring)."""

    def __init__(
        self,
        cfg: TextConfig,
        rows: int,
        req_rows: int,
        dtype: torch.dtype,
        device=None,
        window_rows: int | None = None,
        window_slots: Callable[[torch.Tensor], torch.Tensor] | None = None,
        pool: PoolViews | None = None,
    ):
        """`rows` slots of SGLang's (full) token pool, `req_rows` request slots. Under SGLang's
        hybrid sliding-window pool the window KV lives in its `window_rows` SWA slots, which
        `window_slots` maps full slot ids to (0 = evicted); otherwise it is indexed by full slot.
        With `pool` the rows live in SGLang's own buffers; without, in buffers allocated here."""
        self.cfg, self.rows, self.req_rows, self.dtype = cfg, rows, req_rows, dtype
        self.window_rows = rows if window_rows is None else window_rows
        self.window_slots = window_slots
        self.window_size = cfg.sliding_window
        self.window_codec = window_codec(cfg.head_dim)
        self.latent_codec, self.index_codec = latent_codec(cfg.head_dim), index_codec(cfg.index_head_dim)
        self.layout = full_row_layout(cfg)
        self.ratio = {s: cfg.compress_ratios[s] for s in cfg.kv_source_layer_ids}
        width = self.window_codec.row_bytes
        if pool is None:
            pool = PoolViews(torch.zeros(rows, self.layout.row_bytes, dtype=torch.uint8, device=device), {})
        self.full = pool.full
        self._check_view("the full pool's K buffer", self.full, rows, self.layout.row_bytes)
        if not self.full.is_contiguous():
            raise SlotStateError("the full pool's K buffer must be contiguous to hold slot rows")
        self._flat = self.full.view(-1)
        self.window = []
        for layer in range(cfg.num_hidden_layers):
            view = pool.window.get(layer)
            if view is None:  # a layer SGLang keeps no SWA rows for (its full layer): ours
                view = torch.zeros(self.window_rows, width, dtype=torch.uint8, device=device)
            self._check_view(f"layer {layer}'s SWA K buffer", view, self.window_rows, width)
            self.window.append(view[:, :width])
        stride = self.full.shape[1]
        self._entry_pos = {}  # KV source -> flat offset of each entry byte from its group's row
        for s, (offset, piece) in self.layout.pieces.items():
            e = torch.arange(self.layout.entry_bytes, device=self._flat.device)
            self._entry_pos[s] = torch.div(e, piece, rounding_mode="floor") * stride + offset + e % piece
        self.pending, self.pending_pos = {}, {}
        # request slot -> (span, first position, window rows): this forward's, see begin_forward
        self._forward_rows: dict[int, tuple[Span, int, torch.Tensor]] = {}
        for s, ratio in self.ratio.items():
            if ratio == 2:
                # the (a, z) rows are fp32 math (float64 in a float64 model), not activations
                fp32 = torch.float64 if dtype == torch.float64 else torch.float32
                self.pending[s] = torch.zeros(req_rows, 2, cfg.head_dim, dtype=fp32, device=device)
                self.pending_pos[s] = torch.full((req_rows,), -1, dtype=torch.int64)

    @staticmethod
    def _check_view(what: str, view: torch.Tensor, rows: int, width: int) -> None:
        if view.dtype != torch.uint8 or view.dim() != 2 or view.shape[0] < rows or view.shape[1] < width:
            raise SlotStateError(
                f"{what} is {view.dtype} {list(view.shape)}, expected uint8 [>= {rows}, >= {width}] "
                "(SGLang's pool was not given V41's row geometry; serve without --kv-cache-dtype)"
            )

    def fits(self, rows: int, req_rows: int, window_rows: int | None = None) -> bool:
        window_rows = rows if window_rows is None else window_rows
        return rows <= self.rows and req_rows <= self.req_rows and window_rows <= self.window_rows

    def begin_forward(self, spans: list[Span]) -> None:
        """Translate (and check) each span's window rows once for all layers of a forward:
        positions [start - (window - 1), end) are all that its layers read or write."""
        self._forward_rows = {}
        for span in spans:
            lo = max(0, span.start - (self.window_size - 1))
            self._forward_rows[span.row] = (span, lo, self._translate(span, lo, span.end))

    def end_forward(self) -> None:
        self._forward_rows = {}

    def _window_ids(self, span: Span, lo: int, hi: int) -> torch.Tensor:
        """Rows of `window[layer]` holding positions [lo, hi) of the span's request."""
        cached = self._forward_rows.get(span.row)
        if cached is not None and cached[0] is span and cached[1] <= lo:
            return cached[2][lo - cached[1] : hi - cached[1]]
        return self._translate(span, lo, hi)

    def _translate(self, span: Span, lo: int, hi: int) -> torch.Tensor:
        slots = span.slots[lo:hi]
        ids = slots if self.window_slots is None else self.window_slots(slots).to(torch.int64)
        if bool((ids <= 0).any()):
            gone = [lo + int(i) for i in torch.nonzero(ids <= 0).flatten()[:4]]
            raise SlotStateError(
                f"request slot {span.row}: the window KV of positions {gone} (needed for positions "
                f"{span.start}..{span.end - 1}) is not in the sliding-window pool (evicted or never written)"
            )
        return ids

    # ---- tokens -----------------------------------------------------------------------------

    def write_tokens(self, slots: torch.Tensor, ids: torch.Tensor) -> None:
        self.full[slots, :TOKEN_BYTES] = ids.to(torch.int32).reshape(-1, 1).view(torch.uint8)

    def history_ids(self, span: Span, n: int) -> torch.Tensor:
        """Ids of the (up to) n tokens right before the span's start."""
        rows = self.full[span.slots[max(0, span.start - n) : span.start], :TOKEN_BYTES]
        return rows.contiguous().view(torch.int32).reshape(-1).to(torch.int64)

    # ---- attention state ------------------------------------------------------------------------

    def _entry_bytes(self, source: int, groups: torch.Tensor) -> torch.Tensor:
        """Flat byte positions [n, entry bytes] of the compressed entries of token groups `groups`."""
        first_row = groups * (self.ratio[source] * self.full.shape[1])
        return first_row[:, None] + self._entry_pos[source][None, :]

    def _entry_slots(self, span: Span, source: int, first: int, stop: int) -> torch.Tensor:
        ratio = self.ratio[source]
        return torch.div(span.slots[first * ratio : stop * ratio : ratio], ratio, rounding_mode="floor")

    def before(self, layer: int, span: Span) -> AttentionState:
        """Layer `layer`'s state right before the span's first new token."""
        lo = max(0, span.start - (self.window_size - 1))
        rows = self._window_ids(span, lo, span.start)
        window = self.window_codec.decode(self.window[layer][rows], self.dtype)
        if layer_role(self.cfg, layer) is not LayerRole.FULL:
            return AttentionState(window)
        ratio, n = self.ratio[layer], span.start // self.ratio[layer]
        ids = self._entry_slots(span, layer, 0, n)
        pending = None
        if ratio == 2 and span.start % 2:
            if int(self.pending_pos[layer][span.row]) != span.start - 1:
                raise SlotStateError(
                    f"layer {layer}: request slot {span.row} starts at odd position {span.start}, but "
                    f"its pending ratio-2 token is for position {int(self.pending_pos[layer][span.row])}; "
                    "a prefix-cache hit ended mid pair (serve with an even --page-size)"
                )
            pending = self.pending[layer][span.row]
        entries = self._flat[self._entry_bytes(layer, ids)]
        latents = self.latent_codec.decode(entries[:, : self.layout.latent_bytes], self.dtype)
        keys = self.index_codec.decode(entries[:, self.layout.latent_bytes :], self.dtype)
        return AttentionState(window, CompressedKV(latents, keys, pending))

    def commit(
        self,
        layer: int,
        span: Span,
        window_kv: torch.Tensor,
        after: AttentionState,
        new_entries: torch.Tensor | None = None,
    ) -> None:
        """Store what the span added: every new token's window KV, the completed compressed
        entries (`new_entries`: their input to the FP4 quantiser), the pending token (KV sources)."""
        self.window[layer][self._window_ids(span, span.start, span.end)] = self.window_codec.encode(window_kv)
        if after.compressed is None:
            return
        ratio = self.ratio[layer]
        first, stop = span.start // ratio, span.end // ratio
        where = self._entry_bytes(layer, self._entry_slots(span, layer, first, stop))
        if stop > first:
            if new_entries is None or new_entries.shape[0] != stop - first:
                got = None if new_entries is None else new_entries.shape[0]
                raise SlotStateError(
                    f"layer {layer}: {stop - first} compressed entries completed, but {got} "
                    "unquantised entries were captured for the store"
                )
            self._flat[where[:, : self.layout.latent_bytes]] = self.latent_codec.encode(new_entries)
        keys = after.compressed.index_keys[first:stop]
        self._flat[where[:, self.layout.latent_bytes :]] = self.index_codec.encode(keys)
        if after.compressed.pending is not None:
            self.pending[layer][span.row] = after.compressed.pending.to(self.pending[layer].dtype)
            self.pending_pos[layer][span.row] = span.end - 1
