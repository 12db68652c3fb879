"""The full 129,280-id output head at the cost of the ids training uses, with an exact loss.

The embedding and the head are one matrix while training (tied; exported as the two BF16
tensors of the official layout). Its rows start at zero and a row is given its random initial
value the first time its id appears in a batch (`VocabRows.activate`). A row still zero gives
logit exactly 0, so the softmax denominator over all 129,280 ids is

    sum over active ids of e^logit  +  (number of inactive ids) * e^0,

which `full_vocab_cross_entropy` computes from the active rows alone: the loss is the true
full-vocabulary loss, and a served model gives the never-seen ids exactly the probability
training assumed. Ids no sample ever uses stay zero, so the shipped parameters need only the
active rows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


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


def full_vocab_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, active: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy over all `weight.shape[0]` ids of `hidden [N, D]` -> `targets [N]`,
    computing logits for the active rows only (every inactive row must be zero)."""
    ids = torch.nonzero(active).flatten()
    logits = F.linear(hidden.float(), weight[ids].float())  # [N, n_active]
    inactive = active.numel() - ids.numel()
    if inactive:
        zeros = torch.full((logits.shape[0], 1), math.log(inactive), dtype=logits.dtype)
        logits = torch.cat([logits, zeros], dim=1)  # one column standing for every zero row
    position = torch.full((active.numel(),), -1, dtype=torch.int64)
    position[ids] = torch.arange(ids.numel())
    where = position[targets]
    if bool((where < 0).any()):
        missing = sorted(set(targets[where < 0].tolist()))
        raise ValueError(
            f"target ids {missing[:8]}{' ...' if len(missing) > 8 else ''} have no active row "
            "(activate the batch's ids first)"
        )
    return F.cross_entropy(logits, where)
