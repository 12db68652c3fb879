import subprocess
import sys

import pytest

from sglang_ds41.formats import bytes_per_row, mxfp4, nvfp4, scale_block, scale_bytes, value_bytes
from sglang_ds41.formats.checks import FormatError


def test_engram_row_sizes_match_the_spec():
    # MODEL.md §8.4: 264 B (FP8 + E8M0/32), 136 B (MXFP4), 144 B (NVFP4, global scale per tensor).
    assert bytes_per_row("fp8", 256) == 264
    assert bytes_per_row("mxfp4", 256) == 136
    assert bytes_per_row("nvfp4", 256) == 144


def test_a_row_is_its_values_then_its_block_scales():
    assert [(value_bytes(f, 256), scale_bytes(f, 256)) for f in ("fp8", "mxfp4", "nvfp4")] == [
        (256, 8),
        (128, 8),
        (128, 16),
    ]
    assert (scale_block("fp8"), scale_block("mxfp4"), scale_block("nvfp4")) == (32, 32, 16)
    assert (scale_block("mxfp4"), scale_block("nvfp4")) == (mxfp4.BLOCK, nvfp4.BLOCK)
    assert bytes_per_row("nvfp4", 32) == value_bytes("nvfp4", 32) + scale_bytes("nvfp4", 32) == 18


def test_unknown_format_and_ragged_width_are_errors():
    with pytest.raises(FormatError, match="unknown format 'int4'"):
        bytes_per_row("int4", 256)
    for size in (scale_block, lambda f: value_bytes(f, 256), lambda f: scale_bytes(f, 256)):
        with pytest.raises(FormatError, match="unknown format 'int4'"):
            size("int4")
    with pytest.raises(FormatError, match="cols 100 is not a multiple of 32"):
        bytes_per_row("mxfp4", 100)


def test_the_row_sizes_need_no_torch():
    # The planner and the manifest (engram-plan, inspect) take their row sizes from here.
    code = (
        "import sys, sglang_ds41.formats.sizes, sglang_ds41.engram.plan, sglang_ds41.checkpoint.manifest; "
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
