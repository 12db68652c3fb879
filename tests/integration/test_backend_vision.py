"""Interleaved images through the real V4.1 backend served by `sglang-ds41 serve` (issue 8).

Oracle: the reference model (float64) fed the official renderer's prompt, each image
placeholder expanded to the image's span (`vision.build_image_prompt`) with the span embeddings
of the float64 vision tower; the server computes in float64 too, so greedy tokens must agree
token for token. The server prefills in chunks of 16 tokens, so chunk boundaries fall inside
both image spans of the two-image prompt (positions 16 and 32; spans 4..17 and 21..34).

Prefix caching: SGLang pads each image span with values derived from a hash of the image data,
so a second request with the same images hits the cache through both spans, and one with the
same sizes but other pixels does not get past the first image.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import torch
from sglang_ds41.encoding import encode_prompt, render_request

from sglang_ds41.assets import v41_tokenizer
from sglang_ds41.checkpoint.tiny import write_tiny
from sglang_ds41.reference.generate import generate
from sglang_ds41.reference.weights import load_reference
from sglang_ds41.vision import GridSpec, ImagePrompt, build_image_prompt, load_vision_tower, preprocess_image
from tests.integration.backend_served import post_generate, server_env
from tests.integration.conftest import _STATS
from tests.integration.server import running_server

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread_per_module")]

STEPS = 8
CHUNK = 16
EXAMPLES = Path(__file__).parents[2] / "examples"
# Tiny vision grid (patch 2, 3x3 cells): a 16x16 picture is 8x8 patches -> 3x3 cells ->
# 3 * (3 + 1) + 2 = 14 span positions.
SPAN_16PX = 14


def data_url(name: str) -> str:
    return "data:image/png;base64," + base64.b64encode((EXAMPLES / "images" / name).read_bytes()).decode()


CARROTS, CORN = data_url("carrots.png"), data_url("corn.png")


def chat(first: str, second: str, question: str = "What differs?") -> dict:
    """A request with two interleaved images, thinking off (DeepSeek API form)."""
    content = [
        {"type": "text", "text": "First:"},
        {"type": "image_url", "image_url": {"url": first}},
        {"type": "text", "text": "second:"},
        {"type": "image_url", "image_url": {"url": second}},
        {"type": "text", "text": question},
    ]
    return {
        "model": "DeepSeek-V4.1-Flash",
        "messages": [{"role": "user", "content": content}],
        "thinking": {"type": "disabled"},
    }


class Served:
    """The server plus the float64 reference model and vision tower of its checkpoint."""

    def __init__(self, server, model_dir: Path):
        self.server, self.model_dir = server, model_dir
        self.reference = load_reference(model_dir, torch.float64)
        self.tower = load_vision_tower(model_dir, torch.float64)
        self.client = openai.OpenAI(base_url=server.openai_url, api_key="unused", timeout=300, max_retries=0)

    def generate(self, ids: list[int], images: list[str]) -> dict:
        return post_generate(self.server, ids, STEPS, images)

    def prompt(self, request: dict) -> tuple[list[int], list[str], ImagePrompt]:
        """Prompt ids with one placeholder per image, the image URLs, the expanded prompt."""
        rendered = render_request(request)
        ids = encode_prompt(rendered)
        urls = [s.url for s in rendered.prompt.image_sources]
        spec = GridSpec.from_config(self.reference.config.vision)
        images = [preprocess_image(url, spec) for url in urls]  # bf16 patches, as the server's
        return ids, urls, build_image_prompt(ids, images, self.tower, self.reference.image_token_id)

    def expected(self, prompt: ImagePrompt) -> list[int]:
        return generate(self.reference, prompt.input_ids.tolist(), STEPS, image_embeds=prompt.image_embeds)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("backend-vision")
    model_dir = write_tiny(root / "checkpoint", "base", "fp8", seed=0)
    env = server_env()
    args = ["--chunked-prefill-size", str(CHUNK)]
    # A generous start-up limit: the shared CI box is often busy with other servers.
    log = root / "server.log"
    with running_server(model_dir, args, log_path=log, env=env, ready_timeout_s=600) as server:
        yield Served(server, model_dir)
    _STATS.append(
        f"V4.1 backend with images: ready after {server.ready_s:.1f} s, peak RSS of its process "
        f"tree {server.peak_rss_gib:.2f} GiB, log {server.log_path}"
    )
    assert server.stopped_cleanly, f"serve did not stop cleanly; log {server.log_path}"


def test_chat_with_two_images_returns_the_reference_greedy_tokens(served):
    from tests.encoding.oracle import wheel

    request = chat(CARROTS, CORN)
    ids, urls, prompt = served.prompt(request)
    expected = served.expected(prompt)
    assert ids == list(wheel(request).ids)  # the official renderer's ids
    (s1, n1), (s2, n2) = prompt.spans
    assert n1 == n2 == SPAN_16PX
    assert s1 < CHUNK < s1 + n1 and s2 < 2 * CHUNK < s2 + n2  # chunk boundaries inside both

    reply = served.client.chat.completions.create(
        model="default",
        messages=request["messages"],
        max_tokens=STEPS,
        temperature=0,
        extra_body={"chat_template_kwargs": {"thinking": False}, "ignore_eos": True},
    )
    assert reply.usage.prompt_tokens == prompt.input_ids.numel() == len(ids) - 2 + 2 * SPAN_16PX
    assert reply.choices[0].message.content == v41_tokenizer().decode(expected, skip_special_tokens=True)

    out = served.generate(ids, urls)
    assert out["meta_info"]["prompt_tokens"] == prompt.input_ids.numel()
    assert out["output_ids"] == expected
    assert len(set(expected)) > 1


def test_the_same_images_hit_the_prefix_cache_and_stay_exact(served):
    ids, urls, _ = served.prompt(chat(CARROTS, CORN, "Which is orange?"))
    served.generate(ids, urls)
    ids, urls, prompt = served.prompt(chat(CARROTS, CORN, "Which is yellow?"))
    out = served.generate(ids, urls)
    s2, n2 = prompt.spans[1]
    assert out["meta_info"]["cached_tokens"] >= s2 + n2  # through both image spans
    assert out["output_ids"] == served.expected(prompt)


def test_the_cache_keys_image_spans_by_their_pixels(served):
    ids, urls, straight = served.prompt(chat(CARROTS, CORN, "Which is green?"))
    first = served.generate(ids, urls)["output_ids"]
    ids, urls, swapped = served.prompt(chat(CORN, CARROTS, "Which is green?"))
    assert torch.equal(swapped.input_ids, straight.input_ids)  # same ids, other pixels in the spans
    out = served.generate(ids, urls)
    assert out["meta_info"]["cached_tokens"] <= swapped.spans[0][0]
    assert out["output_ids"] == served.expected(swapped) != first


def test_the_two_image_example_runs_against_the_server(served):
    run = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "vision_tiny_server.py"),
            "--base-url",
            served.server.openai_url,
            "--model-dir",
            str(served.model_dir),
            "--dtype",
            "float64",
            "--steps",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "server == reference, token for token: True" in run.stdout
