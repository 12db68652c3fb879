"""Upstream SGLang's `EngramEmbedding`, able to store and gather MXFP4 and NVFP4 tables.

Registered by `plugin.register` as a REPLACE hook on
`sglang.srt.layers.engram.EngramEmbedding`, so upstream's `Engram` layer builds this class.
Per layer the format comes from the checkpoint's config (`checkpoint_formats`):

* FP8 layers are upstream's class unchanged; only the loader checks each tensor first.
* MXFP4 and NVFP4 layers keep upstream's two-array layout (`weight` uint8 `[rows, dim/2]`
  E2M1 codes, then the block scales: `scale` E8M0 `[rows, dim/32]` for MXFP4,
  `weight_scale` E4M3 `[rows, dim/16]` plus the table's float32 `weight_scale_2` for NVFP4,
  ModelOpt's names as the checkpoint spells them) in every storage mode upstream has:
  device-resident row shards, host tables (`SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE`, per-rank or
  shared, mmap + cudaHostRegister at the exact size through upstream's `_HostTable`), and
  scheduler staging (`EngramRowStager` copies raw bytes of `weight` and `scale`; only
  `dequant_staged` decodes). Overridden is only what touches the bytes: allocation, host-table
  init, the loader, the owned-rows gather, the shared-host branch of `forward` and
  `dequant_staged`. Peer shards (`SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS`, FP8 views of VMM memory)
  are refused with a message.

Importing this module checks the upstream surface first (`plugin.upstream.check`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from sglang.srt.environ import envs
from sglang.srt.layers import engram as upstream
from sglang.srt.runtime_context import get_model, get_parallel
from sglang.srt.utils import is_cuda
from torch import nn

from sglang_ds41.engram.gather import Quant
from sglang_ds41.engram.split_gather import mxfp4_gather, mxfp4_rows, nvfp4_gather, nvfp4_rows
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats import sizes
from sglang_ds41.plugin import upstream as upstream_surface
from sglang_ds41.plugin.checkpoint_formats import engram_formats, stored_table_tensors

upstream_surface.check()

TARGET = upstream_surface.EMBEDDING


class EngramFormatError(Ds41Error):
    """A table tensor does not have the dtype / shape its declared format needs."""


@dataclass(frozen=True)
class _Storage:
    """One format's two row arrays: the dtypes a checkpoint may store (their widths per row are
    `formats.sizes.value_bytes` / `scale_bytes`)."""

    weight_dtypes: tuple[torch.dtype, ...]
    scale_name: str  # the checkpoint's (and the parameter's) name of the block scales
    scale_dtype: torch.dtype  # as allocated
    scale_dtypes: tuple[torch.dtype, ...]  # as a checkpoint may store them (same bytes)


# 4-bit codes: the official layout says uint8, the third-party MXFP4 release writes int8 (same bytes)
_CODES = (torch.uint8, torch.int8)
_E8M0 = (torch.float8_e8m0fnu, torch.uint8)  # E8M0 bits; some writers store plain bytes
_STORAGE = {
    Quant.FP8: _Storage((torch.float8_e4m3fn,), "scale", torch.float8_e8m0fnu, _E8M0),
    Quant.MXFP4: _Storage(_CODES, "scale", torch.float8_e8m0fnu, _E8M0),
    Quant.NVFP4: _Storage(_CODES, "weight_scale", torch.float8_e4m3fn, (torch.float8_e4m3fn,)),
}  # fmt: skip
GLOBAL_SCALE = "weight_scale_2"  # NVFP4's float32 per table
_ST_NAMES = {
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e8m0fnu: "F8_E8M0", torch.uint8: "U8", torch.int8: "I8",
}  # fmt: skip


def layer_format(layer_id: int) -> Quant:
    """The table format of Engram layer `layer_id` in the checkpoint this process serves."""
    model = get_model()
    formats = engram_formats(str(model.model_path), getattr(model, "revision", None))
    if layer_id not in formats:
        raise Ds41Error(f"layer {layer_id} is not an Engram layer of {model.model_path} ({sorted(formats)})")
    return formats[layer_id]


def _spelled(dtypes: tuple[torch.dtype, ...]) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in dtypes)


class Ds41EngramEmbedding(upstream.EngramEmbedding):
    """One layer's Engram table in the checkpoint's format (FP8: upstream's; 4-bit: ours)."""

    def __init__(self, num_embeddings: int, dim: int, layer_id: int, column_bounds: tuple[int, ...]):
        # set before either init: upstream's __init__ calls the (overridden) _init_host_table.
        # nn.Module.__init__ keeps plain attributes set before it.
        self.table_format = layer_format(layer_id)
        self.layer_id = layer_id
        self.num_embeddings = num_embeddings
        self.global_scale = math.nan  # NVFP4: read by the loader from `weight_scale_2`
        self._check_stored(num_embeddings, dim)
        if self.table_format is Quant.FP8:
            super().__init__(num_embeddings, dim, layer_id, column_bounds)
        else:
            self._init_4bit(num_embeddings, dim, layer_id, column_bounds)

    def _value_bytes(self, dim: int) -> int:
        """Bytes per row of the weight: `dim` E4M3 values (FP8) or `dim / 2` E2M1 pairs."""
        return sizes.value_bytes(self.table_format.value, dim)

    def _scale_bytes(self, dim: int) -> int:
        """Bytes per row of the block scales: `dim / 32` (FP8, MXFP4) or `dim / 16` (NVFP4)."""
        return sizes.scale_bytes(self.table_format.value, dim)

    def expected_tensors(self, num_embeddings: int, dim: int) -> dict[str, tuple[tuple[str, ...], tuple]]:
        """Table part -> (accepted safetensors dtypes, shape) that the declared format needs."""
        storage = _STORAGE[self.table_format]
        weight_shape = (num_embeddings, self._value_bytes(dim))
        scale_shape = (num_embeddings, self._scale_bytes(dim))
        expected = {
            "weight": (tuple(_ST_NAMES[d] for d in storage.weight_dtypes), weight_shape),
            storage.scale_name: (tuple(_ST_NAMES[d] for d in storage.scale_dtypes), scale_shape),
        }
        if self.table_format is Quant.NVFP4:
            expected[GLOBAL_SCALE] = (("F32",), ())
        return expected

    def _check_stored(self, num_embeddings: int, dim: int) -> None:
        """Before anything is allocated: the checkpoint's table tensors (headers) are the ones the
        declared format needs, named as it names them; else one error listing every difference."""
        stored = stored_table_tensors(str(get_model().model_path))
        if not stored:
            return
        prefix = f"layers.{self.layer_id}.engram.embed."
        have = {n.removeprefix(prefix): v for n, v in stored.items() if n.startswith(prefix)}
        problems = []
        for part, (dtypes, shape) in self.expected_tensors(num_embeddings, dim).items():
            wanted = f"{' or '.join(dtypes)} {list(shape)}"
            if part not in have:
                problems.append(f"{prefix}{part}: missing (expected {wanted})")
                continue
            dtype, got = have.pop(part)
            ok_shape = got == shape or (part == GLOBAL_SCALE and got == (1,))
            if dtype not in dtypes or not ok_shape:
                problems.append(f"{prefix}{part}: expected {wanted}, found {dtype} {list(got)}")
        fmt = self.table_format.value.upper()
        problems += [f"{prefix}{part}: not a tensor of {fmt} tables" for part in sorted(have)]
        if problems:
            raise EngramFormatError(
                f"the checkpoint's config declares {fmt} Engram tables for layer {self.layer_id} "
                "(quantization_config.engram_embed_quant / engram_embed_layers), but its tensors "
                "differ:\n  " + "\n  ".join(problems)
            )

    def _init_4bit(
        self, num_embeddings: int, dim: int, layer_id: int, column_bounds: tuple[int, ...]
    ) -> None:
        # upstream's __init__ minus its FP8 allocation (a full-size FP8 shard would be allocated
        # just to be replaced): the same attributes, in 4-bit storage
        nn.Module.__init__(self)
        storage, block = _STORAGE[self.table_format], sizes.scale_block(self.table_format.value)
        if dim % block:
            raise EngramFormatError(f"Engram head dim {dim} is not a multiple of {block}")
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
                f"this checkpoint's table is {self.table_format.value.upper()}. Unset it: the table is then "
                "row-sharded in device memory, or in host memory with SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1"
            )
        if envs.SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE.get():
            self._init_host_table(num_embeddings, dim, layer_id)
        else:
            weight = torch.empty(self.rows, self._value_bytes(dim), dtype=torch.uint8)
            scale = torch.empty(self.rows, self._scale_bytes(dim), dtype=storage.scale_dtype)
            self._set_arrays(weight, scale)
        if self.table_format is Quant.NVFP4:
            setattr(self, GLOBAL_SCALE, nn.Parameter(torch.full((), math.nan), requires_grad=False))
            getattr(self, GLOBAL_SCALE).weight_loader = self._load_global_scale

    def _set_arrays(self, weight: torch.Tensor, scale: torch.Tensor) -> None:
        name = _STORAGE[self.table_format].scale_name
        self.weight = nn.Parameter(weight, requires_grad=False)
        setattr(self, name, nn.Parameter(scale, requires_grad=False))
        if name != "scale":
            # upstream's pointers and scheduler stager read `.scale`: the same parameter, unregistered
            # (it is registered once, under the checkpoint's name)
            object.__setattr__(self, "scale", getattr(self, name))
        self.weight.weight_loader = self._load_rows
        self.scale.weight_loader = self._load_rows

    # ---- storage ------------------------------------------------------------------------

    def _init_host_table(self, num_embeddings: int, dim: int, layer_id: int) -> None:
        if self.table_format is Quant.FP8:
            return super()._init_host_table(num_embeddings, dim, layer_id)
        storage = _STORAGE[self.table_format]
        layout = envs.SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT.get()
        n = num_embeddings if layout == "shared" else self.rows
        w_bytes, s_bytes = n * self._value_bytes(dim), n * self._scale_bytes(dim)
        self.host_table = upstream._HostTable(
            layout, max(1, w_bytes + s_bytes), f"sglang_engram_{layer_id}", get_parallel().tp_group
        )
        raw = self.host_table.bytes[: w_bytes + s_bytes]
        self._set_arrays(
            raw[:w_bytes].view(n, self._value_bytes(dim)),
            raw[w_bytes:].view(storage.scale_dtype).view(n, self._scale_bytes(dim)),
        )
        device_ptr = self.host_table.device_ptr
        self._host_table_ptrs = (device_ptr, device_ptr + w_bytes)
        self._sort_host_reads = upstream._sorted_host_reads(torch.cuda.current_device())

    def _load_rows(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Check the checkpoint tensor against the declared format, then upstream's row copy."""
        storage = _STORAGE[self.table_format]
        is_weight = param is self.weight
        part = "weight" if is_weight else storage.scale_name
        dtypes = storage.weight_dtypes if is_weight else storage.scale_dtypes
        width = self._value_bytes(self.dim) if is_weight else self._scale_bytes(self.dim)
        shape = (self.num_embeddings, width)
        if loaded_weight.dtype not in dtypes or tuple(loaded_weight.shape) != shape:
            self._mismatch(part, f"{_spelled(dtypes)} {list(shape)}", loaded_weight)
        if loaded_weight.dtype != param.dtype:  # int8 codes / uint8 scales: the same bytes
            loaded_weight = loaded_weight.view(param.dtype)
        super()._load_rows(param, loaded_weight)

    def _load_global_scale(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """NVFP4's `weight_scale_2`: one finite float32 >= 0, stored 0-d or as [1]; every rank keeps it."""
        value = float(loaded_weight.reshape(())) if loaded_weight.numel() == 1 else math.nan
        if (
            loaded_weight.dtype != torch.float32
            or loaded_weight.dim() > 1
            or not (value >= 0 and math.isfinite(value))
        ):
            self._mismatch(GLOBAL_SCALE, "a finite float32 >= 0, shape [] or [1]", loaded_weight)
        param.data.copy_(loaded_weight.reshape(()))
        self.global_scale = value

    def _mismatch(self, part: str, expected: str, found: torch.Tensor) -> None:
        fmt = self.table_format.value.upper()
        shown = f"{str(found.dtype).removeprefix('torch.')} {list(found.shape)}"
        if found.numel() == 1:
            shown += f" = {float(found.reshape(()).float())}"
        raise EngramFormatError(
            f"layers.{self.layer_id}.engram.embed.{part}: the checkpoint's config declares {fmt} Engram "
            f"tables for layer {self.layer_id} (quantization_config.engram_embed_quant / "
            f"engram_embed_layers), which need {expected}; found {shown}"
        )

    # ---- lookup -------------------------------------------------------------------------

    def _gather(self, ptrs: tuple[int, int], ids: torch.Tensor, out: torch.Tensor, **bounds) -> None:
        """The 4-bit kernel of this table's format over raw pointers (device, host or staged rows)."""
        if self.table_format is Quant.NVFP4:
            nvfp4_gather(*ptrs, ids, out, self.dim, self.global_scale, **bounds)
        else:
            mxfp4_gather(*ptrs, ids, out, self.dim, **bounds)

    def _owned_rows(self, indices: torch.Tensor) -> torch.Tensor:
        if self.table_format is Quant.FP8:
            return super()._owned_rows(indices)
        if self.rows == 0:
            return self.new_rows(indices).zero_()
        if self.host_table is None and not upstream._cuda_kernels(indices):
            local = indices - self.row_start
            owned = (local >= 0) & (local < self.rows)
            if self.table_format is Quant.NVFP4:
                return nvfp4_rows(self.weight, self.scale, self.global_scale, local, owned)
            return mxfp4_rows(self.weight, self.scale, local, owned)
        out = self.new_rows(indices)
        self._gather(
            self._table_ptrs(), indices.reshape(-1), out.view(-1, self.dim),
            row_lo=self.row_start, row_hi=self.row_start + self.rows, sort_ids=self._sort_host_reads,
        )  # fmt: skip
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
            self._gather(
                self._table_ptrs(),
                indices.reshape(-1),
                out.view(-1, self.dim),
                sort_ids=self._sort_host_reads,
            )
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
        ids = torch.arange(flat.shape[0], dtype=torch.int32, device=rows.device)
        self._gather((rows.data_ptr(), scales.data_ptr()), ids, flat, row_hi=rows.shape[0])
        return out
