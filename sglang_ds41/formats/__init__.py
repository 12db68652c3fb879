"""Quantisation formats of the V4.1 checkpoints and caches: pure tensor functions, any device.

Modules: ``e2m1`` / ``e8m0`` (element and scale codes), ``fp8`` (E4M3 + E8M0, 32x32 and 1x32
blocks), ``mxfp4`` (OCP or least-squares scales), ``nvfp4`` (ModelOpt layout; also the NVFP4
Engram table format), ``kv_quant`` (the model's KV fake-quantisers),
``sizes`` (bytes per row).
"""

from .checks import FormatError
from .fp8 import dequantize_fp8_block2d, dequantize_fp8_rows, quantize_fp8_block2d, quantize_fp8_rows
from .mxfp4 import dequantize_mxfp4, fp8_rows_to_mxfp4, quantize_mxfp4
from .nvfp4 import dequantize_nvfp4, fp8_rows_global_scale, fp8_rows_to_nvfp4, mxfp4_to_nvfp4, quantize_nvfp4
from .sizes import bytes_per_row

__all__ = [
    "FormatError",
    "bytes_per_row",
    "dequantize_fp8_block2d",
    "dequantize_fp8_rows",
    "dequantize_mxfp4",
    "dequantize_nvfp4",
    "fp8_rows_global_scale",
    "fp8_rows_to_mxfp4",
    "fp8_rows_to_nvfp4",
    "mxfp4_to_nvfp4",
    "quantize_fp8_block2d",
    "quantize_fp8_rows",
    "quantize_mxfp4",
    "quantize_nvfp4",
]
