"""What `serve` and the launch hooks do for the real V4.1 backend."""

from __future__ import annotations

import json
import types

import pytest

from sglang_ds41.backend.architectures import V41
from sglang_ds41.errors import Ds41Error
from sglang_ds41.serve import launch_hooks
from sglang_ds41.serve import launcher as serve


def _checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [V41]}))
    return tmp_path


def test_serve_defaults_to_an_even_page_size_for_ratio_2_slots(tmp_path):
    items = serve.split_flags(serve.build_launch(_checkpoint(tmp_path), gpu=False).argv[3:])
    assert serve.flag_value(items, "--page-size") == "2"


def test_a_user_page_size_replaces_ours(tmp_path):
    launch = serve.build_launch(_checkpoint(tmp_path), ["--page-size", "64"], gpu=False)
    assert serve.flag_value(serve.split_flags(launch.argv[3:]), "--page-size") == "64"


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--kv-cache-dtype", "fp8_e4m3"], "its own formats"),
        (["--enable-hierarchical-cache"], "layer 0's window rows"),
        (["--enable-lmcache"], "layer 0's window rows"),
        (["--disaggregation-mode", "prefill"], "layer 0's window rows"),
        (["--speculative-algorithm", "EAGLE"], "no draft model"),
    ],
)
def test_features_that_would_lose_or_misread_the_state_are_refused_before_launch(tmp_path, flags, why):
    refusal = rf"^{flags[0]}.*: not supported for V4.1 by the CPU backend: .*{why}"
    with pytest.raises(Ds41Error, match=refusal):
        serve.build_launch(_checkpoint(tmp_path), flags, gpu=False)


def test_harmless_values_of_those_flags_pass(tmp_path):
    flags = ["--kv-cache-dtype", "auto", "--disaggregation-mode", "null"]
    argv = serve.build_launch(_checkpoint(tmp_path), flags, gpu=False).argv
    assert argv[-4:] == flags


def test_sglang_sees_no_quantization_config_for_our_architecture_only():
    class ModelConfig:
        def __init__(self, arch):
            self.hf_config = types.SimpleNamespace(architectures=[arch])

        def _parse_quant_hf_config(self):
            return {"quant_method": "fp8"}

    module = types.SimpleNamespace(ModelConfig=ModelConfig)
    launch_hooks._patch_model_config(module)
    assert module.ModelConfig(V41)._parse_quant_hf_config() is None
    assert module.ModelConfig("LlamaForCausalLM")._parse_quant_hf_config() == {"quant_method": "fp8"}


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "xpu"])
def test_own_backend_refuses_a_gpu_device_and_names_the_engine_to_use(device):
    from sglang_ds41.backend.model import BackendError, refuse_gpu_device

    refusal = rf"does not serve on --device {device}.*upstream SGLang's V4.1 model"
    with pytest.raises(BackendError, match=refusal):
        refuse_gpu_device(device)
    refuse_gpu_device("cpu")


def test_sglang_building_our_model_on_cuda_gets_that_refusal(tmp_path):
    """Through SGLang's own server-args context, as in a scheduler process."""
    from sglang.srt.runtime_context import get_context

    from sglang_ds41.backend.model import BackendError, DeepseekV41ForCausalLM

    with (
        get_context().override_server_args(model_path=str(_checkpoint(tmp_path)), device="cuda"),
        pytest.raises(BackendError, match="does not serve on --device cuda"),
    ):
        DeepseekV41ForCausalLM(config=None)
