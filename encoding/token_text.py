"""Token ids -> text for the output parser, one piece at a time (ENCODING.md §4.2 "Token vs text").

In token mode the parser must tell the special tokens `</think>` (128822) and `｜DSML｜` (128825)
apart from the same spellings produced as ordinary BPE pieces. The decoder therefore writes
those two ids as lone surrogates — code points that no UTF-8 decoding can produce — and the
parser's token-mode patterns use the same sentinels. `restore` turns sentinels back into the
spellings wherever parsed text is handed to the caller.

Ordinary ids are byte-level BPE pieces; their bytes go through an incremental UTF-8 decoder so
a character split across two ids (or two `feed` calls) comes out whole. Other added tokens
(EOS, `<｜User｜>`, grounding tokens, ...) are decoded verbatim, as the official parser does.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from functools import cache

from .errors import EncodingError
from .special_tokens import Special

THINK_END_SENTINEL = "\udc00"
DSML_SENTINEL = "\udc01"
SENTINEL_IDS = {Special.THINK_END.id: THINK_END_SENTINEL, Special.DSML.id: DSML_SENTINEL}
_RESTORE = str.maketrans({THINK_END_SENTINEL: Special.THINK_END.value, DSML_SENTINEL: Special.DSML.value})


def restore(text: str) -> str:
    """Replace token-mode sentinels by the special spellings they stand for."""
    return text.translate(_RESTORE)


def _byte_level_alphabet() -> dict[str, int]:
    """The GPT-2 byte-level alphabet: printable stand-in character -> byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


@cache
def _pieces(tokenizer) -> tuple[dict[int, bytes], dict[int, str], int]:
    """Per tokenizer: id -> bytes for BPE pieces, id -> text for added tokens."""
    alphabet = _byte_level_alphabet()
    added = {token_id: token.content for token_id, token in tokenizer.get_added_tokens_decoder().items()}
    vocab = {}
    for piece, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
        if token_id not in added:  # ids 0-2 sit in both tables; the added token wins
            vocab[token_id] = bytes(alphabet[ch] for ch in piece)
    return vocab, added, tokenizer.get_vocab_size()


class TokenTextDecoder:
    """Incremental ids -> text with the two parser sentinels; see the module docstring."""

    def __init__(self, tokenizer=None) -> None:
        if tokenizer is None:
            from sglang_ds41.assets import v41_tokenizer

            tokenizer = v41_tokenizer()
        self._vocab, self._added, self._size = _pieces(tokenizer)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> tuple[str, list[int]]:
        """Text of `ids`, and the offsets in it where an added token starts or ends.

        The official parser hands each added token to its scanner as a separate piece; the
        offsets let the parser reproduce the effects of those piece boundaries (json_object
        spacing) without depending on how the ids themselves were chunked.
        """
        out: list[str] = []
        cuts: list[int] = []
        size = 0
        for token_id in ids:
            if not isinstance(token_id, int) or isinstance(token_id, bool):
                raise EncodingError(f"token ids must be integers, got {token_id!r}")
            sentinel = SENTINEL_IDS.get(token_id)
            added = self._added.get(token_id) if sentinel is None else None
            if sentinel is not None or added is not None:
                # A special token ends any half-written character (it becomes U+FFFD).
                tail = self._utf8.decode(b"", final=True)
                self._utf8.reset()
                text = sentinel if sentinel is not None else added
                out += [tail, text]
                size += len(tail)
                if not cuts or cuts[-1] != size:
                    cuts.append(size)
                size += len(text)
                cuts.append(size)
                continue
            piece = self._vocab.get(token_id)
            if piece is None:
                raise EncodingError(
                    f"token id {token_id} is not in the tokenizer (expected 0..{self._size - 1})"
                )
            text = self._utf8.decode(piece)
            out.append(text)
            size += len(text)
        return "".join(out), cuts

    def pending_bytes(self) -> int:
        """Bytes of a character that is still incomplete (dropped if the output ends here)."""
        return len(self._utf8.getstate()[0])
