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
* `index_keys[source][group]`: the index key of each compressed entry once more, decoded, written
  by the same `commit` as its packed bytes: the indexer scores every entry of a request at
  every decode step, and decoding them all each step was most of what a 16k-context step adds
  to a 512 one (the bytes stay the stored state; these rows are their decoded copy, in the
  model dtype, like `pending` kept beside SGLang's pool, whose K/V-moving features the launcher refuses);
* `pending[source][req_pool_idx]`: the ratio-2 (a, z) rows of an even token whose partner has
  not arrived. Only a continuing chunk or decode step of the same request starts at an odd
  position (radix hits are page-aligned, so even), so a per-request-slot ring is enough; the
  position it was written for is kept beside it and checked.

Rows are stored packed in the model's own KV formats (`kv_codec`: FP8 window, FP4 latents and
index keys), which is lossless because the model fake-quantises every one of them before use.
Served, the rows *are* SGLang's pool: `serve/launch_hooks.py` gives its hybrid pool one K row per token
of exactly these bytes (894 B full side, 528 B window per layer, no V), so its memory sizing
counts what is stored, and `PoolViews` hands the K buffers here (layer 0, SGLang's one "full"
layer, keeps its window rows in a buffer of ours: 528 B per SWA slot that SGLang does not count).
Nothing is freed here: a row is rewritten by the forward that owns its slot, and reading a
window row SGLang has released is refused by name, never served stale.

Per forward (`begin_forward`): the batch's rows in the order of the attention's logical pool
(`model.batch`), once for all layers. Per layer: `commit` writes what `Attention.project` made
(window KV of every new token, completed entries, pending tokens), then `view` serves the
phases' reads (`model.attention.StateView`): the window rows, the index keys of the entries
the indexer scores, the latents of the entries attention picked (only those are decoded).
Rows are gathered with `index_select` (indexing with a tensor took ~7x as long: 103 against
12 us for a batch of 16's window rows, a layer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sglang_ds41.config import TextConfig
from sglang_ds41.errors import Ds41Error
from sglang_ds41.model.attention import Projected
from sglang_ds41.model.batch import Chunks
from sglang_ds41.model.roles import LayerRole, kv_source, layer_role

from .kv_codec import RowCodec, index_codec, latent_codec, window_codec


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


def entry_segments(
    layout: FullRowLayout, source: int, ratio: int, lo: int, hi: int
) -> list[tuple[int, int, int]]:
    """Where bytes lo..hi-1 of a `source` entry lie: (slot of its group, first column, end column)
    for each of the group's slots that holds some of them, in byte order."""
    offset, piece = layout.pieces[source]
    segments = []
    for r in range(ratio):
        a, b = max(lo, r * piece), min(hi, (r + 1) * piece)
        if a < b:
            segments.append((r, offset + a - r * piece, offset + b - r * piece))
    return segments


def pool_row_bytes(cfg: TextConfig) -> tuple[int, int]:
    """(bytes per full-pool token, bytes per window row of one layer): the geometry SGLang's
    hybrid sliding-window pool is given for V41 (`serve/launch_hooks.py`), so its buffers are our rows."""
    return full_row_layout(cfg).row_bytes, window_codec(cfg.head_dim).row_bytes


def slot_row_geometry(cfg: TextConfig, element_size: int) -> tuple[int, int]:
    """(K head_dim of the full layer, of every SWA layer) in elements of `element_size` bytes:
    our packed rows (`pool_row_bytes`), rounded up to whole elements."""
    full_bytes, window_bytes = pool_row_bytes(cfg)
    return -(-full_bytes // element_size), -(-window_bytes // element_size)


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
            raise SlotStateError(
                "the full pool's K buffer must be contiguous to hold slot rows, got strides "
                f"{list(self.full.stride())} for shape {list(self.full.shape)}"
            )
        self.window = []
        for layer in range(cfg.num_hidden_layers):
            view = pool.window.get(layer)
            if view is None:  # a layer SGLang keeps no SWA rows for (its full layer): ours
                view = torch.zeros(self.window_rows, width, dtype=torch.uint8, device=device)
            self._check_view(f"layer {layer}'s SWA K buffer", view, self.window_rows, width)
            self.window.append(view[:, :width])
        latent, entry = self.layout.latent_bytes, self.layout.entry_bytes
        self._segments = {  # KV source -> part of an entry -> where its bytes lie in the group's rows
            s: {
                "latent": entry_segments(self.layout, s, ratio, 0, latent),
                "index": entry_segments(self.layout, s, ratio, latent, entry),
            }
            for s, ratio in self.ratio.items()
        }
        self.index_keys = {
            s: torch.zeros(rows // ratio + 1, cfg.index_head_dim, dtype=dtype, device=device)
            for s, ratio in self.ratio.items()
        }
        self.pending, self.pending_pos = {}, {}
        self._forward: ForwardRows | None = None  # this forward's rows, see begin_forward
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

    def begin_forward(self, spans: list[Span]) -> Chunks:
        """The rows of this forward's requests, once for all its layers (`ForwardRows`): window
        rows of positions [start - (window - 1), end) (translated and checked once per request),
        the slot group of every compressed entry. Returns the batch's `Chunks`."""
        chunks = Chunks.of([s.start for s in spans], [s.length for s in spans])
        starts = chunks.window_starts(self.window_size).tolist()
        window = [self._translate(span, lo, span.end) for span, lo in zip(spans, starts, strict=True)]
        new = [rows[span.start - lo :] for rows, span, lo in zip(window, spans, starts, strict=True)]
        groups = {
            s: torch.cat([span.slots[: span.end // r * r : r] // r for span in spans])
            for s, r in self.ratio.items()
        }
        rows = torch.tensor([span.row for span in spans], dtype=torch.int64)
        self._forward = ForwardRows(chunks, rows, torch.cat(window), torch.cat(new), groups)
        return chunks

    def end_forward(self) -> None:
        self._forward = None

    def _rows(self) -> ForwardRows:
        if self._forward is None:
            raise SlotStateError("no forward has begun (begin_forward) to read or write attention state for")
        return self._forward

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

    def history_ids(self, spans: list[Span], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Ids of the (up to) n tokens right before each span's start, concatenated, and how
        many each span has: one gather for the batch."""
        slots = [span.slots[max(0, span.start - n) : span.start] for span in spans]
        counts = torch.tensor([s.numel() for s in slots], dtype=torch.int64)
        rows = self.full[:, :TOKEN_BYTES].index_select(0, torch.cat(slots))
        return rows.view(torch.int32).reshape(-1).to(torch.int64), counts

    # ---- attention state ------------------------------------------------------------------------

    def _read(self, source: int, part: str, groups: torch.Tensor) -> torch.Tensor:
        """The packed `part` ("latent" / "index") of `source`'s entries in slot groups [n] -> [n, bytes]."""
        first = groups * self.ratio[source]
        pieces = [self.full[:, a:b].index_select(0, first + r) for r, a, b in self._segments[source][part]]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)

    def _write(self, source: int, part: str, groups: torch.Tensor, packed: torch.Tensor) -> None:
        first, done = groups * self.ratio[source], 0
        for r, a, b in self._segments[source][part]:
            self.full[first + r, a:b] = packed[:, done : done + b - a]
            done += b - a

    def pending_rows(self, layer: int) -> torch.Tensor | None:
        """A ratio-2 KV source's pending (a, z) rows [B, 2, head_dim] of this forward's requests
        (those starting at an odd position need theirs; checked), or None when none does."""
        if self.ratio.get(layer) != 2:
            return None
        fwd = self._rows()
        waiting = fwd.chunks.starts % 2 == 1
        if not bool(waiting.any()):
            return None
        held = self.pending_pos[layer][fwd.req_rows]
        wrong = waiting & (held != fwd.chunks.starts - 1)
        if bool(wrong.any()):
            b = int(torch.nonzero(wrong)[0])
            raise SlotStateError(
                f"layer {layer}: request slot {int(fwd.req_rows[b])} starts at odd position "
                f"{int(fwd.chunks.starts[b])}, but its pending ratio-2 token is for position {int(held[b])}; "
                "a prefix-cache hit ended mid pair (serve with an even --page-size)"
            )
        return self.pending[layer].index_select(0, fwd.req_rows)

    def commit(self, layer: int, projected: Projected) -> None:
        """Store what layer `layer`'s forward made: every new token's window KV; on a KV source
        the completed compressed entries (latents encoded from their FP4 quantiser's input) and
        each request's new pending token."""
        fwd = self._rows()
        window = _bytes(projected.window_bytes, self.window_codec, projected.window_kv)
        self.window[layer][fwd.new_window] = window
        new = projected.entries
        if new is None:
            return
        groups = fwd.groups[layer][fwd.chunks.new_entries(self.ratio[layer])]
        if groups.numel() != new.kv.shape[0]:
            raise SlotStateError(
                f"layer {layer}: the forward completes {groups.numel()} compressed entries, but "
                f"{new.kv.shape[0]} were projected"
            )
        self._write(layer, "latent", groups, _bytes(new.kv_bytes, self.latent_codec, new.rotated))
        keys = _bytes(new.key_bytes, self.index_codec, new.index_keys)
        self._write(layer, "index", groups, keys)
        self.index_keys[layer][groups] = new.index_keys.to(self.dtype)  # = decode(keys), bit for bit
        if new.pending is not None:
            unpaired = fwd.chunks.ends % 2 == 1
            rows = fwd.req_rows[unpaired]
            self.pending[layer][rows] = new.pending[unpaired].to(self.pending[layer].dtype)
            self.pending_pos[layer][rows] = fwd.chunks.ends[unpaired] - 1

    def view(self, layer: int) -> SlotView:
        """Layer `layer`'s state for this forward's requests (`model.attention.StateView`)."""
        return SlotView(self, layer, self._rows())


@dataclass(frozen=True)
class ForwardRows:
    """Where one forward's requests keep their state, in the order of the logical pool
    (`model.batch`): window rows, and the slot group of each compressed entry."""

    chunks: Chunks
    req_rows: torch.Tensor  # [B] request slots (req_pool_idx)
    window: torch.Tensor  # [W] window-pool rows of positions [window start, end) per request
    new_window: torch.Tensor  # [T] window-pool rows of the new tokens
    groups: dict[int, torch.Tensor]  # KV source -> [E] slot group (first slot // ratio) of each entry
    # SlotView's last rows read per (KV source, part): (entry ids, rows)
    last_read: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class SlotView:
    """`model.attention.StateView` over the packed pool bytes: decodes what is asked for only."""

    def __init__(self, store: SlotState, layer: int, rows: ForwardRows):
        self.store, self.layer, self.rows_of = store, layer, rows
        role = layer_role(store.cfg, layer)
        self.source = None if role is LayerRole.WINDOW else kv_source(store.cfg, layer)

    def window(self) -> torch.Tensor:
        store = self.store
        rows = store.window[self.layer].index_select(0, self.rows_of.window)
        return store.window_codec.decode(rows, store.dtype)

    def index_keys(self, ids: torch.Tensor) -> torch.Tensor:
        # Decoded when committed (SlotState.index_keys), gathered here; an index source and a
        # Reindex layer of one KV source (official: 20 and 24..36) score the same entries in a
        # decode step, so the last gather per source is kept.
        keys = self.store.index_keys[self.source]
        return self._kept("index", ids, lambda groups: keys.index_select(0, groups))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        # The layers reading one KV source attend the same entries when each token picks all
        # of them (a context under top-k entries, or a prefill): kept like the index keys.
        return self._decoded("latent", self.store.latent_codec, ids)

    def _decoded(self, part: str, codec, ids: torch.Tensor) -> torch.Tensor:
        """The `part` rows of entries `ids` of this layer's KV source, decoded from the bytes."""
        store = self.store
        return self._kept(
            part, ids, lambda groups: codec.decode(store._read(self.source, part, groups), store.dtype)
        )

    def _kept(
        self, part: str, ids: torch.Tensor, rows_of: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """`rows_of(slot groups of entries ids)`; the last rows read per source and part are
        kept for this forward (a source's entries are all committed before any layer reads them)."""
        key = (self.source, part)
        last = self.rows_of.last_read.get(key)
        if last is not None and last[0].shape == ids.shape and torch.equal(last[0], ids):
            return last[1]
        rows = rows_of(self.rows_of.groups[self.source][ids])
        self.rows_of.last_read[key] = (ids, rows)
        return rows


def _bytes(made: torch.Tensor | None, codec: RowCodec, rows: torch.Tensor) -> torch.Tensor:
    """The stored bytes of `rows`: those the forward's quantiser packed with them (of the rows
    before fake quantisation: what they hold is the same, `kv_codec`), else encoded here."""
    return codec.encode(rows) if made is None else made
