"""What the trained tiny model can do, measured on conversations it never saw.

Cases are drawn like the corpus but from the held-out pools (`corpus.pools`: other city and
person names, made-up words from the other half of the vocabulary pieces, fresh numbers), and
each assistant turn of a conversation is one case: the request up to that turn, and the turn
the corpus would have written. Scores, per case kind:

* `call`   — a turn that calls tools: exact match of every call's name and arguments (parsed
             JSON), in order (`exact`); again apart (`exact_names`, `exact_numbers`) for the
             turns whose copied arguments hold a name, or only numbers: a name is written with
             other ids in a call than in the prompt, a number with the same (docs/TRAINING.md §7);
* `answer` — a final answer after tool results: every value of the expected answer that the
             conversation supplied (numbers, names) appears in the answer;
* `json`   — a JSON answer: parses, validates against the request's schema (`valid`), and the
             fraction of top-level fields equal to the expected ones (`fields`);
* `short`  — a short answer (a remembered capital, a value read from the prompt) contains the
             expected value.

`ended` (over every case) is the share of turns that ended by themselves (a stop or tool calls)
rather than at the token limit: a model that copies can also loop ("Peru is Peru is Peru ..."),
which the per-kind scores alone would not show. Completers put the turn's `finish_reason` beside
the message's fields for it.

`loop` runs the weather-average task end to end (get_weather for each city, calculate, the
answer) with tools that answer from a table, and counts a success when the final answer holds
the exact average. `perplexity` is exp of the mean loss over the assistant tokens of held-out
samples. A `Completer` answers a request: the reference model (`ReferenceCompleter`) or a
served model through the OpenAI client (`ServerCompleter`).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from .corpus import tasks as T
from .corpus.pools import HELD_OUT, Pools

if TYPE_CHECKING:
    from sglang_ds41.encoding.conversation import ParsingOptions
    from sglang_ds41.plugin.serving.served_output import ServedCall

KINDS = ("call", "answer", "json", "short")
FINISH = "finish_reason"  # the completers' key for why a turn ended, beside the message fields
CASE_FAMILIES = ("tool", "weather", "compute", "files", "json", "capital", "copy")


@dataclass(frozen=True)
class Case:
    kind: str
    family: str
    body: dict[str, Any]  # the request: every message before the turn to produce
    expected: dict[str, Any]  # the assistant message the corpus wrote


class Completer(Protocol):
    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The assistant message (OpenAI form: content, reasoning_content, tool_calls)."""
        ...


def cases(seed: int, per_family: int) -> list[Case]:
    """Held-out cases: `per_family` conversations of each family, every assistant turn a case."""
    pools = Pools(HELD_OUT)
    out: list[Case] = []
    for family in CASE_FAMILIES:
        for i in range(per_family):
            dialogue = T.draw(random.Random(f"eval:{seed}:{family}:{i}"), pools, family)
            messages = dialogue.body["messages"]
            for k, message in enumerate(messages):
                if message["role"] != "assistant":
                    continue
                body = {**dialogue.body, "messages": messages[:k]}
                out.append(Case(_kind(family, message, k, messages), family, body, message))
    return out


def _kind(family: str, message: dict[str, Any], k: int, messages: list[dict[str, Any]]) -> str:
    if message.get("tool_calls"):
        return "call"
    if family == "json":
        return "json"
    if any(m["role"] == "tool" for m in messages[:k]):
        return "answer"
    return "short"


# ---- scoring ----------------------------------------------------------------------------------


def calls_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        try:
            arguments = json.loads(fn["arguments"])
        except (TypeError, ValueError):
            arguments = fn["arguments"]
        out.append((fn["name"], arguments))
    return out


_VALUE = re.compile(r"-?\d+(?:\.\d+)?|[A-Za-z][\w.@-]*")


def supplied_text(case: Case) -> str:
    """What the conversation gave the model to copy from: the user's text and the tool results."""
    messages = case.body["messages"]
    return " ".join(str(m.get("content") or "") for m in messages if m["role"] in ("user", "tool"))


def supplied_values(case: Case) -> list[str]:
    """Values of the expected answer that the conversation supplied (numbers and words of the
    user's text and the tool results): what a correct answer must repeat."""
    seen = set(_VALUE.findall(supplied_text(case)))
    common = {"the", "is", "in", "a", "of", "and", "to", "at", "for", "on", "it", "I"}
    return [v for v in _VALUE.findall(case.expected.get("content") or "") if v in seen and v not in common]


_NUMBER = re.compile(r"[-+*/().\d\s]+")


def value_kind(value: str) -> str:
    """`number` (digits and arithmetic), `name` (a letter first, then letters and spaces), or
    `other` (codes, dates, e-mail addresses, file names, ...)."""
    if _NUMBER.fullmatch(value) and any(c.isdigit() for c in value):
        return "number"
    if value[:1].isalpha() and all(c.isalpha() or c == " " for c in value):
        return "name"
    return "other"


def leaves(value: Any) -> list[str]:
    """The scalar leaves of a JSON value, as text (numbers as JSON writes them)."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in leaves(v)]
    if isinstance(value, list):
        return [s for v in value for s in leaves(v)]
    if isinstance(value, bool) or value is None:
        return []
    return [value if isinstance(value, str) else json.dumps(value)]


def copied_kinds(case: Case) -> set[str]:
    """The kinds of the expected calls' argument values that the conversation supplied."""
    context = supplied_text(case)
    values = [v for _, arguments in calls_of(case.expected) for v in leaves(arguments)]
    return {value_kind(v) for v in values if v and v in context}


def score(case: Case, got: dict[str, Any]) -> dict[str, float]:
    content = (got.get("content") or "").strip()
    if case.kind == "call":
        exact = float(calls_of(got) == calls_of(case.expected) and bool(calls_of(got)))
        kinds = copied_kinds(case)
        if "name" in kinds:
            return {"exact": exact, "exact_names": exact}
        if kinds == {"number"}:
            return {"exact": exact, "exact_numbers": exact}
        return {"exact": exact}
    if case.kind == "answer":
        values = supplied_values(case)
        return {"facts": float(all(v in content for v in values)) if values else float(bool(content))}
    if case.kind == "json":
        return _score_json(case, content)
    expected = case.expected["content"].strip().rstrip(".")
    key = expected.split(" is ")[-1].split(" lives in ")[-1].split(" was born on ")[-1]
    return {"correct": float(key.lower() in content.lower())}


def _score_json(case: Case, content: str) -> dict[str, float]:
    import jsonschema

    expected = json.loads(case.expected["content"])
    try:
        value = json.loads(content)
    except ValueError:
        return {"valid": 0.0, "fields": 0.0}
    fmt = case.body.get("response_format", {})
    schema = (
        fmt.get("json_schema", {}).get("schema") if fmt.get("type") == "json_schema" else {"type": "object"}
    )
    try:
        jsonschema.validate(value, schema)
        valid = 1.0
    except jsonschema.ValidationError:
        valid = 0.0
    if not isinstance(value, dict):
        return {"valid": valid, "fields": 0.0}
    return {"valid": valid, "fields": sum(value.get(k) == v for k, v in expected.items()) / len(expected)}


@dataclass
class Report:
    per_case: list[dict[str, Any]] = field(default_factory=list)

    def add(self, case: Case, got: dict[str, Any], scores: dict[str, float]) -> None:
        self.per_case.append({"kind": case.kind, "family": case.family, "scores": scores, "got": got})

    def summary(self) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for row in self.per_case:
            for name, value in row["scores"].items():
                out.setdefault(f"{row['kind']}.{name}", []).append(value)
            out.setdefault("ended", []).append(float(row["got"].get(FINISH) != "length"))
        return {k: round(sum(v) / len(v), 4) for k, v in sorted(out.items())} | {"cases": len(self.per_case)}


def evaluate(
    completer: Completer, all_cases: list[Case], progress: Callable[[], None] | None = None
) -> Report:
    report = Report()
    for case in all_cases:
        got = completer.complete(case.body)
        report.add(case, got, score(case, got))
        if progress:
            progress()
    return report


# ---- the weather-average loop -------------------------------------------------------------------


@dataclass(frozen=True)
class LoopTask:
    question: str
    temperatures: dict[str, float]

    @property
    def answer(self) -> str:
        values = [self.temperatures[c] for c in self.temperatures]
        return repr(T.eval_expression("(" + " + ".join(map(repr, values)) + f") / {len(values)}"))


def loop_tasks(seed: int, n: int) -> list[LoopTask]:
    from .corpus import pools as P

    pools, out = Pools(HELD_OUT), []
    for i in range(n):
        rng = random.Random(f"loop:{seed}:{i}")
        cities = pools.cities(rng, rng.choice((2, 2, 3)))
        out.append(
            LoopTask(T._weather_ask(rng, cities, average=True), {c: P.temperature(rng) for c in cities})
        )
    return out


def run_loop(completer: Completer, task: LoopTask, max_turns: int = 6) -> tuple[bool, list[dict[str, Any]]]:
    """The runner's protocol with the weather and calculator tools answering from `task`."""
    from sglang_ds41.agents.tools import result_text

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Answer with the tools. Call independent tools in parallel."},
        {"role": "user", "content": task.question},
    ]
    body = {
        "model": T.MODEL,
        "messages": messages,
        "tools": [T.B.GET_WEATHER, T.B.CALCULATE],
        "reasoning_effort": "low",
    }
    for _ in range(max_turns):
        got = completer.complete(body)
        messages.append(
            {k: v for k, v in got.items() if v and k != FINISH}
            | {"role": "assistant", "content": got.get("content") or ""}
        )
        calls = got.get("tool_calls") or []
        if not calls:
            return task.answer in (got.get("content") or ""), messages
        for call in calls:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            try:
                args = json.loads(arguments)
                if name == "get_weather":
                    value: Any = {"city": args["city"], "celsius": task.temperatures[args["city"]]}
                elif name == "calculate":
                    value = T.eval_expression(args["expression"])
                else:
                    value = f"Error: ValueError: no tool named {name!r}"
            except Exception as error:  # the model's arguments are untrusted: a wrong one is an error result
                value = f"Error: {type(error).__name__}: {error}"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result_text(value)})
    return False, messages


# ---- completers -------------------------------------------------------------------------------


class ReferenceCompleter:
    """The pure-PyTorch reference model, greedy, its output read as the server reads it
    (`ServedOutput`, tolerant): a malformed call (an invoke never closed, arguments that are not
    JSON) is an `invalid_tool_calls` entry, not a call, so the two are scored alike; a JSON
    answer (`response_format`) is decoded under the grammar the server decodes it under
    (`reference.grammar`)."""

    def __init__(self, model, max_new_tokens: int = 400):
        self.model, self.max_new_tokens = model, max_new_tokens

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        from sglang_ds41.encoding import encode_prompt, render_request
        from sglang_ds41.reference.generate import generate
        from sglang_ds41.reference.grammar import JsonAnswerGrammar

        rendered = render_request(body)
        eos = self.model.config.eos_token_id
        grammar = JsonAnswerGrammar.for_request(body, rendered, self.model.text.vocab_size, eos)
        prompt, stop = encode_prompt(rendered), (eos,)
        ids = generate(self.model, prompt, self.max_new_tokens, stop_ids=stop, constraint=grammar)
        return served_message(ids, served_parsing(rendered.parsing, body), body.get("tools"))


def served_parsing(parsing: ParsingOptions, body: dict[str, Any]) -> ParsingOptions:
    """The request's parsing options as the server reads its output: a `json_schema` answer is
    JSON output there too (`served_output.reads_json_output`), not only a `json_object` one."""
    from sglang_ds41.plugin.serving.served_output import reads_json_output

    kind = (body.get("response_format") or {}).get("type")
    return replace(parsing, parse_json_output=reads_json_output(kind))


def served_message(ids: list[int], parsing: ParsingOptions, tools: Any = None) -> dict[str, Any]:
    """Output ids (EOS last if the turn ended) as the server's chat message: its parse
    (`ServedOutput`, tolerant, the request's `tools` for unwrapping), malformed calls as
    `invalid_tool_calls`, and its finish reason by the server's rule (`served_finish_reason`)."""
    from sglang_ds41.assets import v41_tokenizer
    from sglang_ds41.encoding import wrapped_arguments
    from sglang_ds41.encoding.special_tokens import Special
    from sglang_ds41.plugin.serving.served_output import ServedOutput, served_finish_reason

    ended = bool(ids) and ids[-1] == Special.EOS.id
    output = ServedOutput(
        replace(parsing, tolerant=True),
        tokenizer=v41_tokenizer(),
        declared=wrapped_arguments.declared_parameters(tools),
    )
    engine_reason = "stop" if ended else "length"
    step = output.finish(ids, engine_reason, Special.EOS.id if ended else None)
    message: dict[str, Any] = {"role": "assistant", "content": step.content}
    message["reasoning_content"] = step.reasoning
    if step.calls:
        message["tool_calls"] = [_served_call(call) for call in step.calls]
    if step.invalid_calls:
        invalid = [_served_call(call) | {"error": call.error} for call in step.invalid_calls]
        message["invalid_tool_calls"] = invalid
    return message | {FINISH: served_finish_reason(engine_reason, step)}


def _served_call(call: ServedCall) -> dict[str, Any]:
    return {"id": f"call_{call.position:02d}", "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}  # fmt: skip


class ServerCompleter:
    """A served model through the OpenAI client, greedy."""

    def __init__(self, base_url: str, max_tokens: int = 400):
        import openai

        self.client, self.max_tokens = openai.OpenAI(base_url=base_url, api_key="none"), max_tokens

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        extra = {k: body[k] for k in ("thinking", "reasoning_budget") if k in body}
        fields = {k: v for k, v in body.items() if k not in extra}
        reply = self.client.chat.completions.create(
            **fields, temperature=0, max_tokens=self.max_tokens, extra_body=extra
        )
        message = reply.choices[0].message.model_dump(exclude_none=True)
        return message | {"content": message.get("content") or "", FINISH: reply.choices[0].finish_reason}


def perplexity(model, seed: int, n: int) -> float:
    """exp(mean loss) over the assistant tokens of `n` held-out samples, with the reference."""
    import torch

    from .corpus.samples import samples

    total, count = 0.0, 0
    pools = Pools(HELD_OUT)
    for i in range(n):
        for s in samples(T.draw(random.Random(f"ppl:{seed}:{i}"), pools)):
            ids = torch.tensor(s.ids)
            with torch.no_grad():
                logits = model(ids, model.new_state()).double()
            learn = torch.tensor(s.learn[1:])
            nll = torch.nn.functional.cross_entropy(logits[:-1][learn], ids[1:][learn], reduction="sum")
            total, count = total + float(nll), count + int(learn.sum())
    return math.exp(total / max(count, 1))
