"""V4.1 prompts encoded incrementally on the server (docs/ENCODING.md §10.3).

SGLang 0.5.23 renders a `dsv41` chat request in the TokenizerManager process:
`DeepSeekRecipeChatEncodingAdapter.encode_messages` builds a body from the request and hands it
to `DeepSeekRecipe.encode`, which rewrites it for deepseek-recipe (`pre_normalize`), renders and
tokenizes the whole conversation with the wheel, collects the image URLs, and splices an
integer reasoning effort and a quick-instruction task into the ids. An agent's history is
rendered again on every turn (167 ms for a 131k-token one).

An AROUND hook on `DeepSeekRecipe.encode` (V4.1 spec only) keeps everything of that but the
rendering: the body is rewritten by upstream's own rules, the prompt comes from our
`IncrementalEncoder` (one per `DeepSeekRecipe`, with the server's tokenizer), which reuses the
ids of an earlier request whose settings and first messages this one repeats byte for byte,
and upstream's own methods splice the effort and the task. The ids equal upstream's for every
request (tests/plugin/test_prompt_encoding.py); a request our encoder refuses goes to upstream's
own method, which answers with the wheel's error.

`SGLANG_DS41_INCREMENTAL_ENCODING=0` (`sglang-ds41 serve --no-incremental-encoding`) turns the hook
off; `SGLANG_DS41_PROMPT_CACHE_MIB` caps its cache (default 512; 0: no reuse, every request is
encoded from the start by our encoder). `sglang-ds41 serve` refuses a bad value of either before
it starts SGLang; a plain `launch_server` logs the error at the first request and leaves
encoding to upstream (SGLang would drop the whole plugin if its registration raised).
"""

from __future__ import annotations

import json
import logging
import math
import os
import weakref
from typing import Any

from sglang_ds41.encoding.errors import EncodingError
from sglang_ds41.encoding.incremental import DEFAULT_MAX_BYTES, IncrementalEncoder
from sglang_ds41.encoding.special_tokens import Special
from sglang_ds41.errors import Ds41Error

RENDERER = "sglang.srt.parser.deepseek_recipe_renderer"
RECIPE = f"{RENDERER}.DeepSeekRecipe"
SWITCH_ENV = "SGLANG_DS41_INCREMENTAL_ENCODING"
CACHE_ENV = "SGLANG_DS41_PROMPT_CACHE_MIB"
ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")
V41_MODEL = "DeepSeek-V4.1-Flash"
READY = "V4.1 prompts are encoded incrementally (prompt id cache up to %d MiB; %s=0 turns this off)"
UPSTREAM = "V4.1 prompts are encoded by upstream's deepseek-recipe adapter: %s"

logger = logging.getLogger(__name__)
_ENCODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def switched_on(environ: Any = os.environ) -> bool:
    raw = environ.get(SWITCH_ENV, "")
    value = raw.strip().lower()
    if not value or value in ON:
        return True
    if value in OFF:
        return False
    raise Ds41Error(f"{SWITCH_ENV}={raw!r}: expected 1 (on) or 0 (off)")


def cache_bytes(environ: Any = os.environ) -> int:
    raw = environ.get(CACHE_ENV)
    if raw is None:
        return DEFAULT_MAX_BYTES
    try:
        mib = float(raw)
    except ValueError:
        mib = math.nan
    if not math.isfinite(mib) or mib < 0:
        raise Ds41Error(f"{CACHE_ENV}={raw!r}: expected a number of MiB >= 0 (0 turns reuse off)")
    return int(mib * (1 << 20))


def check_environment(environ: Any = os.environ) -> None:
    """Raise `Ds41Error` naming a bad `SWITCH_ENV` or `CACHE_ENV` value (the launcher's check)."""
    if switched_on(environ):
        cache_bytes(environ)


def unlike_v41(tokenizer: Any) -> list[str]:
    """How `tokenizer`'s special-token ids differ from the V4.1 ones our renderer writes."""
    return [
        f"{token.value} is {got}, not {token.id}"
        for token in Special
        if (got := tokenizer.token_to_id(token.value)) != token.id
    ]


def encoder_of(recipe: Any) -> IncrementalEncoder | None:
    """The incremental encoder serving `recipe` (a `DeepSeekRecipe`), built once; None when
    upstream's own encode serves it (another spec, the switch off or set wrong, or a tokenizer
    whose special ids are not V4.1's; each said once in the log)."""
    if recipe in _ENCODERS:
        return _ENCODERS[recipe]
    encoder = _v41_encoder(recipe.hf_tokenizer) if getattr(recipe, "model", None) == V41_MODEL else None
    _ENCODERS[recipe] = encoder
    return encoder


def _v41_encoder(tokenizer: Any) -> IncrementalEncoder | None:
    try:
        if not switched_on():
            logger.info(UPSTREAM, f"{SWITCH_ENV} is off")
            return None
        max_bytes = cache_bytes()
    except Ds41Error as error:
        logger.error(UPSTREAM, error)
        return None
    problems = unlike_v41(tokenizer)
    if problems:
        logger.warning(UPSTREAM, "the tokenizer's " + "; ".join(problems))
        return None
    encoder = IncrementalEncoder(tokenizer, max_bytes=max_bytes)
    logger.info(READY, encoder.max_bytes >> 20, SWITCH_ENV)
    return encoder


def recipe_request(body: dict[str, Any], model: str, effort_budget: int | None) -> dict[str, Any]:
    """The request `DeepSeekRecipe.encode` converts with the wheel, without copying the history.

    Everything but the messages goes through upstream's own `pre_normalize`; its three rules for
    messages are applied here to the few messages they change (a `developer` message becomes a
    system one, object arguments of a call are serialized, a continued final assistant turn is
    marked `prefix`), so the unchanged history is shared, not deep-copied.
    """
    from sglang.srt.parser import deepseek_recipe_renderer as upstream

    request = upstream.pre_normalize({**{k: v for k, v in body.items() if k != "messages"}, "messages": []})
    messages = [_as_recipe_reads_it(message) for message in body["messages"]]
    if body.get("continue_final_message", False) and messages and messages[-1]["role"] == "assistant":
        messages[-1] = {**messages[-1], "prefix": True}
    request["messages"] = messages
    request["model"] = model
    if effort_budget is not None:
        request["reasoning_effort"] = upstream.BUDGET_TIER
    return request


def _as_recipe_reads_it(message: dict[str, Any]) -> dict[str, Any]:
    changed = {**message, "role": "system"} if message["role"] == "developer" else message
    calls = message.get("tool_calls") or []
    if any(_object_arguments(call["function"]) for call in calls):
        changed = {**changed, "tool_calls": [_serialized_arguments(call) for call in calls]}
    return changed


def _object_arguments(function: dict[str, Any]) -> bool:
    return "arguments" in function and not isinstance(function["arguments"], str)


def _serialized_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    if not _object_arguments(function):
        return call
    arguments = json.dumps(function["arguments"], ensure_ascii=False, separators=(",", ":"))
    return {**call, "function": {**function, "arguments": arguments}}


def encode(original, self, body, *, task=None, effort_budget=None, image_urls=None):
    """AROUND `DeepSeekRecipe.encode`: the same ids, the rendering incremental (module docstring)."""
    encoder = encoder_of(self)
    if encoder is None:
        return original(self, body, task=task, effort_budget=effort_budget, image_urls=image_urls)
    try:
        prompt = encoder.encode(recipe_request(body, self.model, effort_budget))
    except EncodingError:
        prompt = None  # upstream answers with the wheel's own error
    except Exception:  # a body upstream would fail on in its own way; or our bug: never serve it
        logger.exception("incremental V4.1 prompt encoding failed; encoding with upstream")
        prompt = None
    if prompt is None:
        return original(self, body, task=task, effort_budget=effort_budget, image_urls=image_urls)
    ids = prompt.ids
    if image_urls is not None:
        image_urls.extend(source.url for source in prompt.image_sources)
    if effort_budget is not None and body["thinking"]:
        ids = self._replace_effort_budget(ids, effort_budget)
    if task is not None:
        ids = self._attach_task(ids, task, body["thinking"])
    return ids


HOOKS = {f"{RECIPE}.encode": encode}
