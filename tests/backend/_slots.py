"""SGLang's KV slot bookkeeping in miniature, for driving the backend forward outside a server."""

from __future__ import annotations

import torch

from sglang_ds41.backend.kv_state import PoolViews, SlotState, Span, slot_row_geometry


class Slots:
    """SGLang's KV slot bookkeeping in miniature: pages of `page` slots (slot % page ==
    position % page), one `req_to_token` row per request, prefix pages shared like a radix hit.

    With `window_rows`, also SGLang's hybrid sliding-window pool: each new token takes a free
    SWA slot (handed out in a scrambled order), `full_to_swa` maps full slots to them (0 = none)
    and `evict_window` frees the SWA slots of positions a request no longer reads. With
    `pool_dtype` too, the state lives in buffers shaped like the K buffers SGLang allocates
    from the geometry `launch_hooks` gives it ([slots, 1, ceil(row bytes / element size)])."""

    def __init__(
        self,
        cfg,
        rows: int = 1024,
        req_rows: int = 8,
        page: int = 2,
        window_rows: int | None = None,
        pool_dtype: torch.dtype | None = None,
    ):
        self.page, self.next_free = page, page  # page 0 is SGLang's padding page
        self.req_to_token = torch.zeros(req_rows, rows, dtype=torch.int64)
        self.length = [0] * req_rows
        self.full_to_swa = None
        if window_rows is not None:
            self.full_to_swa = torch.zeros(rows, dtype=torch.int64)
            self.free_swa = (
                torch.randperm(window_rows - 1, generator=torch.Generator().manual_seed(0)) + 1
            ).tolist()
        self.store = SlotState(
            cfg,
            rows,
            req_rows,
            torch.float64,
            window_rows=window_rows,
            window_slots=None if window_rows is None else self.full_to_swa.__getitem__,
            pool=None if pool_dtype is None else sglang_shaped_pool(cfg, rows, window_rows, pool_dtype),
        )

    def evict_window(self, row: int, keep_from: int) -> None:
        """Free the SWA slots of request `row`'s positions before `keep_from`."""
        full = self.req_to_token[row, :keep_from]
        live = full[self.full_to_swa[full] > 0]
        self.free_swa += self.full_to_swa[live].tolist()
        self.full_to_swa[live] = 0

    def share(self, row: int, source: int, n: int) -> None:
        """Request `row` starts with the first n (page-aligned) slots of request `source`."""
        assert n % self.page == 0
        self.req_to_token[row, :n] = self.req_to_token[source, :n]
        self.length[row] = n

    def extend(self, row: int, n: int) -> Span:
        start = self.length[row]
        for pos in range(start, start + n):
            if pos % self.page == 0:
                self.next_free += self.page
                base = self.next_free - self.page
            else:
                base = int(self.req_to_token[row, pos - 1]) - (pos - 1) % self.page
            self.req_to_token[row, pos] = base + pos % self.page
            if self.full_to_swa is not None:
                self.full_to_swa[self.req_to_token[row, pos]] = self.free_swa.pop()
        self.length[row] = start + n
        return Span(row, start, n, 0, self.req_to_token[row, : start + n].clone())


def run(backend, slots: Slots, parts: list[tuple[int, list[int]]]) -> torch.Tensor:
    """One forward of (row, new ids) parts -> logits [B, vocab]."""
    spans, ids, offset = [], [], 0
    for row, new in parts:
        span = slots.extend(row, len(new))
        spans.append(Span(span.row, span.start, span.length, offset, span.slots))
        ids += new
        offset += len(new)
    positions = torch.cat([torch.arange(s.start, s.end) for s in spans])
    out_loc = torch.cat([s.new_slots for s in spans])
    return backend.next_token_logits(torch.tensor(ids), positions, out_loc, spans, slots.store)


def sglang_shaped_pool(cfg, rows: int, window_rows: int, dtype: torch.dtype) -> PoolViews:
    """K buffers as SGLang's hybrid pool allocates them for V41 (`launch_hooks`' geometry), seen
    as the model sees them."""
    full_dim, window_dim = slot_row_geometry(cfg, torch.empty((), dtype=dtype).element_size())
    windows = {
        layer: torch.zeros(window_rows, 1, window_dim, dtype=dtype)
        for layer in range(1, cfg.num_hidden_layers)
    }
    return PoolViews.of_k_buffers(torch.zeros(rows, 1, full_dim, dtype=dtype), windows)
