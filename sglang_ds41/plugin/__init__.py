"""sglang-ds41's SGLang plugin: upstream SGLang's own V4.1 model with our Engram table formats.

Installed as the entry point `sglang_ds41` of the group `sglang.srt.plugins`, so every SGLang
process (`python -m sglang.launch_server`, the scheduler and TP workers, the detokenizer)
calls `register` through `sglang.srt.plugins.load_plugins()` before the model is built (the
main process, which runs the OpenAI serving layer, calls it too). It registers `HookRegistry`
hooks:

* REPLACE: upstream's `EngramEmbedding` becomes `engram_embedding.Ds41EngramEmbedding`, which
  serves MXFP4 tables (and FP8 ones unchanged);
* AROUND (`parsers.py`): a V4.1 server's chat output is parsed by our token-aware parser, and
  malformed calls come as the `invalid_tool_calls` extension field, never as `tool_calls`;
* AROUND (`responses.py`): the Responses API's output goes through the same parser; malformed
  calls come as `function_call` items with `status: "incomplete"`;
* AROUND (`text_endpoints.py`): so do `/separate_reasoning` and `/parse_function_call` (text
  in; a malformed call carries an `error` field);
* AROUND (`thinking.py`): one thinking decision per V4.1 request (DeepSeek's `thinking` field,
  `reasoning_effort`, our `reasoning_budget`, the server default) for prompt, parser and
  grammar, so `response_format` / `tool_choice` constrain the answer after the reasoning;
  and each request's `thinking_token_budget` (or the server default) for the scheduler;
* AROUND (`thinking_budget.py`, in the scheduler): that budget enforced through SGLang's
  reasoning grammar object, which forces `</think>` when it is spent;
* AROUND (`grammar_compile.py`): the grammar of a V4.1 tool choice is compiled token-exact, its
  DSML tags the DSML token (`call_grammar.py`), so a constrained call is always one our parser
  reads as a call.

The AROUND hooks act only for V4.1: the serving hooks for the V4.1 chat encoding with the V4.1
parsers, the grammar hook for tags of V4.1 calls on the V4.1 vocabulary. SGLang serves every
other model as before. Nothing else of upstream is swapped.

Importing this package is free: SGLang is imported only when `register` runs, so the project's
GPU check scripts and CPU tools never pay for it. `SGLANG_PLUGINS` (SGLang's own allow-list)
turns the plugin off.
"""

from __future__ import annotations

PLUGIN_NAME = "sglang_ds41"


def register() -> None:
    """Entry point: hook our Engram table class, V4.1 output parser and thinking decision into
    upstream SGLang (importing `engram_embedding` checks the whole upstream surface first)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    # Importing engram_embedding checks upstream; the serving hooks bind upstream names at import.
    from sglang_ds41.plugin.engram_embedding import TARGET, Ds41EngramEmbedding

    HookRegistry.register(TARGET, Ds41EngramEmbedding, HookType.REPLACE)
    from sglang_ds41.plugin import (
        grammar_compile,
        parsers,
        responses,
        text_endpoints,
        thinking,
        thinking_budget,
    )

    for hooks in (
        thinking.HOOKS,
        thinking_budget.HOOKS,
        parsers.HOOKS,
        responses.HOOKS,
        text_endpoints.HOOKS,
        grammar_compile.HOOKS,
    ):
        for target, hook in hooks.items():
            HookRegistry.register(target, hook, HookType.AROUND)
