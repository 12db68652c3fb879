"""The hyper-connection coefficients against SGLang 0.5.23's own V4 kernel.

SGLang computes pre / post / Sinkhorn comb from a site's mixes in one kernel
(`sglang.kernels.ops.layernorm.mhc`); its Triton port runs on the CPU under Triton's
interpreter, which makes it an independent oracle for `model.mhc.split_mixes` (MODEL.md §3.2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from sglang_ds41.model.mhc import split_mixes

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
