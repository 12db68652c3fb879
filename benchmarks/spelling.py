"""Can the trained model's architecture learn how words are spelt without their space? Measured.

A name in a question is one id with its space (`ĠRichmond`); the same name as a tool call's
argument is other ids (`Rich`, `mond`), because in the call `">` and not a space comes before it
(docs/TRAINING.md §7, `copy_spans.py`). Copying ids cannot write it; the model has to know each
word's spelling without its space. This benchmark trains on the trainer's spelling drills alone
(`training/spelling.py`: a capitalised word, `--gap` lower-case words, a value's opening, the
spelling, the closing; loss on the spelling and the closing) and measures how much of the
table the model holds.

The words (the vocabulary's 12,744 capitalised words; `--words` takes a seeded sample) are
split into trained and held-out words (`--held-out`, a share). Every `--report` steps it spells a
fixed sample of each split with the pieces given (teacher forcing, the argmax over the live rows
and the zero logit of the others) and reports the share of words spelt exactly (every piece and
the closing). Trained words measure capacity (the route of a spelling curriculum); held-out
words whether spelling carries over to words never spelt (expected not: it is a table).

The model and trainer are the trained tiny model's (`training/config.py`,
`training.trainer.Run.optimize`), float32, a constant learning rate after a short warm-up.

    python benchmarks/spelling.py --steps 300 --threads 2 [--gap 8]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from sglang_ds41.training.corpus.samples import Sample
from sglang_ds41.training.data import IGNORE, make_batch
from sglang_ds41.training.drills import spelling_filler
from sglang_ds41.training.forward import Batch, forward_hidden
from sglang_ds41.training.settings import Settings
from sglang_ds41.training.spelling import delimiter_ids, spelling_drill, spelling_pair, spelt_words
from sglang_ds41.training.trainer import Run

RESULTS = Path(__file__).resolve().parent / "results" / "spelling.json"
SEQUENCE_TOKENS = 128  # ids per training sequence: within the sliding window
SEQUENCES_PER_STEP = 32
WARMUP = 30
EVAL_WORDS = 400  # per split


def words_of(seed: int, n_words: int | None) -> list[tuple[int, tuple[int, ...]]]:
    """The trainer's spelt words, shuffled by `seed`; the first `n_words` of them."""
    words = list(spelt_words())
    random.Random(seed).shuffle(words)
    return words[:n_words]


class Spelling:
    """Batches of spelling pairs (`training.spelling.spelling_pair`) and the exact-spelling measure."""

    def __init__(self, run: Run, words: list[tuple[int, tuple[int, ...]]], held_out: float, gap: int):
        self.run, self.gap = run, gap
        n_held = int(len(words) * held_out)
        self.held, self.trained = words[:n_held], words[n_held:]
        self.filler = spelling_filler(run.settings.seed)
        every = [i for w, pieces in words for i in (w, *pieces)] + [i for d in delimiter_ids() for i in d]
        every += self.filler
        run.vocab.activate(run.model.embed.parametrizations.weight.original, torch.tensor(every))

    def batch(self, words: list[tuple[int, tuple[int, ...]]], rng: random.Random | None) -> Batch:
        """SEQUENCES_PER_STEP drills of pairs drawn from `words` by `rng`; or, when `rng` is None,
        every word once, in order, in sequences of SEQUENCE_TOKENS ids or fewer."""
        bos = self.run.config.bos_token_id
        if rng is not None:
            drills = [
                spelling_drill(rng, bos, SEQUENCE_TOKENS, self.filler, words, self.gap)
                for _ in range(SEQUENCES_PER_STEP)
            ]
            return make_batch(drills, self.run.hasher)
        fill, sequences = random.Random(0), [[[bos], [False]]]
        for word in words:
            more, more_learn = spelling_pair(fill, word, self.filler, self.gap)
            if len(sequences[-1][0]) + len(more) > SEQUENCE_TOKENS:
                sequences.append([[bos], [False]])
            sequences[-1][0] += more
            sequences[-1][1] += more_learn
        group = [Sample("spelling", tuple(ids), tuple(learn)) for ids, learn in sequences]
        return make_batch(group, self.run.hasher)

    @torch.no_grad()
    def exact(self, words: list[tuple[int, tuple[int, ...]]]) -> float:
        """The share of `words` whose every piece and closing id is the argmax, pieces given."""
        batch = self.batch(words, None)
        hidden = forward_hidden(self.run.model, self.run.tables, batch)
        learn = batch.targets != IGNORE
        live = self.run.vocab.ids
        logits = hidden[learn] @ self.run.model.embed.weight[live].T
        best = logits.max(-1)
        guess = torch.where(best.values > 0, live[best.indices], -1)  # else an all-zero row wins
        right = (guess == batch.targets[learn]).tolist()
        per_word, at = [], 0
        for _, pieces in words:
            n = len(pieces) + 1
            per_word.append(all(right[at : at + n]))
            at += n
        return sum(per_word) / len(per_word)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(
        seed=args.seed, steps=args.steps, lr=args.lr, warmup=WARMUP, min_lr_ratio=1.0, qat_from=2.0
    )
    words = words_of(args.seed, args.words)
    rng = random.Random(args.seed)
    by_step, started = {}, time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        run = Run.create(run_dir, settings)
        spelling = Spelling(run, words, args.held_out, args.gap)
        probe_trained = rng.sample(spelling.trained, min(EVAL_WORDS, len(spelling.trained)))
        probe_held = rng.sample(spelling.held, min(EVAL_WORDS, len(spelling.held)))
        losses = []
        while run.step < args.steps:
            loss, _ = run.optimize(spelling.batch(spelling.trained, rng))
            losses.append(loss)
            if run.step % args.report == 0 or run.step == args.steps:
                by_step[run.step] = {
                    "loss": round(sum(losses) / len(losses), 3),
                    "trained_exact": spelling.exact(probe_trained),
                    "held_out_exact": spelling.exact(probe_held),
                    "seconds": round(time.perf_counter() - started, 1),
                }
                losses = []
                print(f"step {run.step}: {by_step[run.step]}", flush=True)
    pairs = SEQUENCES_PER_STEP * SEQUENCE_TOKENS / (sum(len(p) + 3 + args.gap for _, p in words) / len(words))
    return {
        "words": len(words),
        "trained_words": len(spelling.trained),
        "held_out_words": len(spelling.held),
        "mean_pieces": round(sum(len(p) for _, p in words) / len(words), 2),
        "pairs_per_step": round(pairs),
        "gap": args.gap,
        "lr": args.lr,
        "seed": args.seed,
        "threads": args.threads,
        "by_step": by_step,
    }


def table(r: dict[str, Any]) -> str:
    lines = [
        f"{r['trained_words']} trained / {r['held_out_words']} held-out words, {r['mean_pieces']} pieces "
        f"a word, {r['gap']} words between a word and its spelling, ~{r['pairs_per_step']} pairs a step, "
        f"lr {r['lr']:g}",
        "",
        "| step | loss | trained words spelt exactly | held-out words spelt exactly | seconds |",
        "|---|---|---|---|---|",
    ]
    for step, m in r["by_step"].items():
        lines.append(
            f"| {step} | {m['loss']} | {100 * m['trained_exact']:.1f}% | {100 * m['held_out_exact']:.1f}% "
            f"| {m['seconds']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", type=int, default=None, help="how many words (default: all)")
    parser.add_argument("--held-out", type=float, default=0.1, help="the share of words never trained")
    parser.add_argument("--gap", type=int, default=0, help="lower-case words between a word and its spelling")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--report", type=int, default=100, help="measure every this many steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
