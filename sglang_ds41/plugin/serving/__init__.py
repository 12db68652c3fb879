"""The plugin's serving hooks: what a V4.1 server's OpenAI surface does with V4.1's encoding
(docs/ENCODING.md §4.4). AROUND hooks, each acting only for V4.1 (the V4.1 chat encoding with
the V4.1 parsers, or tags of V4.1 calls on the V4.1 vocabulary):

* `parsers.py`: the chat output is parsed by our token-aware parser (`served_output.py`), and
  malformed calls come as the `invalid_tool_calls` extension field, never as `tool_calls`;
* `responses.py`: the Responses API's output goes through the same parser; malformed calls
  come as `function_call` items with `status: "incomplete"`;
* `text_endpoints.py`: so do `/separate_reasoning` and `/parse_function_call` (text in; a
  malformed call carries an `error` field);
* `thinking.py`: one thinking decision per request (DeepSeek's `thinking` field,
  `reasoning_effort`, our `reasoning_budget`, the server default) for prompt, parser and
  grammar, so `response_format` / `tool_choice` constrain the answer after the reasoning; and
  each request's `thinking_token_budget` (or the server default) for the scheduler;
* `thinking_budget.py` (in the scheduler): that budget enforced through SGLang's reasoning
  grammar object, which forces `</think>` when it is spent;
* `prompt_encoding.py`: a prompt is encoded incrementally, reusing the ids of an earlier
  request whose settings and first messages it repeats (the same ids as upstream's);
* `grammar_compile.py`: the grammar of a V4.1 tool choice is compiled token-exact, its DSML
  tags the DSML token (`call_grammar.py`), so a constrained call is always one our parser reads
  as a call.

Importing this package imports no SGLang; `hooks()` does, after the upstream check.
"""

from __future__ import annotations

from collections.abc import Callable


def hooks() -> dict[str, Callable]:
    """Upstream target -> our AROUND hook, for every serving hook. The modules bind upstream
    names at import, so the caller has checked the upstream surface first (`plugin.register`)."""
    from sglang_ds41.plugin.serving import (
        grammar_compile,
        parsers,
        prompt_encoding,
        responses,
        text_endpoints,
        thinking,
        thinking_budget,
    )

    out: dict[str, Callable] = {}
    for module in (
        thinking,
        thinking_budget,
        parsers,
        responses,
        text_endpoints,
        grammar_compile,
        prompt_encoding,
    ):
        out.update(module.HOOKS)
    return out
