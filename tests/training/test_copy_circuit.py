"""`benchmarks/copy_circuit.py` (the repeat task docs/TRAINING.md §7 reads) asks what it says:
its loss covers exactly the ids only copying predicts, and its diagnostic signal reaches the
stream where it claims to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_ds41.training.trainer import Run, Settings
from tests.training._benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "copy_circuit.py"

SMALL = {"hidden_size": 64, "moe_intermediate_size": 32, "engram_vocab_size": 1009}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _benchmark():
    return load_benchmark("copy_circuit")


def test_the_loss_covers_the_second_copy_from_its_second_id_only(tmp_path):
    bench = _benchmark()
    run = Run.create(tmp_path, Settings(text=SMALL))
    pool = torch.arange(bench.FIRST_ID, bench.FIRST_ID + 7)
    batch = bench.repeat_batch(run, pool, torch.Generator().manual_seed(0))
    start = 0
    for length in batch.lengths.tolist():
        ids, targets = batch.ids[start : start + length], batch.targets[start : start + length]
        n = (length - 1) // 2
        assert ids[0] == run.config.bos_token_id and torch.equal(ids[1 : n + 1], ids[n + 1 :])
        learnt = torch.nonzero(targets != -100).flatten().tolist()
        assert learnt == list(range(n + 1, length - 1))  # predicting s[1:] of the second copy
        assert torch.equal(targets[learnt], ids[[t + 1 for t in learnt]])
        assert bench.LENGTHS[0] <= n < bench.LENGTHS[1]
        start += length
    assert batch.engram_rows.shape[0] == batch.ids.numel()


def test_a_short_run_writes_every_field_for_every_configuration(tmp_path):
    out = tmp_path / "copy.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "2", "--lr", "1e-3", "--feature", "none,layer0-only",
         "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["feature"] for r in rows] == ["none", "layer0-only"]
    for r in rows:
        assert r["steps"] == 2 and r["lr"] == 1e-3 and r["formed_at"] is None
        assert len(r["norms"]["attention_input"]) == 8  # every layer of the trained tiny model
        assert r["norms"]["embedding"] > 0 and r["norms"]["layer0_attention_output"] > 0


@pytest.mark.parametrize("feature", ["layer0", "layer0-only"])
def test_layer_0_writes_the_previous_token_signal(tmp_path, feature):
    bench = _benchmark()
    run = Run.create(tmp_path, Settings(text=SMALL))
    attn = run.model.layers[0].attn
    own = attn.project_out
    signal = bench.PreviousToken(SMALL["hidden_size"], torch.Generator().manual_seed(1))
    bench.install_feature(run, feature, signal)
    signal.batch = batch = bench.repeat_batch(run, torch.arange(5000, 5007), torch.Generator().manual_seed(2))
    o = torch.randn(batch.ids.numel(), attn.n_heads, attn.head_dim)
    positions = batch.chunks.positions
    with torch.no_grad():
        got = attn.project_out(o, positions)
        e = run.model.embed(batch.ids)
        mine = own(o, positions) if feature == "layer0" else 0
    starts = torch.cumsum(batch.lengths, 0) - batch.lengths
    previous = torch.cat([e.new_zeros(1, e.shape[1]), e[:-1]])
    previous[starts] = 0  # a sequence's first token has no previous token
    torch.testing.assert_close(got, mine + previous @ signal.rotation.T)
