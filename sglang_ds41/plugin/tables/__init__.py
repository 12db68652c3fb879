"""The plugin's Engram tables: upstream's `EngramEmbedding` storing and gathering MXFP4 and NVFP4
tables as well as FP8 ones (`embedding`), in the format each layer's checkpoint declares
(`checkpoint_formats`). The formats themselves are `formats.engram`'s; the GPU kernels
`engram.split_gather`'s.
"""

from __future__ import annotations


def replacements() -> dict[str, type]:
    """Upstream class path -> our class (a REPLACE hook). Importing `embedding` checks the whole
    upstream surface first (`plugin.upstream`)."""
    from sglang_ds41.plugin.tables.embedding import TARGET, Ds41EngramEmbedding

    return {TARGET: Ds41EngramEmbedding}
