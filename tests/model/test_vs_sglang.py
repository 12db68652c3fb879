"""Model pieces against SGLang 0.5.23's own V4/V4.1 implementations (independent oracles).

* Hyper-connection coefficients: SGLang computes pre / post / Sinkhorn comb from a site's mixes
  in one kernel (`sglang.kernels.ops.layernorm.mhc`); its Triton port runs on the CPU under
  Triton's interpreter (a subprocess), checked against `model.mhc.split_mixes` (MODEL.md §3.2).
* The router: SGLang's torch-native biased top-k with sqrt-softplus scores
  (`layers/moe/topk.py::fused_topk_torch_native`), checked against `model.moe.Gate` (§6.1).
* RoPE frequencies: SGLang's V4 YaRN table (`kernels/ops/attention/dsv4/rope.py`) (§4.2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_ds41.config import V41Config
from sglang_ds41.model.mhc import split_mixes
from sglang_ds41.model.moe import Gate
from sglang_ds41.model.rope import RotaryEmbedding

from ._tiny import tiny_config

UPSTREAM = """
import json, sys, torch
from sglang.kernels.ops.layernorm import mhc
out = []
for case in json.loads(sys.argv[1]):
    mixes, scale, base = (torch.tensor(case[k]) for k in ("mixes", "scale", "base"))
    pre, post, comb = mhc._hc_split_sinkhorn_triton(mixes[None], scale, base, *case["hc_iters_eps"])
    out.append({"pre": pre[0].tolist(), "post": post[0].tolist(), "comb": comb[0].tolist()})
print(json.dumps(out))
"""
CASES = [(4, 20), (4, 1), (2, 3)]  # (hc, Sinkhorn rounds)
EPS = 1e-6


def inputs(hc: int, iters: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(hc * 100 + iters)
    mixes = torch.randn(16, (2 + hc) * hc, generator=generator) * 4  # logits far from uniform
    scale, base = torch.rand(3, generator=generator) + 0.5, torch.randn((2 + hc) * hc, generator=generator)
    return {"mixes": mixes, "scale": scale, "base": base}


@pytest.fixture(scope="module")
def upstream() -> list[dict[str, torch.Tensor]]:
    """SGLang's Triton port on the CPU (one interpreter for all cases: importing sglang is slow)."""
    pytest.importorskip("sglang")
    cases = [{k: v.tolist() for k, v in inputs(*c).items()} | {"hc_iters_eps": [*c, EPS]} for c in CASES]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", UPSTREAM, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [
        {k: torch.tensor(v) for k, v in out.items()}
        for out in json.loads(done.stdout.strip().splitlines()[-1])
    ]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_pre_post_and_sinkhorn_comb_equal_sglangs_kernel(upstream, case):
    hc, iters = CASES[case]
    x, theirs = inputs(hc, iters), upstream[case]
    ours = split_mixes(x["mixes"], x["base"], x["scale"], hc, iters, EPS)
    assert torch.allclose(ours.pre, theirs["pre"], rtol=0, atol=1e-6)
    assert torch.allclose(ours.post, theirs["post"], rtol=0, atol=1e-6)
    assert torch.allclose(ours.comb, theirs["comb"], rtol=0, atol=1e-6)  # comb[t, j, k], same orientation
    assert not torch.allclose(theirs["comb"], theirs["comb"].transpose(-1, -2), atol=1e-3)  # telling apart


def test_router_picks_and_weighs_like_sglangs_torch_native_top_k():
    topk_module = pytest.importorskip("sglang.srt.layers.moe.topk")
    cfg = tiny_config()
    gate = Gate(cfg)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        gate.weight.normal_(generator=generator)
        gate.bias.normal_(0, 0.5, generator=generator)
        gate.bias_vl.normal_(0, 0.5, generator=generator)
    x = torch.randn(40, cfg.hidden_size, generator=generator)
    is_image = torch.arange(40) % 3 == 0
    weights, ids = gate(x, is_image)
    logits = x @ gate.weight.detach().T / cfg.gate_temp
    for rows, bias in ((~is_image, gate.bias), (is_image, gate.bias_vl)):
        theirs_w, theirs_ids = topk_module.fused_topk_torch_native(
            x[rows], logits[rows], cfg.num_experts_per_tok, cfg.norm_topk_prob, bias.detach(), "sqrtsoftplus"
        )
        order, their_order = ids[rows].argsort(-1), theirs_ids.long().argsort(-1)  # top-k sets, unsorted
        assert torch.equal(ids[rows].gather(1, order), theirs_ids.long().gather(1, their_order))
        ours = weights[rows].gather(1, order) / cfg.routed_scaling_factor
        assert torch.allclose(ours, theirs_w.gather(1, their_order), rtol=1e-6, atol=0)
    _, text_only = gate(x, torch.zeros(40, dtype=torch.bool))
    assert not torch.equal(text_only, ids)  # bias_vl changed picks: both biases were exercised


@pytest.mark.parametrize("ratio", [0, 1, 2])
def test_rope_frequencies_equal_sglangs_yarn_table(ratio):
    """SGLang's V4 table (`kernels/ops/attention/dsv4/rope.py::precompute_freqs_cis`, fp32) for
    the official dims: plain `rope_theta` for window-only layers, YaRN on `compress_rope_theta`
    for compressed ones; ours is float64, so equal to fp32 rounding (a wrong band would not be)."""
    rope = pytest.importorskip("sglang.kernels.ops.attention.dsv4.rope")
    cfg = V41Config.from_file(Path(__file__).parent.parent / "fixtures" / "official_config.json").text
    ours = RotaryEmbedding.for_layer(cfg, ratio).freqs
    if ratio == 0:
        args = (cfg.qk_rope_head_dim, 2, 0, cfg.rope_theta, 1.0, 0, 0)
    else:
        s = cfg.rope_scaling
        args = (cfg.qk_rope_head_dim, 2, s.original_max_position_embeddings, cfg.compress_rope_theta)
        args += (s.factor, s.beta_fast, s.beta_slow)
    theirs = rope.precompute_freqs_cis(*args)[1].angle().double()  # position 1: the frequencies
    assert torch.allclose(ours, theirs, rtol=2e-6, atol=0)
    if ratio:
        assert not torch.allclose(
            ours, RotaryEmbedding.for_layer(cfg, 0).freqs, rtol=1e-2
        )  # not the plain table
