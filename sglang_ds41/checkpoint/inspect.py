"""`inspect`: validate a checkpoint directory and summarise what it holds.

The summary is what an operator needs before serving: which release this is (base FP8 + MXFP4
experts, or NVIDIA's NVFP4 experts), how the Engram tables are stored (FP8, MXFP4 or NVFP4, and
their bytes per row), parameter counts by
component (MODEL.md §9.1 groups) and bytes by storage format. Validation is `Checkpoint.open`,
the same code path the runtimes load through.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sglang_ds41.checkpoint.reader import Checkpoint

_VARIANT_TEXT = {
    "base": "base (FP8 32x32 linears, MXFP4 routed experts)",
    "nvfp4": "nvfp4 (NVIDIA ModelOpt: NVFP4 W4A4 routed experts, the rest as base)",
}
_GROUP_ORDER = ("backbone", "routed_experts", "engram_tables", "dspark", "vision")


def engram_tables(manifest) -> list[dict[str, Any]]:
    """Per Engram table: format, rows and bytes per row (per-table scalars such as NVFP4's global
    scale not counted), from the validated layout."""
    out = []
    for layer, fmt in sorted(manifest.engram_formats.items()):
        specs = [t for t in manifest if t.name.startswith(f"layers.{layer}.engram.embed.")]
        rows = next(t.shape[0] for t in specs if t.role == "weight")
        row_bytes = sum(t.nbytes for t in specs if t.shape) // rows
        out.append({"layer": layer, "format": fmt, "rows": rows, "bytes_per_row": row_bytes})
    return out


def inspect_checkpoint(root: str | Path) -> dict[str, Any]:
    """Validate `root` (raises `CheckpointError` / `ConfigError`) and return a JSON-able summary."""
    ckpt = Checkpoint.open(root)
    m = ckpt.manifest
    groups = m.parameters_by_group()
    return {
        "checkpoint": str(ckpt.root),
        "valid": True,
        "variant": m.variant,
        "engram_format": m.engram_format,
        "engram_formats": {str(k): v for k, v in m.engram_formats.items()},
        "engram_tables": engram_tables(m),
        "tensors": len(m),
        "shards": len(ckpt.shards),
        "total_bytes": m.total_bytes,
        "parameters": m.parameters,
        "parameters_by_group": {g: groups[g] for g in _GROUP_ORDER if g in groups},
        "bytes_by_format": m.bytes_by_format(),
        "layers": ckpt.config.text.num_hidden_layers,
        "dspark_stages": ckpt.config.text.num_nextn_predict_layers,
        "vision": ckpt.config.vision is not None,
        "tokenizer": (ckpt.root / "tokenizer.json").is_file(),
    }


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def render(summary: dict[str, Any]) -> str:
    """Human-readable form of `inspect_checkpoint`'s summary."""
    lines = [
        f"checkpoint     {summary['checkpoint']}: OK",
        f"release        {_VARIANT_TEXT.get(summary['variant'], summary['variant'])}",
        f"engram tables  {summary['engram_format']}: "
        + ", ".join(
            f"layer {t['layer']} {t['rows']:,} rows x {t['bytes_per_row']} B ({t['format']})"
            for t in summary["engram_tables"]
        ),
        f"structure      {summary['layers']} layers, {summary['dspark_stages']} DSpark stages, "
        f"vision tower {'yes' if summary['vision'] else 'no'}, "
        f"tokenizer.json {'present' if summary['tokenizer'] else 'MISSING'}",
        f"tensors        {summary['tensors']:,} in {summary['shards']} shard(s), "
        f"{summary['total_bytes']:,} bytes ({_size(summary['total_bytes'])})",
        f"parameters     {summary['parameters']:,} (4-bit codes count 1 each, scales not counted)",
    ]
    lines += [f"  {group:<15}{n:>20,}" for group, n in summary["parameters_by_group"].items()]
    lines.append("bytes by format")
    lines += [f"  {fmt:<15}{n:>20,}  {_size(n)}" for fmt, n in summary["bytes_by_format"].items()]
    return "\n".join(lines)
