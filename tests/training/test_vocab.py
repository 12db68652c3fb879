"""The loss over the active rows is the full-vocabulary loss."""

import pytest
import torch

from sglang_ds41.training.vocab import VocabRows, full_vocab_cross_entropy


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
    got = full_vocab_cross_entropy(hidden, weight, targets, rows.active)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert int((weight.abs().sum(1) > 0).sum()) == int(rows.active.sum())  # inactive rows stay zero


def test_a_target_without_an_active_row_is_refused():
    rows = VocabRows(10, std=1.0, generator=torch.Generator().manual_seed(0))
    weight = torch.zeros(10, 4)
    rows.activate(weight, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="no active row"):
        full_vocab_cross_entropy(torch.randn(1, 4), weight, torch.tensor([7]), rows.active)
