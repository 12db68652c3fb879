"""sglang-ds41: DeepSeek-V4.1-Flash on SGLang, its prompt format, and an agent runner.

Subpackages: `encoding` (prompt format and output parsing; folder `encoding/`), `agents`
(agent runner; folder `agents/`), `formats` (FP8/MXFP4/NVFP4 tensors), `engram` (hashed
n-gram memory), `commands` (the `sglang-ds41` CLI).
"""

__version__ = "0.1.0"
