"""The full 129,280-id output head at the cost of the ids training uses, with an exact loss.

The embedding and the head are one matrix while training (tied; exported as the two BF16
tensors of the official layout). Its rows start at zero and a row is given its random initial
value the first time its id appears in a batch (`VocabRows.activate`). A row still zero gives
logit exactly 0, so the softmax denominator over all 129,280 ids is

    sum over active ids of e^logit  +  (number of inactive ids) * e^0,

which `full_vocab_cross_entropy` computes from the active rows alone: the loss is the true
full-vocabulary loss, and a served model gives the never-seen ids exactly the probability
training assumed. Ids no sample ever uses stay zero, so the shipped parameters need only the
active rows. The step pays for them only too (`LiveRows`, `step_with_live_rows`): the backward
and the optimizer touch the active rows, with the arithmetic of the whole-matrix step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.optim.adam import adam


class VocabRows:
    """Which rows of the tied embedding are live (`active`), and their initial scale."""

    def __init__(self, vocab_size: int, std: float, generator: torch.Generator):
        self.active = torch.zeros(vocab_size, dtype=torch.bool)
        self.std, self.generator = std, generator

    @property
    def ids(self) -> torch.Tensor:
        return torch.nonzero(self.active).flatten()

    @torch.no_grad()
    def activate(self, weight: torch.Tensor, ids: torch.Tensor) -> int:
        """Give every id of `ids` not yet active its initial row; returns how many were new."""
        new = torch.unique(ids)
        new = new[~self.active[new]]
        if new.numel():
            rows = torch.randn(new.numel(), weight.shape[1], generator=self.generator) * self.std
            weight[new] = rows.to(weight.dtype)
            self.active[new] = True
        return int(new.numel())

    def state_dict(self) -> dict:
        return {"active": self.active.clone(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.active.copy_(state["active"])
        self.generator.set_state(state["generator"])


class LiveRows:
    """One step's view of the tied matrix `weight`: its active rows as one leaf tensor, so the
    backward computes their gradient [n_active, D] and never a whole-matrix one (two zero
    fills, a sum and a gather over the 129,280 rows a step). `rounding(rows)` gives the rows as
    the forward sees them (elementwise: `quant.round_rows`)."""

    def __init__(
        self,
        weight: torch.Tensor,
        ids: torch.Tensor,
        rounding: Callable[[torch.Tensor], torch.Tensor],
    ):
        self.weight, self.ids = weight, ids
        self.leaf = weight.detach()[ids].requires_grad_()
        self.rows = rounding(self.leaf)  # [n_active, D]
        self.position = positions(ids, weight.shape[0])

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The input embeddings [T, D] of `token_ids` (all active)."""
        return F.embedding(self.position[token_ids], self.rows)

    def gradient(self, buffer: torch.Tensor) -> None:
        """After the backward: `weight.grad` = the whole matrix's gradient, written into `buffer`
        (kept from step to step: the active rows only grow, so every row a step wrote is written
        again and the rest stay zero). A gradient that reached `weight` by another path (a
        diagnostic reading the embedding module, benchmarks/copy_circuit.py) is added."""
        buffer[self.ids] = self.leaf.grad
        if self.weight.grad is not None:
            buffer += self.weight.grad
        self.weight.grad = buffer


def positions(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab_size]: each active id's row among `ids` (the active ids in id order), -1 elsewhere."""
    position = torch.full((vocab_size,), -1, dtype=torch.int64)
    position[ids] = torch.arange(ids.numel())
    return position


def full_vocab_cross_entropy(
    hidden: torch.Tensor, live_rows: torch.Tensor, targets: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy over all `position.numel()` ids of `hidden [N, D]` -> `targets [N]`,
    from the rows of the active ids alone (`live_rows [n_active, D]`, in id order, an id's at
    `position[id]`, `positions`; every inactive row is zero)."""
    n_active = int(position.max()) + 1 if position.numel() else 0
    if live_rows.shape[0] != n_active:
        raise ValueError(f"expected the {n_active} active rows, got {live_rows.shape[0]}")
    logits = F.linear(hidden.float(), live_rows.float())  # [N, n_active]
    inactive = position.numel() - n_active
    if inactive:
        zeros = torch.full((logits.shape[0], 1), math.log(inactive), dtype=logits.dtype)
        logits = torch.cat([logits, zeros], dim=1)  # one column standing for every zero row
    where = position[targets]
    if bool((where < 0).any()):
        missing = sorted(set(targets[where < 0].tolist()))
        raise ValueError(
            f"target ids {missing[:8]}{' ...' if len(missing) > 8 else ''} have no active row "
            "(activate the batch's ids first)"
        )
    return F.cross_entropy(logits, where)


@torch.no_grad()
def step_with_live_rows(optimizer: torch.optim.Optimizer, weight: torch.Tensor, rows: torch.Tensor) -> None:
    """`optimizer.step()` (torch's Adam / AdamW), updating only the `rows` of `weight`.

    A row outside `rows` has zero value, gradient and moments, and the step leaves it zero, so
    touching it is waste: ~10 passes over the 129,280 x D matrix a step (66 MB at D = 128) where
    the live rows are a tenth of it. The live rows take the same update as in the whole matrix,
    bit for bit: torch's own functional step (`torch.optim.adam.adam`, with the group's
    settings) runs on them, every element alone. The first step runs whole (it creates the
    moments), as does a step whose `weight` has no gradient."""
    group = next(g for g in optimizer.param_groups if any(p is weight for p in g["params"]))
    plain = {"amsgrad": False, "maximize": False, "capturable": False, "differentiable": False}
    if not isinstance(optimizer, torch.optim.Adam) or any(group[k] != v for k, v in plain.items()):
        raise ValueError(f"step_with_live_rows runs torch's plain Adam / AdamW ({plain}), not {optimizer}")
    state = optimizer.state.get(weight)  # not `[weight]`: that would add an entry out of order
    grad = weight.grad
    if not state or grad is None:
        optimizer.step()
        return
    weight.grad = None  # the optimizer's own step skips it
    try:
        optimizer.step()
    finally:
        weight.grad = grad
    live = weight[rows]
    exp_avg, exp_avg_sq = state["exp_avg"][rows], state["exp_avg_sq"][rows]
    beta1, beta2 = group["betas"]
    adam(
        [live], [grad[rows]], [exp_avg], [exp_avg_sq], [], [state["step"]],
        foreach=group["foreach"], fused=group["fused"],
        decoupled_weight_decay=group["decoupled_weight_decay"], amsgrad=False, beta1=beta1,
        beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
    )  # fmt: skip
    weight[rows] = live
    state["exp_avg"][rows], state["exp_avg_sq"][rows] = exp_avg, exp_avg_sq
