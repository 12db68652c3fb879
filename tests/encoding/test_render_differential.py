"""Generated requests render to the official renderer's exact prompt and token ids, and are
rejected exactly when it rejects them."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from sglang_ds41.encoding import render_request
from sglang_ds41.encoding.render import prefix_closes_reasoning

from tests.encoding.oracle import assert_same, wheel_conversation
from tests.encoding.strategies import Request, requests


def _check(request: Request) -> None:
    assert_same(request.text() if request.has_raw() else request.body)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(requests())
def test_generated_requests_match_the_official_renderer(request: Request) -> None:
    _check(request)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(requests())
def test_generated_requests_as_json_text_match_the_official_renderer(request: Request) -> None:
    assert_same(request.text())


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(requests())
def test_many_generated_requests_match_the_official_renderer(request: Request) -> None:
    _check(request)


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(requests())
def test_parsing_options_match_the_official_conversion(request: Request) -> None:
    body = request.text()
    try:
        official = wheel_conversation(body).parsing_options
    except Exception:  # rejected requests are covered above
        return
    ours = render_request(body)
    stage = official.thinking_initial_stage
    stage_name = None if stage is None else str(stage).rsplit(".", 1)[-1]
    if prefix_closes_reasoning(ours.conversation) and stage_name == "ReasoningContinuation":
        stage_name = "ContentContinuation"  # the wheel's options contradict its own prompt here
    expected = {
        None: (False, False, False),
        "ReasoningStart": (True, False, False),
        "ReasoningContinuation": (True, True, False),
        "ContentContinuation": (True, False, True),
    }[stage_name]
    got = ours.parsing
    assert (got.thinking, got.reasoning_started, got.in_content) == expected
    assert got.parse_tool_calls == official.parse_tool_calls
    assert got.starts_in_tool_calls == official.starts_in_tool_calls
    assert got.parse_json_output == official.parse_json_output
