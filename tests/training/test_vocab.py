"""The loss over the active rows is the full-vocabulary loss."""

import pytest
import torch

from sglang_ds41.training.vocab import VocabRows, full_vocab_cross_entropy, positions, step_with_live_rows


def test_the_active_rows_loss_equals_cross_entropy_over_every_id():
    g = torch.Generator().manual_seed(0)
    vocab, dim = 5000, 16
    weight = torch.zeros(vocab, dim)
    rows = VocabRows(vocab, std=0.5, generator=g)
    used = torch.randint(0, vocab, (300,), generator=g)
    assert rows.activate(weight, used) == torch.unique(used).numel()
    assert rows.activate(weight, used) == 0  # already live: nothing new, values kept
    hidden = torch.randn(40, dim, generator=g)
    targets = used[torch.randint(0, used.numel(), (40,), generator=g)]
    expected = torch.nn.functional.cross_entropy(hidden @ weight.T, targets)
    got = full_vocab_cross_entropy(hidden, weight[rows.ids], targets, positions(rows.ids, vocab))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert int((weight.abs().sum(1) > 0).sum()) == int(rows.active.sum())  # inactive rows stay zero


def test_a_target_without_an_active_row_is_refused():
    rows = VocabRows(10, std=1.0, generator=torch.Generator().manual_seed(0))
    weight = torch.zeros(10, 4)
    rows.activate(weight, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="no active row"):
        full_vocab_cross_entropy(
            torch.randn(1, 4), weight[rows.ids], torch.tensor([7]), positions(rows.ids, 10)
        )


def test_the_loss_wants_exactly_the_active_rows():
    rows = VocabRows(10, std=1.0, generator=torch.Generator().manual_seed(0))
    weight = torch.zeros(10, 4)
    rows.activate(weight, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="expected the 2 active rows, got 10"):
        full_vocab_cross_entropy(torch.randn(1, 4), weight, torch.tensor([1]), positions(rows.ids, 10))


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_stepping_the_live_rows_is_torchs_step_of_the_whole_matrix(weight_decay):
    # Rows outside the live ones have zero value, gradient and moments; the rest take torch's
    # own AdamW update bit for bit, rows with a zero gradient this step (momentum only) too.
    g = torch.Generator().manual_seed(1)
    whole = torch.zeros(3000, 40)
    live = torch.tensor([3, 17, 18, 900, 2999])
    whole[live] = torch.randn(live.numel(), 40, generator=g)
    whole = torch.nn.Parameter(whole)
    other = torch.nn.Parameter(torch.randn(7, 5, generator=g))
    copies = [torch.nn.Parameter(whole.detach().clone()), torch.nn.Parameter(other.detach().clone())]

    def adamw(a: torch.Tensor, b: torch.Tensor) -> torch.optim.AdamW:
        groups = [{"params": [a], "weight_decay": weight_decay}, {"params": [b], "weight_decay": 0.01}]
        return torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95))

    rowwise, plain = adamw(whole, other), adamw(*copies)
    for step in range(5):
        grad = torch.zeros_like(whole)
        touched = live if step != 3 else live[:2]  # step 3: three live rows move on momentum alone
        grad[touched] = torch.randn(touched.numel(), 40, generator=g)
        other_grad = torch.randn(7, 5, generator=g)
        whole.grad, copies[0].grad = grad.clone(), grad.clone()
        other.grad, copies[1].grad = other_grad.clone(), other_grad.clone()
        step_with_live_rows(rowwise, whole, live)
        plain.step()
        assert torch.equal(whole, copies[0]) and torch.equal(other, copies[1])
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(rowwise.state[whole][key], plain.state[copies[0]][key])
    assert not whole[torch.ones(3000, dtype=torch.bool).index_fill_(0, live, False)].any()


def test_stepping_the_live_rows_refuses_an_optimizer_it_does_not_reproduce():
    weight = torch.nn.Parameter(torch.zeros(10, 4))
    weight.grad = torch.zeros(10, 4)
    for optimizer in (torch.optim.AdamW([weight], amsgrad=True), torch.optim.SGD([weight], lr=0.1)):
        with pytest.raises(ValueError, match="plain Adam / AdamW"):
            step_with_live_rows(optimizer, weight, torch.tensor([1]))
