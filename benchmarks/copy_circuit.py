"""Does the trainer grow a copying (induction) circuit? The repeat task, measured.

Each sequence is BOS, then 16-63 ids drawn from a pool of `--ids` ids, then the same ids again.
The loss is taken on the second copy from its second id on: a model that finds where the
current id occurred before and copies the id that followed it there predicts it exactly; one
that cannot stays near ln(ids) nats (a little below once it learns which ids the sequence
holds). Only the distance varies, so no fixed-offset attention solves it.

The model is the trained tiny model's (`training/config.py`), trained by the project's trainer
(`training.trainer.Run.optimize`: the same forward, full-vocabulary loss, AdamW and router-bias
update) on these sequences instead of the corpus, at a constant learning rate after a short
warm-up, with the weights kept in float32 (no quantisation-aware rounding).

`--feature` hands the model a previous-token signal, a diagnostic that is not V4.1: `R e_{t-1}`
(`R` a fixed random rotation, `e` the input embedding) added to each token's embedding
(`embedding`), added to layer 0's attention output (`layer0`), or in place of that output
(`layer0-only`). With it the model only has to learn the second head of the circuit (match the
current id against the previous-token signal, copy), so the runs separate the two halves.

Besides the loss every 25 steps the benchmark writes the residual stream's scale at the end: the
mean norm of the input embeddings, of layer 0's attention output and of every layer's attention
input. docs/TRAINING.md §7 reads these numbers.

    python benchmarks/copy_circuit.py --lr 3e-3,1e-3 --steps 500
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from sglang_ds41.training.forward import Batch, forward_hidden
from sglang_ds41.training.settings import Settings
from sglang_ds41.training.trainer import Run
from sglang_ds41.training.vocab import LiveRows

RESULTS = Path(__file__).resolve().parent / "results" / "copy_circuit.json"
FEATURES = ("none", "embedding", "layer0", "layer0-only")
FIRST_ID = 5000  # the pool: ids FIRST_ID .. FIRST_ID + ids - 1 of the real vocabulary
SEQUENCES_PER_STEP = 16
LENGTHS = (16, 64)  # each copy's length: 16..63
WARMUP = 30
REPORT_EVERY = 25
FORMED_BELOW = 1.0  # nats: the circuit counts as formed once a report's mean loss is below this


def repeat_batch(run: Run, pool: torch.Tensor, generator: torch.Generator) -> Batch:
    """SEQUENCES_PER_STEP sequences `BOS s s`, targets on the second `s` from its second id."""
    ids, lengths, rows, targets = [], [], [], []
    bos = torch.tensor([run.config.bos_token_id])
    for _ in range(SEQUENCES_PER_STEP):
        n = int(torch.randint(*LENGTHS, (1,), generator=generator))
        s = pool[torch.randint(0, pool.numel(), (n,), generator=generator)]
        seq = torch.cat([bos, s, s])
        target = torch.full_like(seq, -100)
        target[n + 1 : -1] = seq[n + 2 :]
        ids.append(seq)
        lengths.append(seq.numel())
        rows.append(run.hasher.hash_sequence(seq))
        targets.append(target)
    return Batch(torch.cat(ids), torch.tensor(lengths), torch.cat(rows), torch.cat(targets))


class PreviousToken:
    """`R e_{t-1}` for the batch being run (zero at each sequence's first token)."""

    def __init__(self, width: int, generator: torch.Generator):
        self.rotation, _ = torch.linalg.qr(torch.randn(width, width, generator=generator))
        self.batch: Batch | None = None

    def of(self, embeddings: torch.Tensor) -> torch.Tensor:
        previous = torch.roll(embeddings, 1, 0)
        previous[self.batch.chunks.offsets[:-1]] = 0  # each sequence's first row
        return previous @ self.rotation.T


def install_feature(run: Run, feature: str, signal: PreviousToken) -> None:
    model = run.model
    if feature == "embedding":
        # Wherever input embeddings are made: the embedding module (stream_norms) and the
        # trainer's step, which takes them from the live rows (`Run.input_embeddings`).
        model.embed.register_forward_hook(lambda _m, _i, out: out + signal.of(out))
        own_embeddings = run.input_embeddings

        def input_embeddings(live: LiveRows, ids: torch.Tensor) -> torch.Tensor:
            e = own_embeddings(live, ids)
            return e + signal.of(e)

        run.input_embeddings = input_embeddings  # this run only
    elif feature in ("layer0", "layer0-only"):
        attn = model.layers[0].attn
        own = attn.project_out
        keep = 1.0 if feature == "layer0" else 0.0

        def project_out(o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return own(o, positions) * keep + signal.of(model.embed(signal.batch.ids))

        attn.project_out = project_out  # this instance only


@torch.no_grad()
def stream_norms(run: Run, batch: Batch) -> dict[str, Any]:
    """Mean L2 norms: input embeddings, layer 0's attention output, each layer's attention input."""
    model, inputs, hooks = run.model, {}, []
    for block in model.layers:
        hooks.append(
            block.attn_norm.register_forward_hook(
                lambda _m, args, _o, k=block.layer: inputs.__setitem__(k, float(args[0].norm(dim=-1).mean()))
            )
        )
    attn = model.layers[0].attn
    own, output = attn.project_out, {}

    def project_out(o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        y = own(o, positions)
        output["norm"] = float(y.norm(dim=-1).mean())
        return y

    attn.project_out = project_out
    forward_hidden(model, run.tables, batch)
    attn.project_out = own
    for hook in hooks:
        hook.remove()
    return {
        "embedding": float(model.embed(batch.ids).norm(dim=-1).mean()),
        "layer0_attention_output": output["norm"],
        "attention_input": [round(inputs[k], 2) for k in sorted(inputs)],
    }


def measure(lr: float, feature: str, steps: int, n_ids: int, seed: int) -> dict[str, Any]:
    settings = Settings(seed=seed, steps=steps, lr=lr, warmup=WARMUP, min_lr_ratio=1.0, qat_from=2.0)
    generator = torch.Generator().manual_seed(seed + 1)
    pool = torch.arange(FIRST_ID, FIRST_ID + n_ids)
    losses, started = {}, time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        run = Run.create(run_dir, settings)
        signal = PreviousToken(run.config.text.hidden_size, generator)
        install_feature(run, feature, signal)
        window = []
        while run.step < steps:
            signal.batch = repeat_batch(run, pool, generator)
            loss, _ = run.optimize(signal.batch)
            window.append(loss)
            if run.step % REPORT_EVERY == 0:
                losses[run.step] = round(sum(window) / len(window), 3)
                window = []
                print(f"lr {lr:g} feature {feature}: step {run.step} loss {losses[run.step]}", flush=True)
        signal.batch = repeat_batch(run, pool, generator)
        norms = stream_norms(run, signal.batch)
    formed = next((s for s, v in losses.items() if v < FORMED_BELOW), None)
    return {
        "lr": lr,
        "feature": feature,
        "ids": n_ids,
        "seed": seed,
        "steps": steps,
        "unigram_floor_nats": round(math.log(n_ids), 3),
        "loss_by_step": losses,
        "formed_at": formed,
        "norms": norms,
        "seconds": round(time.perf_counter() - started, 1),
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| lr | feature | loss at 250 / 500 / last | formed at | norms: embed / L0 attn out / L1 attn in |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        by = r["loss_by_step"]
        last = by[max(by)] if by else None
        n = r["norms"]
        lines.append(
            f"| {r['lr']:g} | {r['feature']} | {by.get(250, '-')} / {by.get(500, '-')} / {last} | "
            f"{r['formed_at'] or '-'} | {n['embedding']:.2f} / {n['layer0_attention_output']:.2f} / "
            f"{n['attention_input'][1]:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", default="3e-3,1e-3", help="comma-separated learning rates")
    parser.add_argument("--feature", default="none", help=f"comma-separated, of {', '.join(FEATURES)}")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--ids", type=int, default=50, help="size of the id pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    features = args.feature.split(",")
    unknown = sorted(set(features) - set(FEATURES))
    if unknown:
        parser.error(f"--feature: unknown {unknown}; expected some of {list(FEATURES)}")
    torch.set_num_threads(args.threads)
    results = [
        measure(float(lr), feature, args.steps, args.ids, args.seed)
        for lr in args.lr.split(",")
        for feature in features
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
