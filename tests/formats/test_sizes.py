import pytest

from sglang_ds41.formats import bytes_per_row
from sglang_ds41.formats.checks import FormatError


def test_engram_row_sizes_match_the_spec():
    # MODEL.md §8.4: 264 B (FP8 + E8M0/32), 136 B (MXFP4), 144 B (NVFP4, global scale per tensor).
    assert bytes_per_row("fp8", 256) == 264
    assert bytes_per_row("mxfp4", 256) == 136
    assert bytes_per_row("nvfp4", 256) == 144


def test_unknown_format_and_ragged_width_are_errors():
    with pytest.raises(FormatError, match="unknown format 'int4'"):
        bytes_per_row("int4", 256)
    with pytest.raises(FormatError, match="cols 100 is not a multiple of 32"):
        bytes_per_row("mxfp4", 100)
