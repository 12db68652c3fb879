"""The calculator's arithmetic (agents/arithmetic.py) on what a model may write: values as Python
computes them, and every expression that would hang, overflow or escape refused with its reason."""

from __future__ import annotations

import json
import operator
import random
import subprocess
import sys
import textwrap

import pytest
from sglang_ds41.agents.arithmetic import MAX_LENGTH, ExpressionError, evaluate

from tests.examples.commands import REPO


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("(18.5 + 4.0) / 2", 11.25),
        ("487 * 36", 17532),
        ("  6406 + 49 ", 6455),
        ("(-16.5 + 19.0) / 2", 1.25),
        ("2 ** 10", 1024),
        ("2 ** -2", 0.25),
        ("-(3) - +4", -7),
        ("7 / 2", 3.5),
        ("1" + "+1" * 499, 500),
        ("2 ** 4095", 2**4095),  # MAX_INT_BITS bits
        ("-(2 ** 4095) - (2 ** 4095 - 1)", -(2**4096) + 1),
    ],
)
def test_values_are_pythons_and_integers_stay_exact(expression, value):
    got = evaluate(expression)
    assert got == value and type(got) is type(value)


def test_random_expressions_get_pythons_own_values():
    """Expressions of the corpus's kind (numbers, + - * /, signs, parentheses) against the
    operators applied directly: the corpus's tool results are these values (training/corpus)."""
    rng = random.Random(0)
    ops = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}

    def expression(depth: int) -> tuple[str, int | float]:
        if depth == 0 or rng.random() < 0.3:
            decimal = round(rng.uniform(-1e3, 1e3), rng.randint(0, 3))
            number = rng.choice((rng.randint(-(10**6), 10**6), decimal))
            return repr(number), number
        (left_text, left), (right_text, right) = expression(depth - 1), expression(depth - 1)
        symbol = rng.choice("+-*" if right == 0 else "+-*/")
        return f"({left_text} {symbol} {right_text})", ops[symbol](left, right)

    for _ in range(3000):
        text, value = expression(4)
        assert repr(evaluate(text)) == repr(value), text


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("9 ** 9 ** 9 ** 9", "9 ** 387420489 would have more than 4,096 bits"),
        ("(2 ** 4000) ** 2", "a 4,001-bit integer ** 2 would have more than 4,096 bits"),
        ("2 ** 4096", "more than 4,096 bits"),
        ("2 ** 4095 * 2 ** 4095", "more than 4,096 bits"),
        ("10.0 ** 400", "a number in the calculation is too large for a float"),
        ("0.5 ** 10 ** 400", "a number in the calculation is too large for a float"),
        ("10 ** 400 / 10 ** -1", "too large for a float"),
        ("1e999", "a number in the calculation is too large for a float"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 / 0", "division by zero"),
        ("1 / (2 - 2)", "division by zero"),
        ('__import__("os").system("true")', "only numbers, + - * / ** and parentheses are allowed"),
        ('"a" * 10 ** 9', "found '\"a\"'"),
        ("True + 1", "found 'True'"),
        ("x + 1", "found 'x'"),
        ("[1] * 3", "found '[1]'"),
        ("1 // 2", "found '1 // 2'"),
        ("1 2", "is not an arithmetic expression (invalid syntax)"),
        ("", "is not an arithmetic expression"),
        ("(" * 300 + "1" + ")" * 300, "too many nested parentheses"),
        ("-" * 999 + "1", "nested too deeply"),
        ("1" * (MAX_LENGTH + 1), f"at most {MAX_LENGTH:,}"),
    ],
)
def test_refusals_name_the_problem(expression, reason):
    with pytest.raises(ExpressionError) as refused:
        evaluate(expression)
    assert reason in str(refused.value)
    assert isinstance(refused.value, ValueError)  # what a tool raises for a bad argument


def test_the_weather_example_survives_a_power_tower_from_the_model():
    """A model that asks the weather example's calculator for 9 ** 9 ** 9 ** 9: the call comes back
    as an error the model reads, and the run ends. (Before the bound, Python's integer power held
    the interpreter lock for hours: the run's tool timeout never fired and the process hung.)"""
    program = textwrap.dedent(
        """
        import json, sys
        sys.path.insert(0, "examples/agents")
        import weather_calculator as example
        from sglang_ds41.agents import Runner
        from sglang_ds41.agents.testing import Reply, ScriptedServer

        script = [Reply(tool_calls=[("calculate", {"expression": "9 ** 9 ** 9 ** 9"})]), Reply(content="ok")]
        with ScriptedServer(script) as server:
            result = Runner.run_sync(example.agent, "Compute it.", base_url=server.base_url)
        print(json.dumps([m["content"] for m in result.messages if m["role"] == "tool"]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (tool_result,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert "9 ** 387420489 would have more than 4,096 bits" in tool_result
