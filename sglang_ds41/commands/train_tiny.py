"""`sglang-ds41 train-tiny RUN_DIR`: train the tiny V4.1 on the synthetic corpus (CPU, float32)."""

from __future__ import annotations

import argparse

NAME = "train-tiny"
# The flags that set `training.settings.Settings` fields of the same name (None = not given).
SETTING_FLAGS = (
    "seed", "steps", "batch_tokens", "lr", "copy_first", "drill_warmup", "drill_every", "drill_share",
    "periodic_drills", "spelling_drills", "spelling_lead", "spelling_gap", "spelling_tail",
    "name_drills", "vocabulary_names",
)  # fmt: skip
HELP = (
    "Train a tiny DeepSeek-V4.1 on the synthetic agent corpus and its drills, one run or one phase of "
    "one: resumable, reproducible from --seed; then pack it for shipping (--bundle) or export a "
    "checkpoint (--export). The embedded default is five phases of this command with other settings: "
    "scripts/train_default.sh runs them (docs/TRAINING.md section 4)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sglang_ds41.training.settings import Settings

    d = Settings()
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (resumed if it holds a run)")
    parser.add_argument(
        "--seed", type=int, default=None, help=f"everything random follows it (default {d.seed})"
    )
    parser.add_argument("--steps", type=int, default=None, help=f"optimizer steps (default {d.steps})")
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        help=f"padded tokens per step (default {d.batch_tokens})",
    )
    parser.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default {d.lr})")
    parser.add_argument(
        "--copy-first",
        type=int,
        default=None,
        help=f"conversations drawn from the copy-heavy mix first (default {d.copy_first})",
    )
    parser.add_argument(
        "--drill-warmup",
        type=int,
        default=None,
        help=f"first steps on copy drills only, to grow the copying circuit (default {d.drill_warmup})",
    )
    parser.add_argument(
        "--drill-every",
        type=int,
        default=None,
        help=f"after the warm-up, every n-th step is a drill step; 0 = none (default {d.drill_every})",
    )
    parser.add_argument(
        "--drill-share",
        type=float,
        default=None,
        help="after the warm-up, each corpus step also learns from drills of this share of its "
        f"tokens, so what the drills grew is kept while the corpus trains (default {d.drill_share})",
    )
    parser.add_argument(
        "--periodic-drills",
        type=float,
        default=None,
        help=f"share of drills that repeat one segment to the end (default {d.periodic_drills})",
    )
    parser.add_argument(
        "--spelling-drills",
        type=float,
        default=None,
        help="share of drills that spell the vocabulary's capitalised words without their space, "
        f"as names in tool calls are written (default {d.spelling_drills})",
    )
    parser.add_argument(
        "--spelling-lead",
        type=int,
        default=None,
        help="the most lower-case words before each word a spelling drill spells, so the word is "
        f"found by what it is rather than where (default {d.spelling_lead})",
    )
    parser.add_argument(
        "--spelling-gap",
        type=int,
        default=None,
        help="the most lower-case words between a spelling drill's word and its spelling, as far "
        f"as a call's value is from the question's name (default {d.spelling_gap})",
    )
    parser.add_argument(
        "--spelling-tail",
        type=int,
        default=None,
        help="the most pieces after a spelling drill's word, copied after its spelling, as the "
        f"rest of a longer name is (default {d.spelling_tail})",
    )
    parser.add_argument(
        "--name-drills",
        type=float,
        default=None,
        help="share of drills that are the corpus's call turns (the question, the call) with every "
        "name a capitalised word of the vocabulary, so its spelling is learnt where a call writes "
        f"it (default {d.name_drills}; with --spelling-drills at most 1)",
    )
    parser.add_argument(
        "--vocabulary-names",
        type=float,
        default=None,
        help="share of the corpus's made-up names that are the vocabulary's capitalised words, so "
        f"calls and JSON values use what the spelling drills teach (default {d.vocabulary_names})",
    )
    parser.add_argument(
        "--continue-from",
        metavar="SOURCE_RUN",
        help="start RUN_DIR from SOURCE_RUN's saved step and carry it on with a new --steps "
        "(and drill settings); the source is not changed",
    )
    parser.add_argument(
        "--until",
        type=int,
        metavar="STEP",
        help="stop after STEP (saved there), the learning rate still following --steps: the end "
        "of one phase of a run that --continue-from carries on with other drill settings "
        "(--bundle and --export then pack the model at STEP)",
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
    import dataclasses
    import os
    from pathlib import Path

    import torch

    from sglang_ds41.errors import Ds41Error
    from sglang_ds41.training.export import export, ship
    from sglang_ds41.training.settings import flag
    from sglang_ds41.training.trainer import STATE_FILE, Run, Settings

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    run_dir = Path(args.run_dir)
    given = {name: getattr(args, name) for name in SETTING_FLAGS if getattr(args, name) is not None}
    if args.continue_from:
        run = Run.continue_from(args.continue_from, run_dir, **given)
        print(f"train-tiny: continuing {args.continue_from} from step {run.step} to {run.settings.steps}")
    elif (run_dir / STATE_FILE).exists() or (run_dir / "settings.json").exists():
        if given:
            flags = ", ".join(flag(name) for name in given)
            raise Ds41Error(
                f"{run_dir} holds a run, which resumes with its own settings; {flags} would change "
                "them: carry it on in a new directory with --continue-from instead"
            )
        run = Run.resume(run_dir)
        print(f"train-tiny: resuming {run_dir} at step {run.step} of {run.settings.steps}")
    else:
        run = Run.create(run_dir, dataclasses.replace(Settings(), **given))
    if args.until is not None and args.until < run.step:
        raise Ds41Error(f"{run_dir} is at step {run.step}, past --until {args.until}")
    run.train(until=args.until)
    if run.step < run.settings.steps:
        print(f"train-tiny: stopped at step {run.step} of {run.settings.steps} (--until)")
    if args.bundle:
        print(f"train-tiny: packed the model into {ship(run, args.bundle)}")
    if args.export:
        print(f"train-tiny: wrote {export(run, args.export, args.variant, args.engram)}")
    return 0
