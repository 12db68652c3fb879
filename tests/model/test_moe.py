import math

import pytest
import torch

from sglang_ds41.errors import Ds41Error
from sglang_ds41.model.moe import Expert, Gate, MoE

from ._tiny import randomize_, tiny_config


def sqrt_softplus(v: float) -> float:
    return math.sqrt(math.log1p(math.exp(v)))


def logit_gate(logits: list[float]) -> tuple[Gate, torch.Tensor]:
    """A gate whose router logits for x = e_0 are `logits` (8 experts, top-2, scale 1.5)."""
    cfg = tiny_config()
    gate = Gate(cfg).to(torch.float64)
    with torch.no_grad():
        gate.weight.zero_()
        gate.weight[:, 0] = torch.tensor(logits, dtype=torch.float64)
    x = torch.zeros(1, cfg.hidden_size, dtype=torch.float64)
    x[0, 0] = 1.0
    return gate, x


LOGITS = [0.5, -1.0, 2.0, 0.0, 1.0, -3.0, 1.5, -0.5]


def test_router_picks_top_scores_and_renormalises_with_route_scale():
    gate, x = logit_gate(LOGITS)
    weights, ids = gate(x)
    assert sorted(ids[0].tolist()) == [2, 6]
    s2, s6 = sqrt_softplus(2.0), sqrt_softplus(1.5)
    got = dict(zip(ids[0].tolist(), weights[0].tolist(), strict=True))
    assert got[2] == pytest.approx(1.5 * s2 / (s2 + s6), rel=1e-14)
    assert got[6] == pytest.approx(1.5 * s6 / (s2 + s6), rel=1e-14)


def test_bias_steers_selection_but_not_weights():
    gate, x = logit_gate(LOGITS)
    with torch.no_grad():
        gate.bias[5] = 10.0  # expert 5 (logit -3) now wins the selection
        gate.bias_vl[1] = 10.0
    weights, ids = gate(x)
    assert sorted(ids[0].tolist()) == [2, 5]
    s2, s5 = sqrt_softplus(2.0), sqrt_softplus(-3.0)
    got = dict(zip(ids[0].tolist(), weights[0].tolist(), strict=True))
    assert got[5] == pytest.approx(1.5 * s5 / (s2 + s5), rel=1e-14)
    # Image tokens use bias_vl instead.
    _, ids = gate(x, is_image=torch.tensor([True]))
    assert sorted(ids[0].tolist()) == [1, 2]


def test_router_without_norm_topk_prob_scales_raw_scores():
    gate, x = logit_gate(LOGITS)
    gate.norm_topk_prob = False
    weights, _ = gate(x)
    assert sorted(weights[0].tolist()) == pytest.approx(
        sorted([1.5 * sqrt_softplus(2.0), 1.5 * sqrt_softplus(1.5)]), rel=1e-14
    )


def test_router_rejects_other_scoring_functions():
    with pytest.raises(Ds41Error, match="sigmoid"):
        Gate(tiny_config(scoring_func="sigmoid"))


def silu(v: float) -> float:
    return v / (1 + math.exp(-v))


@pytest.mark.parametrize(
    ("gate_in", "up_in", "expected"),
    [
        (10.0, 10.0, silu(10.0) * 10.0),  # exactly at the limit: unchanged
        (12.0, 3.0, silu(10.0) * 3.0),  # gate clamped from above
        (-12.0, 3.0, silu(-12.0) * 3.0),  # ...but not from below
        (1.0, 12.0, silu(1.0) * 10.0),  # up clamped from above
        (1.0, -12.0, silu(1.0) * -10.0),  # and from below
    ],
)
def test_swiglu_clamps_at_the_limit(gate_in, up_in, expected):
    expert = Expert(dim=2, inter_dim=1, limit=10.0).to(torch.float64)
    with torch.no_grad():
        expert.w1.weight.copy_(torch.tensor([[1.0, 0.0]]))
        expert.w3.weight.copy_(torch.tensor([[0.0, 1.0]]))
        expert.w2.weight.copy_(torch.tensor([[1.0], [2.0]]))
    y = expert(torch.tensor([[gate_in, up_in]], dtype=torch.float64))
    assert y[0].tolist() == pytest.approx([expected, 2 * expected], rel=1e-14)


def test_moe_output_is_weighted_routed_experts_plus_shared_expert():
    cfg = tiny_config()
    moe = randomize_(MoE(cfg), seed=3)
    x = torch.randn(6, cfg.hidden_size, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    got = moe(x)
    for t in range(6):
        scores = torch.sqrt(torch.log1p(torch.exp(moe.gate.weight @ x[t])))
        chosen = torch.argsort(scores + moe.gate.bias, descending=True)[:2].tolist()
        w = scores[chosen] / scores[chosen].sum() * 1.5
        want = moe.shared_experts(x[t : t + 1])[0]
        for e, we in zip(chosen, w, strict=True):
            want = want + we * moe.experts[e](x[t : t + 1])[0]
        assert torch.allclose(got[t], want, rtol=1e-12, atol=1e-12)
