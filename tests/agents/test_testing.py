"""The scripted test server records its own handling time, so benchmarks can subtract it."""

from __future__ import annotations

import time

import openai
from sglang_ds41.agents.testing import Reply


def test_each_request_is_timed_with_its_cpu_time_separate_from_waiting(serve):
    server = serve([Reply(content="a", delay_s=0.2), Reply(content="b")], validate=False)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    before = time.perf_counter()
    for _ in range(2):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    after = time.perf_counter()
    slow, fast = server.wait_for_timings(2)
    assert slow.path.endswith("/chat/completions") and fast.path.endswith("/chat/completions")
    # `end` is taken after the last byte went out, so it may fall just after the client's `after`
    assert before <= slow.start < slow.end and slow.start < fast.start < fast.end
    assert fast.start <= after
    assert slow.wall_s >= 0.2  # the scripted delay is handling time ...
    assert slow.cpu_s < 0.1  # ... but sleeping is not CPU work
    assert 0 <= fast.cpu_s <= fast.wall_s + 0.01
