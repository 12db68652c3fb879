"""The Engram layer (MODEL.md §5.6), one type for the reference model and the SGLang backend.

    rows = reduce(table.lookup(row ids))   # this rank's table rows, summed over the TP ranks
    R'   = gate(R, rows)                   # `gate.EngramGate`

The table (`table.EngramTable`) is attached by the loader after construction (it is read from
the checkpoint, quantised, into host memory). `reduce` is the identity when the table is whole
(the reference, one rank) and the TP all-reduce when each rank holds a row shard: exact, since
every row has one owner and the other ranks contribute zeros. Parameter names are the gate's
(`layers.L.engram.wkv.weight`, `.q_weight`, `.k_weight`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang_ds41.config import TextConfig
from sglang_ds41.errors import Ds41Error

from .gate import EngramGate
from .table import EngramTable


def whole_table(rows: torch.Tensor) -> torch.Tensor:
    """The reduce of a table held whole: its rows as they are."""
    return rows


class EngramLayer(EngramGate):
    def __init__(
        self,
        cfg: TextConfig,
        layer: int,
        reduce: Callable[[torch.Tensor], torch.Tensor] = whole_table,
        dtype: torch.dtype = torch.float32,
        apply_gate: Callable[..., torch.Tensor] | None = None,
    ):
        """`apply_gate`: steps 2-7 in another form of the same math (default `apply_engram`)."""
        t = cfg
        n_columns = (t.engram_max_ngram_size - 1) * t.engram_n_heads
        super().__init__(t.hidden_size, t.hc_mult, n_columns, t.engram_head_dim, t.rms_norm_eps, dtype)
        self.layer, self.reduce = layer, reduce
        if apply_gate is not None:
            self.apply_gate = apply_gate
        self.table: EngramTable | None = None

    def forward(
        self, residual: torch.Tensor, row_ids: torch.Tensor, is_image: torch.Tensor | None = None
    ) -> torch.Tensor:
        """R [T, hc, D], row ids [T, n_columns] -> R [T, hc, D] (image rows unchanged)."""
        if self.table is None:
            raise Ds41Error(f"layer {self.layer}: Engram table not loaded")
        rows = self.reduce(self.table.lookup(row_ids))  # [T, n_columns, head_dim] bf16
        return super().forward(residual, rows, is_image)
