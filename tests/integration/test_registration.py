"""Our architectures resolve to our classes inside SGLang (config loader + model registry),
checked in fresh interpreters set up the way `sglang-ds41 serve` sets up the server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_ds41.backend import serve

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent.parent / "fixtures"

PROBE = """
import json, sys
from sglang.srt.utils.hf_transformers import get_config
config = get_config(sys.argv[1], trust_remote_code=False)
out = {"architectures": list(config.architectures)}
if sys.argv[2] == "resolve":
    from sglang.srt.models.registry import ModelRegistry
    cls, arch = ModelRegistry.resolve_model_cls(config.architectures)
    out.update(module=cls.__module__, name=cls.__name__)
    try:
        cls(config)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def probe(model_dir: Path, patched: bool) -> dict:
    launch = serve.build_launch(model_dir, gpu=False)
    env = {**os.environ, **launch.env}
    if not patched:  # drop our sitecustomize folder (the first PYTHONPATH entry)
        env["PYTHONPATH"] = os.pathsep.join(env["PYTHONPATH"].split(os.pathsep)[1:])
    argv = [sys.executable, "-c", PROBE, str(model_dir), "resolve" if patched else "config"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def official_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("official")
    shutil.copyfile(FIXTURES / "official_config.json", out / "config.json")
    return out


def test_official_config_resolves_to_our_backend(official_dir):
    got = probe(official_dir, patched=True)
    assert got["architectures"] == ["DeepseekV41ForCausalLM"]
    assert (got["module"], got["name"]) == ("sglang_ds41.backend.model", "DeepseekV41ForCausalLM")
    # built outside a server it cannot find the server's arguments (model path, page size)
    assert "server args" in got["error"]


def test_without_our_patch_sglang_renames_v41_to_its_own_v4_model(official_dir):
    # why launch_hooks exists: SGLang 0.5.23 maps our architecture to its CUDA-only V4 model
    assert probe(official_dir, patched=False)["architectures"] == ["DeepseekV4ForCausalLM"]


def test_scripted_config_resolves_to_the_scripted_model(tmp_path):
    from sglang_ds41.backend.scripted import write_scripted_checkpoint

    got = probe(write_scripted_checkpoint(tmp_path / "scripted"), patched=True)
    assert (got["module"], got["name"]) == ("sglang_ds41.backend.scripted", "DeepseekV41ScriptedForCausalLM")
