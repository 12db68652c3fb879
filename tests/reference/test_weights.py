"""The reference model built from tiny checkpoints through the shared reader (MODEL.md §8, §11)."""

from __future__ import annotations

import torch
from safetensors import safe_open

from sglang_ds41.checkpoint.load import checkpoint_name
from sglang_ds41.checkpoint.reader import INDEX_FILE
from sglang_ds41.formats import dequantize_fp8_block2d, dequantize_mxfp4, dequantize_nvfp4

from ._feed import feed, rel_diff

F64 = torch.float64
IMAGE_ID = 129264  # the tiny checkpoints use the real vocabulary
IMAGE = slice(10, 18)


def _sequence(n: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 128000, (n,), generator=gen)
    ids[0] = 0  # BOS
    ids[IMAGE] = IMAGE_ID
    return ids, torch.randn(IMAGE.stop - IMAGE.start, 64, generator=gen, dtype=F64)


def _raw(ckpt_dir, name: str) -> torch.Tensor:
    """A stored tensor read straight from its shard, bypassing the reader."""
    import json

    shard = json.loads((ckpt_dir / INDEX_FILE).read_text())["weight_map"][name]
    with safe_open(str(ckpt_dir / shard), framework="pt") as f:
        return f.get_tensor(name)


def _params(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


def test_hyper_connection_names_map_to_the_checkpoint():
    assert checkpoint_name("layers.3.hc_attn.fn") == "layers.3.hc_attn_fn"
    assert checkpoint_name("layers.12.hc_ffn.scale") == "layers.12.hc_ffn_scale"
    assert checkpoint_name("layers.3.attn.compressor.wkv.weight") == "layers.3.attn.compressor.wkv.weight"
    assert checkpoint_name("layers.0.ffn.gate.bias_vl") == "layers.0.ffn.gate.bias_vl"


def test_loaded_weights_are_the_dequantised_checkpoint_tensors(load, tiny_ckpt):
    root = tiny_ckpt()
    p = _params(load())
    wq_a = "layers.3.attn.wq_a"
    want = dequantize_fp8_block2d(_raw(root, f"{wq_a}.weight"), _raw(root, f"{wq_a}.scale"), dtype=F64)
    assert torch.equal(p[f"{wq_a}.weight"], want)
    w2 = "layers.5.ffn.experts.6.w2"
    want = dequantize_mxfp4(_raw(root, f"{w2}.weight"), _raw(root, f"{w2}.scale"), dtype=F64)
    assert torch.equal(p[f"{w2}.weight"], want)
    assert torch.equal(p["layers.2.hc_ffn.fn"], _raw(root, "layers.2.hc_ffn_fn").to(F64))
    assert torch.equal(p["layers.0.ffn.gate.bias_vl"], _raw(root, "layers.0.ffn.gate.bias_vl").to(F64))
    assert torch.equal(p["head.weight"], _raw(root, "head.weight").to(F64))


def test_checkpoint_model_chunked_prefill_and_decode_equal_one_shot(load):
    model = load()
    ids, image = _sequence()
    one_shot = feed(model, ids, image, [48])
    chunked = feed(model, ids, image, [13, 14, 13] + [1] * 8)
    assert rel_diff(chunked, one_shot) < 1e-12
    assert torch.isfinite(one_shot).all()


def test_nvfp4_variant_is_a_lossless_re_encoding_of_the_base_experts(load, tiny_ckpt):
    base, nv = load(), load("nvfp4")
    pb, pn = _params(base), _params(nv)
    # The NVFP4 tensors themselves, dequantised here, hold the MXFP4 experts' exact values.
    root = tiny_ckpt("nvfp4")
    name = "layers.4.ffn.experts.3.w1"
    stored = dequantize_nvfp4(
        _raw(root, f"{name}.weight"),
        _raw(root, f"{name}.weight_scale"),
        _raw(root, f"{name}.weight_scale_2"),
        dtype=F64,
    )
    assert torch.equal(pn[f"{name}.weight"], stored)
    assert all(torch.equal(pb[n], pn[n]) for n in pb)
    ids, image = _sequence()
    assert torch.equal(feed(base, ids, image, [48]), feed(nv, ids, image, [48]))


class _Rows:
    """An Engram table stand-in that serves `rows(fp8_rows, mxfp4_rows)` computed from two real tables."""

    def __init__(self, fp8_table, mx_table, rows):
        self.fp8, self.mx, self.rows = fp8_table, mx_table, rows

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self.rows(self.fp8.lookup(ids).double(), self.mx.lookup(ids).double())


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).square().mean().sqrt())


def test_mxfp4_engram_tables_differ_from_fp8_only_in_the_tables(load):
    fp8, mx = load(), load("base", "mxfp4")
    pf, pm = _params(fp8), _params(mx)
    assert all(torch.equal(pf[n], pm[n]) for n in pf)
    rows = torch.arange(434)
    ef = fp8.layers[1].engram.table.lookup(rows).double()
    em = mx.layers[1].engram.table.lookup(rows).double()
    table_err = float(
        (
            (ef - em).abs().unflatten(-1, (-1, 32)) / ef.abs().unflatten(-1, (-1, 32)).amax(-1, keepdim=True)
        ).max()
    )
    assert 0 < table_err <= 0.25  # E2M1 under the same power-of-two scale: at most half a step of 1 in 4
    ids, image = _sequence()
    lm = feed(mx, ids, image, [48])
    assert torch.isfinite(lm).all()
    for layer in (1, 2):
        fp8.layers[layer].engram.table = mx.layers[layer].engram.table
    assert rel_diff(feed(fp8, ids, image, [48]), lm) < 1e-12  # the whole difference is the tables


def test_mxfp4_engram_logits_move_no_more_than_noise_of_the_same_size(load):
    """How close FP8 and MXFP4 Engram logits are, measured against controls run on the same model.

    The tiny random model has no trained margins and the spec's FP4 KV fake-quantisers are step
    functions, so any table change above ~1e-4 relative flips a few index top-k picks and the
    logits move by whole units (a 1e-3 fraction of the MXFP4 error already flips 8 picks). A bound
    on the max difference alone would say nothing; instead MXFP4 must move the logits no more than
    unbiased Gaussian noise of the same per-row RMS does (within the spread of the noise draws),
    and clearly less than a scale error of one power of two (the bug an E8M0 rule gets wrong) or
    dropping the tables."""
    fp8, mx = load(), load("base", "mxfp4")
    ids, image = _sequence()
    lf, lm = feed(fp8, ids, image, [48]), feed(mx, ids, image, [48])

    def logits_with(rows) -> torch.Tensor:
        model = load()
        for layer in (1, 2):
            pair = fp8.layers[layer].engram.table, mx.layers[layer].engram.table
            model.layers[layer].engram.table = _Rows(*pair, rows)
        return feed(model, ids, image, [48])

    def noise(seed: int):
        def rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            scale = (b - a).square().mean(-1, keepdim=True).sqrt()
            gen = torch.Generator().manual_seed(seed)
            return a + scale * torch.randn(a.shape, generator=gen, dtype=a.dtype)

        return rows

    mx_rms = _rms(lm, lf)
    noise_rms = sum(_rms(logits_with(noise(seed)), lf) for seed in range(3)) / 3
    half_rms = _rms(logits_with(lambda a, b: b * 0.5), lf)
    double_rms = _rms(logits_with(lambda a, b: b * 2.0), lf)
    dropped_rms = _rms(logits_with(lambda a, b: torch.zeros_like(a)), lf)
    agree = float((lm.argmax(-1) == lf.argmax(-1)).double().mean())
    print(
        f"\nFP8 vs MXFP4 Engram logits: max |diff| {float((lm - lf).abs().max()):.3g} "
        f"(max |logit| {float(lf.abs().max()):.3g}), rms diff {mx_rms:.3g} "
        f"(rms logit {float(lf.square().mean().sqrt()):.3g}), argmax agreement {agree:.2f}; "
        f"controls (rms diff): noise of the same size {noise_rms:.3g}, "
        f"MXFP4 at half / double scale {half_rms:.3g} / {double_rms:.3g}, no Engram rows {dropped_rms:.3g}"
    )
    assert mx_rms <= 1.2 * noise_rms  # three noise draws spread by about +-10%
    assert mx_rms < 0.6 * min(half_rms, double_rms)
    assert mx_rms < 0.5 * dropped_rms


def test_float32_model_stays_near_float64(load):
    ids, image = _sequence()
    ref = feed(load(), ids, image, [48])
    low = feed(load(dtype=torch.float32), ids, image.float(), [48])
    assert low.dtype == torch.float32
    assert rel_diff(low.double(), ref) < 1e-3


def test_bfloat16_model_keeps_f32_tensors_in_float32(load):
    model = load(dtype=torch.bfloat16)
    p = _params(model)
    assert p["layers.0.attn.wq_a.weight"].dtype == torch.bfloat16
    for name in ("layers.0.hc_attn.fn", "layers.0.attn.attn_sink", "layers.0.ffn.gate.bias_vl"):
        assert p[name].dtype == torch.float32, name  # stored F32 (MODEL.md §8.5)
    ids, image = _sequence()
    logits = feed(model, ids, image.bfloat16(), [48])
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
