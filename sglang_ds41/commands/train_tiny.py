"""`sglang-ds41 train-tiny RUN_DIR`: train the tiny V4.1 on the synthetic corpus (CPU, float32)."""

from __future__ import annotations

import argparse

NAME = "train-tiny"
HELP = (
    "Train the tiny DeepSeek-V4.1 (the embedded default) on the synthetic agent corpus: resumable, "
    "reproducible from --seed; then pack it for shipping (--bundle) or export a checkpoint (--export)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sglang_ds41.training.settings import Settings

    d = Settings()
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (resumed if it holds a run)")
    parser.add_argument(
        "--seed", type=int, default=d.seed, help=f"everything random follows it (default {d.seed})"
    )
    parser.add_argument("--steps", type=int, default=d.steps, help=f"optimizer steps (default {d.steps})")
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=d.batch_tokens,
        help=f"padded tokens per step (default {d.batch_tokens})",
    )
    parser.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate (default {d.lr})")
    parser.add_argument(
        "--copy-first",
        type=int,
        default=d.copy_first,
        help=f"conversations drawn from the copy-heavy mix first (default {d.copy_first})",
    )
    parser.add_argument(
        "--drill-warmup",
        type=int,
        default=d.drill_warmup,
        help=f"first steps on copy drills only, to grow the copying circuit (default {d.drill_warmup})",
    )
    parser.add_argument(
        "--drill-every",
        type=int,
        default=d.drill_every,
        help=f"after the warm-up, every n-th step is a drill step; 0 = none (default {d.drill_every})",
    )
    parser.add_argument(
        "--periodic-drills",
        type=float,
        default=d.periodic_drills,
        help=f"share of drills that repeat one segment to the end (default {d.periodic_drills})",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: all cores)")
    parser.add_argument(
        "--bundle", metavar="DIR", help="after training, pack the model for shipping into DIR"
    )
    parser.add_argument("--export", metavar="OUT_DIR", help="after training, write the checkpoint to OUT_DIR")
    parser.add_argument("--variant", choices=["base", "nvfp4"], default="base", help="--export's variant")
    parser.add_argument(
        "--engram", choices=["fp8", "mxfp4", "nvfp4"], default="fp8", help="--export's tables"
    )


def run(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    import torch

    from sglang_ds41.training.export import export, ship
    from sglang_ds41.training.trainer import STATE_FILE, Run, Settings

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    run_dir = Path(args.run_dir)
    if (run_dir / STATE_FILE).exists() or (run_dir / "settings.json").exists():
        run = Run.resume(run_dir)
        print(f"train-tiny: resuming {run_dir} at step {run.step} of {run.settings.steps}")
    else:
        settings = Settings(
            seed=args.seed,
            steps=args.steps,
            batch_tokens=args.batch_tokens,
            lr=args.lr,
            copy_first=args.copy_first,
            drill_warmup=args.drill_warmup,
            drill_every=args.drill_every,
            periodic_drills=args.periodic_drills,
        )
        run = Run.create(run_dir, settings)
    run.train()
    if args.bundle:
        print(f"train-tiny: packed the model into {ship(run, args.bundle)}")
    if args.export:
        print(f"train-tiny: wrote {export(run, args.export, args.variant, args.engram)}")
    return 0
