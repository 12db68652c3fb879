"""V4.1 tool-call grammars compile token-exact in SGLang's xgrammar backend (call_grammar.py).

An AROUND hook on `XGrammarGrammarBackend.dispatch_structural_tag`, the one place every
structural tag of a request is compiled (whatever built it: `tool_choice` required or named,
strict tools, the reasoning wrapper). A tag that constrains V4.1 calls, on a backend whose
vocabulary is V4.1's, is rewritten by `call_grammar.token_exact` and compiled by a compiler of
its own whose vocabulary has the special tokens *reserved*: their bytes get a leading 0xFF
(invalid UTF-8, the way SGLang reserves a response template's framing tokens), so text cannot
match them and a token element matches nothing but its id. Every other tag, and every tag on
another model, goes to upstream's code unchanged.

That compiler runs uncached (SGLang 0.5.23 notes that xgrammar's cache mixes up token-level
structural tags of different shapes); compiled grammars are kept per tag text instead.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from sglang_ds41.encoding.special_tokens import SPECIAL_IDS
from sglang_ds41.plugin.serving import call_grammar
from sglang_ds41.plugin.upstream import XGRAMMAR_BACKEND as BACKEND

logger = logging.getLogger(__name__)

_STATE = "_sglang_ds41_token_exact"
_COMPILED_PER_BACKEND = 256
RESERVED_PREFIX = b"\xff"


@functools.cache
def v41_added_tokens() -> dict[int, bytes]:
    """id -> UTF-8 spelling of every added token of the V4.1 tokenizer (specials and others)."""
    from sglang_ds41.assets import v41_tokenizer

    return {i: token.content.encode() for i, token in v41_tokenizer().get_added_tokens_decoder().items()}


def special_ids() -> dict[str, int]:
    """Spelling -> id of the special tokens a V4.1 tag may spell."""
    return {special.value: token_id for special, token_id in SPECIAL_IDS.items()}


def serves_v41_vocabulary(decoded_vocab: list[bytes]) -> bool:
    added = v41_added_tokens()
    return len(decoded_vocab) > max(added) and all(decoded_vocab[i] == piece for i, piece in added.items())


def reserved_vocabulary(decoded_vocab: list[bytes]) -> list[bytes]:
    added = v41_added_tokens()
    return [RESERVED_PREFIX + piece if i in added else piece for i, piece in enumerate(decoded_vocab)]


class TokenExactCompiler:
    """The V4.1 backend's compiler for token-exact tags, built once per grammar backend."""

    def __init__(self, tokenizer_info: Any) -> None:
        from xgrammar import GrammarCompiler, TokenizerInfo, VocabType

        info = TokenizerInfo(
            reserved_vocabulary(tokenizer_info.decoded_vocab),
            VocabType.RAW,
            vocab_size=tokenizer_info.vocab_size,
            stop_token_ids=tokenizer_info.stop_token_ids,
        )
        self._compiler = GrammarCompiler(tokenizer_info=info, cache_enabled=False)
        self.compile = functools.lru_cache(maxsize=_COMPILED_PER_BACKEND)(self._compile)

    def _compile(self, key_string: str) -> Any:
        try:
            tag = call_grammar.token_exact(json.loads(key_string), special_ids())
        except call_grammar.UnsupportedTag:
            raise
        except Exception as error:  # a shape the rewrite misreads: upstream compiles it as it is
            raise call_grammar.UnsupportedTag(f"{type(error).__name__}: {error}") from error
        return self._compiler.compile_structural_tag(json.dumps(tag))


def _compiler_of(backend: Any) -> TokenExactCompiler | None:
    state = getattr(backend, _STATE, None)
    if state is None:
        info = getattr(backend, "_tokenizer_info", None)
        v41 = info is not None and serves_v41_vocabulary(info.decoded_vocab)
        if not v41:
            logger.warning(
                "sglang-ds41: V4.1 tool-call grammars on a vocabulary that is not V4.1's; they are "
                "compiled as SGLang builds them (DSML tags may then be spelled as text)"
            )
        state = TokenExactCompiler(info) if v41 else False
        setattr(backend, _STATE, state)
    return state or None


def _v41_call_tag(key_string: str) -> bool:
    if not call_grammar.spells_v41_calls(key_string):
        return False
    try:
        tag = json.loads(key_string)
    except ValueError:
        return False
    return isinstance(tag, dict) and "structures" not in tag


def dispatch_structural_tag(original, self, key_string: str):
    """AROUND `XGrammarGrammarBackend.dispatch_structural_tag`: V4.1 call tags token-exact."""
    if not _v41_call_tag(key_string):
        return original(self, key_string)
    compiler = _compiler_of(self)
    if compiler is None:
        return original(self, key_string)
    from sglang.srt.constrained.base_grammar_backend import GrammarStats, InvalidGrammarObject

    try:
        compiled = compiler.compile(key_string)
    except call_grammar.UnsupportedTag as error:
        logger.warning("sglang-ds41: V4.1 tool-call grammar left as SGLang built it (%s)", error)
        return original(self, key_string)
    except RuntimeError as error:
        logger.error("sglang-ds41: invalid V4.1 tool-call grammar %s: %s", key_string[:500], error)
        return InvalidGrammarObject(str(error))
    return self._from_context(compiled, key_string, GrammarStats(dispatch_type="structural_tag"))


HOOKS = {f"{BACKEND}.dispatch_structural_tag": dispatch_structural_tag}
