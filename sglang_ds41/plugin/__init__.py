"""sglang-ds41's SGLang plugin: upstream SGLang's own V4.1 model with our Engram table formats.

Installed as the entry point `sglang_ds41` of the group `sglang.srt.plugins`, so every SGLang
process (`python -m sglang.launch_server`, the scheduler and TP workers, the detokenizer)
calls `register` through `sglang.srt.plugins.load_plugins()` before the model is built (the
main process, which runs the OpenAI serving layer, calls it too). It registers `HookRegistry`
hooks for two jobs, one sub-package each:

* `tables/` (REPLACE): upstream's `EngramEmbedding` becomes `tables.embedding.Ds41EngramEmbedding`,
  which serves MXFP4 and NVFP4 tables (and FP8 ones unchanged);
* `serving/` (AROUND): a V4.1 server's OpenAI surface -- chat, the Responses API, the text
  endpoints -- reads the model's output with our token-aware parser (malformed calls never come
  as `tool_calls`), decides thinking once per request, enforces its thinking token budget,
  compiles tool-call grammars token-exact and encodes prompts incrementally; each hook acts
  only for V4.1.

`upstream.py` is what both rely on: the check, at import, that the installed SGLang is the
0.5.23 they were written against. Nothing else of upstream is swapped; SGLang serves every
other model as before.

Importing this package is free: SGLang is imported only when `register` runs, so the project's
GPU check scripts and CPU tools never pay for it. `SGLANG_PLUGINS` (SGLang's own allow-list)
turns the plugin off.
"""

from __future__ import annotations

PLUGIN_NAME = "sglang_ds41"


def register() -> None:
    """Entry point: hook our Engram table class, then the V4.1 serving hooks, into upstream SGLang
    (the table class's import checks the whole upstream surface first)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_ds41.plugin import serving, tables

    for target, replacement in tables.replacements().items():
        HookRegistry.register(target, replacement, HookType.REPLACE)
    for target, hook in serving.hooks().items():
        HookRegistry.register(target, hook, HookType.AROUND)
