"""`DeepseekV41ForCausalLM` as an out-of-tree SGLang model (the architecture name of the
official V4.1 checkpoints' config.json).

Only the registration exists so far: the SGLang forward (attention with slot-indexed V4.1
state, MoE, Engram, weight loading; issue 5) is still to be written. Until then, constructing
the model fails with a `Ds41Error` that says so, instead of SGLang falling back to another
implementation.
"""

from __future__ import annotations

from torch import nn

from sglang_ds41.errors import Ds41Error


class BackendNotReadyError(Ds41Error):
    """The SGLang backend cannot run this checkpoint yet."""


class DeepseekV41ForCausalLM(nn.Module):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__()
        raise BackendNotReadyError(
            "DeepseekV41ForCausalLM: the SGLang forward of DeepSeek-V4.1 is not implemented yet "
            f"(checkpoint {getattr(config, '_name_or_path', '?')!r}); the test-only scripted "
            "model (sglang_ds41.backend.scripted) and the reference model (sglang_ds41.reference) "
            "work today"
        )


EntryClass = [DeepseekV41ForCausalLM]
