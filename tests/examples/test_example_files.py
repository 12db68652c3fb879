"""examples/example.txt is exactly the rendered form of examples/example_harmony.json."""

from __future__ import annotations

import json
from pathlib import Path

from sglang_ds41.encoding import encode_prompt, render_request
from sglang_ds41.encoding.special_tokens import Special

from tests.encoding.oracle import wheel

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_rendering_the_harmony_json_gives_exactly_the_text_file() -> None:
    body = json.loads((EXAMPLES / "example_harmony.json").read_text(encoding="utf-8"))
    expected = (EXAMPLES / "example.txt").read_bytes()
    assert render_request(body).prompt.text.encode("utf-8") == expected
    # The official renderer agrees byte for byte, so the text file is not just our own output.
    assert wheel(body).prompt.encode("utf-8") == expected


def test_the_example_holds_two_image_placeholders_as_single_ids() -> None:
    body = json.loads((EXAMPLES / "example_harmony.json").read_text(encoding="utf-8"))
    ids = encode_prompt(render_request(body))
    assert ids.count(Special.IMAGE.id) == 2
    # 39 text ids + 2 placeholders: the count independently reported for this conversation.
    assert len(ids) == 41


def test_every_example_request_renders_like_the_official_renderer() -> None:
    for path in [*sorted(EXAMPLES.glob("*request*.json")), EXAMPLES / "example_harmony.json"]:
        body = json.loads(path.read_text(encoding="utf-8"))
        expected = wheel(body)
        assert not expected.rejected, f"{path.name}: {expected.error}"
        assert render_request(body).prompt.text == expected.prompt, path.name
