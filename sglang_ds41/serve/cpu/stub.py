"""A stand-in `sgl_kernel` module for SGLang's CPU engine.

Always shadows any installed sgl-kernel: PyPI's is the CUDA build, whose ops cannot load
without libcuda, so on a CPU-only machine it has nothing to offer. The stand-in defines only
the ops SGLang imports unconditionally on CPU; `from sgl_kernel import <anything else>`
raises ImportError, which SGLang's optional imports expect. Speculative-decoding ops exist
(they are imported at module level) but raise when called: the shim does not implement them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

MODULE = "sgl_kernel"
STUB_VERSION = "0.0.0+sglang-ds41-cpu-shim"

# Imported at module level by SGLang's speculative-decoding helpers when is_cpu().
_UNSUPPORTED = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "sgl_build_tree_kernel_efficient_cpu",
    "sgl_verify_tree_greedy_cpu",
    "verify_tree_greedy_cpu",
)


def _unsupported(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: speculative decoding needs the CPU build of sgl-kernel, "
            "which the sglang-ds41 CPU shim does not provide"
        )

    op.__name__ = name
    return op


def _populate(module: types.ModuleType) -> None:
    from sglang_ds41.serve.cpu import ops

    module.__version__ = STUB_VERSION
    module.assign_req_to_token_pool_cpu = ops.assign_req_to_token_pool_cpu
    module.copy_all_layer_kv_cache_cpu = ops.copy_all_layer_kv_cache_cpu
    for name in _UNSUPPORTED:
        setattr(module, name, _unsupported(name))


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # default module object

    def exec_module(self, module: types.ModuleType) -> None:
        _populate(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None  # `sgl_kernel.x` then fails: the stand-in is not a package
        return importlib.machinery.ModuleSpec(MODULE, _Loader(), origin="sglang-ds41-cpu-shim")


def install() -> None:
    """Make `import sgl_kernel` give the stand-in (idempotent)."""
    if any(isinstance(finder, _Finder) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
    sys.modules.pop(MODULE, None)
