"""Engram: compressed token map -> n-gram hash ids -> table rows -> gated residual update.

Modules: `token_map` (tokenizer -> compressed ids), `layout` (primes, offsets, multipliers;
documents how hash ids map to table rows), `hashing` (batch hash and per-request state),
`plan` (memory per TP rank), `table` (row store, as the checkpoint's values and scales arrays)
and `gather` (its CPU lookup), `split_gather` (the GPU kernels of the SGLang plugin), `gate`
(layer math). The table formats themselves are `formats.engram`'s.
"""
