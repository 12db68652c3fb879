"""sglang-ds41's SGLang plugin: upstream SGLang's own V4.1 model with our Engram table formats.

Installed as the entry point `sglang_ds41` of the group `sglang.srt.plugins`, so every SGLang
process (`python -m sglang.launch_server`, the scheduler and TP workers, the detokenizer)
calls `register` through `sglang.srt.plugins.load_plugins()` before the model is built. It
registers one `HookRegistry` REPLACE hook: upstream's `EngramEmbedding` becomes
`engram_embedding.Ds41EngramEmbedding`, which serves MXFP4 tables (and FP8 ones unchanged).
Nothing else of upstream is swapped.

Importing this package is free: SGLang is imported only when `register` runs, so the project's
GPU check scripts and CPU tools never pay for it. `SGLANG_PLUGINS` (SGLang's own allow-list)
turns the plugin off.
"""

from __future__ import annotations

PLUGIN_NAME = "sglang_ds41"


def register() -> None:
    """Entry point: hook our Engram table class into upstream SGLang (checks the upstream first)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_ds41.plugin.engram_embedding import TARGET, Ds41EngramEmbedding

    HookRegistry.register(TARGET, Ds41EngramEmbedding, HookType.REPLACE)
