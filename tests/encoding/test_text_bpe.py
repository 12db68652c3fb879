"""`text_bpe.TextEncoder` gives the ids of the `tokenizers` BPE (the V4.1 tokenizer without its
added vocabulary) for any text: the one-pass segmentation equals the pre-tokenizer's pieces
wherever it is used, and everything else goes to `tokenizers` itself."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_ds41.encoding import text_bpe
from sglang_ds41.encoding.prompt_ids import text_tokenizer
from sglang_ds41.encoding.text_bpe import TextEncoder, segmentation_is_ours
from tokenizers import Tokenizer

# Characters the pre-tokenizer treats differently: digits of several scripts, the CJK ranges it
# isolates and their neighbours, kana marks (symbols inside the isolated range), combining marks,
# every kind of space and line break, ASCII and other punctuation, symbols, controls.
TRICKY = (
    "ab Z 09 ٣४½²Ⅻ 一龥龦぀ゟ゠ヿ゛゜ー・〇々 ́ ̈ ा \t\n\r\x0b\x0c\x1c\x85\u2028\u2029\u3000\xa0 "
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ ¡¿«»“”—…€£©®™°±×÷ 😀🫠👍🏽 \x00\x01\x7f é ß ﬁ Ω Я ع א"
)


@pytest.fixture(scope="module")
def hf() -> Tokenizer:
    return text_tokenizer()


@pytest.fixture(scope="module")
def ours(hf) -> TextEncoder:
    encoder = TextEncoder(hf)
    assert text_bpe.is_v41_like(hf)
    return encoder


def hf_pieces(tokenizer: Tokenizer, text: str) -> list[str]:
    return [piece for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)]


def our_pieces(text: str) -> list[str]:
    """Our segmentation in the byte-level spelling the pre-tokenizer reports."""
    table = text_bpe._BYTE_LEVEL
    return [p.encode().decode("latin-1").translate(table) for p in text_bpe.pieces(text)]


texts = st.text(alphabet=st.one_of(st.sampled_from(TRICKY), st.characters(codec="utf-8")), max_size=80)
ascii_texts = st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=80)
# Lines of ASCII and of other text: the text is cut after line breaks and each part is split by
# its own pattern.
lines = st.lists(st.one_of(texts, ascii_texts), min_size=2, max_size=6).map("\n".join)


@settings(max_examples=700, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(texts, lines))
def test_generated_text_encodes_as_tokenizers_does(hf, ours, text):
    assert list(ours.encode(text)) == hf.encode(text, add_special_tokens=False).ids
    if segmentation_is_ours(text):
        assert our_pieces(text) == hf_pieces(hf, text)


def test_every_pair_of_tricky_characters_splits_alike(hf):
    """Where two kinds of character meet, e.g. a kana voicing mark (a symbol inside the CJK
    ranges) next to an ideograph."""
    chars = sorted(set(TRICKY))
    wrong = []
    for a in chars:
        for b in chars:
            text = f"{a}{b}{a} {b}{b}\n{a}"
            if segmentation_is_ours(text) and our_pieces(text) != hf_pieces(hf, text):
                wrong.append(text)
    assert wrong == []


def _probe(ch: str) -> str:
    """`ch` in the contexts where the splits decide: next to letters, digits, CJK, spaces,
    punctuation and line breaks, doubled, and at both ends."""
    return f"{ch}a{ch}b {ch}{ch} {ch}1{ch}.{ch}  {ch}\t{ch}\n{ch}中{ch}é{ch}!{ch}"


def _compare_code_points(hf, code_points) -> list[str]:
    """Code points whose probe our segmentation (where used) splits differently."""
    wrong = []
    for start in range(0, len(code_points), 2000):
        chunk = [chr(c) for c in code_points[start : start + 2000]]
        for ch in chunk:
            probe = _probe(ch)
            if segmentation_is_ours(probe) and our_pieces(probe) != hf_pieces(hf, probe):
                wrong.append(f"U+{ord(ch):04X}")
    return wrong


def test_every_ascii_and_a_sample_of_all_code_points_split_alike(hf):
    """Every ASCII character and every 61st code point (the whole range: the slow test)."""
    sample = [*range(128), *range(128, 0x110000, 61)]
    assert _compare_code_points(hf, [c for c in sample if not 0xD800 <= c <= 0xDFFF]) == []


@pytest.mark.slow
def test_every_code_point_splits_alike(hf):
    code_points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    assert _compare_code_points(hf, code_points) == []


def test_text_with_characters_unicode_14_lacks_goes_to_tokenizers(hf, ours):
    """U+1FAE8 (Unicode 15) is classed differently by the two regex engines' tables: such text is
    not split by ours, and its ids are still the tokenizer's."""
    text = "shaking face \U0001fae8 here"
    assert not segmentation_is_ours(text)
    assert segmentation_is_ours("grinning face \U0001f600 here")
    assert list(ours.encode(text)) == hf.encode(text, add_special_tokens=False).ids


def test_a_tokenizer_that_splits_otherwise_is_encoded_by_itself(hf):
    """A tokenizer whose digit split differs from V4.1's (one digit, not up to three) is not
    V4.1-like; its text is encoded by `tokenizers`, digits one by one."""
    spec = json.loads(hf.to_str())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{N}"
    other = Tokenizer.from_str(json.dumps(spec))
    encoder = TextEncoder(other)
    assert not text_bpe.is_v41_like(other)
    text = "call 12345 and 678 " * 3
    assert list(encoder.encode(text)) == other.encode(text, add_special_tokens=False).ids
    assert list(encoder.encode(text)) != hf.encode(text, add_special_tokens=False).ids
