"""pydantic-ai against the server, after prelude.py and the README's pydantic-ai snippet (which
defines `model`). Prints one JSON object of results."""

# ruff: noqa: F821 (prelude.py and the README snippet define the free names)

from pydantic_ai import Agent, NativeOutput, PromptedOutput, Tool, ToolOutput
from pydantic_ai.exceptions import UnexpectedModelBehavior

QUESTION = "[script:weather-calculator] What is the average temperature of Paris and Oslo?"


def get_weather(city: str) -> str:
    """The temperature of a city in °C."""
    EXECUTED.append(("get_weather", {"city": city}))
    return TEMPERATURES[city]


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    EXECUTED.append(("calculate", {"expression": expression}))
    return "11.25" if expression == "(18.5 + 4.0) / 2" else "?"


def echo(value: str) -> str:
    """Echo the value."""
    EXECUTED.append(("echo", {"value": value}))
    return value


async def main() -> None:
    results = {}
    weather = Agent(model, instructions="Use the tools.", tools=[get_weather, calculate])
    run = await weather.run(QUESTION)
    results["tools"] = {"output": run.output, "executed": list(EXECUTED), "reasoning": reasoning_sent_back()}

    modes = {
        "native": (NativeOutput(Person), "[script:json]"),
        "prompted": (PromptedOutput(Person), "[script:json]"),
        "tool": (ToolOutput(Person), "[script:final-result]"),
    }
    for name, (output_type, trigger) in modes.items():
        REQUESTS.clear()
        agent = Agent(model, instructions="Describe a person.", output_type=output_type)
        run = await agent.run(f"{trigger} go")
        last = REQUESTS[-1]
        results[name] = {"output": run.output.model_dump(), "requests": len(REQUESTS),
                         "response_format": last.get("response_format"),
                         "tools": [t["function"]["name"] for t in last.get("tools") or []]}  # fmt: skip

    EXECUTED.clear()
    REQUESTS.clear()
    # not strict: a strict tool gets the server's grammar, which allows no broken call
    echoing = Agent(model, instructions="Echo.", tools=[Tool(echo, strict=False)])
    try:
        outcome = {"output": (await echoing.run("[script:unclosed-block] go")).output}
    except UnexpectedModelBehavior as error:
        outcome = {"error": str(error)}
    results["malformed_only"] = outcome | {"executed": list(EXECUTED), "requests": len(REQUESTS)}
    report(results)


run(main)
