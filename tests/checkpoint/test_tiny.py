"""`make-tiny` checkpoints: valid in every variant, deterministic, and shaped like the release."""

from __future__ import annotations

import hashlib
import json
import math
import time

import pytest
import torch

from sglang_ds41 import formats
from sglang_ds41.assets import TOKENIZER_SHA256
from sglang_ds41.checkpoint.inspect import inspect_checkpoint
from sglang_ds41.checkpoint.reader import Checkpoint
from sglang_ds41.checkpoint.tiny import tiny_config, write_tiny
from sglang_ds41.config import V41Config
from sglang_ds41.errors import Ds41Error
from sglang_ds41.model.roles import LayerRole, consumes_candidates, layer_role

VARIANTS = [("base", "fp8"), ("base", "mxfp4"), ("base", "nvfp4"), ("nvfp4", "fp8"), ("nvfp4", "mxfp4")]


def file_hashes(directory) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(directory.iterdir())}


@pytest.mark.parametrize(("variant", "engram"), VARIANTS)
def test_every_variant_passes_inspect(tiny_dir, variant, engram):
    summary = inspect_checkpoint(tiny_dir(variant, engram))
    assert summary["valid"] and summary["variant"] == variant and summary["engram_format"] == engram
    assert summary["total_bytes"] < 100 * 2**20
    assert set(summary["bytes_by_format"]) == {"bf16", "f32", "fp8", "mxfp4", f"engram_{engram}"} | (
        {"nvfp4"} if variant == "nvfp4" else set()
    )


@pytest.mark.parametrize(("variant", "engram"), VARIANTS)
def test_release_formats_are_used(tiny_dir, variant, engram):
    ckpt = Checkpoint.open(tiny_dir(variant, engram))
    stored = ckpt.stored
    # FP8 32x32 linears with E8M0 scales; shared experts FP8.
    assert (stored["layers.0.attn.wo_b.weight"].dtype, stored["layers.0.attn.wo_b.weight"].shape) == (
        "F8_E4M3", (64, 64))  # fmt: skip
    assert stored["layers.0.ffn.shared_experts.w2.scale"].dtype == "F8_E8M0"
    # Routed experts: MXFP4 (I8 codes) or NVFP4 (U8 codes, E4M3 per 16, 0-d F32 scales).
    w1 = "layers.3.ffn.experts.5.w1"
    if variant == "base":
        assert (stored[f"{w1}.weight"].dtype, stored[f"{w1}.weight"].shape) == ("I8", (32, 32))
        assert (stored[f"{w1}.scale"].dtype, stored[f"{w1}.scale"].shape) == ("F8_E8M0", (32, 2))
    else:
        assert (stored[f"{w1}.weight"].dtype, stored[f"{w1}.weight"].shape) == ("U8", (32, 32))
        assert (stored[f"{w1}.weight_scale"].dtype, stored[f"{w1}.weight_scale"].shape) == (
            "F8_E4M3",
            (32, 4),
        )
        assert stored[f"{w1}.weight_scale_2"].shape == () and stored[f"{w1}.input_scale"].shape == ()
        assert f"{w1}.scale" not in stored
        assert json.loads((ckpt.root / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == (
            "MIXED_PRECISION"
        )
    # DSpark experts stay MXFP4 in both releases.
    assert stored["mtp.1.ffn.experts.3.w2.weight"].dtype == "I8"
    # Engram tables: 434 / 606 rows (primes of Appendix B), 32 wide.
    table = stored["layers.2.engram.embed.weight"]
    assert (table.dtype, table.shape) == (("F8_E4M3", (606, 32)) if engram == "fp8" else ("U8", (606, 16)))
    if engram == "nvfp4":  # ModelOpt names: E4M3 per 16 columns, one F32 per table
        scale = stored["layers.1.engram.embed.weight_scale"]
        assert (scale.dtype, scale.shape) == ("F8_E4M3", (434, 2))
        global_scale = stored["layers.1.engram.embed.weight_scale_2"]
        assert (global_scale.dtype, global_scale.shape) == ("F32", ())
        assert "layers.1.engram.embed.scale" not in stored
    else:
        scale = stored["layers.1.engram.embed.scale"]
        assert (scale.dtype, scale.shape) == ("F8_E8M0", (434, 1))


def test_config_has_every_structural_feature(tiny_dir):
    root = tiny_dir()
    data = json.loads((root / "config.json").read_text())
    assert set(data) >= {"text_config", "vision_config", "quantization_config"}
    t = V41Config.from_dict(data).text
    roles = [layer_role(t, i) for i in range(t.num_hidden_layers)]
    W, F, RU, RI = LayerRole.WINDOW, LayerRole.FULL, LayerRole.REUSE, LayerRole.REINDEX
    assert roles == [W, W, F, RU, F, RU, RI, RU]
    assert t.compress_ratios[2] == 2 and t.compress_ratios[4] == 1 and t.candidate_source_layer_id == 4
    assert consumes_candidates(t, 6)
    assert [t.compress_ratios[i] for i in t.engram_layer_ids] == [0, 2]  # window-only and ratio-2
    assert t.hc_mult == 4
    assert (t.vocab_size, t.engram_compressed_vocab_size, data["image_token_id"]) == (129280, 99092, 129264)
    # Primes >= 61 handed out in order, 6 per layer (Appendix B): 61+67+71+73+79+83, 89+...+109.
    assert list(t.engram_num_embeddings) == [434, 606]
    # YaRN is active: with rotary dim 16 the ramp spans more than one pair (MODEL.md §4.2 formula).
    rs, dim = t.rope_scaling, t.qk_rope_head_dim
    orig, log_base = rs.original_max_position_embeddings, 2 * math.log(t.compress_rope_theta)
    lo = max(0, math.floor(dim * math.log(orig / (rs.beta_fast * 2 * math.pi)) / log_base))
    hi = min(dim - 1, math.ceil(dim * math.log(orig / (rs.beta_slow * 2 * math.pi)) / log_base))
    assert (lo, hi) == (0, 3) and rs.factor > 1
    assert t.max_position_embeddings == rs.factor * rs.original_max_position_embeddings


def test_real_tokenizer_is_shipped(tiny_dir):
    root = tiny_dir()
    assert hashlib.sha256((root / "tokenizer.json").read_bytes()).hexdigest() == TOKENIZER_SHA256
    assert (root / "tokenizer_config.json").is_file()


def test_same_seed_gives_identical_files_and_another_seed_does_not(tiny_dir, tmp_path):
    start = time.perf_counter()
    again = write_tiny(tmp_path / "again", "base", "fp8", seed=0)
    assert time.perf_counter() - start < 20
    assert file_hashes(again) == file_hashes(tiny_dir("base", "fp8"))
    other = write_tiny(tmp_path / "other", "base", "fp8", seed=1)
    a, b = file_hashes(again), file_hashes(other)
    assert a["config.json"] == b["config.json"]
    assert all(a[f] != b[f] for f in a if f.endswith(".safetensors"))


def test_nvfp4_variant_is_the_base_model_requantised(tiny_dir):
    base, nv = Checkpoint.open(tiny_dir("base", "fp8")), Checkpoint.open(tiny_dir("nvfp4", "fp8"))
    for name, spec in base.manifest.by_name.items():
        if spec.format != "mxfp4" or name.startswith("mtp."):
            assert torch.equal(base.tensor(name).view(torch.uint8), nv.tensor(name).view(torch.uint8)), name
    w_mx = base.dense("layers.6.ffn.experts.2.w3", torch.float32)
    w_nv = nv.dense("layers.6.ffn.experts.2.w3", torch.float32)
    assert (w_nv - w_mx).norm() < 0.1 * w_mx.norm()


def test_4bit_engram_tables_are_the_fp8_tables_reencoded_with_least_squares_scales(tiny_dir):
    fp8, mx = Checkpoint.open(tiny_dir("base", "fp8")), Checkpoint.open(tiny_dir("base", "mxfp4"))
    nv = Checkpoint.open(tiny_dir("base", "nvfp4"))
    for layer in (1, 2):
        prefix = f"layers.{layer}.engram.embed"
        values, fp8_scales = fp8.tensor(f"{prefix}.weight"), fp8.tensor(f"{prefix}.scale")
        codes, scales = formats.fp8_rows_to_mxfp4(values, fp8_scales, scale_rule="mse")
        assert torch.equal(mx.tensor(f"{prefix}.weight"), codes)
        assert torch.equal(mx.tensor(f"{prefix}.scale").view(torch.uint8), scales.view(torch.uint8))
        ws2 = nv.tensor(f"{prefix}.weight_scale_2")
        assert ws2.item() == formats.fp8_rows_global_scale(fp8_scales).item()  # from the whole table
        codes, scales, _ = formats.fp8_rows_to_nvfp4(values, fp8_scales, scale_rule="mse")
        assert torch.equal(nv.tensor(f"{prefix}.weight"), codes)
        assert torch.equal(nv.tensor(f"{prefix}.weight_scale").view(torch.uint8), scales.view(torch.uint8))


def test_weights_keep_unit_scale_through_linears(tiny_dir):
    ckpt = Checkpoint.open(tiny_dir())
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(0))
    for prefix in ("layers.0.attn.wq_a", "layers.4.attn.wkv", "layers.2.ffn.shared_experts.w1",
                   "layers.2.ffn.experts.1.w1", "layers.1.ffn.gate"):  # fmt: skip
        y = x @ ckpt.dense(prefix, torch.float32).T
        assert 0.6 < y.std().item() < 1.5, prefix
    logits = x @ ckpt.dense("head", torch.float32).T
    assert 1.5 < logits.std().item() < 2.5
    assert logits.argmax(-1).unique().numel() > 200  # different inputs -> different greedy tokens
    for name, spec in ckpt.manifest.by_name.items():
        if spec.role in ("param", "weight"):
            assert torch.isfinite(ckpt.tensor(name).float()).all(), name


def test_overrides_change_text_config_fields_and_the_engram_rows_follow(tmp_path):
    """A bigger tiny model (the trainer's): the fields replaced, the Engram tables re-laid out
    from the new engram_vocab_size (sums of the next primes >= 101), every tensor valid."""
    overrides = {"hidden_size": 96, "index_topk": 16, "engram_vocab_size": 101}
    root = write_tiny(tmp_path / "big", overrides=overrides)
    t = V41Config.from_file(root).text
    assert (t.hidden_size, t.index_topk, t.engram_vocab_size) == (96, 16, 101)
    # layer 1: 101 103 107 109 113 127; layer 2: 131 137 139 149 151 157 (3 n-gram sizes x 2 heads)
    assert t.engram_num_embeddings == (660, 864)
    assert inspect_checkpoint(root)["valid"]
    wo_b = Checkpoint.open(root).stored["layers.0.attn.wo_b.weight"]
    assert wo_b.shape == (96, 64)  # [D, groups * o_lora_rank]


def test_overrides_name_an_unknown_or_inconsistent_field():
    with pytest.raises(Ds41Error, match="hidden_sz"):
        tiny_config(overrides={"hidden_sz": 96})
    with pytest.raises(Ds41Error, match="sliding_window"):
        tiny_config(overrides={"sliding_window": 0})


def test_refuses_a_non_empty_output_directory(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(Ds41Error, match="not empty"):
        write_tiny(tmp_path)


@pytest.fixture(scope="module")
def token_map_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("token-map")


@pytest.mark.parametrize(("variant", "engram"), [("base", "fp8"), ("nvfp4", "mxfp4"), ("base", "nvfp4")])
def test_reference_model_decodes_finite_varied_tokens(tiny_dir, token_map_cache, variant, engram):
    weights = pytest.importorskip("sglang_ds41.reference.weights")
    from sglang_ds41.assets import v41_tokenizer

    model = weights.load_reference(tiny_dir(variant, engram), torch.float32, token_map_cache=token_map_cache)
    prompt = "<｜User｜>What is the weather in Paris? Call the tool.<｜Assistant｜></think>"
    ids = v41_tokenizer().encode(prompt, add_special_tokens=False).ids
    state = model.new_state()
    logits = model(torch.tensor(ids), state)
    generated = []
    for _ in range(24):
        assert torch.isfinite(logits).all()
        generated.append(int(logits[-1].argmax()))
        logits = model(torch.tensor(generated[-1:]), state)
    assert len(set(generated)) >= 16, generated  # greedy decoding does not lock onto a token
