"""Files shipped with the package: the real DeepSeek-V4.1 tokenizer and the trained tiny model
(`checkpoint.trained`)."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

TOKENIZER_DIR = Path(__file__).parent / "deepseek-v4.1"
TOKENIZER_JSON = TOKENIZER_DIR / "tokenizer.json"
TINY_TRAINED_DIR = Path(__file__).parent / "tiny-trained"
# SHA-256 of the released deepseek-ai/DeepSeek-V4.1-Flash tokenizer.json (ENCODING.md §1.2).
TOKENIZER_SHA256 = "c90dfa01249db1be4245780a052ede752e1361c612ac6d08e2bdada7d599476b"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@cache
def v41_tokenizer():
    """The V4.1 `tokenizers.Tokenizer`, loaded once per process (it takes ~0.5 s)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER_JSON))


def v41_hf_tokenizer():
    """A new transformers `PreTrainedTokenizerFast` of the V4.1 tokenizer, the form SGLang's chat
    adapter and xgrammar's `TokenizerInfo` take (new each call: its users may set fields on it)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(TOKENIZER_DIR))
