"""Engram table memory per tensor-parallel rank (MODEL.md §8.4, §9.2).

Each table is row-sharded so exactly one rank owns each row (lookup = zero-fill + all-reduce).
When the number of hash columns (24) is a multiple of the TP size, the split follows column
boundaries (rank r owns columns `[r*k, (r+1)*k)`, k = 24 / tp), so a hash id's owner is
known from its column alone; otherwise rank r owns rows `[rows*r // tp, rows*(r+1) // tp)`.
That is SGLang 0.5.23's own rule (`layers/engram.py::shard_range`; tested against it).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sglang_ds41.engram.layout import HEAD_DIM, EngramLayerLayout, EngramLayout
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats.engram import ENGRAM_FORMATS, engram_format

GIB = 1 << 30


@dataclass(frozen=True)
class RowFormat:
    """Bytes of one stored table row (256 values) in a storage format (`formats.engram`)."""

    name: str
    bytes_per_row: int
    bytes_per_table: int  # per-table constants replicated on every rank (NVFP4 global scale)
    layout: str


FORMATS: dict[str, RowFormat] = {
    f.name: RowFormat(f.name, f.bytes_per_row(HEAD_DIM), f.bytes_per_table, f.layout(HEAD_DIM))
    for f in ENGRAM_FORMATS.values()
}


def format_named(name: str) -> RowFormat:
    return FORMATS[engram_format(name).name]


def shard_ranges(layer: EngramLayerLayout, tp: int) -> list[tuple[int, int]]:
    """`[start, end)` row range owned by each of the `tp` ranks."""
    if tp < 1:
        raise Ds41Error(f"tensor-parallel size must be >= 1, got {tp}")
    starts = layer.column_starts()
    if layer.n_columns % tp == 0:
        per_rank = layer.n_columns // tp
        return [(starts[r * per_rank], starts[(r + 1) * per_rank]) for r in range(tp)]
    bounds = [layer.num_rows * r // tp for r in range(tp + 1)]  # as `table.shard_boundaries` stores them
    return list(itertools.pairwise(bounds))


def on_column_boundaries(layer: EngramLayerLayout, tp: int) -> bool:
    return layer.n_columns % tp == 0


@dataclass(frozen=True)
class TablePlan:
    layer_id: int
    rows: int
    n_columns: int
    column_split: bool
    rows_per_rank: tuple[int, ...]


@dataclass(frozen=True)
class EngramPlan:
    """Rows per table and per rank; bytes follow from a `RowFormat`."""

    tp: int
    nnodes: int
    tables: tuple[TablePlan, ...]

    @property
    def rows_total(self) -> int:
        return sum(t.rows for t in self.tables)

    def rows_on_rank(self, rank: int) -> int:
        return sum(t.rows_per_rank[rank] for t in self.tables)

    def table_bytes_on_rank(self, table: TablePlan, rank: int, fmt: RowFormat) -> int:
        return table.rows_per_rank[rank] * fmt.bytes_per_row + fmt.bytes_per_table

    def bytes_on_rank(self, rank: int, fmt: RowFormat) -> int:
        return sum(self.table_bytes_on_rank(t, rank, fmt) for t in self.tables)

    def max_table_bytes_per_rank(self, table: TablePlan, fmt: RowFormat) -> int:
        return max(self.table_bytes_on_rank(table, r, fmt) for r in range(self.tp))

    def max_bytes_per_rank(self, fmt: RowFormat) -> int:
        return max(self.bytes_on_rank(r, fmt) for r in range(self.tp))

    def ranks_of_node(self, node: int) -> range:
        per_node = self.tp // self.nnodes
        return range(node * per_node, (node + 1) * per_node)

    def host_bytes_per_node(self, fmt: RowFormat) -> int:
        """Host memory for the shards of one node's ranks (tables kept in host memory), the
        largest over nodes; also what a node must stage while loading its shards."""
        return max(sum(self.bytes_on_rank(r, fmt) for r in self.ranks_of_node(n)) for n in range(self.nnodes))

    def total_bytes(self, fmt: RowFormat) -> int:
        return sum(t.rows * fmt.bytes_per_row + fmt.bytes_per_table for t in self.tables)


def plan(layout: EngramLayout, tp: int, nnodes: int = 1) -> EngramPlan:
    if tp < 1:
        raise Ds41Error(f"tensor-parallel size must be >= 1, got {tp}")
    if nnodes < 1 or tp % nnodes != 0:
        raise Ds41Error(f"--nnodes {nnodes} must be >= 1 and divide the tensor-parallel size {tp}")
    tables = tuple(
        TablePlan(
            layer_id=layer.layer_id,
            rows=layer.num_rows,
            n_columns=layer.n_columns,
            column_split=on_column_boundaries(layer, tp),
            rows_per_rank=tuple(end - start for start, end in shard_ranges(layer, tp)),
        )
        for layer in layout.layers
    )
    return EngramPlan(tp=tp, nnodes=nnodes, tables=tables)


@dataclass(frozen=True)
class Placement:
    """Where one rank's Engram shards go on a GPU of `hbm_bytes`, next to its other weights.

    `kv_bytes_if_hbm` is what is left for the KV cache and activations with the tables in HBM,
    after `reserve_bytes` (CUDA graphs, activations, the runtime); negative means they do not
    fit and the tables belong in host memory (SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE)."""

    fmt: RowFormat
    engram_bytes: int
    other_bytes: int
    hbm_bytes: int
    reserve_bytes: int

    @property
    def kv_bytes_if_hbm(self) -> int:
        return self.hbm_bytes - self.reserve_bytes - self.other_bytes - self.engram_bytes

    @property
    def kv_bytes_if_host(self) -> int:
        return self.hbm_bytes - self.reserve_bytes - self.other_bytes

    @property
    def where(self) -> str:
        if self.kv_bytes_if_host < 0:
            return "does not fit"  # not even the other weights: more ranks
        return "hbm" if self.kv_bytes_if_hbm > 0 else "host"


def placements(
    the_plan: EngramPlan, formats: list[RowFormat], other_bytes: int, hbm_bytes: int, reserve_bytes: int
) -> list[Placement]:
    """The largest rank's placement for each format; `other_bytes` = one rank's non-Engram weights."""
    return [
        Placement(fmt, the_plan.max_bytes_per_rank(fmt), other_bytes, hbm_bytes, reserve_bytes)
        for fmt in formats
    ]


def shared_host_bytes_per_node(the_plan: EngramPlan, fmt: RowFormat) -> int:
    """Host memory per node with upstream's `shared` host-table layout: one whole copy of every
    table per node, mapped by all its ranks (the `per_rank` layout needs `host_bytes_per_node`)."""
    return the_plan.total_bytes(fmt)
