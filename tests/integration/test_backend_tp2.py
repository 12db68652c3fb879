"""`--tp 2` on CPU (gloo) against the single-process reference, on a `convert-engram` output.

Its own module so its server starts alone: the other backend servers are gone by then (module
fixtures), which keeps the peak memory of the integration run and this server's start time down.
Dense weights are split per MODEL.md §13, Engram rows over the ranks; the ranks must still give
the reference's greedy tokens, through SGLang's sliding-window pool and its radix cache.
"""

from __future__ import annotations

import re

import pytest

from tests.integration.backend_served import PROMPTS, serve_tiny

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread_per_module")]


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    # two ranks load on two shared cores: allow for a busy box
    yield from serve_tiny(tmp_path_factory, "base", "mxfp4", ["--tp", "2"], tp=2, ready_s=900, converted=True)


def test_tp2_ranks_each_hold_half_of_every_engram_table(tp2):
    log = tp2.server.log_path.read_text(errors="replace")
    for layer, rows in ((1, 434), (2, 606)):  # tiny engram_num_embeddings
        held = set(
            re.findall(rf"Engram layer {layer}: TP rank (\d)/2 holds rows (\d+):(\d+) of {rows} ", log)
        )
        assert {rank for rank, _, _ in held} == {"0", "1"}
        bounds = sorted((int(a), int(b)) for _, a, b in held)
        assert bounds[0][0] == 0 and bounds[0][1] == bounds[1][0] and bounds[1][1] == rows


def test_tp2_greedy_tokens_and_prefix_hits_equal_the_reference(tp2):
    first = PROMPTS[2]
    assert tp2.generate(first)["output_ids"] == tp2.expected(first)
    second = [*first[:33], 5, 6, 7]
    out = tp2.generate(second)  # the window at 33 is long gone: recomputed (or cut back) exactly
    assert out["meta_info"]["cached_tokens"] <= 32
    assert out["output_ids"] == tp2.expected(second)
    again = tp2.generate(second)  # where it ended, the window is whole: a full hit
    assert again["meta_info"]["cached_tokens"] >= len(second) - 2
    assert again["output_ids"] == tp2.expected(second)
