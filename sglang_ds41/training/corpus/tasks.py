"""Task families: each draws one whole conversation (an OpenAI Chat Completions body whose
assistant turns are what the model must learn to write).

Families (weights in `FAMILIES`):

* `capital`   — a short factual answer the model remembers (country -> capital);
* `copy`      — a short answer read from the prompt (a fact stated in it, a word to repeat);
* `greeting`  — small talk without tools;
* `tool`      — one call of a bank tool among 1-4 offered, its result, a final answer;
* `weather`   — the weather example: one city, several cities in parallel, or the average
                loop (parallel get_weather, then calculate, then the answer), errors included;
* `compute`   — calculate with the user's numbers, then the answer;
* `files`     — the workspace tools: list + write a summary, read a file, write, append, delete;
* `json`      — a JSON answer under `response_format` (the invoice example's strict schema,
                other json_schema shapes, json_object);
* `no_call`   — tools are offered but the question needs none.

Thinking is on in ~70% of conversations (reasoning effort low / high / max / a budget N, or
unset), off in the rest; the reasoning is one or two short sentences about what to do next.
Every argument value and every number in an answer is copied from the user's words or from a
tool result.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sglang_ds41.agents.tools import result_text

from . import pools as P
from . import toolbank as B
from .pools import Pools

MODEL = "DeepSeek-V4.1-Flash"
SYSTEMS = (
    None,
    None,
    "You are a concise assistant.",
    "You are a helpful assistant.",
    "Answer with the tools. Call independent tools in parallel.",
    "Be brief.",
    "You are an assistant that uses tools when they help.",
)


@dataclass
class Dialogue:
    """A conversation to learn from: `body` is a Chat Completions request whose messages hold
    the assistant turns to learn; `family` names the task family."""

    family: str
    body: dict[str, Any]


@dataclass
class _Builder:
    rng: random.Random
    pools: Pools
    thinking: bool
    messages: list[dict[str, Any]] = field(default_factory=list)
    _calls: int = 0

    def system(self, text: str | None) -> None:
        if text:
            self.messages.append({"role": "system", "content": text})

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def assistant(
        self, reasoning: str, content: str = "", calls: list[tuple[str, dict[str, Any]]] = ()
    ) -> list[str]:
        """Adds a turn; returns the ids of its calls."""
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.thinking:
            message["reasoning_content"] = reasoning
        ids = []
        if calls:
            message["tool_calls"] = []
            for name, arguments in calls:
                self._calls += 1
                ids.append(f"call_{self._calls}")
                message["tool_calls"].append(
                    {
                        "id": ids[-1],
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
                    }
                )
        self.messages.append(message)
        return ids

    def results(self, ids: list[str], values: list[Any]) -> None:
        for call_id, value in zip(ids, values, strict=True):
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result_text(value)})

    def body(self, tools: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": MODEL, "messages": self.messages}
        if tools:
            body["tools"] = tools
        body["thinking"] = {"type": "enabled" if self.thinking else "disabled"}
        if self.thinking:
            effort = self.rng.random()
            if effort < 0.45:
                body["reasoning_effort"] = self.rng.choice(("low", "high", "max"))
            elif effort < 0.6:
                body["reasoning_budget"] = self.rng.randint(1, 100)
        body.update(extra)
        return body


def _number(x: float) -> str:
    """A number as Python (and so the calculator tool and JSON) writes it."""
    return repr(x)


# ---- families ---------------------------------------------------------------------------------


def capital(b: _Builder) -> dict[str, Any]:
    country, city = b.rng.choice(sorted(P.capitals().items()))
    b.system(b.rng.choice(SYSTEMS[:4]))
    one_word = b.rng.random() < 0.5
    ask = b.rng.choice(
        (
            f"What is the capital of {country}?",
            f"What's the capital of {country}?",
            f"Which city is the capital of {country}?",
            f"Name the capital of {country}.",
            f"capital of {country}?",
        )
    )
    b.user(ask + (" Answer in one word." if one_word else ""))
    answer = city if one_word else b.rng.choice((f"The capital of {country} is {city}.", f"{city}."))
    b.assistant(f"The capital of {country} is {city}.", answer)
    return b.body()


def _facts(rng: random.Random, pools: Pools) -> dict[str, str]:
    """A record of a few labelled values, for questions that ask for one of them."""
    fields = {
        "name": lambda: pools.person(rng),
        "city": lambda: pools.city(rng),
        "email": lambda: pools.email(rng),
        "phone": lambda: f"+{rng.randint(1, 99)} {P.integer(rng, (3, 3))} {P.integer(rng, (4, 7))}",
        "order": lambda: P.code(rng),
        "date": lambda: P.date(rng),
        "time": lambda: P.clock(rng),
        "amount": lambda: f"{P.amount(rng)} {rng.choice(B.CURRENCIES)}",
        "company": lambda: pools.company(rng),
        "code": lambda: P.code(rng),
        "word": lambda: pools.made_up_word(rng),
    }
    return {k: fields[k]() for k in rng.sample(sorted(fields), rng.randint(2, 5))}


def _phrase(rng: random.Random, pools: Pools) -> str:
    """Words nobody would guess: made-up words, names, numbers and codes, 3-12 of them."""
    makers = (lambda: pools.made_up_word(rng), lambda: pools.made_up_name(rng), lambda: str(P.integer(rng)),
              lambda: P.code(rng), lambda: pools.city(rng))  # fmt: skip
    return " ".join(rng.choice(makers)() for _ in range(rng.randint(3, 12)))


def repeat(b: _Builder) -> dict[str, Any]:
    """Write back a run of unguessable words: every token after the first is the one that
    followed the previous one in the prompt, which is what copying a long value needs."""
    rng = b.rng
    phrase = _phrase(rng, b.pools)
    b.user(rng.choice((
        f"Repeat exactly: {phrase}", f"Copy this text: {phrase}", f"Say back the following words.\n{phrase}",
        f'Write "{phrase}" again.', f"{phrase}\n\nRepeat the line above.",
    )))  # fmt: skip
    b.assistant("The user wants the text repeated as it is.", phrase)
    return b.body()


def copy_answer(b: _Builder) -> dict[str, Any]:
    rng, pools = b.rng, b.pools
    kind = rng.randrange(7)
    if kind >= 4:
        facts = _facts(rng, pools)
        key = rng.choice(sorted(facts))
        if kind == 4:
            listing = "; ".join(f"{k}: {v}" for k, v in facts.items())
            b.user(
                rng.choice((f"Details: {listing}. What is the {key}?", f"{listing}\nWhich {key} is given?"))
            )
        elif kind == 5:
            listing = "\n".join(f"- {k} = {v}" for k, v in facts.items())
            b.user(f"{listing}\n\nReply with the {key} only.")
        else:
            listing = ", ".join(f"{k} {v}" for k, v in facts.items())
            b.user(f"Remember this: {listing}. Now, what was the {key}?")
        b.assistant(f"The {key} is {facts[key]}.", rng.choice((facts[key], f"The {key} is {facts[key]}.")))
        return b.body()
    if kind == 0:
        who, where = pools.first_name(rng), pools.city(rng)
        b.user(f"{who} lives in {where}. Where does {who} live?")
        b.assistant(f"The text says {who} lives in {where}.", rng.choice((f"{who} lives in {where}.", where)))
    elif kind == 1:
        word = pools.made_up_word(rng)
        b.user(rng.choice((f"Repeat this word: {word}", f"Say '{word}' back to me.", f"Echo: {word}")))
        b.assistant("The user wants the word repeated.", word)
    elif kind == 2:
        item, code = pools.title(rng, (1, 2)), P.code(rng)
        b.user(f"The code for {item} is {code}. What is the code for {item}?")
        b.assistant(f"The code was given: {code}.", rng.choice((code, f"The code for {item} is {code}.")))
    else:
        a, c = pools.person(rng), P.date(rng)
        b.user(f"{a} was born on {c}. When was {a} born?")
        b.assistant(f"The date is in the question: {c}.", f"{a} was born on {c}.")
    return b.body()


def greeting(b: _Builder) -> dict[str, Any]:
    b.system(b.rng.choice(SYSTEMS[:4]))
    b.user(b.rng.choice(("Hello", "Hi!", "Hello, who are you?", "Good morning", "Hey there", "Thanks!")))
    if "Thanks" in b.messages[-1]["content"]:
        b.assistant("The user says thanks.", "You're welcome!")
    else:
        b.assistant(
            "The user greets me.",
            b.rng.choice(("Hello! How can I help you today?", "Hi! What can I do for you?")),
        )
    return b.body()


def _offered(rng: random.Random, must: list[dict[str, Any]], extra: int) -> list[dict[str, Any]]:
    others = [s.tool for s in B.BANK if s.tool not in must] + [B.GET_WEATHER, B.CALCULATE]
    others = [t for t in others if t not in must]
    tools = must + rng.sample(others, min(extra, len(others)))
    rng.shuffle(tools)
    return tools


def tool(b: _Builder) -> dict[str, Any]:
    rng = b.rng
    skill = rng.choice(B.BANK)
    text, args = skill.ask(rng, b.pools)
    b.system(rng.choice(SYSTEMS))
    b.user(text)
    ids = b.assistant(f"The user wants {skill.reason}. I will call {skill.name}.", calls=[(skill.name, args)])
    result = skill.result(rng, args)
    b.results(ids, [result])
    b.assistant(f"{skill.name} answered.", skill.answer(rng, args, result))
    return b.body(_offered(rng, [skill.tool], rng.choice((0, 0, 1, 1, 2, 3))))


def _weather_ask(rng: random.Random, cities: list[str], average: bool) -> str:
    names = P.join_names(cities)
    if average:
        return rng.choice(
            (
                f"What is the average temperature of {names} right now?",
                f"What's the average temperature in {names}?",
                f"Average the current temperatures of {names}.",
                f"How warm is it on average in {names} right now?",
            )
        )
    if len(cities) > 1:
        return rng.choice(
            (
                f"What is the weather in {names}?",
                f"How warm is it in {names} right now?",
                f"Get me the temperatures of {names}.",
                f"What's the weather like in {names}?",
            )
        )
    return rng.choice(
        (
            f"What is the weather in {names}?",
            f"How warm is it in {names} right now?",
            f"What's the temperature in {names}?",
            f"Is it cold in {names} today?",
            f"weather {names}",
            f"What's the weather like in {names}?",
            f"Tell me the current temperature of {names}.",
        )
    )


def weather(b: _Builder) -> dict[str, Any]:
    rng, pools = b.rng, b.pools
    kind = rng.random()
    average = kind < 0.45
    n = 1 if kind > 0.75 else rng.choice((2, 2, 2, 3))
    cities = pools.cities(rng, n)
    b.system(rng.choice(SYSTEMS))
    b.user(_weather_ask(rng, cities, average))
    calls = [("get_weather", {"city": c}) for c in cities]
    plan = "I will call get_weather" + (" for each city in parallel." if n > 1 else ".")
    reasoning = f"The user wants the current temperature in {P.join_names(cities)}. {plan}"
    ids = b.assistant(reasoning, calls=calls)
    missing = {c for c in cities if rng.random() < 0.06}
    temps = {c: P.temperature(rng) for c in cities if c not in missing}
    results = [
        f"Error: KeyError: 'no weather data for {c}'" if c in missing else {"city": c, "celsius": temps[c]}
        for c in cities
    ]
    b.results(ids, results)
    report = ", ".join(f"{c} {temps[c]} °C" for c in cities if c in temps)
    if missing:
        lost = P.join_names(sorted(missing))
        text = f"I could not get the weather for {lost}." + (f" {report}." if temps else "")
        b.assistant(f"There is no data for {lost}.", text)
    elif average and n > 1:
        expr = "(" + " + ".join(_number(temps[c]) for c in cities) + f") / {n}"
        values = "; ".join(f"{c} is {temps[c]}" for c in cities)
        ids = b.assistant(
            f"{values}. I will average them with calculate.", calls=[("calculate", {"expression": expr})]
        )
        mean = eval_expression(expr)
        b.results(ids, [mean])
        b.assistant(
            f"The average is {_number(mean)}.",
            rng.choice(
                (
                    f"{report}; the average is {_number(mean)} °C.",
                    f"The average temperature of {P.join_names(cities)} is {_number(mean)} °C ({report}).",
                )
            ),
        )
    elif n == 1:
        c = cities[0]
        b.assistant(
            f"get_weather says {temps[c]}.",
            rng.choice(
                (
                    f"It is {temps[c]} °C in {c} right now.",
                    f"{c}: {temps[c]} °C.",
                    f"The temperature in {c} is {temps[c]} °C.",
                )
            ),
        )
    else:
        b.assistant("I have every temperature.", f"Right now: {report}.")
    extra = rng.choice((0, 0, 1, 2))
    must = [B.GET_WEATHER, B.CALCULATE] if (average or rng.random() < 0.6) else [B.GET_WEATHER]
    return b.body(_offered(rng, must, extra))


def eval_expression(expression: str) -> float | int:
    """The calculator's answer to an expression: the examples' own calculator (agents/arithmetic.py),
    so a tool result in the corpus is what the weather example's `calculate` returns."""
    from sglang_ds41.agents.arithmetic import evaluate

    return evaluate(expression)


def compute(b: _Builder) -> dict[str, Any]:
    rng = b.rng
    x = P.integer(rng, (1, 4)) if rng.random() < 0.7 else P.decimal(rng)
    y = P.integer(rng, (1, 3)) if rng.random() < 0.7 else P.decimal(rng)
    op = rng.choice(("*", "+", "-", "/"))
    if op == "/" and y == 0:
        y = 7
    expr = f"{_number(x)} {op} {_number(y)}"
    words = {"*": "product", "+": "sum", "-": "difference", "/": "quotient"}[op]
    ask = rng.choice(
        (
            f"Compute {expr}.",
            f"What is {expr}?",
            f"Calculate {expr}.",
            f"{expr} = ?",
            f"How much is {expr}?",
            f"What is the {words} of {_number(x)} and {_number(y)}?",
        )
    )
    b.system(rng.choice(SYSTEMS))
    b.user(ask)
    ids = b.assistant(f"I will compute {expr} with calculate.", calls=[("calculate", {"expression": expr})])
    result = eval_expression(expr)
    b.results(ids, [result])
    b.assistant(
        f"The result is {_number(result)}.",
        rng.choice((f"{expr} = {_number(result)}.", f"{_number(result)}")),
    )
    return b.body(_offered(rng, [B.CALCULATE], rng.choice((0, 1, 2))))


def _file_names(rng: random.Random, pools: Pools, n: int) -> list[str]:
    names = set()
    while len(names) < n:
        names.add(
            pools.made_up_word(rng).lower() + rng.choice((".txt", ".md", ".py", ".json", ".csv", ".log", "/"))
        )
    return sorted(names)


def _file_name(rng: random.Random, pools: Pools, extension: str) -> str:
    return pools.made_up_word(rng).lower() + extension


def files(b: _Builder) -> dict[str, Any]:
    rng, pools = b.rng, b.pools
    tools = workspace_definitions()
    b.system(rng.choice(("You edit files in the workspace with the tools. Keep changes minimal.", None)))
    kind = rng.randrange(5)
    if kind == 0:
        b.user(
            rng.choice(
                (
                    "List the workspace and write SUMMARY.md describing its files.",
                    "Look at the files in the workspace and write a SUMMARY.md that lists them.",
                    "Write SUMMARY.md with one line per file of the workspace.",
                )
            )
        )
        ids = b.assistant("First I list the workspace.", calls=[("list_dir", {"path": "."})])
        entries = _file_names(rng, pools, rng.randint(1, 5)) if rng.random() > 0.05 else []
        sizes = {e: rng.randint(0, 9000) for e in entries}
        listing = "\n".join(e if e.endswith("/") else f"{e} ({sizes[e]} bytes)" for e in entries)
        b.results(ids, [listing or "(empty directory)"])
        lines = [f"- {e}: a directory" if e.endswith("/") else f"- {e}: {sizes[e]} bytes" for e in entries]
        content = "# Summary\n\n" + ("\n".join(lines) if lines else "The workspace is empty.") + "\n"
        ids = b.assistant(
            f"The workspace has {len(entries)} entries. I will write SUMMARY.md.",
            calls=[("write_file", {"path": "SUMMARY.md", "content": content})],
        )
        b.results(ids, [f"wrote {len(content.encode())} bytes to SUMMARY.md"])
        b.assistant(
            "The summary is written.",
            f"I wrote SUMMARY.md describing the {len(entries)} entries of the workspace.",
        )
    elif kind == 1:
        name = _file_name(rng, pools, ".txt")
        b.user(
            rng.choice(
                (f"What does {name} say?", f"Read {name} and tell me what it says.", f"Show me {name}.")
            )
        )
        ids = b.assistant(f"I will read {name}.", calls=[("read_file", {"path": name})])
        text = pools.title(rng, (3, 8)) + "."
        b.results(ids, [text])
        b.assistant("I have the file's text.", f"{name} says: {text}")
    elif kind == 2:
        name = _file_name(rng, pools, ".txt")
        text = pools.title(rng, (2, 6)).lower()
        b.user(rng.choice((f"Create {name} with the text: {text}", f"Write '{text}' into {name}.")))
        ids = b.assistant(f"I will write {name}.", calls=[("write_file", {"path": name, "content": text})])
        b.results(ids, [f"wrote {len(text.encode())} bytes to {name}"])
        b.assistant("Done.", f"I created {name}.")
    elif kind == 3:
        name = _file_name(rng, pools, ".md")
        text = pools.title(rng, (2, 6)).lower()
        b.user(rng.choice((f"Append '{text}' to {name}.", f"Add the line {text} at the end of {name}.")))
        ids = b.assistant(
            f"I will append to {name}.", calls=[("append_file", {"path": name, "content": text})]
        )
        b.results(ids, [f"wrote {len(text.encode())} bytes to {name}"])
        b.assistant("Done.", f"I appended the text to {name}.")
    else:
        name = _file_name(rng, pools, ".log")
        b.user(rng.choice((f"Delete {name}.", f"Remove the file {name} from the workspace.")))
        ids = b.assistant(f"I will delete {name}.", calls=[("delete_file", {"path": name})])
        b.results(ids, [f"deleted {name}"])
        b.assistant("Deleted.", f"I deleted {name}.")
    return b.body(tools)


def workspace_definitions() -> list[dict[str, Any]]:
    return list(B.workspace_tool_definitions().values())


# ---- JSON answers ---------------------------------------------------------------------------------


def invoice_schema() -> dict[str, Any]:
    """The extract_invoice example's `Invoice` as the runner sends it (strict json_schema)."""
    from pydantic import BaseModel, Field

    from sglang_ds41.agents.output import OutputSpec

    class LineItem(BaseModel):
        description: str
        quantity: int = Field(ge=1)
        unit_price: float = Field(ge=0)

    class Invoice(BaseModel):
        number: str
        vendor: str
        items: list[LineItem] = Field(min_length=1)
        total: float = Field(ge=0)
        currency: str = Field(pattern="^[A-Z]{3}$")
        due_date: str | None = None

    return OutputSpec.of(Invoice).response_format()


def _invoice(b: _Builder) -> tuple[str, dict[str, Any], dict[str, Any]]:
    rng, pools = b.rng, b.pools
    number, vendor, currency = P.code(rng), pools.company(rng), rng.choice(B.CURRENCIES)
    items = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        items.append(
            {
                "description": pools.made_up_word(rng).lower(),
                "quantity": rng.randint(1, 20),
                "unit_price": round(rng.uniform(0.5, 400.0), rng.choice((0, 1, 2))),
            }
        )
    total = round(sum(i["quantity"] * i["unit_price"] for i in items), 2)
    due = P.date(rng) if rng.random() < 0.8 else None
    parts = ", ".join(
        f"{i['quantity']} {i['description']} at {i['unit_price']} {currency} each" for i in items
    )
    text = rng.choice(
        (
            f"Invoice {number} from {vendor}: {parts}, total {total} {currency}",
            f"{vendor} invoice {number}. Items: {parts}. Total: {total} {currency}",
        )
    ) + (f", due {due}." if due else ".")
    answer = {
        "number": number,
        "vendor": vendor,
        "items": items,
        "total": total,
        "currency": currency,
        "due_date": due,
    }
    return text, answer, invoice_schema()


def _strict_object(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    """A strict `json_schema` response format: an object with exactly `properties`, all required."""
    schema = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _person(b: _Builder) -> tuple[str, dict[str, Any], dict[str, Any]]:
    rng, pools = b.rng, b.pools
    name, age, city = pools.person(rng), rng.randint(1, 99), pools.city(rng)
    text = rng.choice((f"{name} is {age} years old and lives in {city}.", f"{name}, {age}, from {city}."))
    fmt = _strict_object(
        "Person", {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}}
    )
    return text, {"name": name, "age": age, "city": city}, fmt


def _event(b: _Builder) -> tuple[str, dict[str, Any], dict[str, Any]]:
    rng, pools = b.rng, b.pools
    title, date = pools.title(rng, (1, 3)), P.date(rng)
    people = [pools.first_name(rng) for _ in range(rng.randint(1, 4))]
    text = f"{title} takes place on {date}; {P.join_names(people)} will attend."
    fmt = _strict_object(
        "Event",
        {
            "title": {"type": "string"},
            "date": {"type": "string"},
            "attendees": {"type": "array", "items": {"type": "string"}},
        },
    )
    return text, {"title": title, "date": date, "attendees": people}, fmt


def _product(b: _Builder) -> tuple[str, dict[str, Any], dict[str, Any]]:
    rng, pools = b.rng, b.pools
    name, price, stock = pools.title(rng, (1, 2)), P.amount(rng), rng.random() < 0.6
    text = f"The {name} costs {price} and is {'in stock' if stock else 'out of stock'}."
    fmt = _strict_object(
        "Product", {"name": {"type": "string"}, "price": {"type": "number"}, "in_stock": {"type": "boolean"}}
    )
    return text, {"name": name, "price": price, "in_stock": stock}, fmt


def json_answer(b: _Builder) -> dict[str, Any]:
    rng = b.rng
    kind = rng.random()
    maker = _invoice if kind < 0.4 else rng.choice((_person, _event, _product))
    text, answer, fmt = maker(b)
    if kind > 0.85:  # json_object: the prompt names the keys
        keys = ", ".join(answer)
        b.user(f"{text}\nReply with a JSON object with the keys {keys}.")
        fmt = {"type": "json_object"}
    else:
        instruction = "Extract the invoice described by the user as JSON." if maker is _invoice else None
        b.system(instruction or rng.choice(("Extract the data as JSON.", None)))
        b.user(text)
    b.assistant("I will extract the fields into the schema.", json.dumps(answer, ensure_ascii=False))
    return b.body(response_format=fmt)


def no_call(b: _Builder) -> dict[str, Any]:
    rng = b.rng
    country, city = rng.choice(sorted(P.capitals().items()))
    b.system(rng.choice(SYSTEMS))
    b.user(
        rng.choice(
            (f"What is the capital of {country}?", "Hello", f"Which city is the capital of {country}?")
        )
    )
    if b.messages[-1]["content"] == "Hello":
        b.assistant("A greeting needs no tool.", "Hello! How can I help you today?")
    else:
        b.assistant(
            f"No tool is needed: the capital of {country} is {city}.", f"The capital of {country} is {city}."
        )
    return b.body(_offered(rng, [], rng.randint(1, 3)))


# Short, copy-dense families (copy, repeat, json) are frequent: they teach the model to find a value
# by its role and write it back, at a fraction of the compute of a conversation with tool schemas.
FAMILIES: dict[str, tuple[float, Callable[[_Builder], dict[str, Any]]]] = {
    "capital": (0.05, capital),
    "copy": (0.16, copy_answer),
    "repeat": (0.12, repeat),
    "greeting": (0.02, greeting),
    "tool": (0.17, tool),
    "weather": (0.16, weather),
    "compute": (0.06, compute),
    "files": (0.07, files),
    "json": (0.16, json_answer),
    "no_call": (0.03, no_call),
}


# The first conversations of a run (`Settings.copy_first`): mostly short copying. A small model
# learns to copy (attend to where the current token last occurred and write what followed it)
# from many cheap copy events long before it would from a few per tool conversation; the tool
# families then build on it.
COPY_FIRST = {"repeat": 0.45, "copy": 0.3, "json": 0.1, "capital": 0.05, "weather": 0.05, "tool": 0.05}


def draw(
    rng: random.Random, pools: Pools, family: str | None = None, weights: dict[str, float] | None = None
) -> Dialogue:
    """One conversation of `family` (or of a family drawn by `weights`, default `FAMILIES`')."""
    if family is None:
        weights = weights or {n: w for n, (w, _) in FAMILIES.items()}
        names = list(weights)
        family = rng.choices(names, weights=[weights[n] for n in names])[0]
    thinking = rng.random() < 0.7
    if family == "json" and rng.random() < 0.3:
        thinking = False
    return Dialogue(family, FAMILIES[family][1](_Builder(rng, pools, thinking)))
