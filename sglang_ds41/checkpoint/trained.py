"""The trained tiny model shipped with the package, and its expansion into the official layout.

`sglang_ds41/assets/tiny-trained/` holds the model `sglang-ds41 train-tiny` produced
(docs/TRAINING.md says how, and with which command): its base-variant, FP8-Engram checkpoint
tensors packed row-compactly and compressed (`bundle.pack`: only the vocabulary and Engram rows
training used), its `config.json`, `training.json` (settings, command, what it took) and
`generation_config.json` (greedy decoding by default, `GENERATION`). At first use
`expand` writes the checkpoint of any variant and Engram format from them — the base tensors
bit for bit, the NVFP4 experts and 4-bit tables converted exactly as `make-tiny` and
`convert-engram` do — and the result validates, loads and serves like any release checkpoint.
The DSpark stages and the vision tower are not trained: they are make-tiny's random tensors of
the run's seed, regenerated at expansion and checked against the digests packed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sglang_ds41.errors import Ds41Error

from .tiny import base_tensors, tiny_config, write_checkpoint

TENSORS_FILE, CONFIG_FILE, TRAINING_FILE = "tensors.safetensors.gz", "config.json", "training.json"
UNCOMPRESSED_TENSORS_FILE = "tensors.safetensors"  # what bundles packed before 2026-12-06 hold
# The decoding the model is meant for, which SGLang applies when a request sets none
# (`--sampling-defaults model`): greedy. A 4.6 M-parameter model is at its best on its top token.
GENERATION_FILE = "generation_config.json"
GENERATION = {"bos_token_id": 0, "eos_token_id": 1, "do_sample": False, "temperature": 0.0}
SHIPPED_FILES = (TENSORS_FILE, CONFIG_FILE, TRAINING_FILE, GENERATION_FILE)
# The sparse tensors of a trained model: every row its corpus never touched is the fill row.
SPARSE_SUFFIXES = ("embed.weight", "head.weight", "engram.embed.weight", "engram.embed.scale")
# What training leaves as make-tiny made it (random by the run's seed): regenerated, not shipped.
UNTRAINED_PREFIXES = ("mtp.", "vision.", "aligner.")


def shipped_dir() -> Path:
    from sglang_ds41.assets import TINY_TRAINED_DIR

    return TINY_TRAINED_DIR


def shipped_config(bundle_dir: Path, variant: str = "base", engram: str = "fp8") -> dict[str, Any]:
    """The config.json of the bundled model as `variant` with `engram` tables."""
    try:
        base = json.loads((bundle_dir / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise Ds41Error(f"{bundle_dir}: no {CONFIG_FILE}; not a trained model bundle") from None
    return tiny_config(variant, engram, base["text_config"])


def bundled_tensors(bundle_dir: Path) -> dict[str, Any]:
    """The bundled model's base tensors (FP8 Engram tables), the untrained ones regenerated."""
    from .bundle import unpack

    text_config = shipped_config(bundle_dir)["text_config"]
    seed = json.loads((bundle_dir / TRAINING_FILE).read_text())["settings"]["seed"]
    tensors = bundle_dir / TENSORS_FILE
    if not tensors.exists() and (bundle_dir / UNCOMPRESSED_TENSORS_FILE).exists():
        tensors = bundle_dir / UNCOMPRESSED_TENSORS_FILE
    return unpack(tensors, lambda: base_tensors(seed, text_config))


def expand(
    out_dir: str | Path, bundle_dir: Path | None = None, variant: str = "base", engram: str = "fp8"
) -> Path:
    """Write the bundled model as a checkpoint directory."""
    bundle_dir = shipped_dir() if bundle_dir is None else bundle_dir
    data = shipped_config(bundle_dir, variant, engram)
    out = write_checkpoint(out_dir, data, lambda: bundled_tensors(bundle_dir))
    (out / GENERATION_FILE).write_text((bundle_dir / GENERATION_FILE).read_text())
    return out


def write_bundle(
    bundle_dir: str | Path, tensors: dict[str, Any], config: dict[str, Any], training: dict[str, Any]
) -> Path:
    """Pack a trained model's base tensors (FP8 Engram tables) with its config and training record."""
    from .bundle import pack

    bundle_dir = Path(bundle_dir)
    bundle_dir.mkdir(parents=True, exist_ok=True)
    sparse = [name for name in tensors if name.endswith(SPARSE_SUFFIXES)]
    untrained = [name for name in tensors if name.startswith(UNTRAINED_PREFIXES)]
    pack(tensors, sparse, bundle_dir / TENSORS_FILE, regenerable=untrained)
    (bundle_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    (bundle_dir / TRAINING_FILE).write_text(json.dumps(training, indent=2) + "\n")
    (bundle_dir / GENERATION_FILE).write_text(json.dumps(GENERATION, indent=2) + "\n")
    return bundle_dir
