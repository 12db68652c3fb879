"""Interleaved images through the reference model (issue 8): a rendered two-image chat request
gives the same logits one-shot, chunked with boundaries inside both image spans, and with decode
steps after it."""

from __future__ import annotations

import base64
import itertools

import numpy as np
import pytest
import torch
from PIL import Image
from sglang_ds41.encoding import encode_prompt, render_request

from sglang_ds41.vision.expand import build_image_prompt
from sglang_ds41.vision.grid import GridSpec
from sglang_ds41.vision.preprocess import preprocess_image
from sglang_ds41.vision.weights import load_vision_tower

from .conftest import encode

reference = pytest.importorskip("sglang_ds41.reference.weights")

TOL = 1e-10  # float64: chunking and decode change rounding only


def data_url(picture: Image.Image) -> str:
    return "data:image/png;base64," + base64.b64encode(encode(picture)).decode()


def pictures(seed: int) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in ((12, 12), (20, 10))]


def request(images: list[Image.Image]) -> dict:
    return {
        "model": "DeepSeek-V4.1-Flash",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "First picture:"},
                    {"type": "image_url", "image_url": {"url": data_url(images[0])}},
                    {"type": "text", "text": "and the second:"},
                    {"type": "image_url", "image_url": {"url": data_url(images[1])}},
                    {"type": "text", "text": "What differs?"},
                ],
            }
        ],
    }


@pytest.fixture(scope="module")
def models(tiny_dir, tmp_path_factory):
    cache = tmp_path_factory.mktemp("token-map")
    model = reference.load_reference(tiny_dir, torch.float64, token_map_cache=cache)
    return model, load_vision_tower(tiny_dir, torch.float64)


def prompt_for(images, model, tower):
    rendered = render_request(request(images))
    ids = encode_prompt(rendered)
    spec = GridSpec.from_config(model.config.vision)
    pre = [preprocess_image(s.url, spec, s.detail, torch.float64) for s in rendered.prompt.image_sources]
    return build_image_prompt(ids, pre, tower, model.image_token_id)


def feed(model, prompt, cuts: list[int]) -> torch.Tensor:
    state, out, used = model.new_state(), [], 0
    bounds = [0, *cuts, prompt.input_ids.numel()]
    for lo, hi in itertools.pairwise(bounds):
        n = int(prompt.is_image[lo:hi].sum())
        embeds = prompt.image_embeds[used : used + n] if n else None
        out.append(model(prompt.input_ids[lo:hi], state, embeds))
        used += n
    return torch.cat(out)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_two_images_one_shot_chunked_and_decode_agree(models):
    model, tower = models
    prompt = prompt_for(pictures(0), model, tower)
    (s1, n1), (s2, n2) = prompt.spans
    assert (n1, n2) == (8, 12)
    oneshot = feed(model, prompt, [])
    # Boundaries inside each span, one of them at an odd position (ratio-2 pending token).
    chunked = feed(model, prompt, [s1 + 3, s2 + 5, s2 + n2 + 1])
    assert rel(chunked, oneshot) < TOL

    # Greedy decode after the prompt == one shot over prompt + decoded tokens.
    state = model.new_state()
    logits = model(prompt.input_ids, state, prompt.image_embeds)[-1]
    tokens, rows = [], [logits]
    for _ in range(4):
        row = rows[-1].clone()
        row[model.image_token_id] = float("-inf")
        tokens.append(int(row.argmax()))
        rows.append(model(torch.tensor(tokens[-1:]), state)[-1])
    ids = torch.cat([prompt.input_ids, torch.tensor(tokens)])
    full = model(ids, model.new_state(), prompt.image_embeds)
    assert rel(torch.stack(rows), full[prompt.input_ids.numel() - 1 :]) < TOL


def test_the_pictures_reach_the_logits(models):
    model, tower = models
    a, b = prompt_for(pictures(0), model, tower), prompt_for(pictures(1), model, tower)
    assert torch.equal(a.input_ids, b.input_ids)  # same sizes -> same ids
    la, lb = feed(model, a, []), feed(model, b, [])
    first = a.spans[0][0]
    # causal: text before the images is untouched. To rounding only, not bit for bit: the MoE
    # multiplies each expert's routed rows as one matrix, and BLAS rounds a row differently with
    # the number of rows in the call (1, 2-3 or 4+ here), which the images' routing changes.
    assert rel(la[:first], lb[:first]) < TOL
    assert rel(la[-1], lb[-1]) > 1e-3
