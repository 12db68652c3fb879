"""Torch versions of the `sgl_kernel` CPU ops that SGLang's CPU engine calls unconditionally.

SGLang 0.5.23 with `SGLANG_USE_CPU_ENGINE=1` imports two ops from the CPU build of sgl-kernel
at module level (`srt/mem_cache/allocation.py`, `kernels/ops/kvcache/cache_move.py`); that
build is not on PyPI. Every other CPU op sits behind `cpu_has_amx_support()`, which is false
without it, so SGLang falls back to torch there by itself.
"""

from __future__ import annotations

import ctypes

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of `req_to_token`.

    Request i gets `out_cache_loc[sum(len[:i]) : sum(len[:i+1])]` at columns
    `start_offset[i]:end_offset[i]` of row `req_pool_indices[i]`, len = end - start.
    """
    del pool_len  # the row width; slicing checks bounds already
    taken = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        n = end - start
        if n > 0:
            req_to_token[row, start:end] = out_cache_loc[taken : taken + n].to(req_to_token.dtype)
            taken += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """Copy KV rows `src_loc` to `tgt_loc` in every layer buffer.

    The kernel's interface is raw: one base address and one row size in bytes per buffer.
    All sources are gathered before any target is written, so overlapping sets are safe.
    """
    if tgt_loc.numel() == 0:
        return
    src = src_loc.to(torch.long)
    tgt = tgt_loc.to(torch.long)
    rows = int(torch.maximum(src.max(), tgt.max())) + 1
    for base, row_bytes in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (rows * row_bytes)).from_address(base)
        view = torch.frombuffer(raw, dtype=torch.uint8).view(rows, row_bytes)
        view[tgt] = view[src]
