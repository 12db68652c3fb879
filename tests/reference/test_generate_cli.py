"""`sglang-ds41 generate` in a subprocess, on a tiny checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from sglang_ds41.encoding import encode_prompt, render_request

from sglang_ds41.assets import v41_tokenizer


@pytest.fixture(scope="module")
def cli(tiny_ckpt, token_map_cache):
    env = {**os.environ, "SGLANG_DS41_ENGRAM_CACHE": str(token_map_cache)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "sglang_ds41", "generate", str(tiny_ckpt()), *args],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip

    return run


def test_greedy_json_output_is_the_argmax_continuation(cli, load):
    done = cli("--prompt", "Hello world", "--max-new-tokens", "6", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    tokenizer = v41_tokenizer()
    assert out["prompt_token_ids"] == [0, *tokenizer.encode("Hello world", add_special_tokens=False).ids]
    assert len(out["token_ids"]) == 6
    assert out["text"] == tokenizer.decode(out["token_ids"], skip_special_tokens=False)
    # Oracle: a one-shot float64 forward over prompt + output predicts each output token.
    model = load()
    ids = out["prompt_token_ids"] + out["token_ids"]
    logits = model(torch.tensor(ids[:-1]), model.new_state())
    predicted = logits[len(out["prompt_token_ids"]) - 1 :].argmax(-1).tolist()
    assert predicted == out["token_ids"]


def test_chat_prompt_is_rendered_with_the_v41_format(cli):
    done = cli("--prompt", "What is 2+2?", "--chat", "--max-new-tokens", "2", "--json")
    assert done.returncode == 0, done.stderr
    request = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "What is 2+2?"}]}
    assert json.loads(done.stdout)["prompt_token_ids"] == encode_prompt(render_request(request))


def test_selftest_passes_on_a_tiny_checkpoint(cli):
    done = cli("--selftest", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["decode_steps"] == 22 and report["problems"] == []
    assert report["decode_max_rel_diff"] <= report["tolerance"]


def test_missing_prompt_is_a_clear_error(cli):
    done = cli("--max-new-tokens", "2")
    assert done.returncode == 2
    assert "--prompt is required" in done.stderr


@pytest.mark.parametrize("flag", ["--tiny", "--tiny-random"])
def test_tiny_flags_generate_with_their_own_checkpoints(flag, token_map_cache):
    """`--tiny` is the trained model, `--tiny-random` make-tiny's: each one's greedy tokens are
    that checkpoint's reference continuation (the other's would differ)."""
    from sglang_ds41.cache import tiny_checkpoint, trained_tiny_checkpoint
    from sglang_ds41.reference.generate import generate
    from sglang_ds41.reference.weights import load_reference

    env = {**os.environ, "SGLANG_DS41_ENGRAM_CACHE": str(token_map_cache)}
    args = [flag, "--prompt", "Hi", "--json", "--max-new-tokens", "4"]
    argv = [sys.executable, "-m", "sglang_ds41", "generate", *args]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    mine, other = (trained_tiny_checkpoint(), tiny_checkpoint())[:: 1 if flag == "--tiny" else -1]
    want = generate(load_reference(mine, torch.float32), out["prompt_token_ids"], 4)
    assert out["token_ids"] == want
    assert generate(load_reference(other, torch.float32), out["prompt_token_ids"], 4) != want
