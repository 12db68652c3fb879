"""The held-out evaluation scores the corpus's own turns as right, and counts turns cut at the
token limit as not ended."""

import pytest
import torch

from sglang_ds41.cache import trained_tiny_checkpoint
from sglang_ds41.reference.weights import load_reference
from sglang_ds41.training import evaluate as E

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_turn_the_corpus_wrote_gets_full_marks_in_every_kind():
    cases = E.cases(0, 2)
    assert {c.kind for c in cases} == set(E.KINDS)
    report = E.Report()
    for case in cases:
        report.add(case, case.expected | {E.FINISH: "stop"}, E.score(case, case.expected))
    summary = report.summary()
    assert summary.pop("cases") == len(cases)
    assert summary == dict.fromkeys(summary, 1.0), summary


def test_a_turn_cut_at_the_token_limit_has_not_ended():
    model = load_reference(trained_tiny_checkpoint(), dtype=torch.float32)
    cases = E.cases(0, 1)[:3]
    cut = E.evaluate(E.ReferenceCompleter(model, max_new_tokens=2), cases).summary()
    assert cut["ended"] == 0.0
    assert all(v == 0.0 for k, v in cut.items() if k.startswith("call.") or k.startswith("json."))
