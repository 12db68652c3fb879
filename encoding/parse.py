"""One-shot output parsing: a whole completion (text or token ids) -> ParsedMessage.

This is `StreamParser` fed in one piece, so the one-shot and streamed results cannot drift.
The recognition rules are the official parser's (deepseek-recipe 0.2.0 `StreamProcessor`,
ENCODING.md §4.2); `reasoning_content`, `content`, call names and `arguments` equal the official
result for every input except the ones listed here.

Deliberate differences from the official parser:

1. Problems are reported instead of hidden. The visible fields stay as the official parser
   builds them, but a call is `valid=False` with a reason when its arguments are not valid JSON
   (verbatim `string="false"` garbage, `NaN`, duplicate keys), when the output ended inside it
   ("call truncated at max_tokens" / "unclosed invoke"), when its invoke or parameter tags carry
   text the format does not have (extra attributes, a JSON body, `/>`), and the message lists
   dropped or ignored text (a single-quoted invoke, text after `</｜DSML｜ calls>`, text in the
   calls block, a call cut inside its name, an unclosed block or reasoning section).
2. json_object output: every run of text around the JSON value becomes one space however the
   output is chunked. The official parser emits one space per chunk and run, so its streamed
   result depends on the chunking; it equals ours when the text arrives in one chunk. For token
   ids we also break runs at special tokens, as upstream does, but upstream's exact count of
   spaces next to a special token is only approximated (the JSON value itself is unaffected).
3. Token ids that end inside a UTF-8 character: the incomplete bytes are dropped (and reported);
   the official parser also drops the text decoded since the last special token. Invalid UTF-8
   in the middle becomes U+FFFD per invalid sequence, where the official parser may drop bytes.
   A real U+FFFD the model wrote is kept; the official parser takes one at the end of its decoded
   text for a half-written character and drops the text since the last special token.
4. Tool-call ids are `call_{index:02d}_{24 chars}` as upstream; the id source is pluggable
   (`seeded_tool_call_ids`) so results can be reproduced.
5. Token mode with tools: a `｜DSML｜` id in reasoning or content that does not follow `<` (none,
   or a stray closing `</`) opens the calls block as `<｜DSML｜` does, and the message reports
   it. The id only ever begins a tag, and under a strict `auto` grammar the block after it is
   constrained while the `<` before it is free text (docs/ENCODING.md §4.4); the official
   parser leaves the block in `content`.
6. Opt-in (`ParsingOptions(tolerant=True)`, what the server uses): call spellings besides V4.1's
   whose meaning is clear are read as calls and named in `ParsedToolCall.repairs` (ENCODING.md
   §4.5). Without it, nothing of this list changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .conversation import ParsingOptions
from .errors import EncodingError
from .parsed import ParsedMessage
from .stream import StreamParser, random_tool_call_id


def parse_text(
    text: str,
    options: ParsingOptions | None = None,
    finish_reason: str = "stop",
    *,
    tool_call_id: Callable[[int], str] = random_tool_call_id,
) -> ParsedMessage:
    """Parse a completion given as text; special spellings are recognised anywhere in it."""
    parser = StreamParser(options, tool_call_id=tool_call_id)
    parser.feed_text(text)
    return parser.finish(finish_reason)


def parse_ids(
    ids: Sequence[int],
    options: ParsingOptions | None = None,
    finish_reason: str = "stop",
    *,
    tokenizer=None,
    tool_call_id: Callable[[int], str] = random_tool_call_id,
) -> ParsedMessage:
    """Parse a completion given as V4.1 token ids (the backend's output, stop token removed)."""
    if isinstance(ids, (str, bytes)):
        raise EncodingError("parse_ids expects a sequence of token ids, got a string")
    parser = StreamParser(options, tokenizer=tokenizer, tool_call_id=tool_call_id)
    parser.feed_ids(list(ids))
    return parser.finish(finish_reason)
