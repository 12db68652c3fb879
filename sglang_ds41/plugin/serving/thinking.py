"""One thinking decision per V4.1 request, used by the prompt, the parser and the grammar
(docs/ENCODING.md §4.4).

SGLang 0.5.23 decides "thinking" twice for a `dsv41` server, and the two disagree:

* the prompt and the output parser ask `OpenAIServingChat._thinking_requested`:
  `chat_template_kwargs["thinking"]`, else `SGLANG_DEFAULT_THINKING` (on under
  `sglang-ds41 serve`, as DeepSeek's API);
* the scheduler asks `_get_reasoning_from_request` (the request's `require_reasoning`): for the
  `deepseek-v41` reasoning parser (`reasoning_default="explicit_thinking"`) only an explicit
  `chat_template_kwargs={"thinking": true}` counts.

So under the server default the prompt thinks while the grammar of `response_format` /
`tool_choice` constrains from the first generated token (the reasoning), and reasoning tokens
are not counted. Neither reads DeepSeek's own `thinking` field. The fix decides once, as
DeepSeek's API does, and writes the decision into `chat_template_kwargs["thinking"]`, which
both upstream readers then agree on; `require_reasoning` makes SGLang's `ReasonerGrammarBackend`
apply the grammar only after `</think>` and count the reasoning tokens.

The decision, first match wins:

1. DeepSeek's `thinking` field: `{"type": "enabled" | "adaptive"}` on, `{"type": "disabled"}`
   off (any `reasoning_effort` then ignored, as DeepSeek's API does); anything else is a 400;
2. `chat_template_kwargs["thinking"]` (SGLang sets it from `reasoning_effort`: "none" off,
   any other effort on);
3. the server's `--default-chat-template-kwargs` `thinking`, else `SGLANG_DEFAULT_THINKING`.

Our `reasoning_budget` extension (integer 1-100, as `sglang-ds41 render`): the number on the
prompt's `Reasoning Effort:` line, through SGLang's integer-effort splice; it needs thinking
on (else a 400) and overrides `reasoning_effort`. The field rules and their error texts are the
client's (`encoding/reasoning.py`).

Hooks (AROUND, V4.1 servers only: `dsv41` spec with the `deepseek-v41` reasoning parser):
`OpenAIServingChat.handle_request` (reads `reasoning_budget` from the request body, answers a
bad field with a 400) and `OpenAIServingChat._process_messages`, where every prompt is rendered
(also for SGLang's Anthropic endpoint, which converts without `handle_request`, and for the
Responses API, which renders from a chat request of its own).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from sglang_ds41.encoding import reasoning
from sglang_ds41.encoding.errors import EncodingError

CHAT = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
SPEC = "dsv41"
REASONING_PARSER = "deepseek-v41"
BUDGET_PARAM = reasoning.THINKING_TOKEN_BUDGET  # custom_params key the scheduler reads (thinking_budget.py)


def decide(
    thinking_field: Any,
    chat_template_kwargs: Mapping[str, Any] | None,
    server_kwargs: Mapping[str, Any] | None,
    server_default: bool,
) -> tuple[bool, str]:
    """The request's thinking mode (see the module docstring for the order) and what decided it."""
    explicit = reasoning.thinking_from_field(thinking_field)
    if explicit is not None:
        return explicit, "thinking.type is disabled"
    for kwargs, where in ((chat_template_kwargs, "chat_template_kwargs"), (server_kwargs, "server")):
        if kwargs and kwargs.get("thinking") is not None:
            on = bool(kwargs["thinking"])
            if where == "server":
                return on, "the server's --default-chat-template-kwargs say thinking false"
            return on, "chat_template_kwargs.thinking is false, or reasoning_effort is none"
    return bool(server_default), "the server's default is off"


def budget_from_body(body: Any) -> int | None:
    """`reasoning_budget` of a request body (a dict), validated; None when absent."""
    if not isinstance(body, Mapping):
        return None
    return reasoning.reasoning_budget(body.get(reasoning.REASONING_BUDGET))


def serves_v41(serving: Any) -> bool:
    return (
        getattr(serving, "chat_encoding_spec", None) == SPEC
        and getattr(serving, "reasoning_parser", None) == REASONING_PARSER
    )


def settle(serving: Any, request: Any, budget: int | None = None, token_budget: int | None = None) -> bool:
    """Decide the request's thinking mode and write it, and its budgets, where SGLang reads
    them. `budget` / `token_budget` are the body's `reasoning_budget` / `thinking_token_budget`
    (SGLang's request model keeps neither)."""
    from sglang.srt.environ import envs

    on, off_because = decide(
        request.thinking,
        request.chat_template_kwargs,
        serving.default_chat_template_kwargs,
        envs.SGLANG_DEFAULT_THINKING.get(),
    )
    kwargs = {**(request.chat_template_kwargs or {}), "thinking": on}
    if budget is not None:
        reasoning.check_budget_has_thinking(budget, on, off_because)
        # SGLang moves chat_template_kwargs["reasoning_effort"] to the request's effort, whose
        # integer form is spliced into the prompt's effort line (deepseek_recipe_renderer).
        kwargs["reasoning_effort"] = budget
    request.chat_template_kwargs = kwargs
    if on:
        _settle_token_budget(request, token_budget)
    return on


def _settle_token_budget(request: Any, token_budget: int | None) -> None:
    """The thinking token budget of a thinking request, first found: the body's, one already
    settled, `chat_template_kwargs`' (the paths without `handle_request`), the server's default;
    written to `custom_params` for the scheduler (`thinking_budget.py`)."""
    params = dict(request.custom_params or {})
    if token_budget is None:
        token_budget = params.get(BUDGET_PARAM)
    if token_budget is None:
        token_budget = reasoning.request_token_budget({"chat_template_kwargs": request.chat_template_kwargs})
    source = reasoning.THINKING_TOKEN_BUDGET
    if token_budget is None:
        token_budget = reasoning.server_token_budget(os.environ)
        source = reasoning.THINKING_TOKEN_BUDGET_ENV
    if token_budget is None:
        return
    from sglang.srt.runtime_context import get_exec

    grammar_backend = get_exec().kernel.grammar_backend or "xgrammar"  # SGLang's default
    if grammar_backend != "xgrammar":
        raise EncodingError(
            f"{source} is enforced through the xgrammar grammar backend's token filter, but this "
            f"server runs --grammar-backend {grammar_backend}"
        )
    request.custom_params = {**params, BUDGET_PARAM: token_budget}


_BODY_FIELDS = (reasoning.REASONING_BUDGET.encode(), reasoning.THINKING_TOKEN_BUDGET.encode())


async def _body(raw_request: Any) -> Any:
    if raw_request is None:
        return None
    raw = await raw_request.body()  # Starlette keeps the body FastAPI already read
    if not any(field in raw for field in _BODY_FIELDS):
        return None
    return json.loads(raw)


def handle_request(original, self, request, raw_request=None, *args, **kwargs):
    """AROUND `OpenAIServingChat.handle_request` (a coroutine function)."""
    if not serves_v41(self):
        return original(self, request, raw_request, *args, **kwargs)

    async def handle():
        try:
            body = await _body(raw_request)
            settle(self, request, budget_from_body(body), reasoning.request_token_budget(body))
        except EncodingError as error:
            return self.create_error_response(str(error))
        return await original(self, request, raw_request, *args, **kwargs)

    return handle()


def process_messages(original, self, request, *args, **kwargs):
    """AROUND `OpenAIServingChat._process_messages`, where every prompt is rendered and its
    `require_reasoning` (where the output parse starts) is set: also the paths without
    `handle_request` (the Anthropic endpoint; the Responses API, whose chat request carries
    `reasoning.effort` as `reasoning_effort`). Settling twice gives the same decision."""
    if serves_v41(self):
        settle(self, request)
    return original(self, request, *args, **kwargs)


HOOKS = {
    f"{CHAT}.handle_request": handle_request,
    f"{CHAT}._process_messages": process_messages,
}
