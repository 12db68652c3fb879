"""Run inside the agent SDKs' venv, before the README's snippet: records the body of every Chat
Completions request the SDK sends (openai 3.x speaks through httpx2), and writes results.

Not a test module: tests/integration/test_agent_sdks.py puts this file, the README snippet and
one of the scenario files together into the script it runs.
"""

import asyncio
import json
import sys

import httpx2
from pydantic import BaseModel

REQUESTS: list[dict] = []
_send = httpx2.AsyncClient.send


async def _recording_send(self, request, *args, **kwargs):
    if request.url.path.endswith("/chat/completions"):
        REQUESTS.append(json.loads(request.content))
    return await _send(self, request, *args, **kwargs)


httpx2.AsyncClient.send = _recording_send


class Person(BaseModel):
    name: str
    age: int
    ok: bool


TEMPERATURES = {"Paris": "18.5", "Oslo": "4.0"}
EXECUTED: list[tuple[str, dict]] = []


def reasoning_sent_back() -> list[list[str | None]]:
    """Per request, the `reasoning_content` of each assistant message it sent."""
    return [[m.get("reasoning_content") for m in r["messages"] if m["role"] == "assistant"] for r in REQUESTS]


def report(results: dict) -> None:
    json.dump(results, sys.stdout, ensure_ascii=False)


def run(main) -> None:
    asyncio.run(main())
