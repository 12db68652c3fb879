"""The compressed token map (MODEL.md §5.2): raw token id -> Engram compressed id.

Tokens whose decoded text normalises to the same key ("Hello", " hello", "HELLO") share one
compressed id, so the n-gram hash sees words rather than spellings. Every hash multiplier
depends on the number of compressed ids, so a tokenizer that gives a different count than
`engram_compressed_vocab_size` must be refused, not silently used.

Building the map decodes every token once (seconds); the result is cached as a small `.npy`
keyed by the SHA-256 of `tokenizer.json` and the normalisation version.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sglang_ds41.errors import Ds41Error

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Bump when the key function changes, so stale caches are never read.
NORMALISATION_VERSION = 1
CACHE_ENV = "SGLANG_DS41_ENGRAM_CACHE"
_SPACE_SENTINEL = "\ue000"


class TokenMapError(Ds41Error):
    """The tokenizer's compressed vocabulary does not fit the config (or the cache is corrupt)."""


def _normalizer():
    from tokenizers import Regex, normalizers

    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            # A lone space must survive Strip(): protect it with a private-use sentinel.
            normalizers.Replace(Regex(r"^ $"), _SPACE_SENTINEL),
            normalizers.Strip(),
            normalizers.Replace(_SPACE_SENTINEL, " "),
        ]
    )


def build_token_map(tokenizer: Tokenizer) -> np.ndarray:
    """int32 `[len(tokenizer)]`: compressed ids in order of first appearance by token id."""
    normalizer = _normalizer()
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    texts = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    keys: dict[str, int] = {}
    out = np.empty(size, dtype=np.int32)
    for token_id, text in enumerate(texts):
        # A partial UTF-8 byte decodes to U+FFFD: its raw spelling is the only stable key.
        partial = "\ufffd" in text
        key = tokenizer.id_to_token(token_id) if partial else (normalizer.normalize_str(text) or text)
        out[token_id] = keys.setdefault(key, len(keys))
    return out


def check_size(token_map: np.ndarray, expected: int | None, source: str) -> None:
    got = int(token_map.max()) + 1 if token_map.size else 0
    if expected is not None and got != expected:
        raise TokenMapError(
            f"the tokenizer {source} gives {got} Engram compressed ids, but the config's "
            f"text_config.engram_compressed_vocab_size is {expected}; this tokenizer does not belong "
            "to this checkpoint (every Engram hash multiplier depends on that count)"
        )


def default_cache_dir() -> Path:
    """$SGLANG_DS41_ENGRAM_CACHE, else `engram-token-map` under the project's cache root."""
    from sglang_ds41.cache import cache_dir

    return Path(os.environ.get(CACHE_ENV) or cache_dir() / "engram-token-map").expanduser()


def cache_path(cache_dir: Path, tokenizer_sha256: str) -> Path:
    return cache_dir / f"{tokenizer_sha256}-v{NORMALISATION_VERSION}.npy"


def load_token_map(
    tokenizer_json: str | Path,
    expected_size: int | None = None,
    cache_dir: str | Path | None = None,
) -> np.ndarray:
    """The map of the tokenizer in `tokenizer_json`, from cache if present, else built and cached.

    `cache_dir` defaults to `default_cache_dir()` (`~/.cache/sglang-ds41/engram-token-map`)
    (pass a checkpoint directory to keep the map beside the weights). An unwritable cache only
    costs a rebuild next time. Raises `TokenMapError` if the count differs from `expected_size`.
    """
    from sglang_ds41.assets import sha256_of

    tokenizer_json = Path(tokenizer_json)
    if not tokenizer_json.is_file():
        raise TokenMapError(f"no tokenizer file at {tokenizer_json}")
    path = cache_path(
        Path(cache_dir) if cache_dir is not None else default_cache_dir(), sha256_of(tokenizer_json)
    )
    token_map = _read_cache(path)
    if token_map is None:
        from tokenizers import Tokenizer

        token_map = build_token_map(Tokenizer.from_file(str(tokenizer_json)))
        _write_cache(path, token_map)
    check_size(token_map, expected_size, str(tokenizer_json))
    return token_map


def _read_cache(path: Path) -> np.ndarray | None:
    if not path.is_file():
        return None
    try:
        token_map = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None  # a torn or foreign file: rebuild
    if token_map.ndim != 1 or token_map.dtype != np.int32 or token_map.size == 0:
        return None
    return token_map


def _write_cache(path: Path, token_map: np.ndarray) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.save(f, token_map, allow_pickle=False)
        os.replace(tmp, path)  # atomic: concurrent ranks never see a half-written map
    except OSError:
        tmp.unlink(missing_ok=True)
