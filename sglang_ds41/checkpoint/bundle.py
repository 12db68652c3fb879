"""A checkpoint's tensors in little space: rows that repeat one fill row are left out.

A trained tiny model uses some 25,000 of the 129,280 vocabulary rows; every other row of
`embed` and `head` is the same stored row (zeros). `pack` keeps, for the tensors it is told to,
the rows that differ from the tensor's most common row (a bit per row saying which, their
values, and that fill row once) where that is smaller than the whole tensor, and every other
tensor whole (the Engram tables: its corpus hashes to nearly every row); a tensor equal to an
earlier one is kept once (`head` of a model trained with a tied embedding). Bundles written
before the row mask list their rows as int32 indices (`rows:`), which `unpack` still reads.
Tensors the caller can regenerate (the untrained DSpark stages and vision tower, random by a
seed) are left out with their SHA-256, and `unpack` takes them from a `regenerate` callable and
checks them. `unpack` rebuilds every tensor bit for bit. The packed
form is one safetensors file, its metadata saying how to rebuild each tensor, gzip-compressed
when its name ends in `.gz` (a BF16 row's exponent bytes repeat: the shipped model's 20.3 MB
packs into 16.7 MB; the same bytes again from the same Python and zlib); `unpack` reads either.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
from safetensors import safe_open

from sglang_ds41.errors import Ds41Error

_LAYOUT_KEY = "sglang_ds41.bundle"
_ROWS, _MASK, _VALUES, _FILL = "{}::rows", "{}::mask", "{}::values", "{}::fill"
_GZIP_MAGIC = b"\x1f\x8b"


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Rows of `t` as raw bytes [rows, row_bytes], for comparing rows of any dtype exactly."""
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], -1)


def digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes."""
    raw = _as_bytes(t.reshape(-1, 1) if t.ndim == 0 else t).numpy().tobytes()
    return hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode() + raw).hexdigest()


def pack(
    tensors: Mapping[str, torch.Tensor],
    sparse: Iterable[str],
    path: str | Path,
    regenerable: Iterable[str] = (),
) -> dict[str, str]:
    """Write `tensors` to the safetensors file `path` (gzip-compressed if it ends in `.gz`),
    atomically; the 2-D tensors named in `sparse` keep only their rows that differ from their
    most common row, where that is smaller than the whole tensor; those named in `regenerable`
    are left out (their digest kept). Returns the layout written."""
    layout: dict[str, str] = {}
    stored: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}
    sparse, regenerable = set(sparse), set(regenerable)
    for name, t in tensors.items():
        if name in regenerable:
            layout[name] = f"regenerate:{digest(t)}"
            continue
        key = (t.dtype, tuple(t.shape), _as_bytes(t.reshape(-1, 1) if t.ndim == 0 else t).numpy().tobytes())
        if key in seen:
            layout[name] = f"same:{seen[key]}"
            continue
        seen[key] = name
        if name in sparse and t.ndim == 2:
            rows = _as_bytes(t)
            _, inverse, counts = torch.unique(rows, dim=0, return_inverse=True, return_counts=True)
            fill = int(counts.argmax())
            kept = inverse != fill
            n_kept, row_bytes = int(kept.sum()), rows.shape[1]
            if (n_kept + 1) * row_bytes + (t.shape[0] + 7) // 8 < t.shape[0] * row_bytes:
                stored[_MASK.format(name)] = torch.from_numpy(np.packbits(kept.numpy()))
                stored[_VALUES.format(name)] = t[kept].contiguous()
                stored[_FILL.format(name)] = t[int(torch.nonzero(~kept)[0])].unsqueeze(0).contiguous()
                layout[name] = f"mask:{t.shape[0]}"
                continue
        stored[name] = t.contiguous()
        layout[name] = "whole"
    data = safetensors.torch.save(stored, metadata={_LAYOUT_KEY: json.dumps(layout)})
    path = Path(path)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=9, mtime=0)  # no timestamp in the stream
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_bytes(data)
        partial.chmod(0o644)  # the package is read by other users
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)  # never a half-written file beside the package's
        raise
    return layout


def unpack(
    path: str | Path, regenerate: Callable[[], Mapping[str, torch.Tensor]] | None = None
) -> dict[str, torch.Tensor]:
    """Every tensor of a packed file, as it was given to `pack`; the regenerable ones come from
    `regenerate()` and must have their recorded digests."""
    path = Path(path)
    stored, meta = _read(path)
    if _LAYOUT_KEY not in meta:
        raise Ds41Error(f"{path}: no '{_LAYOUT_KEY}' metadata; not written by checkpoint.bundle.pack")
    layout: dict[str, str] = json.loads(meta[_LAYOUT_KEY])
    out: dict[str, torch.Tensor] = {}
    generated = None
    if regenerate is not None and any(how.startswith("regenerate:") for how in layout.values()):
        generated = regenerate()
    for name, how in layout.items():
        if how == "whole":
            out[name] = stored[name]
        elif how.startswith(("mask:", "rows:")):  # rows: the int32 row list of earlier bundles
            n = int(how.split(":", 1)[1])
            if how.startswith("mask:"):
                bits = np.unpackbits(stored[_MASK.format(name)].numpy(), count=n)
                kept = torch.from_numpy(bits.astype(bool))
            else:
                kept = stored[_ROWS.format(name)].long()
            fill = stored[_FILL.format(name)]
            full = _as_bytes(fill).expand(n, -1).clone()
            full[kept] = _as_bytes(stored[_VALUES.format(name)])
            out[name] = full.view(fill.dtype).reshape(n, *fill.shape[1:])
        elif how.startswith("same:"):
            out[name] = out[how.removeprefix("same:")].clone()
        elif how.startswith("regenerate:"):
            out[name] = _regenerated(path, name, how.removeprefix("regenerate:"), generated)
        else:
            raise Ds41Error(f"{path}: tensor {name} has an unknown layout {how!r}")
    return out


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a packed file, gzip-compressed or not."""
    try:
        data = path.read_bytes()
        compressed = data.startswith(_GZIP_MAGIC)
        if compressed:
            data = gzip.decompress(data)
    except Exception as error:  # OSError, gzip's BadGzipFile / EOFError, zlib's error
        raise Ds41Error(f"{path}: not a readable packed checkpoint ({error})") from None
    if not compressed:
        return _read_plain(path, path)
    # safetensors reads E8M0 scales from a file only (not from bytes): decompress into one
    try:
        with tempfile.TemporaryDirectory() as tmp:
            plain = Path(tmp) / "tensors.safetensors"
            plain.write_bytes(data)
            return _read_plain(plain, path)
    except OSError as error:
        raise Ds41Error(f"{path}: cannot decompress it into a temporary folder ({error})") from None


def _read_plain(file: Path, packed: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """`file`'s tensors and metadata; errors name `packed`, the file the user gave."""
    try:
        with safe_open(str(file), framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}, f.metadata() or {}  # noqa: SIM118
    except Exception as error:  # safetensors raises its own error types
        raise Ds41Error(f"{packed}: not a readable packed checkpoint ({error})") from None


def _regenerated(
    path: Path, name: str, expected: str, generated: Mapping[str, torch.Tensor] | None
) -> torch.Tensor:
    t = None if generated is None else generated.get(name)
    if t is None or digest(t) != expected:
        got = "nothing" if t is None else digest(t)[:12] + "..."
        raise Ds41Error(
            f"{path}: tensor {name} must be regenerated as packed (SHA-256 {expected[:12]}...), got {got}: "
            "the generator of the untrained tensors changed since the model was packed"
        )
    return t
