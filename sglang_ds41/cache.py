"""What sglang-ds41 builds once and reuses, and where: one cache root for the checkpoints that
`serve --tiny` (trained), `--tiny-random` and `--scripted` serve (built on first use, rebuilt
when their generator changes), the Engram token maps (`engram.token_map`) and `serve`'s logs.

A checkpoint is built in a staging folder beside its target and renamed into place, so a
concurrent or interrupted build never leaves a half-written checkpoint where a server looks.
Nothing here imports torch or SGLang until a checkpoint has to be built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from sglang_ds41.errors import Ds41Error


def cache_dir() -> Path:
    """The root of everything cached: $SGLANG_DS41_CACHE, else $XDG_CACHE_HOME/sglang-ds41
    (~/.cache/sglang-ds41)."""
    if root := os.environ.get("SGLANG_DS41_CACHE"):
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sglang-ds41"


def tiny_checkpoint(variant: str = "base", engram: str = "fp8", seed: int = 0) -> Path:
    """The random tiny checkpoint (`make-tiny`; `serve --tiny-random`, the exactness tests),
    built on first use and reused while its generator is unchanged (the directory name carries
    a hash of `checkpoint/tiny.py`)."""
    import hashlib

    try:
        from sglang_ds41.checkpoint import tiny
    except ImportError as error:
        raise Ds41Error(f"--tiny-random: the tiny checkpoint builder is not available ({error})") from error
    stamp = hashlib.sha256(Path(tiny.__file__).read_bytes()).hexdigest()[:12]
    target = cache_dir() / f"tiny-{variant}-{engram}-seed{seed}-{stamp}"
    return cached_checkpoint(target, lambda out: tiny.write_tiny(out, variant, engram, seed))


def trained_tiny_checkpoint(variant: str = "base", engram: str = "fp8") -> Path:
    """The trained tiny model shipped with the package (`serve --tiny`, the embedded default;
    `checkpoint.trained`, docs/TRAINING.md), expanded into the official layout on first use and
    reused while the shipped files and their expansion code are unchanged (the directory name
    carries their hash)."""
    import hashlib

    try:
        from sglang_ds41.checkpoint import bundle, tiny, trained
    except ImportError as error:
        raise Ds41Error(f"--tiny: the checkpoint builder is not available ({error})") from error
    shipped = trained.shipped_dir()
    if not (shipped / trained.TENSORS_FILE).is_file():
        raise Ds41Error(
            f"--tiny: no trained tiny model is shipped in {shipped}; train one (sglang-ds41 "
            "train-tiny RUN_DIR --bundle DIR, docs/TRAINING.md) or serve the random one (--tiny-random)"
        )
    digest = hashlib.sha256()
    files = [shipped / n for n in trained.SHIPPED_FILES]
    for path in [*files, Path(tiny.__file__), Path(trained.__file__), Path(bundle.__file__)]:
        digest.update(path.read_bytes())
    target = cache_dir() / f"tiny-trained-{variant}-{engram}-{digest.hexdigest()[:12]}"
    return cached_checkpoint(target, lambda out: trained.expand(out, shipped, variant, engram))


def scripted_checkpoint() -> Path:
    """The scripted test checkpoint (`checkpoint/scripted.py`: plays the example agent runs through
    SGLang's real parsers), built on first use, cached by a hash of its config (scripts included)."""
    import hashlib

    from sglang_ds41.checkpoint.scripted import scripted_config, write_scripted_checkpoint

    key = hashlib.sha256(json.dumps(scripted_config(), sort_keys=True).encode()).hexdigest()[:12]
    return cached_checkpoint(cache_dir() / f"scripted-{key}", write_scripted_checkpoint)


def cached_checkpoint(target: Path, write: Callable[[Path], object]) -> Path:
    """`target` once it holds a checkpoint, else `write(folder)` (an empty folder in a staging
    folder beside it), renamed into place atomically (a concurrent build that won leaves its
    target in place)."""
    import shutil
    import tempfile

    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{target.name}.", dir=target.parent))
    try:
        building = staging / "ckpt"
        building.mkdir()
        write(building)
        building.rename(target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
