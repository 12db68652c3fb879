"""openai-agents against the server, after prelude.py and the README's openai-agents snippet
(which defines `model`). Prints one JSON object of results."""

# ruff: noqa: F821 (prelude.py and the README snippet define the free names)

from openai.types.responses import ResponseTextDeltaEvent

from agents import Agent, Runner, function_tool


@function_tool
def get_weather(city: str) -> str:
    """The temperature of a city in °C."""
    EXECUTED.append(("get_weather", {"city": city}))
    return TEMPERATURES[city]


@function_tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    EXECUTED.append(("calculate", {"expression": expression}))
    return "11.25" if expression == "(18.5 + 4.0) / 2" else "?"


@function_tool(strict_mode=False)  # strict tools get the server's grammar, which allows no broken call
def echo(value: str) -> str:
    """Echo the value."""
    EXECUTED.append(("echo", {"value": value}))
    return value


QUESTION = "[script:weather-calculator] What is the average temperature of Paris and Oslo?"


async def main() -> None:
    results = {}
    tools = [get_weather, calculate]
    weather = Agent(name="weather", instructions="Use the tools.", tools=tools, model=model)

    run = await Runner.run(weather, QUESTION)
    results["tools"] = {"output": run.final_output, "executed": list(EXECUTED)}
    results["tools"]["reasoning"] = reasoning_sent_back()

    EXECUTED.clear()
    REQUESTS.clear()
    streamed = Runner.run_streamed(weather, QUESTION)
    deltas = []
    async for event in streamed.stream_events():
        if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent):
            deltas.append(event.data.delta)
    results["streamed"] = {"output": streamed.final_output, "text": "".join(deltas)}
    results["streamed"] |= {"executed": list(EXECUTED), "reasoning": reasoning_sent_back()}

    REQUESTS.clear()
    person = Agent(name="person", instructions="Describe a person.", output_type=Person, model=model)
    run = await Runner.run(person, "[script:json] Describe a person as JSON.")
    results["output_type"] = {"output": run.final_output.model_dump()}
    results["output_type"]["response_format"] = REQUESTS[-1]["response_format"]

    EXECUTED.clear()
    REQUESTS.clear()
    echoing = Agent(name="echo", instructions="Echo.", tools=[echo], model=model)
    run = await Runner.run(echoing, "[script:unclosed-block] go")
    results["malformed_only"] = {"output": run.final_output, "executed": list(EXECUTED)}
    results["malformed_only"]["requests"] = len(REQUESTS)
    report(results)


run(main)
