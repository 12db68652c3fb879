"""`convert-engram` on tiny checkpoints: exact output, resumability, and clean failures (issue 7);
MXFP4 / NVFP4 targets, scale rules and the quality report (issue 15)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from sglang_ds41.checkpoint import convert as ce
from sglang_ds41.checkpoint.convert.quality import REPORT_FILE
from sglang_ds41.checkpoint.convert.recode import fp8_to_mxfp4, fp8_to_nvfp4, mxfp4_to_fp8, recode
from sglang_ds41.checkpoint.inspect import inspect_checkpoint
from sglang_ds41.checkpoint.reader import CheckpointError
from sglang_ds41.checkpoint.st_writer import OutputError
from sglang_ds41.formats import (
    dequantize_fp8_rows,
    dequantize_mxfp4,
    dequantize_nvfp4,
    fp8_rows_global_scale,
    fp8_rows_to_mxfp4,
    fp8_rows_to_nvfp4,
    quantize_mxfp4,
)

TABLES = ("layers.1.engram.embed", "layers.2.engram.embed")  # the tiny config's Engram layers


def _convert(src: Path, dst: Path, to: str = "mxfp4", **kw) -> ce.Result:
    return ce.convert(src, dst, to, log=lambda _: None, **kw)


def _tensors(root: Path) -> dict[str, torch.Tensor]:
    weight_map = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for file in sorted(set(weight_map.values())):
        with safe_open(str(root / file), framework="pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if not p.name.startswith(".")}


@pytest.fixture(scope="module")
def converted(tiny_dir, tmp_path_factory):
    """`converted(variant, to)` -> the conversion of the FP8 tiny checkpoint (once per pair)."""
    done: dict[tuple[str, str], Path] = {}

    def get(variant: str = "base", to: str = "mxfp4") -> Path:
        if (variant, to) not in done:
            dst = tmp_path_factory.mktemp(f"conv-{variant}-{to}") / "out"
            _convert(tiny_dir(variant, "fp8"), dst, to)
            done[variant, to] = dst
        return done[variant, to]

    return get


# --- the result ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("variant", "to"), [("base", "mxfp4"), ("nvfp4", "mxfp4"), ("base", "nvfp4")])
def test_conversion_equals_make_tiny_of_the_same_seed_byte_for_byte(converted, tiny_dir, variant, to):
    # make-tiny builds its 4-bit tables as fp8_rows_to_mxfp4 / fp8_rows_to_nvfp4 of the FP8 ones
    # with convert-engram's default rule (tiny.py) and writes with safetensors.save_file: every
    # file, headers and index included, must come out the same. config.json equal as JSON:
    # make-tiny inserts the Engram entries before NVIDIA's, we append them.
    out, want = _files(converted(variant, to)), _files(tiny_dir(variant, to))
    assert json.loads(out.pop("config.json")) == json.loads(want.pop("config.json"))
    assert json.loads(out.pop(REPORT_FILE))["tables"][0]["format"] == to
    assert out == want
    summary = inspect_checkpoint(converted(variant, to))
    assert summary["engram_format"] == to and summary["variant"] == variant
    assert [t["bytes_per_row"] for t in summary["engram_tables"]] == [{"mxfp4": 17, "nvfp4": 18}[to]] * 2


def test_nvfp4_tables_are_the_definition_of_the_fp8_values_under_the_table_global_scale(converted, tiny_dir):
    src, out = _tensors(tiny_dir()), _tensors(converted("base", "nvfp4"))
    assert set(out) - set(src) == {f"{t}.{p}" for t in TABLES for p in ("weight_scale", "weight_scale_2")}
    assert set(src) - set(out) == {f"{t}.scale" for t in TABLES}
    for t in TABLES:
        ws2 = out[f"{t}.weight_scale_2"]
        assert ws2.dtype == torch.float32 and ws2.shape == ()
        assert ws2.item() == fp8_rows_global_scale(src[f"{t}.scale"]).item()
        values, scales = src[f"{t}.weight"], src[f"{t}.scale"]
        codes, weight_scale, _ = fp8_rows_to_nvfp4(values, scales, ws2, scale_rule="mse")
        assert out[f"{t}.weight"].equal(codes) and out[f"{t}.weight"].dtype == torch.uint8
        assert out[f"{t}.weight_scale"].view(torch.uint8).equal(weight_scale.view(torch.uint8))
    index = json.loads((converted("base", "nvfp4") / "model.safetensors.index.json").read_text())
    assert index["weight_map"][f"{TABLES[0]}.weight_scale_2"] == index["weight_map"][f"{TABLES[0]}.weight"]


@pytest.mark.parametrize("to", ["mxfp4", "nvfp4"])
def test_quality_report_equals_an_independent_measurement_of_every_row(converted, tiny_dir, to):
    report = json.loads((converted("base", to) / REPORT_FILE).read_text())
    assert report["kind"] == "sglang-ds41 Engram quality report v1" and len(report["tables"]) == 2
    src, out = _tensors(tiny_dir()), _tensors(converted("base", to))
    for entry, t in zip(report["tables"], TABLES, strict=True):
        x = dequantize_fp8_rows(src[f"{t}.weight"], src[f"{t}.scale"], dtype=torch.float32).double()
        if to == "mxfp4":
            scale = out[f"{t}.scale"].view(torch.uint8).double().sub(127).exp2()
            q = dequantize_mxfp4(out[f"{t}.weight"], out[f"{t}.scale"], torch.float32).double()
            limit, block = 6 * scale, 32
        else:
            ws, ws2 = out[f"{t}.weight_scale"], out[f"{t}.weight_scale_2"]
            q = dequantize_nvfp4(out[f"{t}.weight"], ws, ws2, torch.float32).double()
            limit, block = 6 * (ws.float() * ws2).double(), 16
        cos = (x * q).sum(1) / (x.norm(dim=1) * q.norm(dim=1))
        rel = (q - x).norm(dim=1) / x.norm(dim=1)
        n = x.shape[0]
        assert (entry["layer"], entry["rows"], entry["rows_measured"]) == (int(t[7]), n, n)
        assert entry["zero_rows"] == entry["non_finite_rows"] == 0
        assert (entry["format"], entry["scale_rule"], entry["source_format"]) == (to, "mse", "fp8")
        assert (entry["bytes_per_row"], entry["source_bytes_per_row"]) == ({"mxfp4": 17, "nvfp4": 18}[to], 33)
        c, e = entry["row_cosine"], entry["relative_error"]
        assert c["mean"] == pytest.approx(float(cos.mean()), abs=1e-7)
        assert c["min"] == pytest.approx(float(cos.min()), abs=1e-7)
        assert e["mean"] == pytest.approx(float(rel.mean()), abs=1e-7)
        assert e["max"] == pytest.approx(float(rel.max()), abs=1e-7)
        # the 1% tails: the k-th worst row, k = ceil(1% of the rows), to the histogram's resolution
        k = -(-n // 100)
        worst_cos, worst_rel = float(cos.sort().values[k - 1]), float(rel.sort().values[n - k])
        assert worst_cos - 0.003 * (1 - worst_cos) <= c["p1"] <= worst_cos + 1e-7
        assert worst_rel - 1e-7 <= e["p99"] <= worst_rel * 1.003
        clipped = (x.abs().view(n, -1, block) > limit.unsqueeze(-1)).any(-1)
        assert entry["saturated_blocks"] == pytest.approx(float(clipped.double().mean()), abs=1e-7)
        assert entry["blocks"] == clipped.numel()


def test_ocp_rule_conversion_writes_the_ocp_definition(tiny_dir, tmp_path):
    _convert(tiny_dir(), tmp_path / "ocp", scale_rule="ocp")
    src, out = _tensors(tiny_dir()), _tensors(tmp_path / "ocp")
    for t in TABLES:
        exact = dequantize_fp8_rows(src[f"{t}.weight"], src[f"{t}.scale"], dtype=torch.float32)
        codes, scales = quantize_mxfp4(exact, "ocp")
        assert out[f"{t}.weight"].equal(codes)
        assert out[f"{t}.scale"].view(torch.uint8).equal(scales.view(torch.uint8))
    report = json.loads((tmp_path / "ocp" / REPORT_FILE).read_text())
    assert {t["scale_rule"] for t in report["tables"]} == {"ocp"}


def test_non_engram_tensors_are_byte_identical_and_tables_are_mxfp4_of_the_fp8_values(converted, tiny_dir):
    src, out = _tensors(tiny_dir()), _tensors(converted())
    assert set(src) == set(out)
    tables = {f"{t}.{p}" for t in TABLES for p in ("weight", "scale")}
    for name in set(src) - tables:
        a, b = src[name], out[name]
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.view(-1).view(torch.uint8).equal(b.view(-1).view(torch.uint8)), name
    for t in TABLES:
        exact = dequantize_fp8_rows(src[f"{t}.weight"], src[f"{t}.scale"], dtype=torch.float32)
        codes, scales = quantize_mxfp4(exact, "mse")  # convert-engram's default rule
        assert out[f"{t}.weight"].dtype == torch.uint8 and out[f"{t}.weight"].shape == (exact.shape[0], 16)
        assert out[f"{t}.weight"].equal(codes)
        assert out[f"{t}.scale"].view(torch.uint8).equal(scales.view(torch.uint8))


def test_reverse_conversion_restores_the_mxfp4_values_exactly(tiny_dir, tmp_path):
    # MXFP4 -> FP8 is lossless: every decoded table value and every other tensor is unchanged.
    src = tiny_dir("base", "mxfp4")
    _convert(src, tmp_path / "fp8", "fp8")
    assert inspect_checkpoint(tmp_path / "fp8")["engram_format"] == "fp8"
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())["quantization_config"]
    assert not any(k.startswith("engram_embed") for k in config)  # reads as the official FP8 release
    a, b = _tensors(src), _tensors(tmp_path / "fp8")
    for t in TABLES:
        mx = dequantize_mxfp4(a[f"{t}.weight"], a[f"{t}.scale"], torch.float32)
        fp8 = dequantize_fp8_rows(b[f"{t}.weight"], b[f"{t}.scale"], dtype=torch.float32)
        assert torch.equal(mx, fp8)


def _every_byte_and_scale() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    weight, scale = [], []
    for s in range(256):  # each row: all 256 E4M3 bytes once, all 8 blocks with scale byte s
        weight.append(rng.permutation(256).astype(np.uint8))
        scale.append(np.full(8, s, np.uint8))
    for mag in range(128):  # blocks whose largest magnitude byte is `mag`, at edge scales
        for s in (0, 1, 9, 127, 200, 246, 247, 254):
            w = rng.integers(0, mag + 1, 256) | (rng.integers(0, 2, 256) << 7)
            weight.append(w.astype(np.uint8))
            scale.append(np.full(8, s, np.uint8))
    w, s = np.stack(weight), np.stack(scale)
    w[::5, :32] &= 0x80  # all-zero blocks, with +0 and -0
    return w, s


def _torch_rows(w: np.ndarray, s: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(w).view(torch.float8_e4m3fn), torch.from_numpy(s).view(torch.float8_e8m0fnu)


@pytest.mark.parametrize("rule", ["mse", "ocp"])
def test_fast_recoding_equals_the_definition_on_every_byte_and_scale(rule):
    w, s = _every_byte_and_scale()
    codes, scales = fp8_to_mxfp4(w, s, scale_rule=rule)
    ref_codes, ref_scales = fp8_rows_to_mxfp4(*_torch_rows(w, s), scale_rule=rule)
    assert np.array_equal(codes, ref_codes.numpy())
    assert np.array_equal(scales, ref_scales.view(torch.uint8).numpy())
    # and back: lossless (an exact block has error 0 under its OCP exponent, which both rules keep)
    back_codes, back_scales = fp8_to_mxfp4(*mxfp4_to_fp8(codes, scales), scale_rule=rule)
    values = dequantize_mxfp4(torch.from_numpy(codes), ref_scales, torch.float32).numpy()
    back_scales = torch.from_numpy(back_scales)
    back = dequantize_mxfp4(torch.from_numpy(back_codes), back_scales, torch.float32).numpy()
    finite = np.isfinite(values).all(1)
    assert np.array_equal(values[finite], back[finite])
    if rule == "ocp":  # the very codes, up to the sign of zero (-0 re-encodes as +0, formats/e2m1.py)
        nibbles = np.stack([codes & 0xF, codes >> 4])
        positive_zero = np.where(nibbles == 8, 0, nibbles)
        assert np.array_equal((positive_zero[0] | positive_zero[1] << 4)[finite], back_codes[finite])


def test_reference_logits_on_the_converted_checkpoints_stay_within_the_bound(
    converted, tiny_dir, tmp_path, one_torch_thread
):
    """4-bit tables change the tiny model's logits (its random Engram path is large), but by far
    less than removing Engram does, and NVFP4 (finer scales) less than MXFP4; the measured
    numbers are printed (pytest -s)."""
    reference = pytest.importorskip("sglang_ds41.reference.weights")
    load = lambda root: reference.load_reference(root, torch.float64, token_map_cache=tmp_path)  # noqa: E731
    roots = (tiny_dir(), converted(), converted("base", "nvfp4"), tiny_dir())
    source, mx, nv, ablated = (load(root) for root in roots)
    for block in ablated.layers:
        if block.engram is not None:
            real = block.engram.table.lookup
            block.engram.table.lookup = lambda ids, real=real: torch.zeros_like(real(ids))
    ids = torch.randint(3, 128000, (48,), generator=torch.Generator().manual_seed(5))
    ids[0] = 0
    logits = [m(ids, m.new_state(), None) for m in (source, mx, nv, ablated)]
    err = lambda x: float(((x - logits[0]).norm(dim=-1) / logits[0].norm(dim=-1)).mean())  # noqa: E731
    mx_err, nv_err, ablated_err = err(logits[1]), err(logits[2]), err(logits[3])
    print(f"mean relative logit error: MXFP4 {mx_err:.3f}, NVFP4 {nv_err:.3f}, no Engram {ablated_err:.3f}")
    assert 0 < nv_err < mx_err < 0.6 * ablated_err  # measured 0.296 < 0.359 < 0.880 (float64, deterministic)
    assert mx_err < 0.5


# --- resuming -----------------------------------------------------------------------------------


def _killed_run(src: Path, dst: Path, at: str, to: str = "mxfp4") -> subprocess.CompletedProcess:
    env = {**os.environ, ce.KILL_ENV: at}
    cmd = [sys.executable, "-m", "sglang_ds41", "convert-engram", str(src), str(dst), "--to", to]
    cmd += ["--chunk-rows", "64", "--no-progress"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("at", "to"), [("chunk:5", "mxfp4"), ("commit:2", "mxfp4"), ("journal:4", "mxfp4"),
                                        ("chunk:500", "mxfp4"), ("commit:2", "nvfp4")])  # fmt: skip
def test_killed_conversion_resumes_to_identical_files(converted, tiny_dir, tmp_path, at, to):
    # identical includes the quality report, whose statistics of the finished shards come from
    # the journal and do not depend on the chunking (the resumed run uses other chunks)
    dst = tmp_path / "out"
    done = _killed_run(tiny_dir(), dst, at, to)
    assert done.returncode == -9, done.stderr
    want = _files(converted("base", to))
    for p in dst.iterdir():  # whatever exists under a final name is complete and final
        assert p.name.endswith(".partial") or p.name == ce.JOURNAL or p.read_bytes() == want[p.name], p.name
    assert not (dst / "config.json").exists()
    recorded = set(json.loads((dst / ce.JOURNAL).read_text())["shards"])
    assert bool(recorded) == (at != "chunk:5")  # chunk 5 is still in the first shard
    result = _convert(tiny_dir(), dst, to, chunk_rows=100)
    assert set(result.skipped) == recorded  # finished shards are kept, the rest redone
    assert _files(dst) == want
    assert not list(dst.glob("*.partial"))


def test_rerun_of_a_finished_conversion_only_verifies(converted, tiny_dir):
    result = _convert(tiny_dir(), converted())
    assert result.written == [] and result.verification.tables


# --- errors -------------------------------------------------------------------------------------


def _no_partial_output(dst: Path) -> None:
    names = {p.name for p in dst.iterdir()} if dst.exists() else set()
    assert not {n for n in names if n.endswith(".partial")}
    assert names <= {ce.JOURNAL}, names  # nothing else was completed before the failure


def test_source_already_mxfp4_is_refused(tiny_dir, tmp_path):
    with pytest.raises(ce.ConvertError, match=r"already MXFP4"):
        _convert(tiny_dir("base", "mxfp4"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unknown_format_and_mismatched_scale_rules_are_refused(tiny_dir, tmp_path):
    with pytest.raises(ce.ConvertError, match=r"unknown Engram format 'int4'"):
        _convert(tiny_dir(), tmp_path / "out", "int4")
    with pytest.raises(ce.ConvertError, match=r"--scale-rule 'ocp' does not apply to --to nvfp4: .*modelopt"):
        _convert(tiny_dir(), tmp_path / "out", "nvfp4", scale_rule="ocp")
    with pytest.raises(ce.ConvertError, match=r"--scale-rule 'modelopt' does not apply to --to mxfp4"):
        _convert(tiny_dir(), tmp_path / "out", "mxfp4", scale_rule="modelopt")
    assert not (tmp_path / "out").exists()


def test_a_second_4bit_format_or_nvfp4_to_fp8_is_refused(tiny_dir, tmp_path):
    with pytest.raises(ce.ConvertError, match=r"layer\(s\) \[1, 2\] are already MXFP4.* would mix two"):
        _convert(tiny_dir("base", "mxfp4"), tmp_path / "out", "nvfp4")
    with pytest.raises(ce.ConvertError, match=r"are NVFP4; --to fp8 converts MXFP4 tables only"):
        _convert(tiny_dir("base", "nvfp4"), tmp_path / "out", "fp8")
    assert not (tmp_path / "out").exists()


def test_resuming_with_another_scale_rule_is_refused(converted, tiny_dir):
    with pytest.raises(ce.ConvertError, match=r"holds a different conversion .*scale rule 'mse'.*'ocp'"):
        _convert(tiny_dir(), converted(), scale_rule="ocp")


def test_a_journal_from_before_scale_rules_reads_as_ocp(tiny_dir, tmp_path):
    dst = tmp_path / "out"
    _convert(tiny_dir(), dst, scale_rule="ocp")
    journal = json.loads((dst / ce.JOURNAL).read_text())
    del journal["scale_rule"]  # what convert-engram wrote before --scale-rule (OCP scales)
    (dst / ce.JOURNAL).write_text(json.dumps(journal))
    assert _convert(tiny_dir(), dst, scale_rule="ocp").written == []  # adopted, only verified
    with pytest.raises(ce.ConvertError, match=r"scale rule 'ocp'.*than this one .*scale rule 'mse'"):
        _convert(tiny_dir(), dst)


def test_missing_shard_is_named(tiny_dir, clone, tmp_path):
    src = clone(tiny_dir())
    (src / "model-00002-of-00006.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"missing shard model-00002-of-00006.safetensors"):
        _convert(src, tmp_path / "out")


def test_destination_with_other_content_or_another_source_is_refused(converted, tiny_dir, tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(ce.ConvertError, match=r"not empty \(notes.txt\)"):
        _convert(tiny_dir(), tmp_path / "other")
    with pytest.raises(ce.ConvertError, match=r"holds a different conversion"):
        _convert(tiny_dir("nvfp4"), converted())


def _failing_pwrite(after: int, code: int):
    budget = [after]

    def pwrite(fd: int, data, offset: int) -> int:
        if budget[0] <= 0:
            raise OSError(code, os.strerror(code))
        n = min(len(data), budget[0])
        budget[0] -= n
        return os.pwrite(fd, data[:n], offset)

    return pwrite


def test_disk_full_mid_shard_names_the_file_and_leaves_no_partial_output(tiny_dir, tmp_path):
    dst = tmp_path / "out"
    with pytest.raises(
        OutputError, match=r"disk full while writing .*model-00001-of-00006.safetensors; [\d,]+ more"
    ):
        _convert(tiny_dir(), dst, pwrite=_failing_pwrite(2_000_000, errno.ENOSPC))
    _no_partial_output(dst)


def test_read_only_target_is_reported(tiny_dir, tmp_path):
    with pytest.raises(OutputError, match=r"read-only or not writable"):
        _convert(tiny_dir(), tmp_path / "out", pwrite=_failing_pwrite(0, errno.EROFS))
    _no_partial_output(tmp_path / "out")


def _mount(*args: str) -> bool:
    return os.geteuid() == 0 and subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 8 MiB filesystem (root only): the tiny conversion needs ~49 MB."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)):
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_real_full_disk_is_caught_before_and_during_writing(tiny_dir, small_tmpfs):
    dst = small_tmpfs / "out"
    with pytest.raises(OutputError, match=r"not enough space .* needs [\d,]+ bytes"):
        _convert(tiny_dir(), dst)
    with pytest.raises(OutputError, match=r"disk full while writing .*model-00001-of-00006.safetensors"):
        _convert(tiny_dir(), dst, check_space=False)
    _no_partial_output(dst)


def test_real_read_only_mount_is_reported(tiny_dir, tmp_path):
    target, view = tmp_path / "target", tmp_path / "ro"
    target.mkdir()
    view.mkdir()
    if not (_mount("--bind", str(target), str(view)) and _mount("-o", "remount,ro,bind", str(view))):
        subprocess.run(["umount", str(view)], capture_output=True)
        pytest.skip("cannot make a read-only bind mount here")
    try:
        with pytest.raises(OutputError, match=r"read-only"):
            _convert(tiny_dir(), view / "out")
    finally:
        subprocess.run(["umount", str(view)], check=True)
    assert not list(target.iterdir())


def test_cli_dry_run_prints_the_plan_and_writes_nothing(tiny_dir, tmp_path):
    cmd = [sys.executable, "-m", "sglang_ds41", "convert-engram", str(tiny_dir()), str(tmp_path / "out")]
    done = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "FP8 -> MXFP4: layer 1 (434 rows), layer 2 (606 rows)" in done.stdout
    assert "time estimate" in done.stdout and "bytes out" in done.stdout
    assert not (tmp_path / "out").exists()
    refused = subprocess.run([*cmd, "--to", "int4"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "unknown Engram format" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_cli_dry_run_report_measures_a_sample_and_writes_nothing(tiny_dir, tmp_path):
    cmd = [sys.executable, "-m", "sglang_ds41", "convert-engram", str(tiny_dir()), str(tmp_path / "out")]
    done = subprocess.run(
        [*cmd, "--to", "nvfp4", "--dry-run", "--report", "--report-rows", "100"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "FP8 -> NVFP4" in done.stdout and "scale rule      mse" in done.stdout
    assert "a sample of up to 100 rows per table" in done.stdout
    lines = [line.split() for line in done.stdout.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert [line[:3] for line in lines] == [["1", "nvfp4/mse", "18"], ["2", "nvfp4/mse", "18"]]
    assert all(0.98 < float(line[4]) < 1.0 for line in lines)  # cosine mean of 100 tiny rows
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("rule", ["mse", "modelopt"])
@pytest.mark.parametrize("global_scale", [None, 1.0, 3.7e-30, 2.5e4])
def test_fast_nvfp4_recoding_equals_the_definition_on_every_byte_and_scale(rule, global_scale):
    # None: the global scale of the rows themselves (as converted); others: blocks whose E4M3
    # scales saturate, underflow to subnormals or to zero, and zero divisors
    w, s = _every_byte_and_scale()
    ws2 = fp8_rows_global_scale(torch.from_numpy(s)) if global_scale is None else torch.tensor(global_scale)
    codes, scales = fp8_to_nvfp4(w, s, float(ws2), scale_rule=rule)
    ref_codes, ref_scales, _ = fp8_rows_to_nvfp4(*_torch_rows(w, s), ws2, scale_rule=rule)
    ref_scales = ref_scales.view(torch.uint8).numpy()
    bad = np.flatnonzero((codes != ref_codes.numpy()).any(1) | (scales != ref_scales).any(1))
    assert bad.size == 0, (bad[:5], w[bad[:1]], s[bad[:1]])


@pytest.mark.parametrize(("to", "rule"), [("mxfp4", "mse"), ("mxfp4", "ocp"), ("nvfp4", "mse")])
def test_threaded_recoding_equals_the_definition(to, rule):
    rng = np.random.default_rng(1)
    w = rng.integers(0, 256, (20_000, 64), dtype=np.uint8)  # includes NaN bytes: fallback rows
    s = rng.integers(100, 150, (20_000, 2), dtype=np.uint8)
    s[7_000:7_010] = 250  # scales that would overflow float32: fallback rows in one worker's slice
    ws2 = fp8_rows_global_scale(torch.from_numpy(s))
    codes, scales = recode(to, w, s, workers=4, scale_rule=rule, global_scale=float(ws2))
    if to == "mxfp4":
        ref_codes, ref_scales = fp8_rows_to_mxfp4(*_torch_rows(w, s), scale_rule=rule)
    else:
        ref_codes, ref_scales, _ = fp8_rows_to_nvfp4(*_torch_rows(w, s), ws2, scale_rule=rule)
    assert np.array_equal(codes, ref_codes.numpy())
    assert np.array_equal(scales, ref_scales.view(torch.uint8).numpy())


def test_copies_through_an_injected_writer_give_the_same_files(converted, tiny_dir, tmp_path):
    """With the default writer untouched tensors are copied by the kernel; through any other
    `pwrite` (here one that counts) every byte goes through it, and the files are the same."""
    seen = [0]

    def counting_pwrite(fd: int, data, offset: int) -> int:
        seen[0] += len(data)
        return os.pwrite(fd, data, offset)

    dst = tmp_path / "out"
    _convert(tiny_dir(), dst, pwrite=counting_pwrite, chunk_rows=100)
    assert _files(dst) == _files(converted())
    assert seen[0] >= sum(p.stat().st_size for p in dst.glob("*.safetensors"))
