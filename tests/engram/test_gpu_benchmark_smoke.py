"""`benchmarks/gpu_engram.py` (what `scripts/gpu_check.sh` runs on a lent GPU) walks every code
path on the CPU in its smoke mode (tiny tables, Triton's interpreter), so the one GPU run a
session may get is not lost to a broken script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_smoke_run_is_correct_and_measures_every_mode(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_engram.py"), "--smoke", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_engram_smoke.json").read_text())
    assert report["correctness"] and all(v is True for v in report["correctness"].values())
    measured = {(t["memory"], t["format"]) for t in report["timings"] if "ms" in t}
    for memory in ("device", "torch_pinned", "host_registered"):
        for fmt in ("mxfp4", "nvfp4", "fp8"):
            assert (memory, fmt) in measured
    assert report["ratios"] and all(r["ratio"] > 0 for r in report["ratios"])
