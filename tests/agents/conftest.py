"""Fixtures: a scripted OpenAI-compatible server on 127.0.0.1 (see sglang_ds41.agents.testing)."""

from __future__ import annotations

import pytest
from sglang_ds41.agents import Limits, Policies, ThreadExecutor
from sglang_ds41.agents.testing import ScriptedServer


@pytest.fixture
def serve():
    """`serve(script, validate=True)` -> a started server, stopped after the test."""
    started: list[ScriptedServer] = []

    def start(script, validate: bool = True) -> ScriptedServer:
        server = ScriptedServer(script, validate=validate).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def fast_policies(**limits) -> Policies:
    """Thread executor (tests may share Python state with tools) and tight limits."""
    return Policies(limits=Limits(**limits), executor=ThreadExecutor())
