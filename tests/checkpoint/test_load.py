"""The shared loader's lookups: one tokenizer path, one Engram layout per config."""

from __future__ import annotations

from pathlib import Path

from sglang_ds41.assets import TOKENIZER_JSON
from sglang_ds41.checkpoint.load import tokenizer_json
from sglang_ds41.config import V41Config
from sglang_ds41.engram.layout import EngramLayout

TINY = Path(__file__).parents[1] / "fixtures" / "tiny_config.json"


def test_the_checkpoints_own_tokenizer_wins_else_the_packaged_one(tmp_path):
    assert tokenizer_json(tmp_path) == TOKENIZER_JSON
    (tmp_path / "tokenizer.json").write_text("{}")
    assert tokenizer_json(tmp_path) == tmp_path / "tokenizer.json"


def test_the_engram_layout_is_computed_once_per_config():
    first, second = V41Config.from_file(TINY), V41Config.from_file(TINY)
    assert first is not second
    assert EngramLayout.from_config(first.text) is EngramLayout.from_config(second.text)
