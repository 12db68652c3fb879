"""Fast paths of the model math for inference (no autograd): compiled CPU loops (numba) and
batched forms of what `model/` and `engram/` define op by op.

The plain functions stay the definitions and the oracles: the trainer differentiates through
them, the reference model runs them, and every fast path here equals its oracle to rounding
(float64: ~1e-15 relative; tests/fast). The SGLang backend runs these on the CPU, where a step
of a small model is otherwise mostly op dispatch: one compiled call instead of the ~100 tiny
ops of a Sinkhorn, one grouped GEMM per expert instead of a loop of masks.

* `mhc`: a site's coefficients (RMS, sigmoids, Sinkhorn), collapse + RMSNorm, expand.
* `selection`: the indexer's selection of a decode step's scores (mask, candidate blocks, top-k).
* `hashing`: the Engram rows of a batch's chunks from the raw ids before them (exact: integers).
* `engram`: the Engram layer's gate (normalised dots, signed root, sigmoid, value added).
"""
