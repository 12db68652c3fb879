"""Images in the backend forward outside a server (`backend/images.py` and the model's hooks).

Oracle: the reference model (float64) fed the expanded prompt and the float64 vision tower's
span embeddings. The backend gets the spans through its SGLang hook `get_image_feature` (items
shaped like SGLang's processor output) and the prompt ids as the scheduler pads them (hash
values above the vocabulary), in chunks whose boundaries fall inside both image spans; it must
give the reference's logits, so the image rows must reach Engram (DEAD) and the router
(`bias_vl`) as image positions.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from PIL import Image

from sglang_ds41.backend import images
from sglang_ds41.backend.model import DeepseekV41ForCausalLM
from sglang_ds41.reference.weights import load_reference
from sglang_ds41.vision import GridSpec, build_image_prompt, load_vision_tower, preprocess_image
from tests.backend._slots import Slots
from tests.backend.test_model import close

MM_PAD_SHIFT = 1_000_000  # SGLang 0.5.23's first image pad value (schedule_batch.MM_PAD_SHIFT_VALUE)


@pytest.fixture(scope="module")
def prompt(ckpt):
    """Text, a 12x12 picture (8 positions), text, a 20x10 picture (12 positions), text."""
    reference = load_reference(ckpt, torch.float64)
    rng = np.random.default_rng(0)
    spec = GridSpec.from_config(reference.config.vision)
    sizes = ((12, 12), (20, 10))
    pictures = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
    pre = [preprocess_image(p, spec) for p in pictures]  # bf16 patches, like SGLang's processor
    image = reference.image_token_id
    ids = [0, 3, 17, image, 9, 1200, 77, image, 5, 8, 300]
    built = build_image_prompt(ids, pre, load_vision_tower(ckpt, torch.float64), image)
    logits = reference(built.input_ids, reference.new_state(), built.image_embeds)
    return built, pre, logits


def item(pre, start: int) -> types.SimpleNamespace:
    """One image as SGLang's processor hands it to the model (patches, grid, inclusive offsets)."""
    g, span = pre.grid, [(start, start + pre.token_count - 1)]
    return types.SimpleNamespace(feature=pre.patches, n_vit_h=g.n_vit_h, n_vit_w=g.n_vit_w, offsets=span)


def test_padded_chunks_with_tower_spans_equal_the_reference(ckpt, prompt):
    built, pre, expected = prompt
    backend = DeepseekV41ForCausalLM.for_checkpoint(ckpt, torch.float64, page_size=2)
    (s1, n1), (s2, n2) = built.spans
    spans = backend.get_image_feature([item(p, s) for p, (s, _) in zip(pre, built.spans, strict=True)])
    assert [s.shape[0] for s in spans] == [n1, n2] == [8, 12]
    rows = torch.cat(spans)
    padded = built.input_ids.clone()
    padded[built.is_image] = MM_PAD_SHIFT + torch.arange(n1 + n2)  # the scheduler's hash pads

    slots, start, used = Slots(backend.v41.text), 0, 0
    for end in (s1 + 3, s2 + 5, built.input_ids.numel()):  # odd boundaries inside both spans
        ids = images.vocab_ids(padded[start:end], backend.model.image_token_id)
        assert torch.equal(ids, built.input_ids[start:end])
        embeds = backend.model.embed(ids).clone()
        mask = ids == backend.model.image_token_id
        embeds[mask] = rows[used : used + int(mask.sum())]
        span = slots.extend(1, end - start)
        [logits] = backend.next_token_logits(
            ids, torch.arange(start, end), span.new_slots, [span], slots.store, embeds
        )
        assert close(logits, expected[end - 1])
        start, used = end, used + int(mask.sum())


def test_an_item_whose_grid_disagrees_with_its_span_is_refused(ckpt, prompt):
    _, pre, _ = prompt
    tower = load_vision_tower(ckpt, torch.float64)
    wrong = item(pre[0], 0)
    wrong.offsets = [(0, pre[0].token_count)]  # one position too many
    with pytest.raises(images.ImageInputError, match="8 span rows but the prompt holds 9"):
        images.image_spans(tower, [wrong], torch.device("cpu"))


def test_serve_asks_sglang_for_the_pil_preprocessing_that_matches_ours(tmp_path):
    """SGLang's PIL patchify (selected by `--image-processor-backend pil`) is ours bit for bit,
    here on the tiny grid's strong downscales, where its Rust resizer is not."""
    from sglang.srt.multimodal.deepseek_v41_image_processing import patchify_image

    from sglang_ds41.serve import launcher as serve

    (tmp_path / "config.json").write_text('{"architectures": ["DeepseekV41ForCausalLM"]}')
    argv = serve.build_launch(tmp_path, gpu=True).argv
    assert argv[argv.index("--image-processor-backend") + 1] == "pil"

    spec = GridSpec(patch_size=2, downsample_ratio=3, max_image_tokens=64, min_pixels=16, max_wh_ratio=None)
    args = types.SimpleNamespace(
        vision_patch_size=2,
        vision_downsample_ratio=3,
        vision_max_n_token=64,
        vision_min_pixels=16,
        vision_max_wh_ratio=None,
    )
    rng = np.random.default_rng(1)
    for w, h in ((250, 600), (3, 900), (33, 17)):
        picture = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        assert torch.equal(patchify_image(picture, args)[0], preprocess_image(picture, spec).patches), (w, h)
