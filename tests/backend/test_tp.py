"""Tensor parallelism of the dense weights (MODEL.md §13) outside a server.

Shards must be exact slices of the checkpoint tensors, and two ranks talking over gloo must
compute what one rank computes: the same logits (float64, up to the order of the all-reduce
sums) and the same greedy tokens, for a batched, chunked prefill and decode steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_ds41.backend.model import DeepseekV41ForCausalLM
from sglang_ds41.backend.tp import TensorParallel, TensorParallelError
from sglang_ds41.serve.server_process import free_port

from ._tp_rank import logits_of_the_script

RANK_SCRIPT = Path(__file__).with_name("_tp_rank.py")


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt):
    return tiny_ckpt("base", "mxfp4")


@pytest.fixture(scope="module")
def whole(ckpt):
    return DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float64)


def _params(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


def test_each_rank_holds_its_slice_and_the_slices_make_the_whole(ckpt, whole):
    ranks = [
        _params(DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float64, tp=TensorParallel(r, 2)))
        for r in (0, 1)
    ]
    full = _params(whole)
    split = {  # parameter -> dim it is split along
        "model.embed.weight": 0,
        "head.weight": 0,
        "model.layers.4.attn.wq_b.weight": 0,
        "model.layers.4.attn.attn_sink": 0,
        "model.layers.4.attn.wo_a.weight": 0,
        "model.layers.4.attn.wo_b.weight": 1,
        "model.layers.3.ffn.experts.5.w1.weight": 0,
        "model.layers.3.ffn.experts.5.w3.weight": 0,
        "model.layers.3.ffn.experts.5.w2.weight": 1,
        "model.layers.0.ffn.shared_experts.w2.weight": 1,
    }
    for name, dim in split.items():
        halves = [r[name] for r in ranks]
        assert halves[0].shape[dim] * 2 == full[name].shape[dim], name
        assert torch.equal(torch.cat(halves, dim=dim), full[name]), name
    sharded = 0
    for name, value in full.items():
        if ranks[0][name].shape == value.shape:  # replicated: the whole tensor on both ranks
            assert torch.equal(ranks[0][name], value) and torch.equal(ranks[1][name], value), name
        else:
            sharded += 1
    per_rank = sum(p.numel() for p in ranks[0].values())
    assert sharded > len(split) and per_rank < 0.75 * sum(p.numel() for p in full.values())


def test_shapes_that_do_not_split_are_named():
    from sglang_ds41.config import V41Config

    text = V41Config.from_file(Path(__file__).parents[1] / "fixtures" / "tiny_config.json").text
    with pytest.raises(TensorParallelError, match=r"vocab_size = 512 is not divisible by --tp 3"):
        TensorParallel(0, 3).local_text_config(text)


def test_two_ranks_over_gloo_equal_one_rank(ckpt, whole, tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"rank{r}.pt" for r in (0, 1)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(RANK_SCRIPT), str(ckpt), str(r), "2", str(outs[r])],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    for r, proc in enumerate(procs):
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"rank {r} failed:\n{err[-3000:]}"
    expected = logits_of_the_script(whole)
    for out in outs:
        got = torch.load(out)
        assert len(got) == len(expected)
        for step, (g, e) in enumerate(zip(got, expected, strict=True)):
            finite = torch.isfinite(e)
            assert torch.equal(finite, torch.isfinite(g)), step
            assert (g[finite] - e[finite]).abs().max() <= 1e-12 * e[finite].abs().max(), step
            assert torch.equal(g.argmax(-1), e.argmax(-1)), step
