"""Open a Hugging Face style V4.1 checkpoint directory: config, index, shard headers, tensors.

Opening reads only JSON and the safetensors headers (a few MB even for the 48 official shards)
and checks them against the manifest, so a broken download fails in seconds with a message
naming the file or tensor, not halfway through loading 500 GB. Tensor data is then read through
`safetensors.safe_open`, which memory-maps the shards. Both runtimes load weights through here.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_ds41.checkpoint.manifest import DTYPE_BYTES, Manifest, TensorSpec, build_manifest, table_format
from sglang_ds41.config import ConfigError, V41Config
from sglang_ds41.errors import Ds41Error

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
HF_QUANT_FILE = "hf_quant_config.json"

MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit
MAX_LISTED_PROBLEMS = 20


class CheckpointError(Ds41Error):
    """The checkpoint directory does not hold what its config promises."""


@dataclass(frozen=True)
class StoredTensor:
    """One tensor as a shard header describes it; `start`/`end` are absolute file offsets."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class ShardHeader:
    file: str
    size: int
    tensors: Mapping[str, StoredTensor]


def read_shard_header(path: Path) -> ShardHeader:
    """Parse a safetensors header and check it against the file size (truncation) and itself."""
    name = path.name
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(
                    f"shard {name} is truncated: {size} bytes, too short for a safetensors header"
                )
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES:
                raise CheckpointError(
                    f"shard {name}: header length {header_len} is not plausible (corrupt file?)"
                )
            if 8 + header_len > size:
                raise CheckpointError(
                    f"shard {name} is truncated: its header needs {8 + header_len} bytes, the file has {size}"
                )
            raw = f.read(header_len)
    except OSError as error:
        raise CheckpointError(f"shard {name}: cannot read: {error}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"shard {name}: header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"shard {name}: header must be a JSON object, got {type(header).__name__}")
    base = 8 + header_len
    tensors: dict[str, StoredTensor] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape = str(info["dtype"]), tuple(int(n) for n in info["shape"])
            begin, end = (int(n) for n in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"shard {name}: malformed header entry for tensor {key}") from None
        if not 0 <= begin <= end:
            raise CheckpointError(f"shard {name}: tensor {key} has invalid data_offsets [{begin}, {end}]")
        if dtype in DTYPE_BYTES and end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise CheckpointError(
                f"shard {name}: tensor {key} is {dtype} {list(shape)} = "
                f"{math.prod(shape) * DTYPE_BYTES[dtype]} bytes, but its data_offsets span {end - begin}"
            )
        if base + end > size:
            raise CheckpointError(
                f"shard {name} is truncated: tensor {key} ends at byte {base + end}, "
                f"the file has {size} bytes"
            )
        tensors[key] = StoredTensor(key, name, dtype, shape, base + begin, base + end)
    return ShardHeader(name, size, tensors)


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{what} {path}: cannot read JSON: {error}") from None


# --- config: config.json (+ hf_quant_config.json) ----------------------------------------------

# hf_quant_config.json "quantization" key -> the flat quantization_config key (§1.2).
_HF_QUANT_KEYS = {
    "quant_algo": "quant_algo",
    "kv_cache_quant_algo": "kv_cache_quant_algo",
    "exclude_modules": "ignore",
    "quantized_layers": "quantized_layers",
}


def load_config(root: Path) -> V41Config:
    """`config.json`, with ModelOpt's `hf_quant_config.json` merged in when present.

    NVIDIA's fields may sit in either file (§1.2); when both state one, they must agree.
    """
    path = root / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{root}: no {CONFIG_FILE}")
    data = _read_json(path, "config")
    hf_path = root / HF_QUANT_FILE
    if hf_path.is_file() and isinstance(data, dict):
        hf = _read_json(hf_path, "ModelOpt config")
        section = hf.get("quantization") if isinstance(hf, dict) else None
        if not isinstance(section, dict):
            found = type(section).__name__ if section is not None else "none"
            raise ConfigError(f"{hf_path}: expected a 'quantization' object, got {found}")
        quant = dict(data.get("quantization_config") or {})
        for hf_key, key in _HF_QUANT_KEYS.items():
            if hf_key not in section:
                continue
            if key in quant and quant[key] != section[hf_key]:
                raise ConfigError(
                    f"{path} quantization_config.{key} = {quant[key]!r} contradicts {hf_path} "
                    f"quantization.{hf_key} = {section[hf_key]!r}"
                )
            quant[key] = section[hf_key]
        if "producer" in hf and "producer" not in quant:
            quant["producer"] = hf["producer"]
        data = {**data, "quantization_config": quant}
    return V41Config.from_dict(data, source=str(path))


# --- the checkpoint ----------------------------------------------------------------------------


class Checkpoint:
    """A validated checkpoint directory; `tensor(name)` reads (memory-mapped) data."""

    def __init__(
        self,
        root: Path,
        config: V41Config,
        manifest: Manifest,
        stored: Mapping[str, StoredTensor],
        shards: Mapping[str, ShardHeader],
        index_total_size: int | None,
    ):
        self.root = root
        self.config = config
        self.manifest = manifest
        self.stored = stored
        self.shards = shards
        self.index_total_size = index_total_size
        self._handles: dict[str, Any] = {}

    @classmethod
    def open(cls, root: str | Path, validate: bool = True) -> Checkpoint:
        """Read config, index and shard headers; with `validate`, raise `CheckpointError` listing
        every missing / extra / mis-shaped / mistyped tensor, missing or truncated shard."""
        root = Path(root)
        if not root.is_dir():
            raise CheckpointError(f"{root}: not a directory")
        config = load_config(root)
        manifest = build_manifest(config)
        problems: list[str] = []
        weight_map, total_size = _read_index(root)
        shards: dict[str, ShardHeader] = {}
        for file in sorted(set(weight_map.values())):
            path = root / file
            if not path.is_file():
                users = sorted(n for n, f in weight_map.items() if f == file)
                problems.append(
                    f"missing shard {file}: {INDEX_FILE} assigns {len(users)} tensors to it (e.g. {users[0]})"
                )
                continue
            try:
                shards[file] = read_shard_header(path)
            except CheckpointError as error:
                problems.append(str(error))
        stored = _collect(weight_map, shards, problems)
        if validate:
            unreadable = {f for f in weight_map.values() if f not in shards}
            explained = {n for n, f in weight_map.items() if f in unreadable}  # already reported
            problems += check_against_manifest(stored, manifest, skip=explained)
            stored_bytes = sum(t.end - t.start for t in stored.values())
            if total_size is not None and not problems and total_size != stored_bytes:
                problems.append(
                    f"{INDEX_FILE}: metadata.total_size = {total_size}, but the shards hold {stored_bytes} "
                    "bytes of tensor data"
                )
        if problems:
            raise CheckpointError(_format_problems(root, problems))
        return cls(root, config, manifest, stored, shards, total_size)

    # --- data ---------------------------------------------------------------------------------

    def tensor(self, name: str):
        """The stored tensor, as safetensors loads it (F8_E8M0 -> float8_e8m0fnu, I8 -> int8, ...)."""
        stored = self.stored.get(name)
        if stored is None:
            raise CheckpointError(f"{self.root}: no tensor {name} in the checkpoint")
        handle = self._handles.get(stored.file)
        if handle is None:
            from safetensors import safe_open

            handle = safe_open(str(self.root / stored.file), framework="pt")
            self._handles[stored.file] = handle
        return handle.get_tensor(name)

    def dense(self, prefix: str, dtype=None):
        """The weight `prefix` (e.g. ``layers.0.attn.wq_a``) dequantised to a dense tensor.

        FP8 blocks, MXFP4 and NVFP4 are expanded with `sglang_ds41.formats`; plain tensors are
        cast. Engram tables are not dense weights: serve them with `engram.table` instead.
        """
        import torch

        from sglang_ds41 import formats

        dtype = torch.bfloat16 if dtype is None else dtype
        fmt = self.manifest.format_of(prefix)
        name = prefix if prefix in self.manifest else f"{prefix}.weight"
        if fmt in ("bf16", "f32"):
            return self.tensor(name).to(dtype)
        if fmt == "fp8":
            return formats.dequantize_fp8_block2d(
                self.tensor(f"{prefix}.weight"), self.tensor(f"{prefix}.scale"), dtype=dtype
            )
        if fmt == "mxfp4":
            return formats.dequantize_mxfp4(
                self.tensor(f"{prefix}.weight"), self.tensor(f"{prefix}.scale"), dtype=dtype
            )
        if fmt == "nvfp4":
            return formats.dequantize_nvfp4(
                self.tensor(f"{prefix}.weight"),
                self.tensor(f"{prefix}.weight_scale"),
                self.tensor(f"{prefix}.weight_scale_2"),
                dtype=dtype,
            )
        raise CheckpointError(f"{prefix}: not a dense weight of this checkpoint (format {fmt})")

    def close(self) -> None:
        self._handles.clear()


def _weight_map_problem(weight_map: object) -> str:
    """What an index's bad `weight_map` is instead (absent, not an object, a non-string file)."""
    if weight_map is None:
        return "none"
    if not isinstance(weight_map, dict):
        return type(weight_map).__name__
    name, shard = next((k, v) for k, v in weight_map.items() if not isinstance(v, str))
    return f"{type(shard).__name__} {shard!r} as the file of {name}"


def _read_index(root: Path) -> tuple[dict[str, str], int | None]:
    index = root / INDEX_FILE
    if index.is_file():
        data = _read_json(index, "index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            found = _weight_map_problem(weight_map)
            raise CheckpointError(
                f"{index}: expected a 'weight_map' object of tensor name -> shard file, got {found}"
            )
        total = (data.get("metadata") or {}).get("total_size")
        return dict(weight_map), (int(total) if total is not None else None)
    single = root / SINGLE_FILE
    if single.is_file():
        header = read_shard_header(single)
        return {name: SINGLE_FILE for name in header.tensors}, None
    raise CheckpointError(f"{root}: neither {INDEX_FILE} nor {SINGLE_FILE} found")


def _collect(
    weight_map: Mapping[str, str], shards: Mapping[str, ShardHeader], problems: list[str]
) -> dict[str, StoredTensor]:
    """Tensors by name, cross-checking the index against the headers it points to."""
    stored: dict[str, StoredTensor] = {}
    for file, shard in shards.items():
        for name, tensor in shard.tensors.items():
            listed = weight_map.get(name)
            if listed is None:
                problems.append(f"tensor {name} is in shard {file} but not in {INDEX_FILE}")
            elif listed != file:
                problems.append(f"tensor {name} is in shard {file} but {INDEX_FILE} places it in {listed}")
            if name in stored:
                problems.append(f"tensor {name} is stored twice: in {stored[name].file} and {file}")
            stored.setdefault(name, tensor)
    for name, file in weight_map.items():
        if file in shards and name not in shards[file].tensors:
            problems.append(f"tensor {name}: {INDEX_FILE} places it in shard {file}, whose header lacks it")
    return stored


def check_against_manifest(
    stored: Mapping[str, StoredTensor], manifest: Manifest, skip: Iterable[str] = ()
) -> list[str]:
    """Problems, one line each: missing, unexpected, mis-shaped or mistyped tensors.

    Names in `skip` are not reported missing (their shard is missing or unreadable)."""
    problems: list[str] = []
    skipped = set(skip)
    for spec in manifest:
        got = stored.get(spec.name)
        if got is None:
            if spec.name not in skipped:
                problems.append(f"missing tensor {spec.name} (expected {spec.describe()})")
        elif not spec.accepts(got.dtype, got.shape):
            problems.append(_mismatch(spec, got, manifest))
    for name, got in stored.items():
        if name not in manifest:
            problems.append(
                f"unexpected tensor {name} ({got.dtype} {list(got.shape)}) in shard {got.file}: "
                f"not part of the V4.1 layout for this config"
            )
    return problems


def _mismatch(spec: TensorSpec, got: StoredTensor, manifest: Manifest) -> str:
    what = []
    if not spec.accepts(got.dtype, spec.shape):
        what.append(f"dtype {got.dtype}, expected {spec.dtype}")
    if not spec.accepts(spec.dtype, got.shape):
        what.append(f"shape {list(got.shape)}, expected {list(spec.shape)}")
    line = f"tensor {spec.name} in shard {got.file}: " + "; ".join(what) + f" ({spec.format} {spec.role})"
    table = table_format(spec)
    if table is not None and spec.role == table.values.name:
        line += (
            f" — the config declares {table.name.upper()} Engram tables "
            "(quantization_config.engram_embed_quant)"
        )
    elif spec.format in ("mxfp4", "nvfp4") and spec.role == "weight":
        line += f" — config.json says routed experts are {spec.format.upper()} (variant {manifest.variant})"
    return line


def _format_problems(root: Path, problems: list[str]) -> str:
    shown = problems[:MAX_LISTED_PROBLEMS]
    more = len(problems) - len(shown)
    text = f"{root}: invalid checkpoint ({len(problems)} problem{'s' if len(problems) != 1 else ''}):\n  "
    text += "\n  ".join(shown)
    if more:
        text += f"\n  ... and {more} more"
    return text
