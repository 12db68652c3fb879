"""How `sglang-ds41 serve` builds the SGLang command line and environment (no server started)."""

import json
import sys

import pytest

from sglang_ds41.assets import TOKENIZER_DIR
from sglang_ds41.errors import Ds41Error
from sglang_ds41.serve import launcher as serve

CHUNKED = ["--chunked-prefill-size", "7"]


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV41ForCausalLM"]}))
    return tmp_path


def flags(launch) -> dict[str, list[str]]:
    """The launch_server flags as {flag: values}; asserts no flag is given twice."""
    assert launch.argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    items = serve.split_flags(launch.argv[3:])
    names = [item[0] for item in items]
    assert len(names) == len(set(names)), names
    return {item[0]: item[1:] for item in items}


def test_gpu_launch_is_plain_upstream_sglang_with_the_v41_parsers(model_dir):
    """On a GPU: upstream's own V4.1 model, found by SGLang itself; none of our backend's hooks."""
    launch = serve.build_launch(model_dir, gpu=True)
    got = flags(launch)
    assert got["--model-path"] == [str(model_dir)]
    assert got["--reasoning-parser"] == ["deepseek-v41"]
    assert got["--tool-call-parser"] == ["deepseekv41"]
    assert got["--host"] == ["127.0.0.1"] and got["--port"] == ["30000"]
    for own_backend_flag in ("--device", "--attention-backend", "--page-size", "--max-total-tokens"):
        assert own_backend_flag not in got
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in launch.env and "PYTHONPATH" not in launch.env
    assert "SGLANG_USE_CPU_ENGINE" not in launch.env
    assert not launch.cpu


def test_gpu_launch_passes_what_the_cpu_backend_refuses(model_dir):
    """DSpark and SGLang's KV formats are upstream's business on a GPU."""
    args = ["--speculative-algorithm", "DSPARK", "--kv-cache-dtype", "fp8_e4m3"]
    launch = serve.build_launch(model_dir, args, gpu=True)
    assert launch.argv[-4:] == args


def test_device_flag_picks_the_engine_whatever_the_machine(model_dir):
    assert not serve.build_launch(model_dir, ["--device", "cuda"], gpu=False).cpu
    assert serve.build_launch(model_dir, ["--device", "cpu"], gpu=True).cpu


def test_describe_prints_the_exact_command_and_environment(model_dir):
    launch = serve.build_launch(model_dir, ["--port", "31555"], gpu=False)
    text = serve.describe(launch)
    assert "own backend (CPU engine)" in text and "http://127.0.0.1:31555" in text
    env_line, command = text.splitlines()[-2:]
    assert env_line.endswith(" \\")
    assert command.strip().split() == launch.argv
    for key, value in launch.env.items():
        assert f"{key}={value}" in env_line


def test_cpu_launch_adds_the_cpu_engine_settings(model_dir):
    launch = serve.build_launch(model_dir, gpu=False)
    got = flags(launch)
    assert got["--device"] == ["cpu"]
    assert got["--attention-backend"] == ["torch_native"]
    assert got["--max-total-tokens"] == [str(serve.CPU_MAX_TOTAL_TOKENS)]
    assert got["--sleep-on-idle"] == []  # an idle server waits on its sockets instead of polling a core
    assert launch.env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert "SGLANG_CPU_OMP_THREADS_BIND" not in launch.env  # one rank needs no binding
    assert launch.cpu


def test_user_flags_replace_defaults_and_everything_else_passes_through(model_dir):
    launch = serve.build_launch(
        model_dir,
        ["--port=31234", "--max-total-tokens", "4096", "--disable-radix-cache", *CHUNKED],
        gpu=False,
    )
    got = flags(launch)
    assert got["--port"] == ["31234"] and launch.port == 31234
    assert got["--max-total-tokens"] == ["4096"]
    assert got["--disable-radix-cache"] == []
    assert got["--chunked-prefill-size"] == ["7"]
    assert launch.url == "http://127.0.0.1:31234"


def test_device_cpu_on_a_gpu_machine_selects_the_cpu_settings(model_dir):
    launch = serve.build_launch(model_dir, ["--device", "cpu"], gpu=True)
    assert launch.cpu and launch.env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert flags(launch)["--device"] == ["cpu"]


def test_tp_on_cpu_binds_each_rank_to_its_cores(model_dir):
    launch = serve.build_launch(model_dir, ["--tp", "2"], gpu=False, cpus=[0, 1, 2, 3])
    assert flags(launch)["--tp-size"] == ["2"]
    assert launch.env["SGLANG_CPU_OMP_THREADS_BIND"] == "0,1|2,3"


def test_omp_bind_shares_cores_when_ranks_outnumber_them():
    assert serve.omp_bind(2, [0, 1]) == "0|1"
    assert serve.omp_bind(4, [5, 3]) == "3|5|3|5"


def test_packaged_tokenizer_is_used_when_the_checkpoint_has_none(model_dir):
    assert flags(serve.build_launch(model_dir, gpu=True))["--tokenizer-path"] == [str(TOKENIZER_DIR)]
    (model_dir / "tokenizer.json").write_text("{}")
    assert "--tokenizer-path" not in flags(serve.build_launch(model_dir, gpu=True))


def test_all_interfaces_host_is_reached_through_loopback(model_dir):
    launch = serve.build_launch(model_dir, ["--host", "0.0.0.0", "--port", "1"], gpu=True)
    assert launch.url == "http://127.0.0.1:1"


def test_a_directory_without_config_is_refused(tmp_path):
    with pytest.raises(Ds41Error, match=r"no config\.json"):
        serve.build_launch(tmp_path, gpu=True)


def test_a_stray_value_before_any_flag_is_refused(model_dir):
    with pytest.raises(Ds41Error, match="expected an sglang flag"):
        serve.build_launch(model_dir, ["8000"], gpu=True)


def test_a_second_model_path_is_refused(model_dir):
    with pytest.raises(Ds41Error, match="the checkpoint is given twice"):
        serve.build_launch(model_dir, ["--model-path", "x"], gpu=True)


# ---- SGLang's habits -------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", [True, False])
def test_served_as_deepseek_v41_flash_with_cache_reports_on_both_engines(model_dir, gpu):
    launch = serve.build_launch(model_dir, gpu=gpu)
    got = flags(launch)
    assert (
        got["--served-model-name"] == ["DeepSeek-V4.1-Flash"]
        and launch.served_model_name == "DeepSeek-V4.1-Flash"
    )
    assert got["--enable-cache-report"] == []


def test_the_served_model_name_can_be_overridden(model_dir):
    launch = serve.build_launch(model_dir, ["--served-model-name", "mine"], gpu=False)
    assert flags(launch)["--served-model-name"] == ["mine"] and launch.served_model_name == "mine"


@pytest.mark.parametrize(
    ("args", "form"),
    [
        (["--model-path", "D", "--port", "1"], "space"),
        (["--port", "1", "--model=D"], "equals"),
        (["--model", "D", "--model-path", "D"], "the same twice"),
    ],
)
def test_take_model_path_reads_sglangs_spellings(args, form):
    assert serve.take_model_path(args) == ("D", ["--port", "1"] if form != "the same twice" else []), form


def test_take_model_path_refuses_two_different_or_no_value():
    with pytest.raises(Ds41Error, match="two checkpoints given"):
        serve.take_model_path(["--model-path", "A", "--model", "B"])
    with pytest.raises(Ds41Error, match="needs a value"):
        serve.take_model_path(["--model-path", "--port", "1"])


def test_cpu_computes_in_float32_like_generate_unless_told(model_dir, monkeypatch):
    from sglang_ds41.commands import generate

    parser = __import__("argparse").ArgumentParser()
    generate.add_arguments(parser)
    assert parser.get_default("dtype") == serve.CPU_DTYPE == "float32"  # the same greedy tokens
    monkeypatch.delenv("SGLANG_DS41_DTYPE", raising=False)
    assert serve.build_launch(model_dir, gpu=False).env["SGLANG_DS41_DTYPE"] == "float32"
    assert "SGLANG_DS41_DTYPE" not in serve.build_launch(model_dir, ["--dtype", "bfloat16"], gpu=False).env
    assert "SGLANG_DS41_DTYPE" not in serve.build_launch(model_dir, gpu=True).env
    monkeypatch.setenv("SGLANG_DS41_DTYPE", "float64")  # the user's own choice reaches the server as is
    assert "SGLANG_DS41_DTYPE" not in serve.build_launch(model_dir, gpu=False).env


# ---- the GPU check without torch ------------------------------------------------------------


def test_has_gpu_reads_the_nvidia_device_files(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    dev, proc = tmp_path / "dev", tmp_path / "gpus"
    dev.mkdir()
    (dev / "nvidiactl").touch()  # the driver without a device is no GPU
    (dev / "nvidia-uvm").touch()
    assert not serve.has_gpu(dev, proc)
    (dev / "nvidia0").touch()
    assert serve.has_gpu(dev, proc)
    (dev / "nvidia0").unlink()
    proc.mkdir()
    assert not serve.has_gpu(dev, proc)
    (proc / "0000:01:00.0").mkdir()
    assert serve.has_gpu(dev, proc)
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not serve.has_gpu(dev, proc)


def test_this_machine_has_no_gpu_by_either_check():
    """The CI box: no device files, and torch (imported here anyway) agrees."""
    import torch

    assert serve.has_gpu() == torch.cuda.is_available()


# ---- validation before launch ---------------------------------------------------------------


def test_validate_checkpoint_describes_a_good_one_and_names_what_is_wrong(tmp_path):
    from sglang_ds41.checkpoint.reader import CheckpointError
    from sglang_ds41.checkpoint.scripted import write_scripted_checkpoint

    assert serve.validate_checkpoint(write_scripted_checkpoint(tmp_path / "s")) == "the scripted test model"
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        serve.validate_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="not a directory"):
        serve.validate_checkpoint(tmp_path / "absent")
    shard = tmp_path / "s" / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:20])
    with pytest.raises(CheckpointError, match=r"model\.safetensors is truncated"):
        serve.validate_checkpoint(tmp_path / "s")


# ---- the environment check ------------------------------------------------------------------


def test_without_sglang_serve_prints_the_exact_install_command(monkeypatch):
    real = serve.installed_version
    monkeypatch.setattr(serve, "installed_version", lambda name: None if name == "sglang" else real(name))
    with pytest.raises(Ds41Error) as cpu_error:
        serve.check_environment(cpu=True)
    text = str(cpu_error.value)
    assert "SGLang is not installed" in text
    assert f"{sys.executable} -m pip install" in text and "[serve]" in text
    assert f"{sys.executable} -m pip install --no-deps sglang==0.5.23" in text
    with pytest.raises(Ds41Error) as gpu_error:
        serve.check_environment(cpu=False)
    assert "[gpu]" in str(gpu_error.value) and "constraints/gpu-cu13.txt" in str(gpu_error.value)


def test_another_sglang_release_is_named(monkeypatch):
    real = serve.installed_version
    monkeypatch.setattr(serve, "installed_version", lambda name: "0.5.9" if name == "sglang" else real(name))
    with pytest.raises(
        Ds41Error, match=r"sglang 0\.5\.9 is installed; sglang-ds41 serves with sglang 0\.5\.23"
    ):
        serve.check_environment(cpu=True)


def test_a_missing_serve_extra_package_is_named(monkeypatch):
    real = serve.installed_version
    monkeypatch.setattr(serve, "installed_version", lambda name: None if name == "xgrammar" else real(name))
    with pytest.raises(Ds41Error, match=r"needs the serve extra; .*xgrammar==0\.2\.7"):
        serve.check_environment(cpu=True)
    serve.check_environment(cpu=False)  # upstream on GPUs brings its own dependencies


def test_this_environment_can_serve_on_the_cpu():
    serve.check_environment(cpu=True)
    assert serve.missing_serve_requirements() == []


# ---- the quiet start log --------------------------------------------------------------------


def test_log_excerpt_is_the_last_traceback(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text(
        "noise\nTraceback (most recent call last):\n  old\nValueError: first\n"
        "more noise\nTraceback (most recent call last):\n  File x\nRuntimeError: the cause\n"
    )
    assert serve.log_excerpt(log) == "Traceback (most recent call last):\n  File x\nRuntimeError: the cause"
    log.write_text("\n".join(f"line {i}" for i in range(100)))
    assert serve.log_excerpt(log, max_lines=3) == "line 97\nline 98\nline 99"


def test_wait_ready_reports_a_taken_port_and_an_early_exit_from_the_log(tmp_path):
    import subprocess

    log = tmp_path / "serve.log"
    log.write_text(f"ERROR: [Errno 98] {serve.BIND_FAILED} ('127.0.0.1', 1): address already in use\n")
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(Ds41Error, match="the port is in use"):
            serve.wait_ready("http://127.0.0.1:1", alive, timeout_s=10, log_path=log)
    finally:
        alive.kill()
        alive.wait()
    log.write_text("Traceback (most recent call last):\n  File y\nOSError: no weights\n")
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    with pytest.raises(
        Ds41Error, match=r"exited with code 3 before it was ready; its log: .*\nTraceback"
    ) as error:
        serve.wait_ready("http://127.0.0.1:1", dead, timeout_s=10, log_path=log)
    assert str(error.value).endswith("OSError: no weights")
