"""Tensor parallelism of the backend's dense weights, as MODEL.md §13 lays it out.

Sharded (each rank holds one contiguous slice of the checkpoint tensor):

* `embed.weight`, `head.weight`: vocabulary rows (vocab-parallel; lookups are masked to the
  rank's rows and all-reduced, logits are all-gathered);
* `attn.wq_b` rows and `attn.attn_sink` over heads, `attn.wo_a` rows over output groups (a
  group's rows stay together, with its heads), `attn.wo_b` columns over the same groups, so
  each rank's `wo_b` gives a partial sum (all-reduced);
* every routed and shared expert's `w1` / `w3` rows and `w2` columns over the intermediate
  width (the clamped SwiGLU is elementwise), the MoE output all-reduced once.

Everything else is replicated: `wq_a`, `wkv`, the norms, compressor, indexer (every rank scores
all index heads, so top-k needs no reduction), router, hyper-connections, Engram gate weights.
Engram tables are row-sharded by `engram.table` on their own.

Collectives go through SGLang's TP group inside a server, or through `torch.distributed`'s
default group when the model is built outside one (tests run two ranks over gloo).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from sglang_ds41.config import TextConfig
from sglang_ds41.errors import Ds41Error


class TensorParallelError(Ds41Error):
    """The checkpoint's shapes cannot be split over this many ranks."""


# checkpoint tensor name -> (what is split, dim of the split)
_RULES: list[tuple[re.Pattern[str], str, int]] = [
    (re.compile(r"^(embed|head)\.weight$"), "vocab", 0),
    (re.compile(r"^layers\.\d+\.attn\.wq_b\.weight$"), "heads", 0),
    (re.compile(r"^layers\.\d+\.attn\.attn_sink$"), "heads", 0),
    (re.compile(r"^layers\.\d+\.attn\.wo_a\.weight$"), "groups", 0),
    (re.compile(r"^layers\.\d+\.attn\.wo_b\.weight$"), "groups", 1),
    (re.compile(r"^layers\.\d+\.ffn\.(experts\.\d+|shared_experts)\.(w1|w3)\.weight$"), "inter", 0),
    (re.compile(r"^layers\.\d+\.ffn\.(experts\.\d+|shared_experts)\.w2\.weight$"), "inter", 1),
]


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    collectives: Literal["sglang", "torch"] = "torch"

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise TensorParallelError(f"TP rank {self.rank} is not in 0..{self.size - 1}")

    # ---- shapes ---------------------------------------------------------------------------

    def local_text_config(self, text: TextConfig) -> TextConfig:
        """The config a rank builds its sharded modules from: its heads, groups, expert width."""
        if self.size == 1:
            return text
        for field in ("vocab_size", "num_attention_heads", "o_groups", "moe_intermediate_size"):
            value = getattr(text, field)
            if value % self.size:
                raise TensorParallelError(
                    f"text_config.{field} = {value} is not divisible by --tp {self.size} "
                    "(MODEL.md §13 splits it evenly over the ranks)"
                )
        return dataclasses.replace(
            text,
            num_attention_heads=text.num_attention_heads // self.size,
            o_groups=text.o_groups // self.size,
            moe_intermediate_size=text.moe_intermediate_size // self.size,
        )

    def vocab_rows(self, vocab_size: int) -> tuple[int, int]:
        """This rank's [start, stop) of the vocabulary."""
        per = vocab_size // self.size
        return self.rank * per, (self.rank + 1) * per

    def shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of checkpoint tensor `name` (the tensor itself when replicated)."""
        if self.size == 1:
            return full
        for pattern, what, dim in _RULES:
            if pattern.match(name):
                if full.shape[dim] % self.size:
                    raise TensorParallelError(
                        f"tensor {name}: dim {dim} ({what}) has {full.shape[dim]} rows, "
                        f"not divisible by --tp {self.size}"
                    )
                return full.chunk(self.size, dim=dim)[self.rank].contiguous()
        return full

    # ---- collectives ----------------------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's `x` (returned; `x` may or may not be overwritten)."""
        if self.size == 1:
            return x
        if self.collectives == "sglang":
            from sglang.srt.distributed.communication_op import tensor_model_parallel_all_reduce

            return tensor_model_parallel_all_reduce(x)
        x = x.clone()
        dist.all_reduce(x)
        return x

    def sum_shards(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows looked up in row-sharded tables, summed over the ranks (exact: each row has one
        owner, the others add zeros), in float32 and back to the rows' dtype."""
        if self.size == 1:
            return rows
        return self.all_reduce(rows.float()).to(rows.dtype)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` concatenated along the last dim, in rank order."""
        if self.size == 1:
            return x
        if self.collectives == "sglang":
            from sglang.srt.distributed.communication_op import tensor_model_parallel_all_gather

            return tensor_model_parallel_all_gather(x, dim=-1)
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


SINGLE = TensorParallel()  # one rank: nothing sharded, no collectives


class VocabParallelEmbedding(torch.nn.Module):
    """The token embedding with this rank's vocabulary rows (`weight` [V / tp, D]); other ids
    look up zeros, and the all-reduce completes each row (exact: one rank owns each id)."""

    def __init__(self, vocab_size: int, dim: int, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.num_embeddings, self.embedding_dim = vocab_size, dim  # full sizes, as nn.Embedding's
        self.start, self.stop = tp.vocab_rows(vocab_size)
        self.weight = torch.nn.Parameter(torch.zeros(self.stop - self.start, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return torch.nn.functional.embedding(ids, self.weight)
        mine = (ids >= self.start) & (ids < self.stop)
        local_ids = (ids - self.start).clamp(0, self.weight.shape[0] - 1)
        local = torch.nn.functional.embedding(local_ids, self.weight)
        return self.tp.all_reduce(torch.where(mine.unsqueeze(-1), local, 0.0))
