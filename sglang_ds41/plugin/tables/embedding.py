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

import torch
from sglang.srt.environ import envs
from sglang.srt.layers import engram as upstream
from sglang.srt.runtime_context import get_model, get_parallel
from sglang.srt.utils import is_cuda
from torch import nn

from sglang_ds41.engram.split_gather import mxfp4_gather, mxfp4_rows, nvfp4_gather, nvfp4_rows
from sglang_ds41.errors import Ds41Error
from sglang_ds41.formats.engram import FP8, NVFP4, EngramFormat, Part, accepts_shape
from sglang_ds41.plugin import upstream as upstream_surface
from sglang_ds41.plugin.tables.checkpoint_formats import engram_formats, stored_table_tensors

upstream_surface.check()

TARGET = upstream_surface.EMBEDDING
# upstream names its two arrays as the FP8 checkpoint does; its pointers and stager read this one
UPSTREAM_SCALE = FP8.scales.name


class EngramFormatError(Ds41Error):
    """A table tensor does not have the dtype / shape its declared format needs."""


def layer_format(layer_id: int) -> EngramFormat:
    """The table format of Engram layer `layer_id` in the checkpoint this process serves."""
    model = get_model()
    formats = engram_formats(str(model.model_path), getattr(model, "revision", None))
    if layer_id not in formats:
        raise Ds41Error(f"layer {layer_id} is not an Engram layer of {model.model_path} ({sorted(formats)})")
    return formats[layer_id]


def _spelled(part: Part) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in part.torch_dtypes())


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
        if self.table_format is FP8:
            super().__init__(num_embeddings, dim, layer_id, column_bounds)
        else:
            self._init_4bit(num_embeddings, dim, layer_id, column_bounds)

    def _value_bytes(self, dim: int) -> int:
        """Bytes per row of the weight: `dim` E4M3 values (FP8) or `dim / 2` E2M1 pairs."""
        return self.table_format.value_bytes(dim)

    def _scale_bytes(self, dim: int) -> int:
        """Bytes per row of the block scales: `dim / 32` (FP8, MXFP4) or `dim / 16` (NVFP4)."""
        return self.table_format.scale_bytes(dim)

    def expected_tensors(self, num_embeddings: int, dim: int) -> dict[str, tuple[tuple[str, ...], tuple]]:
        """Table part -> (accepted safetensors dtypes, shape) that the declared format needs."""
        return {
            part.name: (part.accepted, shape)
            for part, shape in self.table_format.shapes(num_embeddings, dim).items()
        }

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
            if dtype not in dtypes or not accepts_shape(shape, got):
                problems.append(f"{prefix}{part}: expected {wanted}, found {dtype} {list(got)}")
        fmt = self.table_format.name.upper()
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
        block = self.table_format.scale_block
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
                f"this checkpoint's table is {self.table_format.name.upper()}. Unset it: the table is then "
                "row-sharded in device memory, or in host memory with SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1"
            )
        if envs.SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE.get():
            self._init_host_table(num_embeddings, dim, layer_id)
        else:
            fmt = self.table_format
            weight = torch.empty(self.rows, self._value_bytes(dim), dtype=fmt.values.torch_dtype())
            scale = torch.empty(self.rows, self._scale_bytes(dim), dtype=fmt.scales.torch_dtype())
            self._set_arrays(weight, scale)
        global_scale = self.table_format.global_scale
        if global_scale is not None:
            setattr(self, global_scale.name, nn.Parameter(torch.full((), math.nan), requires_grad=False))
            getattr(self, global_scale.name).weight_loader = self._load_global_scale

    def _set_arrays(self, weight: torch.Tensor, scale: torch.Tensor) -> None:
        name = self.table_format.scales.name
        self.weight = nn.Parameter(weight, requires_grad=False)
        setattr(self, name, nn.Parameter(scale, requires_grad=False))
        if name != UPSTREAM_SCALE:
            # upstream's pointers and scheduler stager read `.scale`: the same parameter, unregistered
            # (it is registered once, under the checkpoint's name)
            object.__setattr__(self, UPSTREAM_SCALE, getattr(self, name))
        self.weight.weight_loader = self._load_rows
        self.scale.weight_loader = self._load_rows

    # ---- storage ------------------------------------------------------------------------

    def _init_host_table(self, num_embeddings: int, dim: int, layer_id: int) -> None:
        if self.table_format is FP8:
            return super()._init_host_table(num_embeddings, dim, layer_id)
        layout = envs.SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT.get()
        n = num_embeddings if layout == "shared" else self.rows
        w_bytes, s_bytes = n * self._value_bytes(dim), n * self._scale_bytes(dim)
        self.host_table = upstream._HostTable(
            layout, max(1, w_bytes + s_bytes), f"sglang_engram_{layer_id}", get_parallel().tp_group
        )
        raw = self.host_table.bytes[: w_bytes + s_bytes]
        self._set_arrays(
            raw[:w_bytes].view(n, self._value_bytes(dim)),
            raw[w_bytes:].view(self.table_format.scales.torch_dtype()).view(n, self._scale_bytes(dim)),
        )
        device_ptr = self.host_table.device_ptr
        self._host_table_ptrs = (device_ptr, device_ptr + w_bytes)
        self._sort_host_reads = upstream._sorted_host_reads(torch.cuda.current_device())

    def _load_rows(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Check the checkpoint tensor against the declared format, then upstream's row copy."""
        fmt = self.table_format
        part = fmt.values if param is self.weight else fmt.scales
        shape = fmt.shapes(self.num_embeddings, self.dim)[part]
        if loaded_weight.dtype not in part.torch_dtypes() or tuple(loaded_weight.shape) != shape:
            self._mismatch(part.name, f"{_spelled(part)} {list(shape)}", loaded_weight)
        if loaded_weight.dtype != param.dtype:  # int8 codes / uint8 scales: the same bytes
            loaded_weight = loaded_weight.view(param.dtype)
        super()._load_rows(param, loaded_weight)

    def _load_global_scale(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """NVFP4's `weight_scale_2`: one finite float32 >= 0, stored 0-d or as [1]; every rank keeps it."""
        part = NVFP4.global_scale
        value = float(loaded_weight.reshape(())) if loaded_weight.numel() == 1 else math.nan
        if (
            loaded_weight.dtype not in part.torch_dtypes()
            or loaded_weight.dim() > 1
            or not (value >= 0 and math.isfinite(value))
        ):
            self._mismatch(part.name, f"a finite {_spelled(part)} >= 0, shape [] or [1]", loaded_weight)
        param.data.copy_(loaded_weight.reshape(()))
        self.global_scale = value

    def _mismatch(self, part: str, expected: str, found: torch.Tensor) -> None:
        fmt = self.table_format.name.upper()
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
        if self.table_format is NVFP4:
            nvfp4_gather(*ptrs, ids, out, self.dim, self.global_scale, **bounds)
        else:
            mxfp4_gather(*ptrs, ids, out, self.dim, **bounds)

    def _owned_rows(self, indices: torch.Tensor) -> torch.Tensor:
        if self.table_format is FP8:
            return super()._owned_rows(indices)
        if self.rows == 0:
            return self.new_rows(indices).zero_()
        if self.host_table is None and not upstream._cuda_kernels(indices):
            local = indices - self.row_start
            owned = (local >= 0) & (local < self.rows)
            if self.table_format is NVFP4:
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
        if self.table_format is FP8 or not self._shared:
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
        if self.table_format is FP8:
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
