"""Training is reproducible from the seed and a resumed run ends where an uninterrupted one does."""

import json

import pytest
import torch

from sglang_ds41.errors import Ds41Error
from sglang_ds41.training.data import IGNORE, batches
from sglang_ds41.training.forward import forward_hidden
from sglang_ds41.training.quant import set_rounding
from sglang_ds41.training.trainer import PROGRESS_FILE, Run, Settings
from sglang_ds41.training.vocab import full_vocab_cross_entropy, positions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = Settings(
    seed=3, steps=3, batch_tokens=600, max_len=600, warmup=2, save_every=100,
    text={"hidden_size": 64, "moe_intermediate_size": 32, "engram_vocab_size": 1009},
)  # fmt: skip


def _state(run: Run) -> dict[str, torch.Tensor]:
    return {**run.model.state_dict(), **{f"tables.{k}": v for k, v in run.tables.state_dict().items()}}


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    straight = Run.create(tmp_path / "a", SMALL)
    straight.train(progress_bar=False)
    interrupted = Run.create(tmp_path / "b", SMALL)
    interrupted.train(progress_bar=False, until=1)
    resumed = Run.resume(tmp_path / "b")
    assert resumed.step == 1
    resumed.train(progress_bar=False)
    a, b = _state(straight), _state(resumed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:3]
    losses = [json.loads(line)["loss"] for line in (tmp_path / "a" / PROGRESS_FILE).read_text().splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0]  # it learns
    assert straight.vocab.active.sum() > 0
    embed = straight.model.embed.parametrizations.weight.original
    assert torch.equal(embed.abs().sum(1) > 0, straight.vocab.active)  # rows never used stay zero


def test_a_run_directory_is_not_overwritten(tmp_path):
    Run.create(tmp_path / "a", SMALL).save()
    with pytest.raises(Ds41Error, match="already holds a training run"):
        Run.create(tmp_path / "a", SMALL)


def test_a_run_with_copy_drills_resumes_exactly_and_keeps_its_corpus_place(tmp_path):
    drilled = Settings(**{**SMALL.__dict__, "steps": 4, "drill_warmup": 1, "drill_every": 2})
    straight = Run.create(tmp_path / "a", drilled)
    straight.train(progress_bar=False)
    interrupted = Run.create(tmp_path / "b", drilled)
    interrupted.train(progress_bar=False, until=2)
    resumed = Run.resume(tmp_path / "b")
    resumed.train(progress_bar=False)
    a, b = _state(straight), _state(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    records = [json.loads(line) for line in (tmp_path / "a" / PROGRESS_FILE).read_text().splitlines()]
    assert [r["drill"] for r in records] == [True, False, True, False]
    plain = Run.create(tmp_path / "c", Settings(**{**SMALL.__dict__, "steps": 2}))
    plain.train(progress_bar=False)
    assert straight.position == plain.position  # drill steps do not consume the corpus


def test_a_run_written_before_a_setting_existed_resumes_as_it_ran(tmp_path):
    """Its settings.json lacks `periodic_drills`: the run drew half of its drills periodic."""
    Run.create(tmp_path / "a", Settings(**{**SMALL.__dict__, "periodic_drills": 0.0})).save()
    path = tmp_path / "a" / "settings.json"
    assert Run.resume(tmp_path / "a").settings.periodic_drills == 0.0
    record = json.loads(path.read_text())
    del record["periodic_drills"]
    path.write_text(json.dumps(record))
    assert Run.resume(tmp_path / "a").settings.periodic_drills == 0.5


def _optimizer_moments(run: Run) -> list[torch.Tensor]:
    return [t for state in run.optimizer.state_dict()["state"].values() for t in state.values()]


def test_a_continued_run_carries_on_its_source_and_resumes_exactly(tmp_path):
    source = Run.create(tmp_path / "a", SMALL)
    source.train(progress_bar=False)
    trained, moments = _state(source), _optimizer_moments(source)
    carried = Run.continue_from(tmp_path / "a", tmp_path / "b", steps=5, drill_every=2)
    assert (carried.step, carried.position) == (3, source.position)
    assert all(torch.equal(trained[k], v) for k, v in _state(carried).items())
    assert all(torch.equal(a, b) for a, b in zip(moments, _optimizer_moments(carried), strict=True))
    carried.train(progress_bar=False)
    records = [json.loads(line) for line in (tmp_path / "b" / PROGRESS_FILE).read_text().splitlines()]
    # records count the steps done; the 4th and 5th steps, 0-based 3 and 4: every 2nd one drills
    assert [(r["step"], r["drill"]) for r in records] == [(4, True), (5, False)]
    again = Run.resume(tmp_path / "a")  # the source is read, never written
    assert again.step == 3 and all(torch.equal(trained[k], v) for k, v in _state(again).items())
    recorded = json.loads((tmp_path / "b" / "settings.json").read_text())["continued_from"]
    assert recorded["step"] == 3 and Settings.from_record(recorded["settings"]) == SMALL

    interrupted = Run.continue_from(tmp_path / "a", tmp_path / "c", steps=5, drill_every=2)
    interrupted.train(progress_bar=False, until=4)
    resumed = Run.resume(tmp_path / "c")
    assert resumed.settings.steps == 5 and resumed.step == 4
    resumed.train(progress_bar=False)
    b, c = _state(carried), _state(resumed)
    assert all(torch.equal(b[k], c[k]) for k in b)


def test_a_continuation_refuses_what_would_make_it_another_run(tmp_path):
    source = Run.create(tmp_path / "a", SMALL)
    source.train(progress_bar=False, until=2)
    with pytest.raises(Ds41Error, match=r"can change only .*; got lr"):
        Run.continue_from(tmp_path / "a", tmp_path / "b", steps=9, lr=1.0)
    with pytest.raises(Ds41Error, match="at step 2; a continued run needs --steps above it, got 2"):
        Run.continue_from(tmp_path / "a", tmp_path / "b", steps=2)
    with pytest.raises(Ds41Error, match="nothing to continue from"):
        Run.continue_from(tmp_path / "missing", tmp_path / "b", steps=9)
    with pytest.raises(Ds41Error, match="already holds a training run"):
        Run.continue_from(tmp_path / "a", tmp_path / "a", steps=9)
    (tmp_path / "b").mkdir()
    record = {**SMALL.__dict__, "continued_from": {"step": 2, "settings": SMALL.__dict__}}
    (tmp_path / "b" / "settings.json").write_text(json.dumps(record))
    with pytest.raises(Ds41Error, match=r"a continued run without its state\.pt"):
        Run.resume(tmp_path / "b")  # never a silent fresh start


def test_train_tiny_does_not_resume_a_run_with_other_settings(tmp_path, capsys):
    from sglang_ds41 import cli

    Run.create(tmp_path / "a", SMALL).save()
    assert (
        cli.main(["train-tiny", str(tmp_path / "a"), "--steps", "9", "--drill-every", "2", "--threads", "1"])
        == 2
    )
    error = capsys.readouterr().err
    assert "--steps, --drill-every would change them" in error and "--continue-from" in error


def test_train_tiny_until_ends_a_phase_that_a_continuation_carries_on(tmp_path, capsys):
    import dataclasses

    from sglang_ds41 import cli

    Run.create(tmp_path / "a", dataclasses.replace(SMALL, steps=6)).save()
    assert cli.main(["train-tiny", str(tmp_path / "a"), "--until", "2", "--threads", "1"]) == 0
    phase = Run.resume(tmp_path / "a")
    assert phase.step == 2 and phase.settings.steps == 6  # stopped; its schedule still 6 steps long
    assert "stopped at step 2 of 6" in capsys.readouterr().out
    assert cli.main(["train-tiny", str(tmp_path / "a"), "--until", "1", "--export", str(tmp_path / "x")]) == 2
    assert "is at step 2, past --until 1" in capsys.readouterr().err  # never packed at another step
    assert not (tmp_path / "x").exists()


def test_a_bundle_of_a_continued_phase_records_the_whole_lineages_time(tmp_path, monkeypatch):
    """A shipped model can be a phase's end (`--until` with `--bundle`); its record counts the
    seconds of every step behind it once, its sources' included, even where a stopped run's log
    ran past its last save and the resumed run did those steps again."""
    import dataclasses

    from sglang_ds41 import cli
    from sglang_ds41.checkpoint.trained import TRAINING_FILE

    Run.create(tmp_path / "a", dataclasses.replace(SMALL, steps=6)).train(progress_bar=False, until=2)
    with open(tmp_path / "a" / PROGRESS_FILE, "a") as log:  # step 3 logged, then stopped unsaved
        log.write(json.dumps({"step": 3, "loss": 9.0, "s": 1000.0, "tokens": 1, "learnt": 1}) + "\n")
    assert len(Run.resume(tmp_path / "a").progress()) == 2
    Run.resume(tmp_path / "a").train(progress_bar=False, until=3)  # step 3 done again
    done = Run.resume(tmp_path / "a").progress()
    source_seconds = sum(r["s"] for r in done)
    assert [r["step"] for r in done] == [1, 2, 3] and source_seconds < 1000.0

    argv = ["train-tiny", "--threads", "1", str(tmp_path / "b"), "--continue-from", str(tmp_path / "a"),
            "--steps", "8", "--until", "5", "--bundle", str(tmp_path / "bundle")]  # fmt: skip
    monkeypatch.setattr("sys.argv", ["sglang-ds41", *argv])  # as the console script sees it
    assert cli.main(argv) == 0
    record = json.loads((tmp_path / "bundle" / TRAINING_FILE).read_text())
    written = ["sglang-ds41", *("RUN_DIR" if a == str(tmp_path / "b") else a for a in argv)]
    assert record["command"] == " ".join(written)
    own = [json.loads(line)["s"] for line in (tmp_path / "b" / PROGRESS_FILE).read_text().splitlines()]
    assert record["steps"] == 5 and record["settings"]["steps"] == 8 and len(own) == 2
    assert record["settings"]["continued_from"]["train_seconds"] == pytest.approx(source_seconds, abs=0.1)
    assert record["train_seconds"] == pytest.approx(sum(own), abs=0.1)
    assert record["lineage_train_seconds"] == pytest.approx(source_seconds + sum(own), abs=0.2)


def test_a_drill_share_adds_this_steps_drills_to_each_corpus_step_and_leaves_the_corpus_place(tmp_path):
    from sglang_ds41.training.data import IGNORE
    from sglang_ds41.training.drills import drill_batch

    plain = Run.create(tmp_path / "a", SMALL)
    plain.train(progress_bar=False)
    mixed_settings = Settings(**{**SMALL.__dict__, "drill_share": 0.5, "spelling_drills": 1.0})
    mixed = Run.create(tmp_path / "b", mixed_settings)
    mixed.train(progress_bar=False)
    assert mixed.position == plain.position  # the drills ride along; the corpus is not skipped

    def records(run_dir):
        return [json.loads(line) for line in (run_dir / PROGRESS_FILE).read_text().splitlines()]

    drilled = [
        drill_batch(SMALL.seed, step, 300, mixed.hasher, mixed.config.bos_token_id, 0.5, 1.0)
        for step in range(SMALL.steps)
    ]
    added = [
        (b["tokens"] - a["tokens"], b["learnt"] - a["learnt"], b["drill"])
        for a, b in zip(records(tmp_path / "a"), records(tmp_path / "b"), strict=True)
    ]
    assert added == [(d.ids.numel(), int((d.targets != IGNORE).sum()), False) for d in drilled]
    assert all(n > 0 for n, _, _ in added)


def test_train_tiny_refuses_a_share_outside_0_to_1_before_it_creates_the_run(tmp_path, capsys):
    from sglang_ds41 import cli

    assert cli.main(["train-tiny", str(tmp_path / "a"), "--drill-share", "1.5", "--threads", "1"]) == 2
    error = capsys.readouterr().err
    assert "drill_share (--drill-share) is a share: expected 0 to 1, got 1.5" in error
    assert not (tmp_path / "a").exists()


def _plain_step(run: Run, batch) -> None:
    """The textbook step the trainer's must equal: the loss through the whole parametrized
    (rounded) 129,280-row matrix, torch's AdamW over every row of it."""
    for group in run.optimizer.param_groups:
        group["lr"] = run.lr_at(run.step)
    rounding = run.step >= run.settings.qat_from * run.settings.steps
    set_rounding(run.model, rounding)
    run.tables.rounding = rounding
    run.vocab.activate(run.model.embed.parametrizations.weight.original, batch.ids)
    hidden = forward_hidden(run.model, run.tables, batch, embed=run.model.embed)
    learn = batch.targets != IGNORE
    ids = run.vocab.ids
    head, position = run.model.embed.weight[ids], positions(ids, run.vocab.active.numel())
    loss = full_vocab_cross_entropy(hidden[learn], head, batch.targets[learn], position)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for group in run.optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, run.settings.clip)
    run.optimizer.step()
    run._update_router_bias()
    run.step += 1


def test_a_step_changes_the_weights_and_moments_as_the_plain_full_matrix_step_does(tmp_path):
    # The trainer's step takes the tied matrix's live rows as one leaf and steps only them; it
    # must be the same arithmetic, bit for bit: float and rounded steps, new rows every step.
    # A clip this small scales every step's gradient: the norm must be the whole matrix's.
    settings = Settings(**{**SMALL.__dict__, "steps": 4, "qat_from": 0.5, "clip": 0.05})
    fast, plain = Run.create(tmp_path / "a", settings), Run.create(tmp_path / "b", settings)
    stream = batches(settings.seed, settings.batch_tokens, settings.max_len, fast.hasher)
    for _ in range(settings.steps):
        batch = next(stream).batch
        fast.optimize(batch)
        _plain_step(plain, batch)
    a, b = _state(fast), _state(plain)
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:3]
    moments_a, moments_b = _optimizer_moments(fast), _optimizer_moments(plain)
    assert len(moments_a) == len(moments_b)
    assert all(torch.equal(x, y) for x, y in zip(moments_a, moments_b, strict=True))
    embed = fast.model.embed.parametrizations.weight.original
    assert torch.equal(embed.abs().sum(1) > 0, fast.vocab.active)  # rows never used stay zero
