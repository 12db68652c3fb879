"""What a forward reads back from the packed pool (`kv_state.SlotView`): the latents of the
entries attention picked only, so a decode step decodes O(top-k) latents per layer, not
O(context); the index keys of every visible entry (the indexer scores them all, MODEL.md §4.5)
come from their copy decoded at commit (`SlotState.index_keys`), which must equal the bytes."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from sglang_ds41.backend.kv_state import Span
from sglang_ds41.backend.model import DeepseekV41ForCausalLM

from ._slots import Slots, run

PROMPT = list(range(100, 140))  # 40 tokens


@pytest.fixture(scope="module")
def backend(ckpt):
    return DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float64)


def reads_of_one_step(backend, slots: Slots, parts) -> Counter:
    """Rows decoded per (KV source, part) in one forward (the real reads, counted)."""
    counted, read = Counter(), slots.store._read

    def counting(source: int, part: str, groups: torch.Tensor) -> torch.Tensor:
        counted[source, part] += groups.numel()
        return read(source, part, groups)

    slots.store._read = counting
    try:
        run(backend, slots, parts)
    finally:
        slots.store._read = read
    return counted


def test_a_decode_step_decodes_the_picked_latents_only(backend):
    text = backend.v41.text  # tiny: sources 2 (ratio 2; layers 2, 3) and 4 (ratio 1; layers 4..7)
    slots = Slots(text)
    run(backend, slots, [(1, PROMPT)])
    reads = reads_of_one_step(backend, slots, [(1, [7])])  # position 40: 20 and 41 entries
    assert reads[2, "index"] == reads[4, "index"] == 0  # decoded when committed
    k = text.index_topk
    assert 0 < reads[2, "latent"] <= 2 * k and 0 < reads[4, "latent"] <= 4 * k


def test_a_batch_of_decode_steps_reads_each_requests_picks(backend):
    text = backend.v41.text
    slots = Slots(text)
    run(backend, slots, [(1, PROMPT), (2, PROMPT[:21]), (3, PROMPT[:6])])
    reads = reads_of_one_step(backend, slots, [(1, [7]), (2, [8]), (3, [9])])
    assert reads[4, "index"] == reads[2, "index"] == 0
    assert 0 < reads[4, "latent"] <= 4 * 3 * text.index_topk


def test_a_prefill_decodes_each_source_s_latents_once(backend):
    """Its tokens pick (nearly) every entry: the layers of a KV source read all its latents, once."""
    slots = Slots(backend.v41.text)
    prompt = PROMPT + PROMPT[:4]  # 44 tokens: 22 entries of source 2 (ratio 2), 44 of source 4 (ratio 1)
    reads = reads_of_one_step(backend, slots, [(1, prompt)])
    assert reads[2, "latent"] == 22 and reads[4, "latent"] == 44


def test_the_decoded_index_keys_equal_the_stored_bytes_after_shared_and_reused_slots(backend):
    """Prefill, decode, a request over the first one's prefix slots (a radix hit), then a request
    in the second one's slots again (freed and handed out anew): every group's decoded key is
    what its bytes decode to."""
    slots = Slots(backend.v41.text)
    run(backend, slots, [(1, PROMPT), (2, PROMPT[:9])])
    run(backend, slots, [(1, [7]), (2, [8])])
    slots.share(3, 1, 30)
    run(backend, slots, [(3, [5, 6, 7])])
    reused = slots.req_to_token[2, :10].clone()
    span = Span(4, 0, 10, 0, reused)
    backend.next_token_logits(torch.tensor(PROMPT[20:30]), torch.arange(10), reused, [span], slots.store)
    store, committed = slots.store, 0
    for source, ratio in store.ratio.items():
        groups = torch.arange(store.rows // ratio)
        decoded = store.index_codec.decode(store._read(source, "index", groups), store.dtype)
        assert torch.equal(store.index_keys[source][: len(groups)], decoded), source
        committed += int((decoded != 0).any(-1).sum())
    assert committed > 60  # the forwards above committed entries of both sources


def test_the_bytes_a_forward_packs_hold_what_the_store_would_encode(backend, monkeypatch):
    """The fast quantisers hand the store the bytes they packed with the fake-quantised rows
    (no second encoding at commit). They are the quantisation of the rows themselves, which can
    differ in bytes from re-encoding the fake-quantised rows (a block's scale one step apart,
    its codes shifted to match), not in what they hold: every pool decodes to the same rows as
    if the store had encoded them itself, through a prefill and a decode step."""
    from sglang_ds41.backend import kv_state

    def filled(slots: Slots) -> Slots:
        run(backend, slots, [(1, PROMPT), (2, PROMPT[:7])])
        run(backend, slots, [(1, [7]), (2, [8])])
        return slots

    def decoded(store: kv_state.SlotState) -> list[torch.Tensor]:
        rows = [store.window_codec.decode(w, torch.float64) for w in store.window]
        for source, ratio in store.ratio.items():
            groups = torch.arange(store.rows // ratio)
            for part, codec in (("latent", store.latent_codec), ("index", store.index_codec)):
                rows.append(codec.decode(store._read(source, part, groups), torch.float64))
        return rows

    encodes, encode = Counter(), kv_state.RowCodec.encode

    def counted(codec, rows: torch.Tensor) -> torch.Tensor:
        encodes[codec.name] += 1
        return encode(codec, rows)

    monkeypatch.setattr(kv_state.RowCodec, "encode", counted)
    carried = decoded(filled(Slots(backend.v41.text)).store)
    assert not encodes  # every row's bytes came from the forward
    monkeypatch.setattr(kv_state, "_bytes", lambda made, codec, rows: codec.encode(rows))
    encoded = decoded(filled(Slots(backend.v41.text)).store)
    assert set(encodes) == {"window KV", "latent", "index key"}
    assert all(torch.equal(a, b) for a, b in zip(carried, encoded, strict=True))
    assert any(bool((a != 0).any()) for a in carried)
