"""Checkpoint layout: the expected tensors (`manifest`), reading + validation (`reader`),
the `inspect` summary and tiny random checkpoints (`tiny`). MODEL.md §8, §9, §11."""

from .manifest import Manifest, TensorSpec, build_manifest
from .reader import Checkpoint, CheckpointError, load_config

__all__ = ["Checkpoint", "CheckpointError", "Manifest", "TensorSpec", "build_manifest", "load_config"]
