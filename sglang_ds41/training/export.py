"""A trained model -> a checkpoint in the official layout, through the project's own quantisers.

The trained float32 masters become the release's tensors exactly as `make-tiny` writes its
random ones (`checkpoint.tiny.write_tiny` with `dense=`): FP8 32x32-block linears, MXFP4 routed
experts (and their lossless NVFP4 re-encoding for `variant="nvfp4"`), BF16 / F32 plain tensors,
FP8 Engram tables (re-encoded to MXFP4 / NVFP4 as `convert-engram` does, for `engram=`). The
quantisers are the ones training rounded with (`quant.py`), so the stored values are the
trained ones. The tied embedding is written as both `embed.weight` and `head.weight`. The
vision tower, aligner and DSpark stages are not trained: they get make-tiny's random values of
the same seed (they load and validate; serving on the CPU does not run DSpark).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sglang_ds41.checkpoint.load import checkpoint_name
from sglang_ds41.checkpoint.tiny import write_tiny

from .config import TRAINED_TEXT
from .quant import master_weights

if TYPE_CHECKING:
    from .forward import EngramTables
    from .trainer import Run


def dense_weights(model: torch.nn.Module, tables: EngramTables) -> dict[str, torch.Tensor]:
    """Checkpoint name (the prefix for quantised weights) -> the float32 value to store."""
    out: dict[str, torch.Tensor] = {}
    for name, value in master_weights(model).items():
        stored = checkpoint_name(name)
        out[stored] = value
        out[stored.removesuffix(".weight")] = value
    out["head.weight"] = out["embed.weight"]
    for layer, table in zip(tables.layer_ids, tables.tables, strict=True):
        out[f"layers.{layer}.engram.embed"] = table.detach()
    return out


def export(run: Run, out_dir: str | Path, variant: str = "base", engram: str = "fp8") -> Path:
    """Write the run's model as a checkpoint directory of `variant` with `engram` tables."""
    overrides: dict[str, Any] = {**TRAINED_TEXT, **run.settings.text}
    return write_tiny(
        out_dir, variant, engram, run.settings.seed, overrides=overrides,
        dense=dense_weights(run.model, run.tables),
    )  # fmt: skip


def ship(run: Run, bundle_dir: str | Path) -> Path:
    """Pack the run's model for the package (`checkpoint.trained`): its base tensors, its
    config, and what produced it (the command with its run directory as RUN_DIR, settings,
    steps, time, tokens, losses; from progress.jsonl). Of a continued run, the tokens, losses
    and `train_seconds` are its own phase's; `lineage_train_seconds` counts every phase's steps."""
    import dataclasses
    import sys

    from sglang_ds41.checkpoint.tiny import base_tensors, tiny_config
    from sglang_ds41.checkpoint.trained import write_bundle

    overrides: dict[str, Any] = {**TRAINED_TEXT, **run.settings.text}
    records = run.progress()
    last = records[-50:]
    command = None
    if sys.argv[1:2] == ["train-tiny"]:
        given = ("RUN_DIR" if _same_path(a, run.dir) else a for a in sys.argv[2:])
        command = " ".join(["sglang-ds41", "train-tiny", *given])
    training = {
        "command": command,
        "settings": dataclasses.asdict(run.settings),
        "steps": run.step,
        "train_seconds": round(sum(r["s"] for r in records), 1),
        "lineage_train_seconds": round(run.lineage_seconds(), 1),
        "tokens": sum(r["tokens"] for r in records),
        "learnt_tokens": sum(r["learnt"] for r in records),
        "final_loss_mean_last_50": round(sum(r["loss"] for r in last) / max(1, len(last)), 4),
        "vocabulary_rows": int(run.vocab.active.sum()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    tensors = base_tensors(run.settings.seed, overrides, dense_weights(run.model, run.tables))
    return write_bundle(bundle_dir, tensors, tiny_config("base", "fp8", overrides), training)


def _same_path(argument: str, path: Path) -> bool:
    return Path(argument).resolve() == path.resolve()
