"""The tools the corpus offers: the examples' own (weather, calculator, workspace files) and a
bank of others covering the JSON Schema shapes agents use (strings, integers, numbers, enums,
booleans, arrays, nested objects).

Each `Skill` is one tool plus how a user asks for it: `ask` draws a request (the user's words
and the arguments a correct call carries, every value copied from those words), `result` what
the tool returns, `answer` the final reply built from the result. Tool definitions are OpenAI
`tools` entries, written as the agent runner sends them (`function_tool`'s schemas:
`additionalProperties: false`, descriptions from the docstring's Args).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import pools as P
from .pools import Pools

Args = dict[str, Any]


def tool(
    name: str, description: str, properties: dict[str, dict[str, Any]], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "additionalProperties": False,
                "required": required,
            },
        },
    }


def string(description: str | None = None, **extra: Any) -> dict[str, Any]:
    return ({"description": description} if description else {}) | {"type": "string"} | extra


def typed(kind: str, description: str | None = None, **extra: Any) -> dict[str, Any]:
    return ({"description": description} if description else {}) | {"type": kind} | extra


# The weather example's tools (examples/agents/weather_calculator.py) exactly as the runner sends
# them; tests/training checks that they have not drifted apart.
GET_WEATHER = tool(
    "get_weather",
    "Current temperature of a city in degrees Celsius.",
    {"city": string("City name, e.g. Paris.")},
    ["city"],
)
CALCULATE = tool(
    "calculate",
    "Evaluate an arithmetic expression (+ - * / ** and parentheses only).",
    {"expression": string('For example "(18.5 + 4) / 2".')},
    ["expression"],
)


def workspace_tool_definitions() -> dict[str, dict[str, Any]]:
    """The file tools of `agents.workspace_tools`, by name, as the runner sends them."""
    import tempfile

    from sglang_ds41.agents.workspace_tools import workspace_tools

    return {t.name: t.to_openai() for t in workspace_tools(tempfile.gettempdir())}


@dataclass(frozen=True)
class Skill:
    tool: dict[str, Any]
    ask: Callable[[random.Random, Pools], tuple[str, Args]]
    result: Callable[[random.Random, Args], Any]
    answer: Callable[[random.Random, Args, Any], str]
    reason: str  # the reasoning sentence's verb phrase: "the user wants ..."

    @property
    def name(self) -> str:
        return self.tool["function"]["name"]


def _pick(rng: random.Random, *templates: str) -> str:
    return rng.choice(templates)


# ---- the bank --------------------------------------------------------------------------------


def _timer_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    minutes, label = rng.randint(1, 180), pools.title(rng, (1, 2)).lower()
    text = _pick(
        rng,
        f"Set a timer for {minutes} minutes called {label}.",
        f"Start a {minutes} minute timer named {label}.",
        f"Please set a {label} timer for {minutes} minutes.",
    )
    return text, {"minutes": minutes, "label": label}


def _currency_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    amount, (a, b) = P.amount(rng), rng.sample(CURRENCIES, 2)
    text = _pick(
        rng,
        f"Convert {amount} {a} to {b}.",
        f"How much is {amount} {a} in {b}?",
        f"What are {amount} {a} worth in {b}?",
    )
    return text, {"amount": amount, "from_currency": a, "to_currency": b}


def _email_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    to, subject = pools.email(rng), pools.title(rng, (1, 3))
    body = f"{pools.title(rng, (2, 5))} on {P.date(rng)}."
    text = _pick(
        rng,
        f"Send an email to {to} with the subject {subject} saying: {body}",
        f"Email {to}, subject {subject}, body: {body}",
        f"Write to {to} (subject: {subject}): {body}",
    )
    return text, {"to": to, "subject": subject, "body": body}


def _event_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    title, date = pools.title(rng, (1, 3)), P.date(rng)
    people = [pools.first_name(rng) for _ in range(rng.randint(1, 3))]
    who = P.join_names(people)
    text = _pick(
        rng,
        f"Create an event {title} on {date} with {who}.",
        f"Schedule {title} for {date} and invite {who}.",
        f"Put {title} in the calendar on {date}; attendees: {who}.",
    )
    return text, {"title": title, "date": date, "attendees": people}


def _stock_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    symbol = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(rng.randint(2, 5)))
    text = _pick(
        rng, f"What is the stock price of {symbol}?", f"Quote {symbol} for me.", f"How is {symbol} trading?"
    )
    return text, {"symbol": symbol}


def _table_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    place, people, time = pools.title(rng, (1, 2)), rng.randint(1, 12), P.clock(rng)
    text = _pick(
        rng,
        f"Book a table at {place} for {people} people at {time}.",
        f"Reserve {place} at {time}, {people} guests.",
        f"Get us a table for {people} at {place} at {time}.",
    )
    return text, {"restaurant": place, "people": people, "time": time}


def _translate_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    phrase, lang = pools.title(rng, (2, 5)).lower(), rng.choice(LANGUAGES)
    text = _pick(rng, f"Translate '{phrase}' into {lang}.", f"How do you say '{phrase}' in {lang}?")
    return text, {"text": phrase, "target_language": lang}


def _todo_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    item, priority, done = pools.title(rng, (2, 4)).lower(), rng.choice(PRIORITIES), rng.random() < 0.2
    state = " and mark it done" if done else ""
    text = _pick(
        rng,
        f"Add '{item}' to my todo list with {priority} priority{state}.",
        f"New todo: {item} ({priority} priority){state}.",
    )
    return text, {"item": item, "priority": priority, "done": done}


def _contact_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    name, email = pools.person(rng), pools.email(rng)
    phone = f"+{rng.randint(1, 99)} {P.integer(rng, (3, 3))} {P.integer(rng, (4, 7))}"
    text = _pick(
        rng,
        f"Save {name} as a contact: email {email}, phone {phone}.",
        f"Add a contact named {name} ({email}, {phone}).",
    )
    return text, {"contact": {"name": name, "email": email, "phone": phone}}


def _flight_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    a, b = pools.cities(rng, 2)
    date, n = P.date(rng), rng.randint(1, 6)
    text = _pick(
        rng,
        f"Find flights from {a} to {b} on {date} for {n} passengers.",
        f"Search flights {a} to {b}, {date}, {n} travellers.",
        f"I need {n} seats from {a} to {b} on {date}.",
    )
    return text, {"origin": a, "destination": b, "date": date, "passengers": n}


def _order_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    order = P.code(rng)
    text = _pick(
        rng, f"Where is my order {order}?", f"Look up order {order}.", f"What is the status of order {order}?"
    )
    return text, {"order_id": order}


def _time_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    city = pools.city(rng)
    text = _pick(rng, f"What time is it in {city}?", f"Tell me the local time in {city}.")
    return text, {"city": city}


def _reminder_ask(rng: random.Random, pools: Pools) -> tuple[str, Args]:
    what, date, time = pools.title(rng, (2, 4)).lower(), P.date(rng), P.clock(rng)
    text = _pick(
        rng, f"Remind me to {what} on {date} at {time}.", f"Set a reminder for {date} {time}: {what}."
    )
    return text, {"text": what, "at": {"date": date, "time": time}}


CURRENCIES = ["EUR", "USD", "GBP", "JPY", "CHF", "SEK", "NOK", "CAD", "AUD", "INR", "CNY", "BRL"]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Japanese", "Portuguese", "Dutch", "Polish"]
PRIORITIES = ["low", "medium", "high"]
STATUSES = ["shipped", "processing", "delivered", "delayed", "cancelled"]


def _done(what: str) -> Callable[[random.Random, Args, Any], str]:
    return lambda rng, args, result: what.format(**args, result=result)


BANK: tuple[Skill, ...] = (
    Skill(
        tool(
            "set_timer",
            "Start a countdown timer.",
            {
                "minutes": typed("integer", "Duration in minutes.", minimum=1),
                "label": string("A short name."),
            },
            ["minutes", "label"],
        ),
        _timer_ask,
        lambda rng, a: {"ok": True, "timer": a["label"], "minutes": a["minutes"]},
        _done("The {label} timer is set for {minutes} minutes."),
        "a timer",
    ),
    Skill(
        tool(
            "convert_currency",
            "Convert an amount between currencies at today's rate.",
            {
                "amount": typed("number"),
                "from_currency": string("ISO code, e.g. EUR."),
                "to_currency": string("ISO code, e.g. USD."),
            },
            ["amount", "from_currency", "to_currency"],
        ),
        _currency_ask,
        lambda rng, a: {
            "amount": round(a["amount"] * rng.uniform(0.2, 3.0), 2),
            "currency": a["to_currency"],
        },
        lambda rng, a, r: f"{a['amount']} {a['from_currency']} is {r['amount']} {r['currency']}.",
        "a currency conversion",
    ),
    Skill(
        tool(
            "send_email",
            "Send an email.",
            {"to": string("Recipient address."), "subject": string(), "body": string()},
            ["to", "subject", "body"],
        ),
        _email_ask,
        lambda rng, a: f"sent to {a['to']}",
        _done("I sent the email to {to}."),
        "to send an email",
    ),
    Skill(
        tool(
            "create_event",
            "Create a calendar event.",
            {
                "title": string(),
                "date": string("YYYY-MM-DD"),
                "attendees": typed("array", "First names.", items={"type": "string"}),
            },
            ["title", "date", "attendees"],
        ),
        _event_ask,
        lambda rng, a: {"created": True, "id": P.code(rng)},
        lambda rng, a, r: f"{a['title']} is in the calendar on {a['date']} (event {r['id']}).",
        "a calendar event",
    ),
    Skill(
        tool("get_stock_price", "Latest price of a stock.", {"symbol": string("Ticker symbol.")}, ["symbol"]),
        _stock_ask,
        lambda rng, a: {"symbol": a["symbol"], "price": P.amount(rng), "currency": "USD"},
        lambda rng, a, r: f"{a['symbol']} is trading at {r['price']} USD.",
        "a stock price",
    ),
    Skill(
        tool(
            "book_table",
            "Reserve a restaurant table.",
            {"restaurant": string(), "people": typed("integer", minimum=1), "time": string("HH:MM")},
            ["restaurant", "people", "time"],
        ),
        _table_ask,
        lambda rng, a: {"confirmed": True, "reference": P.code(rng)},
        lambda rng, a, r: (
            f"Booked {a['restaurant']} for {a['people']} at {a['time']}; reference {r['reference']}."
        ),
        "a restaurant booking",
    ),
    Skill(
        tool(
            "translate",
            "Translate a short text.",
            {"text": string(), "target_language": string(enum=LANGUAGES)},
            ["text", "target_language"],
        ),
        _translate_ask,
        lambda rng, a: {"translation": Pools().title(rng, (2, 4)).lower()},
        lambda rng, a, r: f"In {a['target_language']}: {r['translation']}.",
        "a translation",
    ),
    Skill(
        tool(
            "add_todo",
            "Add an item to the todo list.",
            {"item": string(), "priority": string(enum=PRIORITIES), "done": typed("boolean")},
            ["item", "priority", "done"],
        ),
        _todo_ask,
        lambda rng, a: {"added": True, "count": rng.randint(1, 40)},
        lambda rng, a, r: (
            f"Added '{a['item']}' with {a['priority']} priority; the list has {r['count']} items."
        ),
        "a new todo item",
    ),
    Skill(
        tool(
            "create_contact",
            "Save a contact.",
            {
                "contact": typed(
                    "object",
                    properties={
                        "name": {"type": "string"},
                        "email": {"type": "string"},
                        "phone": {"type": "string"},
                    },
                    required=["name", "email", "phone"],
                    additionalProperties=False,
                )
            },
            ["contact"],
        ),
        _contact_ask,
        lambda rng, a: {"saved": True},
        lambda rng, a, r: f"Saved {a['contact']['name']}.",
        "to save a contact",
    ),
    Skill(
        tool(
            "search_flights",
            "Search flights.",
            {
                "origin": string("City."),
                "destination": string("City."),
                "date": string("YYYY-MM-DD"),
                "passengers": typed("integer", minimum=1),
            },
            ["origin", "destination", "date", "passengers"],
        ),
        _flight_ask,
        lambda rng, a: {"flights": rng.randint(0, 9), "cheapest": P.amount(rng)},
        lambda rng, a, r: (
            f"There are {r['flights']} flights from {a['origin']} to {a['destination']} on {a['date']}; "
            f"the cheapest is {r['cheapest']}."
        ),
        "flights",
    ),
    Skill(
        tool("lookup_order", "Status of an order.", {"order_id": string()}, ["order_id"]),
        _order_ask,
        lambda rng, a: {"order_id": a["order_id"], "status": rng.choice(STATUSES)},
        lambda rng, a, r: f"Order {a['order_id']} is {r['status']}.",
        "the status of an order",
    ),
    Skill(
        tool("get_time", "Local time in a city.", {"city": string()}, ["city"]),
        _time_ask,
        lambda rng, a: {"city": a["city"], "time": P.clock(rng)},
        lambda rng, a, r: f"It is {r['time']} in {a['city']}.",
        "the local time",
    ),
    Skill(
        tool(
            "set_reminder",
            "Set a reminder.",
            {
                "text": string(),
                "at": typed(
                    "object",
                    properties={"date": {"type": "string"}, "time": {"type": "string"}},
                    required=["date", "time"],
                    additionalProperties=False,
                ),
            },
            ["text", "at"],
        ),
        _reminder_ask,
        lambda rng, a: {"ok": True},
        lambda rng, a, r: f"I will remind you to {a['text']} on {a['at']['date']} at {a['at']['time']}.",
        "a reminder",
    ),
)
