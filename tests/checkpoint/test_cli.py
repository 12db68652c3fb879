"""`sglang-ds41 make-tiny` and `sglang-ds41 inspect` as a user runs them (subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_ds41", *args], capture_output=True, text=True, timeout=120
    )


def test_make_tiny_then_inspect(tmp_path):
    out = tmp_path / "tiny"
    made = run_cli("make-tiny", str(out), "--variant", "nvfp4", "--engram", "mxfp4", "--seed", "3")
    assert made.returncode == 0, made.stderr
    shown = run_cli("inspect", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "nvfp4 (NVIDIA" in shown.stdout and "engram tables  mxfp4" in shown.stdout
    summary = json.loads(run_cli("inspect", "--json", str(out)).stdout)
    assert (summary["variant"], summary["engram_format"], summary["layers"]) == ("nvfp4", "mxfp4", 8)
    # 8 layers x 8 experts x 3 projections x 4 tensors + 3 stages x 4 experts x 3 x 2 (DSpark MXFP4)
    assert summary["tensors"] > 8 * 8 * 3 * 4 + 3 * 4 * 3 * 2


def test_inspect_reports_a_broken_checkpoint_without_a_traceback(tiny_dir, clone):
    ckpt = clone(tiny_dir())
    (ckpt / "model-00003-of-00006.safetensors").unlink()
    done = run_cli("inspect", str(ckpt))
    assert done.returncode == 2
    assert "missing shard model-00003-of-00006.safetensors" in done.stderr
    assert "Traceback" not in done.stderr


def test_make_tiny_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    done = run_cli("make-tiny", str(tmp_path))
    assert done.returncode == 2 and "not empty" in done.stderr and "Traceback" not in done.stderr


def test_make_tiny_names_an_output_it_cannot_create(tmp_path):
    (tmp_path / "afile").write_text("x")
    done = run_cli("make-tiny", str(tmp_path / "afile" / "sub"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"cannot write {tmp_path / 'afile' / 'sub'}: Not a directory" in done.stderr
