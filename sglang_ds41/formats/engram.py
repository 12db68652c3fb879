"""The Engram table formats: the one statement of which exist, their tensors, dtypes and sizes.

A table (one per Engram layer, MODEL.md §8.4) is stored as two row arrays -- the values, then
one scale per block of a row -- and, for NVFP4, one float32 per table:

    format  embed.weight              scales                                per table
    fp8     F8_E4M3 [rows, 256]       embed.scale F8_E8M0 [rows, 8]         -
    mxfp4   U8 [rows, 128] (E2M1 x2)  embed.scale F8_E8M0 [rows, 8]         -
    nvfp4   U8 [rows, 128] (E2M1 x2)  embed.weight_scale F8_E4M3 [rows, 16] embed.weight_scale_2 F32 []

(shapes for the official head_dim of 256: 264, 136 and 144 bytes per row; two E2M1 codes a
byte, the even column in the low nibble). FP8 is the official release; MXFP4 and NVFP4 are what
`convert-engram` writes (NVFP4 is our decision, ModelOpt-named: `formats/nvfp4.py`). Checkpoints
spell some of these bytes differently, and every reader accepts those spellings: 4-bit codes as
I8 (third-party MXFP4 releases), E8M0 scales as U8, the global scale as [1].

The manifest (`checkpoint.manifest`), the planner (`engram.plan`), the table (`engram.table`),
the converter (`checkpoint.convert`: its plan, re-encoder, quality report and verifier) and the SGLang plugin
(`plugin.tables.embedding`) read names, tensors, dtypes, sizes and decoders here; a test checks
that none of them spells them itself. Sizes are `formats.sizes`' arithmetic and decoders are
`formats.fp8` / `mxfp4` / `nvfp4`'s, loaded on first use: importing this module needs no torch,
so the torch-free manifest and planner read it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import sizes
from .checks import FormatError

if TYPE_CHECKING:
    import torch

TABLE = "embed"  # a layer's table tensors are `layers.L.engram.embed.<part>`

# safetensors dtype name -> torch dtype attribute: those table tensors use, and those a wrong
# tensor is likeliest to have (error messages name dtypes as a checkpoint spells them)
_TORCH_NAMES = {
    "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu",
    "U8": "uint8",
    "I8": "int8",
    "F32": "float32",
    "BF16": "bfloat16",
    "F16": "float16",
    "F64": "float64",
}


@dataclass(frozen=True)
class Part:
    """One stored tensor of a table: its name after ``embed.``, the dtype written, the dtypes a
    checkpoint may store instead (the same bytes) and what one element holds."""

    name: str
    dtype: str
    accepted: tuple[str, ...]
    element: str  # E4M3, E8M0, E2M1 x2 (two codes a byte), F32

    def torch_dtype(self) -> torch.dtype:
        """The dtype it is allocated as."""
        return torch_dtype(self.dtype)

    def torch_dtypes(self) -> tuple[torch.dtype, ...]:
        """Every dtype a loaded tensor may have."""
        return tuple(torch_dtype(d) for d in self.accepted)


@dataclass(frozen=True)
class EngramFormat:
    """One table format: its parts (`values`, `scales`, NVFP4's `global_scale`) and sizes."""

    name: str
    values: Part
    scales: Part
    global_scale: Part | None = None

    def __repr__(self) -> str:
        return f"EngramFormat({self.name!r})"

    def __reduce__(self) -> tuple:
        return engram_format, (self.name,)  # unpickled as the registry's own object (`is` holds)

    @property
    def parts(self) -> tuple[Part, ...]:
        return (self.values, self.scales) if self.global_scale is None else (
            self.values, self.scales, self.global_scale)  # fmt: skip

    @property
    def four_bit(self) -> bool:
        """Values are packed E2M1 pairs (MXFP4, NVFP4), not one E4M3 byte each (FP8)."""
        return self.values.element == E2M1_PAIR

    @property
    def scale_block(self) -> int:
        """Values per scale byte: 32 (FP8, MXFP4) or 16 (NVFP4)."""
        return sizes.scale_block(self.name)

    def value_bytes(self, head_dim: int) -> int:
        return sizes.value_bytes(self.name, head_dim)

    def scale_bytes(self, head_dim: int) -> int:
        return sizes.scale_bytes(self.name, head_dim)

    def bytes_per_row(self, head_dim: int) -> int:
        """264 (FP8), 136 (MXFP4) or 144 (NVFP4) for head_dim 256."""
        return sizes.bytes_per_row(self.name, head_dim)

    @property
    def bytes_per_table(self) -> int:
        """Bytes stored once per table, replicated on every rank: NVFP4's float32 global scale."""
        return 0 if self.global_scale is None else 4

    def shapes(self, rows: int, head_dim: int) -> dict[Part, tuple[int, ...]]:
        """Each part's stored shape for a table of `rows` rows of `head_dim` values."""
        out = {
            self.values: (rows, self.value_bytes(head_dim)),
            self.scales: (rows, self.scale_bytes(head_dim)),
        }
        if self.global_scale is not None:
            out[self.global_scale] = ()
        return out

    def layout(self, head_dim: int) -> str:
        """One line: ``E2M1 x2 [rows,128] + E8M0 [rows,8] (one scale per 32)`` and the like."""
        head = f"{self.values.element} [rows,{self.value_bytes(head_dim)}] + "
        head += f"{self.scales.element} [rows,{self.scale_bytes(head_dim)}]"
        if self.global_scale is not None:
            return head + f" + {self.global_scale.element} global scale"
        return head + f" (one scale per {self.scale_block})"

    def dequantize(
        self, values: torch.Tensor, scales: torch.Tensor, global_scale: float | None = None, dtype=None
    ) -> torch.Tensor:
        """Rows of this format as `dtype` (default bf16), by the definition in `formats/`."""
        import torch

        from . import fp8, mxfp4, nvfp4

        dtype = torch.bfloat16 if dtype is None else dtype
        if self is FP8:
            return fp8.dequantize_fp8_rows(values, scales, block=self.scale_block, dtype=dtype)
        if self is MXFP4:
            return mxfp4.dequantize_mxfp4(values, scales, dtype=dtype)
        if global_scale is None:
            raise FormatError(f"{self.name} Engram rows need the table's float32 {self.global_scale.name}")
        return nvfp4.dequantize_nvfp4(values, scales, global_scale, dtype=dtype)

    def from_fp8_rows(
        self, values: torch.Tensor, scales: torch.Tensor, scale_rule: str, global_scale=None
    ) -> tuple[torch.Tensor, ...]:
        """The official FP8 rows (E4M3 values, E8M0 scales) in this format, one tensor per part,
        by the definition in `formats/` (`convert-engram`'s fast re-encoder equals it bit for
        bit). `global_scale`: NVFP4's, default the rows' own (`fp8_rows_global_scale`)."""
        from . import mxfp4, nvfp4

        if self is FP8:
            return values, scales
        if self is MXFP4:
            return mxfp4.fp8_rows_to_mxfp4(values, scales, scale_rule=scale_rule)
        codes, scale, ws2 = nvfp4.fp8_rows_to_nvfp4(values, scales, global_scale, scale_rule=scale_rule)
        return codes, scale, ws2.reshape(())


E4M3, E8M0, E2M1_PAIR, F32 = "E4M3", "E8M0", "E2M1 x2", "F32"
_CODES = Part("weight", "U8", ("U8", "I8"), E2M1_PAIR)  # the official layout says U8, some releases I8
_E8M0_SCALES = Part("scale", "F8_E8M0", ("F8_E8M0", "U8"), E8M0)  # some writers store plain bytes

FP8 = EngramFormat("fp8", Part("weight", "F8_E4M3", ("F8_E4M3",), E4M3), _E8M0_SCALES)
MXFP4 = EngramFormat("mxfp4", _CODES, _E8M0_SCALES)
NVFP4 = EngramFormat(
    "nvfp4",
    _CODES,
    Part("weight_scale", "F8_E4M3", ("F8_E4M3",), E4M3),
    Part("weight_scale_2", "F32", ("F32",), F32),
)
ENGRAM_FORMATS: dict[str, EngramFormat] = {f.name: f for f in (FP8, MXFP4, NVFP4)}
NAMES = tuple(ENGRAM_FORMATS)  # fp8, mxfp4, nvfp4
FOUR_BIT = tuple(f.name for f in ENGRAM_FORMATS.values() if f.four_bit)


def engram_format(name: str | EngramFormat) -> EngramFormat:
    """The format called `name` (case-insensitive), or a FormatError naming the known ones."""
    if isinstance(name, EngramFormat):
        return name
    try:
        return ENGRAM_FORMATS[name.lower()]
    except (KeyError, AttributeError):
        raise FormatError(f"unknown Engram table format {name!r}; expected one of {list(NAMES)}") from None


def tensor_name(prefix: str, part: Part | str) -> str:
    """`layers.1.engram` + weight -> `layers.1.engram.embed.weight`."""
    return f"{prefix}.{TABLE}.{part if isinstance(part, str) else part.name}"


def table_prefix(name: str) -> str:
    """`layers.1.engram.embed.<part>` -> `layers.1.engram` (what `tensor_name` took)."""
    return name.rsplit(f".{TABLE}.", 1)[0]


def part_names() -> tuple[str, ...]:
    """Every part name any format stores (weight, scale, weight_scale, weight_scale_2)."""
    return tuple(dict.fromkeys(p.name for f in ENGRAM_FORMATS.values() for p in f.parts))


def accepts_shape(expected: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """A stored shape matches: as expected, or a per-table scalar stored as [1]."""
    return tuple(shape) == tuple(expected) or (expected == () and tuple(shape) == (1,))


def torch_dtype(st_dtype: str) -> torch.dtype:
    import torch

    return getattr(torch, _TORCH_NAMES[st_dtype])


def st_dtype(dtype: str | torch.dtype) -> str:
    """A torch dtype's safetensors name (`torch.float8_e4m3fn` -> F8_E4M3); names pass through."""
    if isinstance(dtype, str):
        return dtype
    spelled = str(dtype).removeprefix("torch.")
    return next((st for st, name in _TORCH_NAMES.items() if name == spelled), spelled)

