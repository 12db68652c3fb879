"""What the trained tiny model does on held-out conversations, and what its formats cost.

    .venv/bin/python benchmarks/tiny_eval.py [--model-dir DIR] [--per-family 12] [--loops 20]
                                             [--perplexity 40] [--reference-only] [--no-quality]

Cases are `training.evaluate.cases` (held-out entities: city and person names, made-up words and
numbers no training conversation has), greedy:

1. **The model as shipped** (base variant, FP8 Engram tables): every case through a real
   `sglang-ds41 serve` (the OpenAI client, 6 requests at a time) and in the pure-PyTorch reference
   model (a JSON answer decoded under the server's grammar in both, `reference/grammar.py`);
   per-kind scores (tool-call exact match, answer facts, JSON validity and field accuracy,
   short answers), the weather-average loop end to end (the agent runner against the server;
   `evaluate.run_loop` in the reference), held-out perplexity, and whether the server's greedy
   answer equals the reference's on every case.
2. **The quality table**: the same cases through the server with the Engram tables re-encoded by
   `convert-engram` (MXFP4 with OCP and least-squares scales, NVFP4 with ModelOpt and
   least-squares scales; NVFP4 *experts* need no row: the NVFP4 variant re-encodes the MXFP4 codes
   losslessly, the same values); in the reference,
   the experts at their trained float32 values when a run directory is given (`--run-dir`), and
   Engram off (tables zeroed: the layer adds gate * 0). Each row also says on how many cases its
   greedy answer is the shipped tables' answer, message for message ("same as fp8"): the task
   scores of a few dozen cases move by a case either way, the answers themselves show what a
   format changes.

Writes `benchmarks/results/tiny_eval.json` (or `--out`; with every case whose server answer is
not the reference's, request and both answers) and prints a short table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from sglang_ds41.cache import trained_tiny_checkpoint
from sglang_ds41.reference.weights import load_reference
from sglang_ds41.serve.server_process import running_server
from sglang_ds41.training import evaluate as E

RESULTS = Path(__file__).resolve().parent / "results" / "tiny_eval.json"
PARALLEL = 6


def through_server(
    model_dir: Path, cases: list[E.Case], loops: list[E.LoopTask], log: Path
) -> dict[str, Any]:
    with running_server(model_dir, log_path=log) as server:
        completer = E.ServerCompleter(f"{server.url}/v1")
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
            answers = list(pool.map(completer.complete, [c.body for c in cases]))
        report = E.Report()
        for case, got in zip(cases, answers, strict=True):
            report.add(case, got, E.score(case, got))
        loop_ok = sum(runner_loop(f"{server.url}/v1", task) for task in loops)
        return {
            "summary": report.summary() | {"loop.success": round(loop_ok / max(1, len(loops)), 4)},
            "answers": answers,
            "seconds": round(time.perf_counter() - started, 1),
        }


def runner_loop(base_url: str, task: E.LoopTask) -> bool:
    """The weather-average task with the agent runner, tools answering from the task's table."""
    from sglang_ds41.agents import Agent, AgentError, Runner, function_tool

    @function_tool
    def get_weather(city: str) -> dict:
        """Current temperature of a city in degrees Celsius.

        Args:
            city: City name, e.g. Paris.
        """
        return {"city": city, "celsius": task.temperatures[city]}

    @function_tool
    def calculate(expression: str) -> float:
        """Evaluate an arithmetic expression (+ - * / ** and parentheses only).

        Args:
            expression: For example "(18.5 + 4) / 2".
        """
        return E.T.eval_expression(expression)

    agent = Agent(
        name="weather-calculator",
        instructions="Answer with the tools. Call independent tools in parallel.",
        tools=[get_weather, calculate],
        reasoning_effort="low",
        model_settings={"temperature": 0, "max_tokens": 400},
    )
    try:
        result = Runner.run_sync(agent, task.question, base_url=base_url)
    except AgentError:
        return False
    return task.answer in str(result.final_output)


def in_reference(
    model, cases: list[E.Case], loops: list[E.LoopTask], perplexity_n: int, seed: int
) -> dict[str, Any]:
    completer = E.ReferenceCompleter(model)
    started = time.perf_counter()
    report = E.evaluate(completer, cases)
    loop_ok = sum(E.run_loop(completer, task)[0] for task in loops)
    summary = report.summary() | {"loop.success": round(loop_ok / max(1, len(loops)), 4)}
    if perplexity_n:
        summary["perplexity"] = round(E.perplexity(model, seed, perplexity_n), 4)
    answers = [row["got"] for row in report.per_case]
    return {"summary": summary, "answers": answers, "seconds": round(time.perf_counter() - started, 1)}


def agreement(run: dict[str, Any], other: dict[str, Any]) -> str:
    """How many cases two runs answered with the same message: "n/N"."""
    pairs = list(zip(run["answers"], other["answers"], strict=True))
    return f"{sum(same_message(a, b) for a, b in pairs)}/{len(pairs)}"


def disagreements(cases: list[E.Case], run: dict[str, Any], other: dict[str, Any]) -> list[dict[str, Any]]:
    """The cases two runs answered differently: the request and both messages, to look at."""
    return [
        {
            "case": i,
            "kind": case.kind,
            "family": case.family,
            "request": case.body,
            "server": a,
            "reference": b,
        }
        for i, (case, a, b) in enumerate(zip(cases, run["answers"], other["answers"], strict=True))
        if not same_message(a, b)
    ]


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        (a.get("content") or "") == (b.get("content") or "")
        and (a.get("reasoning_content") or "") == (b.get("reasoning_content") or "")
        and E.calls_of(a) == E.calls_of(b)
    )


def convert(src: Path, out: Path, to: str, rule: str) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_ds41",
            "convert-engram",
            str(src),
            str(out),
            "--to",
            to,
            "--scale-rule",
            rule,
        ],
        check=True,
        capture_output=True,
    )
    return out


def engram_off(model) -> None:
    """Every Engram table read as zeros: the layer then adds gate * 0 (MODEL.md §5.6)."""
    for block in model.layers:
        if block.engram is not None:
            table = block.engram.table
            block.engram.table = type("Zeros", (), {"lookup": lambda self, ids, t=table: t.lookup(ids) * 0})()


def float_experts(model, run_dir: Path) -> None:
    """The routed experts at their trained float32 values (before MXFP4 rounding)."""
    state = torch.load(run_dir / "state.pt", weights_only=False)["model"]
    for name, param in model.named_parameters():
        if ".ffn.experts." in name:
            key = name.replace(".weight", ".parametrizations.weight.original")
            param.data = state[key].to(param.dtype)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="default: the shipped trained tiny model")
    parser.add_argument("--run-dir", type=Path, help="the training run (for the float-experts row)")
    parser.add_argument("--per-family", type=int, default=12)
    parser.add_argument("--loops", type=int, default=20)
    parser.add_argument("--perplexity", type=int, default=40, help="held-out conversations for perplexity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference-only", action="store_true")
    parser.add_argument("--no-quality", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir = args.model_dir or trained_tiny_checkpoint()
    cases, loops = E.cases(args.seed, args.per_family), E.loop_tasks(args.seed, args.loops)
    scratch = Path(tempfile.mkdtemp(prefix="tiny-eval-"))
    rows: dict[str, dict[str, Any]] = {}
    differing: list[dict[str, Any]] = []
    try:
        reference = load_reference(model_dir, dtype=torch.float32)
        ref = in_reference(reference, cases, loops, args.perplexity, args.seed)
        rows["fp8 (reference)"] = ref["summary"]
        served = None
        if not args.reference_only:
            served = through_server(model_dir, cases, loops, scratch / "serve.log")
            rows["fp8 (server)"] = served["summary"] | {"server==reference": agreement(served, ref)}
            differing = disagreements(cases, served, ref)
        if not args.no_quality:
            variants = {
                "mxfp4 ocp": ("mxfp4", "ocp"), "mxfp4 mse": ("mxfp4", "mse"),
                "nvfp4 modelopt": ("nvfp4", "modelopt"), "nvfp4 mse": ("nvfp4", "mse"),
            }  # fmt: skip
            for name, (to, rule) in variants.items():
                out = convert(model_dir, scratch / name.replace(" ", "-"), to, rule)
                if args.reference_only:
                    variant = in_reference(load_reference(out), cases, loops, args.perplexity, args.seed)
                    rows[name] = variant["summary"] | {"same as fp8": agreement(variant, ref)}
                else:
                    variant = through_server(out, cases, loops, scratch / f"{name}.log")
                    rows[name] = variant["summary"] | {"same as fp8": agreement(variant, served)}
                    ppl = E.perplexity(load_reference(out, dtype=torch.float32), args.seed, args.perplexity)
                    rows[name]["perplexity"] = round(ppl, 4)
                shutil.rmtree(out)
            off = load_reference(model_dir, dtype=torch.float32)
            engram_off(off)
            variant = in_reference(off, cases, loops, args.perplexity, args.seed)
            rows["engram off (reference)"] = variant["summary"] | {"same as fp8": agreement(variant, ref)}
            if args.run_dir:
                fl = load_reference(model_dir, dtype=torch.float32)
                float_experts(fl, args.run_dir)
                variant = in_reference(fl, cases, loops, args.perplexity, args.seed)
                same = {"same as fp8": agreement(variant, ref)}
                rows["experts float32 (reference)"] = variant["summary"] | same
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "model_dir": str(model_dir), "cases": len(cases), "loops": len(loops), "rows": rows,
        "server_differs_from_reference": differing,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    metrics = ["call.exact", "call.exact_names", "call.exact_numbers", "loop.success", "json.valid",
               "json.fields", "short.correct", "answer.facts", "ended", "perplexity", "server==reference",
               "same as fp8"]  # fmt: skip
    print("| variant | " + " | ".join(metrics) + " |")
    print("|---" * (len(metrics) + 1) + "|")
    for name, summary in rows.items():
        print(f"| {name} | " + " | ".join(str(summary.get(m, "")) for m in metrics) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
