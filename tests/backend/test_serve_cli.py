"""`sglang-ds41 serve` argument handling up to the point where a server would start."""

import pytest

from sglang_ds41 import cli
from sglang_ds41.backend import serve


@pytest.fixture
def launched(monkeypatch):
    """Capture the Launch instead of starting a server."""
    seen = []
    monkeypatch.setattr(serve, "has_gpu", lambda: False)
    monkeypatch.setattr(serve, "serve", lambda launch, ready_timeout_s: seen.append(launch) or 0)
    return seen


def test_model_dir_then_sglang_flags(tmp_path, launched):
    (tmp_path / "config.json").write_text("{}")
    assert cli.main(["serve", str(tmp_path), "--port", "31000", "--tp", "2"]) == 0
    argv = launched[0].argv
    assert argv[argv.index("--port") + 1] == "31000"
    assert argv[argv.index("--tp-size") + 1] == "2"


def test_missing_model_dir_is_a_clear_error(capsys, launched):
    assert cli.main(["serve"]) == 2
    assert "missing MODEL_DIR" in capsys.readouterr().err


def test_tiny_serves_the_cached_tiny_checkpoint(tmp_path, monkeypatch, launched):
    built = tmp_path / "tiny"
    built.mkdir()
    (built / "config.json").write_text("{}")
    monkeypatch.setattr(serve, "tiny_checkpoint", lambda: built)
    assert cli.main(["serve", "--tiny", "--", "--port", "31001"]) == 0
    argv = launched[0].argv
    assert argv[argv.index("--model-path") + 1] == str(built)


def test_tiny_passes_sglang_flags_through_without_a_separator(tmp_path, monkeypatch, launched):
    built = tmp_path / "tiny"
    built.mkdir()
    (built / "config.json").write_text("{}")
    monkeypatch.setattr(serve, "tiny_checkpoint", lambda: built)
    assert cli.main(["serve", "--tiny", "--port", "31002", "--disable-radix-cache"]) == 0
    argv = launched[0].argv
    assert argv[argv.index("--port") + 1] == "31002"
    assert "--disable-radix-cache" in argv


def test_other_commands_still_refuse_unknown_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["render", "x.json", "--port", "1"])
    assert "unrecognized arguments: --port 1" in capsys.readouterr().err


def test_tiny_with_a_model_dir_is_refused(capsys, launched):
    assert cli.main(["serve", "--tiny", "some/dir"]) == 2
    assert "drop MODEL_DIR" in capsys.readouterr().err


def test_tiny_checkpoint_is_built_once_and_reused(tmp_path, monkeypatch):
    from sglang_ds41.checkpoint import tiny

    calls = []

    def fake_write_tiny(out_dir, variant, engram, seed):
        calls.append((variant, engram, seed))
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setenv("SGLANG_DS41_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny, "write_tiny", fake_write_tiny)
    first = serve.tiny_checkpoint()
    second = serve.tiny_checkpoint()
    assert first == second and (first / "config.json").is_file()
    assert calls == [("base", "fp8", 0)]
    assert first.parent == tmp_path and first.name.startswith("tiny-base-fp8-seed0-")
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no half-built leftovers


@pytest.mark.parametrize(
    ("device_args", "engine", "own_backend_env"),
    [([], "own backend (CPU engine)", True), (["--device", "cuda"], "upstream SGLang's V4.1 model", False)],
)
def test_dry_run_prints_each_engines_command_and_starts_nothing(
    tmp_path, capsys, launched, device_args, engine, own_backend_env
):
    (tmp_path / "config.json").write_text("{}")
    assert cli.main(["serve", "--dry-run", str(tmp_path), *device_args, "--tp", "4"]) == 0
    assert launched == []  # nothing was started
    out = capsys.readouterr().out
    assert out.startswith("# engine: ") and engine in out.splitlines()[0]
    assert f"-m sglang.launch_server --model-path {tmp_path}" in out and "--tp-size 4" in out
    assert ("SGLANG_EXTERNAL_MODEL_PACKAGE=sglang_ds41.backend" in out) is own_backend_env
    assert ("--page-size 2" in out) is own_backend_env
