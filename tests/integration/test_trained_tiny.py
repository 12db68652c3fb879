"""The trained tiny model through `sglang-ds41 serve --tiny`, asked as a user would: the
plain `openai` client, default settings (thinking on), entities it never saw in training.

What the shipped model does reliably is the *shape* of each task (which tool, how many calls,
arguments and answers that satisfy the declared schemas), copying numbers into a call, and the
same greedy tokens as the pure-PyTorch reference. A name it never saw it mostly writes wrong
after its first piece (docs/TRAINING.md §7); `benchmarks/tiny_eval.py` measures that, these tests
do not pretend it."""

from __future__ import annotations

import json
import random

import jsonschema
import openai
import pytest
import torch
from sglang_ds41.encoding import encode_prompt, render_request

from sglang_ds41.cache import trained_tiny_checkpoint
from sglang_ds41.reference.generate import generate
from sglang_ds41.reference.weights import load_reference
from sglang_ds41.training import evaluate
from sglang_ds41.training.corpus import toolbank
from sglang_ds41.training.corpus.pools import HELD_OUT, Pools
from sglang_ds41.training.corpus.tasks import invoice_schema
from tests.integration.server import running_server

pytestmark = pytest.mark.integration
HELD = Pools(HELD_OUT)
MODEL = "DeepSeek-V4.1-Flash"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained-tiny")
    with running_server(trained_tiny_checkpoint(), log_path=root / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=300, max_retries=0)


def _ask(client, text: str, **body):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], **body)


def _calls(reply) -> list[tuple[str, dict]]:
    calls = reply.choices[0].message.tool_calls or []
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


def _schema(tool: dict) -> dict:
    return tool["function"]["parameters"]


def test_a_weather_question_gets_get_weather_calls_with_a_city(client):
    city = HELD.city(random.Random(11))
    reply = _ask(client, f"What is the weather in {city}?", tools=[toolbank.GET_WEATHER, toolbank.CALCULATE])
    calls = _calls(reply)
    assert calls and reply.choices[0].finish_reason == "tool_calls"
    for name, arguments in calls:
        assert name == "get_weather"
        jsonschema.validate(arguments, _schema(toolbank.GET_WEATHER))


@pytest.mark.parametrize(
    ("question", "expression"), [("What is 487 * 36?", "487 * 36"), ("What is 262 + 3991?", "262 + 3991")]
)
def test_arithmetic_goes_to_the_calculator_with_the_users_numbers(client, question, expression):
    """(Asked "Compute 487 * 36." the shipped model mostly writes "487 * 36." and ends the turn
    inside the call: a malformed call, README "What it does not".)"""
    reply = _ask(client, question, tools=[toolbank.GET_WEATHER, toolbank.CALCULATE])
    [(name, arguments)] = _calls(reply)
    assert name == "calculate"
    jsonschema.validate(arguments, _schema(toolbank.CALCULATE))
    assert arguments["expression"] == expression


def test_it_picks_the_tool_that_fits_among_several_with_schema_valid_arguments(client):
    label = HELD.made_up_word(random.Random(13)).lower()
    tools = [skill.tool for skill in toolbank.BANK[:5]]
    reply = _ask(client, f"Set a timer for 25 minutes called {label}.", tools=tools)
    [(name, arguments)] = _calls(reply)
    [timer] = [t for t in tools if t["function"]["name"] == "set_timer"]
    assert name == "set_timer"
    jsonschema.validate(arguments, _schema(timer))


def test_an_invoice_comes_back_as_json_valid_under_its_schema(client):
    vendor = HELD.company(random.Random(14))
    text = f"Invoice 2031-4417 from {vendor}: 4 bolts at 2.5 EUR each, total 10.0 EUR, due 2031-02-17."
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Extract the invoice described by the user as JSON."},
                  {"role": "user", "content": text}],
        response_format=invoice_schema(),
    )  # fmt: skip
    invoice = json.loads(reply.choices[0].message.content)
    jsonschema.validate(invoice, invoice_schema()["json_schema"]["schema"])


def test_turns_end_by_themselves_rather_than_looping_to_the_token_limit(client):
    """A model that copies can also loop ("The capital of Peru is Peru is Peru ..."); the
    shipped one must end each of these turns well before 300 tokens."""
    city, label = HELD.city(random.Random(31)), HELD.made_up_word(random.Random(32)).lower()
    asks = [
        (f"What is the weather in {city}?", [toolbank.GET_WEATHER, toolbank.CALCULATE]),
        ("What is the capital of Peru?", None),
        (f"Remember the word {label}. Which word did I ask you to remember?", None),
        ("Compute 1234 + 4321.", [toolbank.CALCULATE]),
    ]
    for text, tools in asks:
        reply = _ask(client, text, max_tokens=300, **({"tools": tools} if tools else {}))
        assert reply.choices[0].finish_reason in ("stop", "tool_calls"), (text, reply.choices[0].message)


def test_the_server_writes_the_reference_models_greedy_answer(server):
    """Exactness on trained weights: the served greedy turn (reasoning, content, calls) equals the
    pure-PyTorch reference model's for held-out requests of four task shapes, the JSON answer
    decoded under the server's grammar in both (`reference.grammar`): an extraction whose
    unconstrained greedy answer is not the served one."""
    model = load_reference(trained_tiny_checkpoint(), dtype=torch.float32)
    reference = evaluate.ReferenceCompleter(model, 160)
    served = evaluate.ServerCompleter(f"{server.url}/v1", 160)
    city = HELD.city(random.Random(21))
    bodies = [
        {"model": MODEL, "messages": [{"role": "user", "content": f"How warm is it in {city} right now?"}],
         "tools": [toolbank.GET_WEATHER]},
        {"model": MODEL, "messages": [{"role": "user", "content": "Compute 17 * 3."}],
         "tools": [toolbank.CALCULATE], "thinking": {"type": "disabled"}},
        {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of Peru?"}]},
        EXTRACTION,
    ]  # fmt: skip
    for body in bodies:
        got, want = served.complete(body), reference.complete(body)
        for field in ("reasoning_content", "content"):
            assert (got.get(field) or "") == (want.get(field) or ""), field
        assert evaluate.calls_of(got) == evaluate.calls_of(want)
        assert _malformed(got) == _malformed(want)
        assert got[evaluate.FINISH] == want[evaluate.FINISH]
    # the grammar decides that answer: unconstrained, the reference writes another one
    rendered = render_request(EXTRACTION)
    free = generate(model, encode_prompt(rendered), 160, stop_ids=(model.config.eos_token_id,))
    assert evaluate.served_message(free, rendered.parsing)["content"] != got["content"]


# A schema the corpus never uses: unconstrained, the model writes some other JSON; under the
# schema's grammar every key and the five digits are the grammar's doing.
DELIVERY = {
    "type": "object",
    "properties": {
        "zip_code": {"type": "string", "pattern": "^[0-9]{5}$"},
        "parcels": {"type": "integer", "minimum": 3},
    },
    "required": ["zip_code", "parcels"],
    "additionalProperties": False,
}
EXTRACTION = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "Extract the delivery as JSON."},
        {"role": "user", "content": "Two parcels go to Dana Reyes in Lisbon."},
    ],
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "delivery", "schema": DELIVERY, "strict": True},
    },
}


def _malformed(message: dict) -> list[tuple[str, str]]:
    calls = message.get("invalid_tool_calls", [])
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
