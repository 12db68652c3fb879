"""How `sglang-ds41 serve` builds the SGLang command line and environment (no server started)."""

import json
import sys

import pytest

from sglang_ds41.assets import TOKENIZER_DIR
from sglang_ds41.backend import serve
from sglang_ds41.errors import Ds41Error

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


def test_model_path_flag_is_refused(model_dir):
    with pytest.raises(Ds41Error, match="MODEL_DIR"):
        serve.build_launch(model_dir, ["--model-path", "x"], gpu=True)
