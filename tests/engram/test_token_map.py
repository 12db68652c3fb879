"""The compressed token map: the real V4.1 count, the normalisation rules, the cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sglang_ds41.assets import TOKENIZER_JSON, sha256_of, v41_tokenizer
from sglang_ds41.engram.token_map import TokenMapError, cache_path, load_token_map


@pytest.fixture(scope="session")
def real_map(engram_cache_dir: Path) -> np.ndarray:
    return load_token_map(TOKENIZER_JSON, expected_size=99_092, cache_dir=engram_cache_dir)


def test_real_tokenizer_gives_99092_compressed_ids(real_map: np.ndarray) -> None:
    assert real_map.shape == (129_280,)
    assert len(np.unique(real_map)) == 99_092
    assert int(real_map.max()) == 99_091


def test_ids_are_assigned_in_order_of_first_appearance(real_map: np.ndarray) -> None:
    first_seen = np.maximum.accumulate(real_map)
    # Each new id is exactly one more than every id seen before it.
    new = np.concatenate([[True], real_map[1:] > first_seen[:-1]])
    assert np.array_equal(real_map[new], np.arange(99_092))


def test_case_and_leading_space_variants_share_an_id(real_map: np.ndarray) -> None:
    tok = v41_tokenizer()
    ids = [tok.token_to_id(s) for s in ("hello", "Hello", "Ġhello", "ĠHello")]
    assert None not in ids
    assert len({int(real_map[i]) for i in ids}) == 1


def test_count_mismatch_is_refused_with_both_numbers(real_map: np.ndarray, tmp_path: Path) -> None:
    # Reuse the session's cache file so this test costs nothing.
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    np.save(cache_path(cache_dir, sha256_of(TOKENIZER_JSON)), real_map)
    with pytest.raises(TokenMapError, match=r"99092 .*engram_compressed_vocab_size is 99000"):
        load_token_map(TOKENIZER_JSON, expected_size=99_000, cache_dir=cache_dir)


def _word_level_tokenizer(path: Path, vocab: list[str]) -> Path:
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(vocab)}, "unk_token": vocab[0]},
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_normalisation_rules_by_hand(tmp_path: Path) -> None:
    vocab = [
        "Hello",  # 0 -> "hello"
        " hello",  # strip -> "hello"
        "HELLO\t",  # lowercase + strip -> "hello"
        "Café",  # NFD + strip accents -> "cafe"
        "cafe",
        "ﬁne",  # NFKC ligature -> "fine"
        "fine",
        " ",  # a lone space survives Strip() as " "
        "\t\n",  # whitespace run -> " " -> same key
        "  x  y",  # runs collapse, then strip -> "x y"
        "x y",
    ]
    tokenizer_json = _word_level_tokenizer(tmp_path / "tokenizer.json", vocab)
    token_map = load_token_map(tokenizer_json, cache_dir=tmp_path / "cache")
    assert token_map.tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_map_is_cached_by_tokenizer_hash(tmp_path: Path) -> None:
    tokenizer_json = _word_level_tokenizer(tmp_path / "tokenizer.json", ["a", "A", "b"])
    cache_dir = tmp_path / "cache"
    assert load_token_map(tokenizer_json, expected_size=2, cache_dir=cache_dir).tolist() == [0, 0, 1]
    cached = cache_path(cache_dir, sha256_of(tokenizer_json))
    assert cached.is_file()
    # The cache is what a second load reads: plant a different map and see it come back.
    np.save(cached, np.array([0, 1, 2], dtype=np.int32))
    assert load_token_map(tokenizer_json, cache_dir=cache_dir).tolist() == [0, 1, 2]
    # A corrupt cache file is rebuilt rather than trusted.
    cached.write_bytes(b"not numpy")
    assert load_token_map(tokenizer_json, cache_dir=cache_dir).tolist() == [0, 0, 1]
    # A different tokenizer gets a different cache entry.
    other = _word_level_tokenizer(tmp_path / "other.json", ["a", "b", "c"])
    assert load_token_map(other, cache_dir=cache_dir).tolist() == [0, 1, 2]


def test_missing_tokenizer_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenMapError, match="no tokenizer file"):
        load_token_map(tmp_path / "missing.json", cache_dir=tmp_path)
