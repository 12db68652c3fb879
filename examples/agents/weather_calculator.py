"""A tool agent with a weather lookup and a calculator.

    sglang-ds41 serve --tiny --port 30000 &
    python examples/agents/weather_calculator.py --base-url http://127.0.0.1:30000/v1 --transcript
    python examples/agents/weather_calculator.py --scripted

Against `serve --tiny` the trained tiny model decides every step itself (which calls, in
parallel or not, the arithmetic it hands the calculator, the answer); what it gets right and
wrong is measured in docs/TRAINING.md. Any other V4.1 server works too. `--scripted` plays the
intended run (two parallel weather calls, a calculator call, the answer) from an in-process
scripted server instead, no SGLang needed.
"""

from __future__ import annotations

import argparse
import json

from sglang_ds41.agents import Agent, AgentError, Runner, function_tool
from sglang_ds41.agents.arithmetic import evaluate

WEATHER = {"paris": 18.5, "oslo": 4.0, "tokyo": 22.0}
QUESTION = "What is the average temperature of Paris and Oslo right now?"


@function_tool
def get_weather(city: str) -> dict:
    """Current temperature of a city in degrees Celsius.

    Args:
        city: City name, e.g. Paris.
    """
    if city.lower() not in WEATHER:
        raise KeyError(f"no weather data for {city}")
    return {"city": city, "celsius": WEATHER[city.lower()]}


@function_tool
def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression (+ - * / ** and parentheses only).

    Args:
        expression: For example "(18.5 + 4) / 2".
    """
    return evaluate(expression)  # parsed, never eval'ed; bounded (agents/arithmetic.py)


agent = Agent(
    name="weather-calculator",
    instructions="Answer with the tools. Call independent tools in parallel.",
    tools=[get_weather, calculate],
    reasoning_effort="low",
)


def scripted():
    from sglang_ds41.agents.testing import Reply, ScriptedServer

    return ScriptedServer(
        [
            Reply(
                reasoning_content="Look up both cities.",
                tool_calls=[("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})],
            ),
            Reply(
                reasoning_content="Average them.",
                tool_calls=[("calculate", {"expression": "(18.5 + 4.0) / 2"})],
            ),
            Reply(reasoning_content="Done.", content="Paris 18.5 °C, Oslo 4.0 °C; the average is 11.25 °C."),
        ],
        validate=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="the server's OpenAI API: http://127.0.0.1:30000/v1")
    where.add_argument("--scripted", action="store_true", help="an in-process scripted server")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--transcript", action="store_true", help="print every message of the run")
    args = parser.parse_args()
    question = args.question
    try:
        if args.scripted:
            with scripted() as server:
                result = Runner.run_sync(agent, question, base_url=server.base_url)
        else:
            result = Runner.run_sync(agent, question, base_url=args.base_url)
    except AgentError as error:  # no server, a refused request: one line, not a traceback
        parser.exit(1, f"error: {error}\n")
    if args.transcript:
        for message in result.messages:
            print(json.dumps(message, ensure_ascii=False))
    print(result.final_output)
    print(f"({result.steps} steps, {result.tool_calls} tool calls, {result.usage.total_tokens} tokens)")
