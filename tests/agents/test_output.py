"""Structured output: response_format, client-side validation, bounded repair."""

from __future__ import annotations

import pydantic
import pytest
from sglang_ds41.agents import Agent, OutputValidationError, Runner
from sglang_ds41.agents.output import OutputSpec
from sglang_ds41.agents.testing import Reply

from .conftest import fast_policies


class Invoice(pydantic.BaseModel):
    vendor: str
    total: float = pydantic.Field(ge=0)
    currency: str = "EUR"


def test_pydantic_output_becomes_a_json_schema_response_format():
    spec = OutputSpec.of(Invoice)
    assert spec.response_format() == {
        "type": "json_schema",
        "json_schema": {
            "name": "Invoice",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {
                    "vendor": {"type": "string"},
                    "total": {"type": "number", "minimum": 0},
                    "currency": {
                        "anyOf": [{"type": "string"}, {"type": "null"}],
                        "description": 'Default: "EUR".',
                    },
                },
                "additionalProperties": False,
                "required": ["vendor", "total", "currency"],
            },
        },
    }


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("not json", "not valid JSON"),
        ('{"vendor": "ACME", "total": -5, "currency": null}', "/total: -5 is less than the minimum of 0"),
        ('{"vendor": "ACME", "currency": null}', "'total' is a required property"),
    ],
)
def test_validation_reports_what_is_wrong(content, problem):
    value, message = OutputSpec.of(Invoice).validate(content)
    assert value is None and problem in message


def test_fenced_json_and_null_defaults_are_accepted():
    value, problem = OutputSpec.of(Invoice).validate(
        '```json\n{"vendor": "A", "total": 3, "currency": null}\n```'
    )
    assert problem is None and value == Invoice(vendor="A", total=3, currency="EUR")


def test_a_reply_that_fails_validation_gets_a_repair_turn(serve):
    server = serve(
        [
            Reply(reasoning_content="r", content='{"vendor": "ACME", "total": -1, "currency": "USD"}'),
            Reply(reasoning_content="r", content='{"vendor": "ACME", "total": 12.5, "currency": "USD"}'),
        ]
    )
    agent = Agent(
        name="extract",
        instructions="Extract the invoice as JSON.",
        output_type=Invoice,
        policies=fast_policies(),
    )
    result = Runner.run_sync(agent, "ACME, 12.50 USD", base_url=server.base_url)
    assert result.final_output == Invoice(vendor="ACME", total=12.5, currency="USD")
    assert all(b["response_format"]["type"] == "json_schema" for b in server.bodies)
    repair = server.bodies[1]["messages"][-1]
    assert repair["role"] == "user" and "/total: -1 is less than the minimum of 0" in repair["content"]
    assert "## Response Format:" in server.requests[0].prompt


def test_output_that_never_validates_fails_clearly_after_the_repair_budget(serve):
    server = serve(lambda body, i: Reply(reasoning_content="r", content="I refuse"))
    agent = Agent(name="extract", output_type=Invoice, max_output_repairs=2, policies=fast_policies())
    with pytest.raises(
        OutputValidationError, match=r"never matched the output schema 'Invoice' \(2 repair turns"
    ):
        Runner.run_sync(agent, "ACME", base_url=server.base_url)
    assert len(server.requests) == 3


def test_plain_json_schema_output(serve):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}, "required": ["n"]}
    server = serve([Reply(content='{"n": 3}'), Reply(content='{"n": 4}')])
    agent = Agent(name="even", output_type=schema, thinking=False, policies=fast_policies())
    assert Runner.run_sync(agent, "an even number", base_url=server.base_url).final_output == {"n": 4}
