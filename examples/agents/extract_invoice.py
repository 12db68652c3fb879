"""Structured extraction: the answer is an `Invoice`, validated client-side, repaired if needed.

    sglang-ds41 serve --tiny --port 30000 &
    python examples/agents/extract_invoice.py --base-url http://127.0.0.1:30000/v1
    python examples/agents/extract_invoice.py --scripted

The request carries the `Invoice` schema as its `response_format`, so the server's grammar keeps
the trained tiny model's answer to the schema's shape; the values are the model's own reading
of the text. `--scripted` shows the repair turn: its first reply breaks the currency's pattern.
"""

from __future__ import annotations

import argparse

from pydantic import BaseModel, Field
from sglang_ds41.agents import Agent, AgentError, Runner

TEXT = "Invoice 2025-117 from ACME GmbH: 3 widgets at 4.50 EUR each, total 13.50 EUR, due 2025-12-01."


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


agent = Agent(
    name="extract",
    instructions="Extract the invoice described by the user as JSON.",
    output_type=Invoice,
    thinking=False,
)


def scripted():
    from sglang_ds41.agents.testing import Reply, ScriptedServer

    good = (
        '{"number": "2025-117", "vendor": "ACME GmbH", "items": [{"description": "widget", "quantity": 3, '
        '"unit_price": 4.5}], "total": 13.5, "currency": "EUR", "due_date": "2025-12-01"}'
    )
    # The first reply breaks `pattern` (a keyword grammar engines often skip): one repair turn.
    return ScriptedServer(
        [Reply(content=good.replace('"EUR"', '"euro"')), Reply(content=good)], validate=True
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="the server's OpenAI API: http://127.0.0.1:30000/v1")
    where.add_argument("--scripted", action="store_true", help="an in-process scripted server")
    parser.add_argument("--text", default=TEXT, help="the document to extract from")
    args = parser.parse_args()
    try:
        if args.scripted:
            with scripted() as server:
                result = Runner.run_sync(agent, args.text, base_url=server.base_url)
        else:
            result = Runner.run_sync(agent, args.text, base_url=args.base_url)
    except AgentError as error:  # no server, a refused request: one line, not a traceback
        parser.exit(1, f"error: {error}\n")
    print(result.final_output.model_dump_json(indent=2))
    print(f"({result.steps} steps)")
