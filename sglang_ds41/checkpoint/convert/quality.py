"""How much an Engram conversion lost: each converted row against its source row (issue 15).

4-bit tables are lossy, and that is the first thing users ask about, so every `convert-engram`
measures every row it writes and reports per table:

* the **row cosine** and **relative error** ``||q - x|| / ||x||`` of each row ``q`` against its
  source row ``x`` (mean, the 1% tail -- p1 of the cosine, p99 of the error -- and the worst);
* the **saturated-block fraction**: blocks where a source value exceeded the format's largest
  value (E2M1's 6 x the block scale), so it was clipped; and the **flushed-block** fraction:
  blocks whose values all decode to zero although the source's did not (NVFP4 block scales
  that round to zero);
* the **bytes per row** of source and output.

Both rows are decoded from their stored bytes (not taken from the encoder) in float64, so the
report measures what was written. Rows whose source is all zero are counted, not measured (no
direction); rows with NaN or infinities are counted apart.

The statistics are mergeable and exact whatever the chunking: sums in integer fixed point
(2**-40), the tails from histograms of log10(1 - cosine) and log10(error) with 1000 bins per
decade (the reported tail is its bin's upper edge: within 0.23% of (1 - cosine) and never
optimistic), so a conversion resumed after a kill writes the same report, byte for byte, as one
that ran through. `--dry-run --report` measures a sample of rows instead (evenly spaced runs of
consecutive rows, which cover every hash column of a table).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import torch

from sglang_ds41 import formats
from sglang_ds41.checkpoint.convert.recode import split_rows
from sglang_ds41.fast.jit import compiled
from sglang_ds41.formats.engram import ENGRAM_FORMATS, EngramFormat, engram_format

REPORT_FILE = "engram_quality.json"
REPORT_KIND = "sglang-ds41 Engram quality report v1"
_FIXED = 2.0**40  # fixed-point unit of the sums
_PER_DECADE = 1000
_LOW_DECADE = -12  # values below 1e-12 (and exact zeros) share bin 0
_BINS = (_LOW_DECADE * -1 + 2) * _PER_DECADE  # up to 1e2
MEASURED, ZERO_ROW, NON_FINITE_ROW = 0, 1, 2


def _kernel_code(fmt: EngramFormat) -> int:
    """The row kernel's cases: 0 = E4M3 values under E8M0 scales per 32 (FP8), 1 = E2M1 codes
    under E8M0 per 32 (MXFP4), 2 = E2M1 codes under E4M3 per 16 times a global scale (NVFP4)."""
    if not fmt.four_bit:
        return 0
    return 2 if fmt.global_scale is not None else 1


_FORMAT_CODES = {name: _kernel_code(fmt) for name, fmt in ENGRAM_FORMATS.items()}


@cache
def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """float64 value of each E4M3 byte, 2**(b - 127) per E8M0 byte (NaN for 255), value of each
    E2M1 code; float32 value of each E4M3 byte (NVFP4 block scales)."""
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    pow2 = formats.e8m0.decode(torch.arange(256, dtype=torch.uint8)).double()
    e2m1 = torch.tensor(formats.e2m1.VALUES, dtype=torch.float64)
    return e4m3.double().numpy(), pow2.numpy(), e2m1.numpy(), e4m3.numpy().astype(np.float32)


@compiled(reassociate=True)
def _value(fmt, w, r, i, e4m3, e2m1):
    """Value i of row r in units of its block scale: an E4M3 byte (FP8) or an E2M1 nibble."""
    if fmt == 0:
        return e4m3[w[r, i]]
    return e2m1[(w[r, i >> 1] >> ((i & 1) << 2)) & 15]


@compiled(reassociate=True)
def _unit(fmt, s, r, j, ws2, pow2, e4m3_f32):
    """The scale of 16-value piece j of row r: E8M0 per 32 (FP8, MXFP4) or E4M3 x global (NVFP4)."""
    if fmt == 2:
        return np.float64(e4m3_f32[s[r, j]] * ws2)  # float32 product, as NVFP4 decoders form it
    return pow2[s[r, j >> 1]]


@compiled(reassociate=True)
def _row_quality(
    src_fmt, sw, ss, out_fmt, ow, os_, ws2, width, e4m3, pow2, e2m1, e4m3_f32, cos, rel, kind, blocks
):
    """Per row: cosine, relative error, kind (MEASURED / ZERO_ROW / NON_FINITE_ROW); saturated and
    flushed output blocks into `blocks` [rows, 2]. Works on 16-value pieces, the common divisor
    of the block sizes: sums of scale-free values per piece, scaled once."""
    pieces_per_block = 1 if out_fmt == 2 else 2
    top = 448.0 if out_fmt == 0 else 6.0
    for r in range(sw.shape[0]):
        x2 = q2 = xq = e2 = 0.0
        saturated = flushed = 0
        x_max = q_max = 0.0
        for j in range(width // 16):
            ux = _unit(src_fmt, ss, r, j, ws2, pow2, e4m3_f32)
            uq = _unit(out_fmt, os_, r, j, ws2, pow2, e4m3_f32)
            sv2 = sc2 = svc = se = 0.0
            if j % pieces_per_block == 0:
                x_max = q_max = 0.0
            for i in range(j * 16, j * 16 + 16):
                v = _value(src_fmt, sw, r, i, e4m3, e2m1)
                c = _value(out_fmt, ow, r, i, e4m3, e2m1)
                sv2 += v * v
                sc2 += c * c
                svc += v * c
                d = uq * c - ux * v
                se += d * d
                x_max = max(x_max, abs(v))
                q_max = max(q_max, abs(c))
            x2 += ux * ux * sv2
            q2 += uq * uq * sc2
            xq += ux * uq * svc
            e2 += se
            if j % pieces_per_block == pieces_per_block - 1:
                saturated += ux * x_max > top * uq
                flushed += (x_max > 0) & (uq * q_max == 0)
        blocks[r, 0] = saturated
        blocks[r, 1] = flushed
        if not (np.isfinite(x2) and np.isfinite(q2) and np.isfinite(xq) and np.isfinite(e2)):
            kind[r], cos[r], rel[r] = NON_FINITE_ROW, 0.0, 0.0
        elif x2 == 0:
            kind[r], cos[r], rel[r] = ZERO_ROW, 0.0, 0.0
        else:
            kind[r] = MEASURED
            cos[r] = xq / math.sqrt(x2 * q2) if q2 > 0 else 0.0
            rel[r] = math.sqrt(e2 / x2)


def _bins(values: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        logs = np.log10(np.maximum(values, 0.0))
    idx = np.floor((logs - _LOW_DECADE) * _PER_DECADE) + 1
    return np.clip(np.nan_to_num(idx, nan=0.0, neginf=0.0), 0, _BINS - 1).astype(np.int64)


def _upper_edge(bin_: int) -> float:
    return 0.0 if bin_ == 0 else 10.0 ** (_LOW_DECADE + bin_ / _PER_DECADE)


def _fixed_sum(values: np.ndarray) -> int:
    return int(np.rint(values * _FIXED).astype(np.int64).sum())


def _merge_hist(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _hist(values: np.ndarray) -> dict[int, int]:
    idx, counts = np.unique(_bins(values), return_counts=True)
    return {int(i): int(c) for i, c in zip(idx, counts, strict=True)}


def _tail(hist: dict[int, int], total: int, fraction: float) -> int:
    """The bin holding the value below which `fraction` of `total` values lie."""
    need, seen = math.ceil(fraction * total), 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= need:
            return b
    return max(hist) if hist else 0


@dataclass
class Quality:
    """Mergeable statistics of converted rows against their source rows (one table)."""

    rows: int = 0
    measured: int = 0
    zero_rows: int = 0
    non_finite_rows: int = 0
    blocks: int = 0
    saturated_blocks: int = 0
    flushed_blocks: int = 0
    cos_sum: int = 0  # fixed point, units of 2**-40
    rel_sum: int = 0
    cos_min: float = 1.0
    rel_max: float = 0.0
    hist_loss: dict[int, int] = field(default_factory=dict)  # bins of log10(1 - cosine)
    hist_rel: dict[int, int] = field(default_factory=dict)  # bins of log10(relative error)

    def merge(self, other: Quality) -> Quality:
        return Quality(
            self.rows + other.rows,
            self.measured + other.measured,
            self.zero_rows + other.zero_rows,
            self.non_finite_rows + other.non_finite_rows,
            self.blocks + other.blocks,
            self.saturated_blocks + other.saturated_blocks,
            self.flushed_blocks + other.flushed_blocks,
            self.cos_sum + other.cos_sum,
            self.rel_sum + other.rel_sum,
            min(self.cos_min, other.cos_min),
            max(self.rel_max, other.rel_max),
            _merge_hist(self.hist_loss, other.hist_loss),
            _merge_hist(self.hist_rel, other.hist_rel),
        )

    # --- the journal keeps one per finished shard -------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if not k.startswith("hist")}
        data["hist_loss"] = sorted(self.hist_loss.items())
        data["hist_rel"] = sorted(self.hist_rel.items())
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Quality:
        plain = {k: v for k, v in data.items() if not k.startswith("hist")}
        return cls(
            **plain,
            hist_loss={int(k): int(v) for k, v in data["hist_loss"]},
            hist_rel={int(k): int(v) for k, v in data["hist_rel"]},
        )

    # --- what the report says ---------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        n = self.measured
        if n == 0:
            return {"rows_measured": 0, "zero_rows": self.zero_rows, "non_finite_rows": self.non_finite_rows}
        loss_p99 = min(_upper_edge(_tail(self.hist_loss, n, 0.99)), 1.0 - self.cos_min)
        rel_p99 = min(_upper_edge(_tail(self.hist_rel, n, 0.99)), self.rel_max)
        return {
            "rows_measured": n,
            "zero_rows": self.zero_rows,
            "non_finite_rows": self.non_finite_rows,
            "row_cosine": {
                "mean": round(self.cos_sum / _FIXED / n, 7),
                "p1": round(1.0 - loss_p99, 7),
                "min": round(self.cos_min, 7),
            },
            "relative_error": {
                "mean": round(self.rel_sum / _FIXED / n, 7),
                "p99": round(rel_p99, 7),
                "max": round(self.rel_max, 7),
            },
            "blocks": self.blocks,
            "saturated_blocks": round(self.saturated_blocks / max(self.blocks, 1), 7),
            "flushed_blocks": round(self.flushed_blocks / max(self.blocks, 1), 7),
        }


def measure(
    source_format: str,
    src_weight: np.ndarray,
    src_scale: np.ndarray,
    to: str,
    out_weight: np.ndarray,
    out_scale: np.ndarray,
    global_scale: float | None = None,
    workers: int = 1,
) -> Quality:
    """Quality of converted rows (`to`, uint8 bytes as stored) against their source rows."""
    rows = src_weight.shape[0]
    width = src_scale.shape[1] * engram_format(source_format).scale_block
    cos, rel = np.empty(rows, np.float64), np.empty(rows, np.float64)
    kind, blocks = np.empty(rows, np.uint8), np.empty((rows, 2), np.int64)
    ws2 = np.float32(global_scale if global_scale is not None else 0.0)
    tables = _tables()
    src_fmt, out_fmt = _FORMAT_CODES[source_format], _FORMAT_CODES[to]

    def run(part: slice) -> None:
        _row_quality(
            src_fmt, src_weight[part], src_scale[part], out_fmt, out_weight[part], out_scale[part], ws2,
            width, *tables, cos[part], rel[part], kind[part], blocks[part],
        )  # fmt: skip

    split_rows(rows, workers, run)
    ok = kind == MEASURED
    c, e = cos[ok], rel[ok]
    per_row = engram_format(to).scale_bytes(width)  # output blocks per row
    return Quality(
        rows=rows,
        measured=int(ok.sum()),
        zero_rows=int((kind == ZERO_ROW).sum()),
        non_finite_rows=int((kind == NON_FINITE_ROW).sum()),
        blocks=rows * per_row,
        saturated_blocks=int(blocks[:, 0].sum()),
        flushed_blocks=int(blocks[:, 1].sum()),
        cos_sum=_fixed_sum(c),
        rel_sum=_fixed_sum(e),
        cos_min=float(c.min()) if c.size else 1.0,
        rel_max=float(e.max()) if e.size else 0.0,
        hist_loss=_hist(1.0 - c),
        hist_rel=_hist(e),
    )


# --- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TableReport:
    layer: int
    tensor: str
    rows: int
    source_format: str
    format: str
    scale_rule: str
    width: int
    quality: Quality

    def to_json(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "tensor": self.tensor,
            "rows": self.rows,
            "source_format": self.source_format,
            "format": self.format,
            "scale_rule": self.scale_rule,
            "bytes_per_row": engram_format(self.format).bytes_per_row(self.width),
            "source_bytes_per_row": engram_format(self.source_format).bytes_per_row(self.width),
            **self.quality.summary(),
        }


def report_json(source: str, tables: list[TableReport], sample_rows: int | None) -> bytes:
    """The report as written beside the converted tables: nothing in it depends on where or in
    how many runs they were written."""
    data = {
        "kind": REPORT_KIND,
        "source": source,
        "measured": (
            "every converted row against its source row, both decoded from their stored bytes in float64"
            if sample_rows is None
            else f"a sample of up to {sample_rows:,} rows per table (dry run), encoded as a conversion would"
        ),
        "tables": [t.to_json() for t in tables],
    }
    return (json.dumps(data, indent=2) + "\n").encode()


def render(tables: list[TableReport], sample_rows: int | None) -> str:
    what = "all rows" if sample_rows is None else f"a sample of up to {sample_rows:,} rows per table"
    lines = [
        f"Engram quality, each converted row vs its source row ({what}):",
        f"  {'layer':>5}  {'format':<14} {'B/row':>9}  {'cos mean':>8} {'cos p1':>8} {'cos min':>8}  "
        f"{'err mean':>8} {'err p99':>8} {'err max':>8}  {'saturated':>9}",
    ]
    for t in tables:
        s = t.to_json()
        fmt = f"{t.format}/{t.scale_rule}"
        size = f"{s['bytes_per_row']} ({s['source_bytes_per_row']})"
        if not s["rows_measured"]:
            lines.append(f"  {t.layer:>5}  {fmt:<14} {size:>9}  no non-zero finite rows")
            continue
        c, e = s["row_cosine"], s["relative_error"]
        lines.append(
            f"  {t.layer:>5}  {fmt:<14} {size:>9}  {c['mean']:>8.5f} {c['p1']:>8.5f} {c['min']:>8.5f}  "
            f"{e['mean']:>8.4f} {e['p99']:>8.4f} {e['max']:>8.4f}  {s['saturated_blocks']:>9.3%}"
        )
        extra = [
            f"{s[key]:,} {label}" for key, label in (("zero_rows", "all-zero rows"),
                                                     ("non_finite_rows", "non-finite rows")) if s[key]
        ]  # fmt: skip
        if s["flushed_blocks"]:
            extra.append(f"{s['flushed_blocks']:.4%} of blocks flushed to zero")
        if s["rows_measured"] + s["zero_rows"] + s["non_finite_rows"] < t.rows and sample_rows is None:
            extra.append(f"only {s['rows_measured']:,} of {t.rows:,} rows measured")
        if extra:
            lines.append(f"  {'':>5}  ({'; '.join(extra)})")
    lines.append(
        "  B/row: output (source); err: ||row - source|| / ||source||; saturated: blocks with a clipped value"
    )
    return "\n".join(lines)
