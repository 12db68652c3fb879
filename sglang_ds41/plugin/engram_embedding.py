"""Upstream SGLang's `EngramEmbedding`, able to store and gather MXFP4 tables.

Registered by `plugin.register` as a REPLACE hook on
`sglang.srt.layers.engram.EngramEmbedding`, so upstream's `Engram` layer builds this class.
Per layer the format comes from the checkpoint's config (`checkpoint_formats`):

* FP8 layers are upstream's class unchanged; only the loader checks each tensor first.
* MXFP4 layers keep upstream's two-array layout (`weight` uint8 `[rows, dim/2]`, `scale` E8M0
  `[rows, dim/32]`) in every storage mode upstream has: device-resident row shards, host
  tables (`SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE`, per-rank or shared, mmap +
  cudaHostRegister at the exact size through upstream's `_HostTable`), and scheduler staging
  (`EngramRowStager` copies raw bytes of both arrays; only `dequant_staged` decodes). What is
  overridden is only what touches the bytes: allocation, host-table init, the owned-rows
  gather, the shared-host branch of `forward` and `dequant_staged`. Peer shards
  (`SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS`, FP8 views of VMM memory) are refused with a message.

Importing this module checks the upstream surface first (`plugin.upstream.check`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.environ import envs
from sglang.srt.layers import engram as upstream
from sglang.srt.runtime_context import get_model, get_parallel
from sglang.srt.utils import is_cuda
from torch import nn

from sglang_ds41.engram.gather import SCALE_BLOCK, Quant
from sglang_ds41.engram.split_gather import mxfp4_gather, mxfp4_rows
from sglang_ds41.errors import Ds41Error
from sglang_ds41.plugin import upstream as upstream_surface
from sglang_ds41.plugin.checkpoint_formats import engram_formats

upstream_surface.check()

TARGET = upstream_surface.EMBEDDING


class EngramFormatError(Ds41Error):
    """A table tensor does not have the dtype / shape its declared format needs."""


@dataclass(frozen=True)
class _Storage:
    """The two arrays of one format: dtypes accepted from a checkpoint and the widths."""

    weight_dtypes: tuple[torch.dtype, ...]
    weight_width_divisor: int  # dim / this = bytes per row of values


_STORAGE = {
    Quant.FP8: _Storage((torch.float8_e4m3fn,), 1),
    # the third-party MXFP4 release writes int8 codes; same bytes as uint8
    Quant.MXFP4: _Storage((torch.uint8, torch.int8), 2),
}
_SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8)  # E8M0 bits; some writers store plain bytes


def layer_format(layer_id: int) -> Quant:
    """The table format of Engram layer `layer_id` in the checkpoint this process serves."""
    model = get_model()
    formats = engram_formats(str(model.model_path), getattr(model, "revision", None))
    if layer_id not in formats:
        raise Ds41Error(f"layer {layer_id} is not an Engram layer of {model.model_path} ({sorted(formats)})")
    return formats[layer_id]


class Ds41EngramEmbedding(upstream.EngramEmbedding):
    """One layer's Engram table in the checkpoint's format (FP8: upstream's; MXFP4: ours)."""

    def __init__(self, num_embeddings: int, dim: int, layer_id: int, column_bounds: tuple[int, ...]):
        # set before either init: upstream's __init__ calls the (overridden) _init_host_table
        self.table_format = layer_format(layer_id)
        self.layer_id = layer_id
        self.num_embeddings = num_embeddings
        if self.table_format is Quant.FP8:
            super().__init__(num_embeddings, dim, layer_id, column_bounds)
        else:
            self._init_4bit(num_embeddings, dim, layer_id, column_bounds)

    def _init_4bit(
        self, num_embeddings: int, dim: int, layer_id: int, column_bounds: tuple[int, ...]
    ) -> None:
        # upstream's __init__ minus its FP8 allocation (a full-size FP8 shard would be
        # allocated just to be replaced): the same attributes, in 4-bit storage.
        # nn.Module.__init__ keeps the plain attributes set before it.
        nn.Module.__init__(self)
        if dim % SCALE_BLOCK:
            raise EngramFormatError(f"Engram head dim {dim} is not a multiple of {SCALE_BLOCK}")
        self.dim = dim
        self.tp_size = get_parallel().tp_size
        tp_rank = get_parallel().tp_rank
        self.row_start, row_end = upstream.shard_range(num_embeddings, column_bounds, tp_rank, self.tp_size)
        self.rows = row_end - self.row_start
        self.host_table = None
        self._sort_host_reads = False
        self.staged_by_scheduler = False
        self.peer = None
        if envs.SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS.get() and self.tp_size > 1 and is_cuda():
            raise EngramFormatError(
                f"layer {layer_id}: SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS maps FP8 Engram shards only, and "
                "this checkpoint's table is MXFP4. Unset it: the MXFP4 table is then row-sharded in "
                "device memory, or in host memory with SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1"
            )
        if envs.SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE.get():
            self._init_host_table(num_embeddings, dim, layer_id)
        else:
            self.weight = nn.Parameter(
                torch.empty(self.rows, dim // 2, dtype=torch.uint8), requires_grad=False
            )
            self.scale = nn.Parameter(
                torch.empty(self.rows, dim // SCALE_BLOCK, dtype=torch.float8_e8m0fnu), requires_grad=False
            )
        self.weight.weight_loader = self._load_rows
        self.scale.weight_loader = self._load_rows

    # ---- storage ------------------------------------------------------------------------

    def _init_host_table(self, num_embeddings: int, dim: int, layer_id: int) -> None:
        if self.table_format is Quant.FP8:
            return super()._init_host_table(num_embeddings, dim, layer_id)
        layout = envs.SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT.get()
        n = num_embeddings if layout == "shared" else self.rows
        w_bytes, s_bytes = n * dim // 2, n * (dim // SCALE_BLOCK)
        self.host_table = upstream._HostTable(
            layout, max(1, w_bytes + s_bytes), f"sglang_engram_{layer_id}", get_parallel().tp_group
        )
        raw = self.host_table.bytes[: w_bytes + s_bytes]
        self.weight = nn.Parameter(raw[:w_bytes].view(n, dim // 2), requires_grad=False)
        self.scale = nn.Parameter(
            raw[w_bytes:].view(torch.float8_e8m0fnu).view(n, dim // SCALE_BLOCK), requires_grad=False
        )
        device_ptr = self.host_table.device_ptr
        self._host_table_ptrs = (device_ptr, device_ptr + w_bytes)
        self._sort_host_reads = upstream._sorted_host_reads(torch.cuda.current_device())

    def _load_rows(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Check the checkpoint tensor against the declared format, then upstream's row copy."""
        is_weight = param is self.weight
        name = f"layers.{self.layer_id}.engram.embed.{'weight' if is_weight else 'scale'}"
        fmt = self.table_format
        dtypes = _STORAGE[fmt].weight_dtypes if is_weight else _SCALE_DTYPES
        width = self.dim // (_STORAGE[fmt].weight_width_divisor if is_weight else SCALE_BLOCK)
        shape = (self.num_embeddings, width)
        if loaded_weight.dtype not in dtypes or tuple(loaded_weight.shape) != shape:
            spelled = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise EngramFormatError(
                f"{name}: the checkpoint's config declares {fmt.value.upper()} Engram tables for layer "
                f"{self.layer_id} (quantization_config.engram_embed_quant / engram_embed_layers), which "
                f"need {spelled} {list(shape)}; found {str(loaded_weight.dtype).removeprefix('torch.')} "
                f"{list(loaded_weight.shape)}"
            )
        if loaded_weight.dtype != param.dtype:  # int8 codes / uint8 scales: the same bytes
            loaded_weight = loaded_weight.view(param.dtype)
        super()._load_rows(param, loaded_weight)

    # ---- lookup -------------------------------------------------------------------------

    def _owned_rows(self, indices: torch.Tensor) -> torch.Tensor:
        if self.table_format is Quant.FP8:
            return super()._owned_rows(indices)
        if self.rows == 0:
            return self.new_rows(indices).zero_()
        if self.host_table is None and not upstream._cuda_kernels(indices):
            local = indices - self.row_start
            owned = (local >= 0) & (local < self.rows)
            return mxfp4_rows(self.weight, self.scale, local, owned)
        out = self.new_rows(indices)
        mxfp4_gather(
            *self._table_ptrs(),
            indices.reshape(-1),
            out.view(-1, self.dim),
            self.dim,
            row_lo=self.row_start,
            row_hi=self.row_start + self.rows,
            sort_ids=self._sort_host_reads,
        )
        return out

    def forward(
        self,
        indices: torch.Tensor,
        forward_batch=None,
        *,
        cp_all_tokens: bool = False,
    ) -> torch.Tensor:
        if self.table_format is Quant.FP8 or not self._shared:
            return super().forward(indices, forward_batch, cp_all_tokens=cp_all_tokens)
        # the shared host layout maps every row here: one gather, no collective
        out = self.new_rows(indices)
        if indices.shape[0]:
            mxfp4_gather(
                *self._table_ptrs(), indices.reshape(-1), out.view(-1, self.dim), self.dim,
                sort_ids=self._sort_host_reads,
            )  # fmt: skip
        return out

    def dequant_staged(
        self, rows: torch.Tensor, scales: torch.Tensor, copied: torch.cuda.Event, hash_shape: torch.Size
    ) -> torch.Tensor:
        if self.table_format is Quant.FP8:
            return super().dequant_staged(rows, scales, copied, hash_shape)
        stream = torch.cuda.current_stream()
        stream.wait_event(copied)
        rows.record_stream(stream)
        scales.record_stream(stream)
        out = torch.empty(*hash_shape, self.dim, dtype=torch.bfloat16, device=rows.device)
        flat = out.view(-1, self.dim)
        if rows.shape[0] > flat.shape[0]:
            raise EngramFormatError(f"staged {rows.shape[0]} rows for an output of {flat.shape[0]}")
        # rows past the staged ones (prefill graph padding) read as zero: row_hi bounds them
        mxfp4_gather(
            rows.data_ptr(), scales.data_ptr(),
            torch.arange(flat.shape[0], dtype=torch.int32, device=rows.device), flat, self.dim,
            row_hi=rows.shape[0],
        )  # fmt: skip
        return out
