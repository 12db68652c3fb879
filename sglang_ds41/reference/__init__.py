"""The pure-PyTorch reference model: `model/` + `engram/` assembled into one module per request.

`model.Transformer` (the forward of MODEL.md §2), `state.RequestState` (what a request carries
between chunks), `weights.load_reference` (dense weights from a checkpoint directory through the
shared reader), `generate` (greedy / sampled decoding and the self-test). Slow and simple on
purpose: it is the oracle the SGLang backend is tested against, not a server.
"""

from .model import Block, Transformer
from .state import RequestState

__all__ = ["Block", "RequestState", "Transformer"]
