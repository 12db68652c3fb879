"""Patches applied inside every SGLang server process that `sglang-ds41 serve` starts.

They run from `_pythonpath/sitecustomize.py` (the serve command puts that folder on
PYTHONPATH, and SGLang's scheduler, detokenizer and TP ranks inherit it), before SGLang is
imported, so each patch waits for its target module with an import hook.

* On a CPU-only machine (`SGLANG_USE_CPU_ENGINE=1`): the `sgl_kernel` CPU-op shim (`cpu/`), and
  each rank bound to its cores with one torch thread per core (`cpu/threads.py`), which SGLang
  does only with sgl-kernel's AMX / arm64 build.
* Always: keep our architecture names. SGLang 0.5.23 maps a `deepseek_v41` config whose
  architectures are exactly `["DeepseekV41ForCausalLM"]` to its own CUDA-only
  `DeepseekV4ForCausalLM` (`normalize_deepseek_v41_config` in `srt/configs/deepseek_v41.py`);
  the patch undoes that rename so the model registry finds our backend.
* Always: the sliding-window pool (`window_pool_fields`), so the window KV of old tokens is freed,
  and its geometry (`use_slot_row_geometry`): SGLang sizes and allocates its full and SWA pools
  from ModelConfig's head dims, so V41 gives it one K row per token of exactly our packed rows
  (894 B full side, 528 B per layer of window for the official dims) and no V rows; the model
  keeps its state in those buffers, and SGLang's memory sizing counts the real bytes.
* Always: quantization. Our backend reads the checkpoint's FP8 / MXFP4 / NVFP4 tensors itself
  (the shared loader dequantises), so SGLang must not build its own quantization config from
  `quantization_config` / `hf_quant_config.json` (it would refuse float32 and expect its own
  linear layers): for our architectures the parsed HF quantization config is None.
* Always: images. SGLang picks the multimodal processor by architecture name, and registers
  its V4.1 image processor only under `DeepseekV4ForCausalLM`; a V4.1 checkpoint (it has a
  vision tower) under our name gets that processor too.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable
from types import ModuleType

from sglang_ds41.backend.architectures import OUR_ARCHITECTURES, V41

V41_CONFIG_MODULE = "sglang.srt.configs.deepseek_v41"
MM_PROCESSOR_MODULE = "sglang.srt.managers.multimodal_processor"
MODEL_CONFIG_MODULE = "sglang.srt.configs.model_config"
BOOTSTRAP_MODULE = "sglang.srt.distributed.bootstrap"


def keep_architectures(normalize: Callable[[dict], dict]) -> Callable[[dict], dict]:
    """Wrap SGLang's V4.1 config normaliser so that our architecture names survive it."""

    def normalize_keeping_ours(values):
        given = dict(values).get("architectures")
        out = normalize(values)
        if given and given[0] in OUR_ARCHITECTURES:
            out["architectures"] = list(given)
            if given[0] == V41:  # the scripted test model keeps no attention state
                out.update(window_pool_fields(out))
        return out

    normalize_keeping_ours.__wrapped__ = normalize
    return normalize_keeping_ours


def window_pool_fields(config: dict) -> dict:
    """Opt in to SGLang's hybrid sliding-window pool: every layer but layer 0 is a "SWA" layer,
    so SGLang keeps window KV only for the last window of each request and cached prefix (its
    radix cache cuts a prefix hit back to where the window is still whole). `--disable-hybrid-
    swa-memory` turns it off again (the window KV is then kept for every token)."""
    layers = int(config.get("num_hidden_layers") or 0)
    if layers < 2:
        return {}
    return {"is_hybrid_swa": True, "hybrid_layer_pattern": [0] + [1] * (layers - 1)}


def _patch_v41_config(module: ModuleType) -> None:
    module.normalize_deepseek_v41_config = keep_architectures(module.normalize_deepseek_v41_config)


def _patch_mm_processor(module: ModuleType) -> None:
    find = module.get_mm_processor_cls

    def get_mm_processor_cls(hf_config, model_config=None):
        found = find(hf_config, model_config)
        if found is None and V41 in (getattr(hf_config, "architectures", None) or []):
            from sglang.srt.multimodal.processors.deepseek_v41 import DeepseekV41ImageProcessor

            return DeepseekV41ImageProcessor
        return found

    module.get_mm_processor_cls = get_mm_processor_cls


def use_slot_row_geometry(model_config) -> None:
    """Give a hybrid-SWA V41 ModelConfig the KV geometry of our slot rows (one K "head" per
    token, in elements of the model dtype, which SGLang's `--kv-cache-dtype auto` stores; no V):
    the full layer's K row holds a slot's token id + compressed-entry pieces, each SWA layer's
    K row that layer's packed window KV."""
    import torch

    from sglang_ds41.backend.kv_state import slot_row_geometry
    from sglang_ds41.config import V41Config

    cfg = V41Config.from_file(os.path.join(model_config.model_path, "config.json")).text
    element = torch.empty((), dtype=model_config.dtype).element_size()
    model_config.head_dim, model_config.swa_head_dim = slot_row_geometry(cfg, element)
    model_config.v_head_dim = model_config.swa_v_head_dim = 0
    text = model_config.hf_text_config
    text.num_key_value_heads = text.swa_num_key_value_heads = 1
    text.v_head_dim = text.swa_v_head_dim = 0
    text.swa_head_dim = model_config.swa_head_dim
    model_config.is_hybrid_swa_compress = True  # SGLang passes the per-pool dims only then


def _patch_model_config(module: ModuleType) -> None:
    parse = module.ModelConfig._parse_quant_hf_config
    init = module.ModelConfig.__init__

    def _parse_quant_hf_config(self):
        if (getattr(self.hf_config, "architectures", None) or [None])[0] in OUR_ARCHITECTURES:
            return None
        return parse(self)

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        architectures = getattr(self.hf_config, "architectures", None) or [None]
        if architectures[0] == V41 and getattr(self, "is_hybrid_swa", False):
            use_slot_row_geometry(self)

    module.ModelConfig._parse_quant_hf_config = _parse_quant_hf_config
    module.ModelConfig.__init__ = __init__


def _patch_cpu_threads(module: ModuleType) -> None:
    """Without sgl-kernel's AMX / arm64 build, SGLang's per-rank core binding is a warning:
    bind the rank ourselves (`cpu.threads.bind`)."""
    init = module._init_cpu_threads_env

    def _init_cpu_threads_env(*, local_omp_cpuid=None, dist_init_method=None):
        if module._is_cpu_amx_available or module._is_cpu_arm64:
            return init(local_omp_cpuid=local_omp_cpuid, dist_init_method=dist_init_method)
        from sglang_ds41.serve.cpu.threads import bind

        bind(local_omp_cpuid)

    _init_cpu_threads_env.__wrapped__ = init
    module._init_cpu_threads_env = _init_cpu_threads_env


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    V41_CONFIG_MODULE: _patch_v41_config,
    MM_PROCESSOR_MODULE: _patch_mm_processor,
    MODEL_CONFIG_MODULE: _patch_model_config,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after `name` is executed, before anyone imports from it."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def install() -> None:
    """Install the patches this process needs (idempotent; cheap: imports nothing heavy)."""
    if any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    patches = dict(PATCHES)
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        from sglang_ds41.serve import cpu

        cpu.install()
        patches[BOOTSTRAP_MODULE] = _patch_cpu_threads
    for name, patch in patches.items():
        if name in sys.modules:
            patch(sys.modules[name])
        else:
            sys.meta_path.insert(0, _AfterImport(name, patch))
