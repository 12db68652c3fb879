"""`sglang-ds41 serve` argument handling up to the point where a server would start.

The checkpoints are real: the session's tiny checkpoint (official layout, validated as `inspect`
does) and the scripted test checkpoint; only the final `serve.serve` (which would start SGLang)
is replaced by a recorder, except in the subprocess tests, which run the real command."""

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_ds41 import cache, cli
from sglang_ds41.checkpoint.scripted import write_scripted_checkpoint
from sglang_ds41.serve import launcher as serve


@pytest.fixture
def launched(monkeypatch):
    """Capture the Launch (and how serve would log) instead of starting a server."""
    seen = []
    monkeypatch.setattr(serve, "has_gpu", lambda: False)

    def record(launch, ready_timeout_s, log_path, serving):
        seen.append((launch, log_path, serving))
        return 0

    monkeypatch.setattr(serve, "serve", record)
    return seen


def model_path(launch) -> str:
    return launch.argv[launch.argv.index("--model-path") + 1]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory) -> Path:
    return write_scripted_checkpoint(tmp_path_factory.mktemp("scripted") / "ckpt")


def test_model_dir_then_sglang_flags(ckpt, launched):
    assert cli.main(["serve", str(ckpt), "--port", "31000", "--tp", "2"]) == 0
    launch, log, serving = launched[0]
    argv = launch.argv
    assert argv[argv.index("--port") + 1] == "31000"
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert log == serve.default_log_path(31000) and log.name == "serve-31000.log"
    assert serving.startswith(f"{ckpt}: base release, fp8 Engram tables")


@pytest.mark.parametrize(
    "form", [["--model-path", "{}"], ["--model", "{}"], ["--model-path={}"], ["{}", "--model", "{}"]]
)
def test_the_checkpoint_as_sglangs_model_path(ckpt, launched, form):
    args = [part.format(ckpt) for part in form]
    assert cli.main(["serve", *args, "--port", "31003"]) == 0
    launch = launched[0][0]
    assert model_path(launch) == str(ckpt)
    assert launch.argv.count("--model-path") == 1 and "--model" not in launch.argv


def test_the_server_thinking_token_budget_goes_to_the_plugin_s_variable(scripted, launched):
    assert cli.main(["serve", str(scripted), "--port", "31005", "--thinking-token-budget", "64"]) == 0
    launch = launched[0][0]
    assert launch.env["SGLANG_DS41_THINKING_TOKEN_BUDGET"] == "64"
    assert "--thinking-token-budget" not in launch.argv  # ours, not SGLang's
    assert cli.main(["serve", str(scripted), "--port", "31005"]) == 0
    assert "SGLANG_DS41_THINKING_TOKEN_BUDGET" not in launched[1][0].env


def test_the_incremental_encoder_is_on_unless_turned_off(scripted, launched):
    assert cli.main(["serve", str(scripted), "--port", "31006"]) == 0
    assert "SGLANG_DS41_INCREMENTAL_ENCODING" not in launched[0][0].env
    assert cli.main(["serve", str(scripted), "--port", "31006", "--no-incremental-encoding"]) == 0
    launch = launched[1][0]
    assert launch.env["SGLANG_DS41_INCREMENTAL_ENCODING"] == "0"
    assert "--no-incremental-encoding" not in launch.argv  # ours, not SGLang's


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SGLANG_DS41_INCREMENTAL_ENCODING", "of", "='of': expected 1 (on) or 0 (off)"),
        ("SGLANG_DS41_PROMPT_CACHE_MIB", "lots", "='lots': expected a number of MiB >= 0"),
        ("SGLANG_DS41_PROMPT_CACHE_MIB", "-1", "='-1': expected a number of MiB >= 0"),
    ],
)
def test_a_bad_prompt_encoding_variable_is_refused_by_name(
    scripted, capsys, launched, monkeypatch, variable, value, message
):
    monkeypatch.setenv(variable, value)
    assert cli.main(["serve", str(scripted), "--port", "31007"]) == 2
    assert variable + message in capsys.readouterr().err and launched == []


MUST = "--thinking-token-budget must be an integer of at least 1, got"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--thinking-token-budget", "0"], f"{MUST} integer `0`"),
        (["--thinking-token-budget", "-1"], f"{MUST} integer `-1`"),
        (["--thinking-token-budget", "lots"], f"{MUST} string 'lots'"),
        (["--thinking-token-budget", "8", "--grammar-backend", "outlines"], "outlines has none"),
    ],
)
def test_a_bad_server_thinking_token_budget_is_refused_by_name(scripted, capsys, launched, args, message):
    with pytest.raises(SystemExit) if "outlines" not in args else contextlib.nullcontext():
        assert cli.main(["serve", str(scripted), *args]) == 2
    assert message in capsys.readouterr().err and launched == []


def test_two_different_checkpoints_are_refused(ckpt, scripted, capsys, launched):
    assert cli.main(["serve", str(ckpt), "--model-path", str(scripted)]) == 2
    assert "two checkpoints given" in capsys.readouterr().err and launched == []


def test_missing_checkpoint_says_how_to_give_one(capsys, launched):
    assert cli.main(["serve", "--port", "31000"]) == 2
    err = capsys.readouterr().err
    assert "which checkpoint? give MODEL_DIR (or --model-path DIR" in err and "--tiny" in err


def test_tiny_random_serves_the_cached_random_tiny_checkpoint(ckpt, monkeypatch, launched):
    monkeypatch.setattr(cache, "tiny_checkpoint", lambda: ckpt)
    assert cli.main(["serve", "--tiny-random", "--", "--port", "31001"]) == 0
    launch, _, serving = launched[0]
    assert model_path(launch) == str(ckpt)
    assert str(ckpt) in serving  # the ready line names the checkpoint it serves


def test_tiny_passes_sglang_flags_through_without_a_separator(ckpt, monkeypatch, launched):
    monkeypatch.setattr(cache, "trained_tiny_checkpoint", lambda: ckpt)
    assert cli.main(["serve", "--tiny", "--port", "31002", "--disable-radix-cache"]) == 0
    argv = launched[0][0].argv
    assert argv[argv.index("--port") + 1] == "31002"
    assert "--disable-radix-cache" in argv


def test_scripted_serves_the_cached_scripted_checkpoint(tmp_path, monkeypatch, launched):
    monkeypatch.setenv("SGLANG_DS41_CACHE", str(tmp_path))
    assert cli.main(["serve", "--scripted", "--port", "31004"]) == 0
    launch, _, serving = launched[0]
    built = Path(model_path(launch))
    assert built.parent == tmp_path and built.name.startswith("scripted-")
    assert "the scripted test model" in serving
    assert cli.main(["serve", "--scripted", "--port", "31004"]) == 0  # reused, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [built.name]


def test_other_commands_still_refuse_unknown_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["render", "x.json", "--port", "1"])
    assert "unrecognized arguments: --port 1" in capsys.readouterr().err


def test_tiny_with_a_model_dir_is_refused(capsys, launched):
    assert cli.main(["serve", "--tiny", "some/dir"]) == 2
    assert "drop MODEL_DIR" in capsys.readouterr().err


def test_log_file_and_verbose(ckpt, tmp_path, launched):
    assert cli.main(["serve", str(ckpt), "--log-file", str(tmp_path / "x.log")]) == 0
    assert cli.main(["serve", str(ckpt), "--verbose"]) == 0
    assert [log for _, log, _ in launched] == [tmp_path / "x.log", None]


def test_tiny_checkpoint_is_built_once_and_reused(tmp_path, monkeypatch):
    from sglang_ds41.checkpoint import tiny

    calls = []

    def fake_write_tiny(out_dir, variant, engram, seed):
        calls.append((variant, engram, seed))
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setenv("SGLANG_DS41_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny, "write_tiny", fake_write_tiny)
    first = cache.tiny_checkpoint()
    second = cache.tiny_checkpoint()
    assert first == second and (first / "config.json").is_file()
    assert calls == [("base", "fp8", 0)]
    assert first.parent == tmp_path and first.name.startswith("tiny-base-fp8-seed0-")
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no half-built leftovers


@pytest.mark.parametrize(
    ("device_args", "engine", "own_backend_env"),
    [([], "own backend (CPU engine)", True), (["--device", "cuda"], "upstream SGLang's V4.1 model", False)],
)
def test_dry_run_prints_each_engines_command_and_starts_nothing(
    ckpt, capsys, launched, device_args, engine, own_backend_env
):
    assert cli.main(["serve", "--dry-run", str(ckpt), *device_args, "--tp", "4"]) == 0
    assert launched == []  # nothing was started
    out = capsys.readouterr().out
    first, second = out.splitlines()[:2]
    assert first.startswith(f"# checkpoint: {ckpt} (base release")
    assert second.startswith("# engine: ") and engine in second
    assert f"-m sglang.launch_server --model-path {ckpt}" in out and "--tp-size 4" in out
    assert "--served-model-name DeepSeek-V4.1-Flash --enable-cache-report" in out
    assert ("SGLANG_EXTERNAL_MODEL_PACKAGE=sglang_ds41.backend" in out) is own_backend_env
    assert ("--page-size 2" in out) is own_backend_env


def test_version_names_ours_sglangs_and_torchs(capsys):
    from importlib.metadata import version

    for argv in (["--version"], ["serve", "--version"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert out == f"sglang-ds41 {version('sglang-ds41')} (sglang 0.5.23, torch {version('torch')})\n"


# ---- the real command, in a subprocess ------------------------------------------------------


def broken_copies(ckpt: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Checkpoints that `inspect` rejects, and a phrase of the validator's message for each."""
    shard = sorted(ckpt.glob("*.safetensors"))[-1]
    truncated = root / "truncated"
    shutil.copytree(ckpt, truncated)
    data = (truncated / shard.name).read_bytes()
    (truncated / shard.name).write_bytes(data[: len(data) - 1000])
    bad_config = root / "bad-config"
    shutil.copytree(ckpt, bad_config)
    config = json.loads((bad_config / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = -1
    (bad_config / "config.json").write_text(json.dumps(config))
    not_json = root / "not-json"
    shutil.copytree(ckpt, not_json)
    (not_json / "config.json").write_text("{")
    return {
        "truncated": (truncated, f"{shard.name}"),
        "bad-config": (bad_config, "num_hidden_layers"),
        "not-json": (not_json, "cannot read JSON"),
    }


def test_a_broken_checkpoint_fails_at_once_with_the_validators_message(ckpt, tmp_path):
    """Before SGLang starts: no server process, the same message as `inspect`, in about a second."""
    for name, (broken, phrase) in broken_copies(ckpt, tmp_path).items():
        inspected = subprocess.run(
            [sys.executable, "-m", "sglang_ds41", "inspect", str(broken)], capture_output=True, text=True
        )
        t0 = time.monotonic()
        served = subprocess.run(
            [sys.executable, "-m", "sglang_ds41", "serve", str(broken), "--port", "31999"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        seconds = time.monotonic() - t0
        assert served.returncode == 2 and inspected.returncode == 2, name
        assert phrase in served.stderr, (name, served.stderr)
        message = served.stderr.split("error: ", 1)[1]
        assert message == inspected.stderr.split("error: ", 1)[1], name
        assert "starting SGLang" not in served.stderr and "Traceback" not in served.stderr
        assert seconds < 5, f"{name}: serve took {seconds:.1f} s to refuse it"  # ~0.3 s idle


def test_the_serve_process_never_imports_torch(ckpt):
    """The wrapper finds the GPU, checks the environment and the checkpoint without torch (it
    held 836 MB when it imported torch to look for a GPU)."""
    probe = (
        "import sys; from sglang_ds41.serve import launcher as serve; "
        "cpu = serve.engine_is_cpu([]); serve.check_environment(cpu); "
        f"print(serve.validate_checkpoint({str(ckpt)!r})); "
        "serve.build_launch(sys.argv[1], []); "
        "print(sorted(m for m in ('torch', 'numba', 'sglang', 'triton') if m in sys.modules)); "
        "print(next(int(l.split()[1]) // 1024 for l in open('/proc/self/status') if l.startswith('VmHWM')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(ckpt)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0].startswith("base release") and out[1] == "[]"
    assert int(out[2]) < 150, f"peak RSS {out[2]} MB"  # ~50 MB


def test_a_port_in_use_is_refused_before_anything_starts(ckpt, capsys, launched):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["serve", str(ckpt), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert (
        f"cannot listen on 127.0.0.1:{port}: Address already in use (another server" in err and launched == []
    )
    assert cli.main(["serve", str(ckpt), "--port", str(port)]) == 0  # free again


def test_tiny_serves_the_trained_checkpoint(ckpt, monkeypatch, launched):
    monkeypatch.setattr(cache, "trained_tiny_checkpoint", lambda: ckpt)
    assert cli.main(["serve", "--tiny", "--port", "31003"]) == 0
    assert model_path(launched[0][0]) == str(ckpt)


def test_tiny_without_a_shipped_model_says_what_to_do(tmp_path, monkeypatch, capsys, launched):
    from sglang_ds41.checkpoint import trained

    monkeypatch.setattr(trained, "shipped_dir", lambda: tmp_path / "nothing")
    assert cli.main(["serve", "--tiny", "--port", "31005"]) == 2
    err = capsys.readouterr().err
    assert "no trained tiny model is shipped" in err and "(--tiny-random)" in err and launched == []
