"""The agent SDKs people use, against a real `sglang-ds41 serve`: openai-agents and pydantic-ai,
pinned in tests/integration/sdk/requirements.txt, set up by the README's own snippets.

The SDKs need openai>=3 and this environment has the serve extra's openai==2.8.0, so they run in
a venv of their own (built once per pin set into the sglang-ds41 cache, ~35 s), as subprocess
clients: each script is tests/integration/sdk/prelude.py (records the request bodies), the
README block for that SDK with the server's URL and model name put in, and the SDK's scenarios;
it prints its results as JSON. The scripted model plays the conversations (the weather and
calculator agent run of examples/agents, a JSON person, a `final_result` call, an unclosed
calls block). Both served names are used: `DeepSeek-V4.1-Flash` (the session's scripted server)
and `default` (the second scripted server, whose thinking token budget of 64 leaves these short
reasonings whole).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_ds41.cache import cache_dir
from sglang_ds41.checkpoint import scripted
from tests.examples.commands import REPO

pytestmark = pytest.mark.integration

SDK_DIR = Path(__file__).parent / "sdk"
REQUIREMENTS = SDK_DIR / "requirements.txt"
README_URL = "http://127.0.0.1:30000/v1"
README_MODEL = '"DeepSeek-V4.1-Flash"'
ANSWER = "Paris 18.5 °C, Oslo 4.0 °C; the average is 11.25 °C."
PERSON = json.loads(scripted.PERSON_JSON_TEXT)
WEATHER_RUN = [
    ["get_weather", {"city": "Paris"}],
    ["get_weather", {"city": "Oslo"}],
    ["calculate", {"expression": "(18.5 + 4.0) / 2"}],
]


def same_run(executed: list) -> bool:
    """The weather run's tool executions: the two parallel lookups in either order (the SDKs run
    a turn's calls concurrently), then the calculation."""
    lookups, expected = sorted(map(json.dumps, executed[:2])), sorted(map(json.dumps, WEATHER_RUN[:2]))
    return len(executed) == 3 and lookups == expected and executed[2] == WEATHER_RUN[2]


# The reasoning of each earlier assistant turn, as every request of the three-turn run sends it.
REASONING_SENT_BACK = [[], ["Look up both cities."], ["Look up both cities.", "Average them."]]


@pytest.fixture(scope="session")
def sdk_python() -> str:
    """The python of a venv with the pinned SDKs, built once per pin set: into a temporary
    folder, then renamed into place (the scripts run as `python script.py`, which a moved venv
    still serves)."""
    pins = REQUIREMENTS.read_bytes()
    venv = cache_dir() / f"agent-sdks-{hashlib.sha256(pins).hexdigest()[:12]}"
    if not (venv / "bin" / "python").exists():
        building = venv.with_name(f"{venv.name}.building-{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        subprocess.run(["python3.11", "-m", "venv", str(building)], check=True)
        pip = [str(building / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--no-input"]
        install = [*pip, "install", "--quiet", "-r", str(REQUIREMENTS)]
        done = subprocess.run(install, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        try:
            building.rename(venv)
        except OSError:  # another session built it meanwhile
            shutil.rmtree(building, ignore_errors=True)
    return str(venv / "bin" / "python")


def readme_snippet(sdk: str) -> str:
    """The README's python block for `sdk` (its first line is `# openai-agents ...` / `# pydantic-ai ...`)."""
    text = (REPO / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    [block] = [b for b in blocks if b.startswith(f"# {sdk} ")]
    assert README_URL in block and README_MODEL in block, block
    return block


def run_sdk(python: str, sdk: str, server, model: str, tmp_path: Path) -> dict:
    snippet = readme_snippet(sdk).replace(README_URL, server.openai_url)
    snippet = snippet.replace(README_MODEL, json.dumps(model))
    scenarios = (SDK_DIR / f"{sdk.replace('-', '_')}_scenarios.py").read_text()
    script = tmp_path / f"{sdk}.py"
    script.write_text("\n\n".join([(SDK_DIR / "prelude.py").read_text(), snippet, scenarios]))
    done = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, f"{sdk} against {model}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


SERVED = {"DeepSeek-V4.1-Flash": "scripted_server", "default": "scripted_budget_server"}


@pytest.fixture(scope="module", params=sorted(SERVED))
def served(request):
    """(server, the model name clients give it: its --served-model-name)."""
    return request.getfixturevalue(SERVED[request.param]), request.param


@pytest.fixture(scope="module")
def openai_agents(sdk_python, served, tmp_path_factory) -> dict:
    server, model = served
    return run_sdk(sdk_python, "openai-agents", server, model, tmp_path_factory.mktemp("openai-agents"))


@pytest.fixture(scope="module")
def pydantic_ai(sdk_python, served, tmp_path_factory) -> dict:
    server, model = served
    return run_sdk(sdk_python, "pydantic-ai", server, model, tmp_path_factory.mktemp("pydantic-ai"))


# ---- openai-agents ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["tools", "streamed"])
def test_openai_agents_runs_function_tools_and_sends_the_reasoning_back(openai_agents, mode):
    run = openai_agents[mode]
    assert run["output"] == ANSWER
    assert same_run(run["executed"]), run["executed"]
    assert run["reasoning"] == REASONING_SENT_BACK


def test_openai_agents_streams_the_answer(openai_agents):
    assert openai_agents["streamed"]["text"] == ANSWER


def test_openai_agents_output_type(openai_agents):
    result = openai_agents["output_type"]
    assert result["output"] == PERSON
    assert result["response_format"]["type"] == "json_schema"


def test_openai_agents_sees_a_turn_of_only_malformed_calls_as_its_answer(openai_agents):
    """finish_reason "stop", no tool_calls (the call is in invalid_tool_calls, which the SDK does
    not read): the run ends with the turn's text, and nothing runs."""
    assert openai_agents["malformed_only"] == {"output": "", "executed": [], "requests": 1}


# ---- pydantic-ai -----------------------------------------------------------------------------


def test_pydantic_ai_runs_tools_and_sends_the_reasoning_back(pydantic_ai):
    run = pydantic_ai["tools"]
    assert run["output"] == ANSWER
    assert same_run(run["executed"]), run["executed"]
    assert run["reasoning"] == REASONING_SENT_BACK


def test_pydantic_ai_native_output_asks_for_the_json_schema(pydantic_ai):
    result = pydantic_ai["native"]
    assert (result["output"], result["requests"]) == (PERSON, 1)
    assert result["response_format"]["type"] == "json_schema"


def test_pydantic_ai_prompted_output(pydantic_ai):
    assert (pydantic_ai["prompted"]["output"], pydantic_ai["prompted"]["requests"]) == (PERSON, 1)


def test_pydantic_ai_tool_output_is_the_final_result_call(pydantic_ai):
    result = pydantic_ai["tool"]
    assert (result["output"], result["requests"]) == (PERSON, 1)
    assert result["tools"] == ["final_result"]


def test_pydantic_ai_asks_again_after_a_turn_of_only_malformed_calls(pydantic_ai):
    """No call and no text is no answer for pydantic-ai: it asks again, and when the model (the
    scripted one answers the same) does it again, the run fails by name; the call never runs."""
    result = pydantic_ai["malformed_only"]
    assert result == {"error": "Exceeded maximum output retries (1)", "executed": [], "requests": 2}
