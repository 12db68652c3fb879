"""The backend forward outside a server, with SGLang's slot bookkeeping played by `Slots`
(every checkpoint variant and Engram table format: FP8, MXFP4, NVFP4, U8 or I8 codes).

Oracle: the reference model (`reference.Transformer`, float64) on the same checkpoint, fed the
whole sequence per request. The backend must give the same logits however the sequence
reaches it: one shot, odd chunks, decode steps, a prefix shared through the radix cache
(slots of another request), or batched with other requests.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ds41.backend.kv_state import SlotState, SlotStateError
from sglang_ds41.backend.model import DeepseekV41ForCausalLM
from sglang_ds41.engram.gate import apply_engram
from sglang_ds41.engram.layer import EngramLayer
from sglang_ds41.fast import engram as fast_engram
from sglang_ds41.reference.generate import generate
from sglang_ds41.reference.weights import load_reference

from ._slots import Slots, run

TOL = 1e-9  # float64: relative to max |logit|
IMAGE_TOKEN = 129264
PROMPT = [0, 3, 17, 9, 1200, 77, 5, 5, 5, 8, 300, 41, 12, 6, 99, 1000, 4, 2, 19, 23, 64, 7]


@pytest.fixture(scope="module")
def reference(ckpt):
    return load_reference(ckpt, torch.float64)


@pytest.fixture(scope="module")
def backend(ckpt):
    return DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float64, page_size=2)


def ref_last(reference, ids: list[int]) -> torch.Tensor:
    return reference(torch.tensor(ids), reference.new_state())[-1]


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Backend logits `a` vs reference `b`; the backend masks the image token (never sampled)."""
    finite = torch.ones_like(a, dtype=torch.bool)
    finite[IMAGE_TOKEN] = False
    assert bool(torch.isfinite(a[finite]).all()) and a[IMAGE_TOKEN] == float("-inf")
    return bool((a[finite] - b[finite]).abs().max() <= TOL * b[finite].abs().max())


def test_one_shot_prefill_equals_the_reference(backend, reference):
    slots = Slots(backend.v41.text)
    [logits] = run(backend, slots, [(1, PROMPT)])
    assert close(logits, ref_last(reference, PROMPT))


def test_greedy_decode_equals_reference_generate(backend, reference):
    slots = Slots(backend.v41.text)
    expected = generate(reference, PROMPT, 18)
    tokens = [int(run(backend, slots, [(1, PROMPT)])[0].argmax())]
    while len(tokens) < 18:
        tokens.append(int(run(backend, slots, [(1, tokens[-1:])])[0].argmax()))
    assert tokens == expected
    assert len(set(tokens)) > 1


@pytest.mark.parametrize("chunks", [[5, 6, 11], [1, 2, 3, 16], [13, 9]])
def test_odd_chunk_boundaries_give_the_one_shot_logits(backend, reference, chunks):
    slots, start = Slots(backend.v41.text), 0
    for n in chunks:
        [logits] = run(backend, slots, [(2, PROMPT[start : start + n])])
        start += n
        assert close(logits, ref_last(reference, PROMPT[:start]))


@pytest.mark.parametrize(
    "shared", [10, 12, 14]
)  # page-aligned hits; the tail's 4-grams reach into the prefix
def test_a_prefix_hit_resumes_exactly(backend, reference, shared):
    slots = Slots(backend.v41.text)
    run(backend, slots, [(1, PROMPT)])
    tail = [501, 502, 7, 9, 11]
    slots.share(3, 1, shared)  # request 3 reuses request 1's first `shared` slots
    [logits] = run(backend, slots, [(3, tail)])
    assert close(logits, ref_last(reference, PROMPT[:shared] + tail))


def test_a_batch_of_different_lengths_equals_each_request_alone(backend, reference):
    slots = Slots(backend.v41.text)
    a, b, c = PROMPT, PROMPT[3:10], [42] * 3
    logits = run(backend, slots, [(1, a), (2, b), (4, c)])
    for row, ids in zip(logits, (a, b, c), strict=True):
        assert close(row, ref_last(reference, ids))
    # and a mixed step: two decodes and a new prefill together
    logits = run(backend, slots, [(1, [5]), (5, PROMPT[:7]), (2, [6])])
    for row, ids in zip(logits, ([*a, 5], PROMPT[:7], [*b, 6]), strict=True):
        assert close(row, ref_last(reference, ids))


def test_the_backend_gates_engram_in_the_compiled_loop_and_the_reference_with_the_oracle(
    backend, reference
):
    """The Engram layers share one class: the backend's take the fast gate, the reference's
    (the oracle, also the trainer's form) keep `apply_engram`."""
    ours = [m for m in backend.modules() if isinstance(m, EngramLayer)]
    theirs = [m for m in reference.modules() if isinstance(m, EngramLayer)]
    assert len(ours) == len(theirs) == len(backend.v41.text.engram_layer_ids) > 0
    assert all(m.apply_gate is fast_engram.apply_engram for m in ours)
    assert all(m.apply_gate is apply_engram for m in theirs)


def test_a_new_request_at_an_odd_prefix_is_refused(backend):
    slots = Slots(backend.v41.text, page=1)
    run(backend, slots, [(1, PROMPT)])
    slots.share(3, 1, 11)
    with pytest.raises(SlotStateError, match="even --page-size"):
        run(backend, slots, [(3, [5, 6])])


def test_an_odd_page_size_is_refused(ckpt):
    with pytest.raises(Exception, match="even page size"):
        DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float64, page_size=1)


@pytest.mark.parametrize(("variant", "engram"), [("base", "mxfp4"), ("base", "nvfp4"), ("nvfp4", "fp8")])
def test_the_other_checkpoint_variants_load_and_equal_their_reference(tiny_ckpt, variant, engram):
    ckpt = tiny_ckpt(variant, engram)
    backend = DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float64)
    slots = Slots(backend.v41.text)
    [logits] = run(backend, slots, [(1, PROMPT)])
    assert close(logits, ref_last(load_reference(ckpt, torch.float64), PROMPT))


def test_nvfp4_engram_tables_serve_the_reference_greedy_tokens(tiny_ckpt):
    ckpt = tiny_ckpt("base", "nvfp4")
    backend = DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float64, page_size=2)
    reference = load_reference(ckpt, torch.float64)
    expected = generate(reference, PROMPT, 12)
    slots = Slots(backend.v41.text)
    run(backend, slots, [(1, PROMPT[:9])])  # a chunked prefill: 9 + 13 tokens
    tokens = [int(run(backend, slots, [(1, PROMPT[9:])])[0].argmax())]
    while len(tokens) < 12:
        tokens.append(int(run(backend, slots, [(1, tokens[-1:])])[0].argmax()))
    assert tokens == expected
    fp8 = load_reference(tiny_ckpt("base", "fp8"), torch.float64)  # the same model, FP8 tables
    assert not torch.equal(ref_last(reference, PROMPT), ref_last(fp8, PROMPT))


def _with_int8_codes(src, dst):
    """The checkpoint with its 4-bit Engram codes stored as I8 (same bytes), as the third-party
    MXFP4-Engram release does; every other file linked unchanged."""
    import json
    import os

    from safetensors.torch import load_file, save_file

    dst.mkdir()
    weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    codes = {n for n in weight_map if n.endswith("engram.embed.weight")}
    for f in src.iterdir():
        if f.name not in {weight_map[n] for n in codes}:
            os.symlink(f, dst / f.name)
    for file in {weight_map[n] for n in codes}:
        tensors = load_file(src / file)
        tensors.update({n: tensors[n].view(torch.int8) for n in codes if n in tensors})
        save_file(tensors, dst / file, metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("engram", ["mxfp4", "nvfp4"])
def test_int8_engram_codes_load_everywhere_as_the_same_bytes(tiny_ckpt, tmp_path, engram):
    from safetensors import safe_open

    from sglang_ds41.checkpoint.inspect import inspect_checkpoint

    u8 = tiny_ckpt("base", engram)
    i8 = _with_int8_codes(u8, tmp_path / "i8")
    with safe_open(i8 / "model-00002-of-00006.safetensors", "pt") as f:
        assert f.get_slice("layers.1.engram.embed.weight").get_dtype() == "I8"
    assert inspect_checkpoint(i8)["engram_format"] == engram
    reference = load_reference(i8, torch.float64)
    assert torch.equal(ref_last(reference, PROMPT), ref_last(load_reference(u8, torch.float64), PROMPT))
    backend = DeepseekV41ForCausalLM.for_checkpoint(i8, torch.float64)
    [logits] = run(backend, Slots(backend.v41.text), [(1, PROMPT)])
    assert close(logits, ref_last(reference, PROMPT))


def test_float32_serving_stays_within_float_noise_of_the_float32_reference(ckpt):
    backend = DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float32)
    slots = Slots(backend.v41.text)
    slots.store = SlotState(backend.v41.text, 1024, 8, torch.float32)
    [logits] = run(backend, slots, [(1, PROMPT)])
    expected = ref_last(load_reference(ckpt, torch.float32), PROMPT)
    keep = torch.arange(logits.numel()) != IMAGE_TOKEN
    assert float((logits[keep] - expected[keep]).abs().max() / expected.abs().max()) < 1e-5


@pytest.mark.parametrize("pool_dtype", [None, torch.float64, torch.bfloat16])
def test_a_window_pool_smaller_than_the_context_with_eviction_equals_the_reference(
    backend, reference, pool_dtype
):
    """SGLang's hybrid sliding-window pool: window KV in SWA slots, positions older than the
    window freed after every step and their slots reused by later tokens; the rows in buffers
    of our own, or in SGLang-shaped K buffers (padded rows: 84 -> 88 B in float64)."""
    w = backend.v41.text.sliding_window
    slots = Slots(backend.v41.text, window_rows=len(PROMPT) + w + 1, pool_dtype=pool_dtype)
    expected = generate(reference, PROMPT, 24)
    logits = run(backend, slots, [(1, PROMPT)])
    tokens = [int(logits[0].argmax())]
    while len(tokens) < 24:
        slots.evict_window(1, slots.length[1] - (w - 1))  # what the next token no longer reads
        tokens.append(int(run(backend, slots, [(1, tokens[-1:])])[0].argmax()))
    assert tokens == expected
    assert len(PROMPT) + len(tokens) > slots.store.window_rows  # SWA slots were reused


def test_reading_an_evicted_window_position_is_refused_by_name(backend):
    w = backend.v41.text.sliding_window
    slots = Slots(backend.v41.text, window_rows=64)
    run(backend, slots, [(1, PROMPT)])
    slots.evict_window(1, len(PROMPT) - (w - 2))  # one position too many
    with pytest.raises(SlotStateError, match=rf"window KV of positions \[{len(PROMPT) - (w - 1)}\]"):
        run(backend, slots, [(1, [5])])


def test_window_rows_are_translated_once_per_request_and_forward(backend, reference):
    """SGLang's full -> SWA slot translation (a gather and a check, a device sync on a GPU) is
    done once per request of a forward, not once per layer and read/write."""
    slots = Slots(backend.v41.text, window_rows=256)
    calls = []
    translate = slots.store.window_slots
    slots.store.window_slots = lambda full: calls.append(full.numel()) or translate(full)
    [a, b] = run(backend, slots, [(1, PROMPT[:9]), (2, PROMPT[:13])])
    assert close(a, ref_last(reference, PROMPT[:9]))
    assert len(calls) == 2
    [c] = run(backend, slots, [(1, PROMPT[9:])])
    assert len(calls) == 3
    assert close(c, ref_last(reference, PROMPT)) and close(b, ref_last(reference, PROMPT[:13]))
