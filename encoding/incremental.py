"""Prompt ids of a request that extends an earlier one, reusing the earlier ids (ENCODING.md §10).

An agent resends its whole history every turn. `IncrementalEncoder.encode(body)` gives the ids
`encode_prompt(render_request(body))` gives, but when the request's settings and its first k
messages are exactly those of a request it encoded before, it takes that request's ids for
them from a cache and renders and tokenizes only messages k.. and the generation header.

Why that is exact (ENCODING.md §10.1): `PromptWriter` writes a message's text only once no later
message can change it, and every such write starts with a special token; text runs between
special tokens are tokenized on their own (§1.3). So the ids written for messages ..k-1 are a
prefix of the ids of any request that continues them, and what comes after follows from the
state of the writer and of the request's checks (`MessageConverter`), both kept with the ids.

The cache is keyed by a hash (SHA-256) of the request's settings (everything but the messages)
and of each message, chained, over their exact JSON: a request is given cached ids only for a
prefix it contains itself, byte for byte, and equal as JSON values to the messages the
checkpoint keeps (read back from those bytes). Entries are kept up to `max_bytes` (ids, values,
held-back text and image URLs counted as `_store` says), least recently used first out. A
request that changes an earlier message reuses the ids of the longest cached prefix it still
repeats (an earlier turn that ended before the change); one with other settings, or never
seen, is encoded from the start; a request the incremental path refuses is handed to
`render_request`, which raises the error the official renderer gives.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import json_text
from .conversation import ImagePart, ImageSource
from .errors import EncodingError
from .prompt_ids import prompt_ids, text_encoder_of
from .render import PromptBuilder, PromptWriter
from .request import MessageConverter, RequestSettings, request_settings, typed_message

if TYPE_CHECKING:
    from tokenizers import Tokenizer

DEFAULT_MAX_BYTES = 512 << 20
BYTES_PER_ID = 36  # a list slot and an int object: an upper bound (ids below 257 share one)
# The messages kept as values, per message and per byte of its JSON (measured: about 2 bytes
# per JSON byte for agent histories, more for many short strings).
BYTES_PER_MESSAGE = 256
BYTES_PER_JSON_BYTE = 4
SETTINGS_ENTRIES = 256

try:  # the server has orjson; any JSON serialization keys the cache alike (`_prefix_digests`)
    import orjson

    _json_bytes = orjson.dumps
    _json_value = orjson.loads

except ImportError:  # pragma: no cover - the client install without orjson

    def _json_bytes(value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode()

    _json_value = json.loads


@dataclass(frozen=True)
class EncodedPrompt:
    """A request's prompt ids, its images in placeholder order, and how many ids came from
    the cache (0: encoded from the start)."""

    ids: list[int]
    image_sources: tuple[ImageSource, ...]
    reused: int


@dataclass(frozen=True)
class _Checkpoint:
    """Where encoding stood after a request's messages, before its generation header."""

    ids: list[int]  # never changed once stored
    images: tuple[ImageSource, ...]
    messages: list[Any]  # their JSON values, read back from their bytes; never changed
    converter: MessageConverter
    writer: PromptWriter
    nbytes: int


class _NotIncremental(Exception):
    """This request is not encoded incrementally (see `IncrementalEncoder.encode`)."""


class IncrementalEncoder:
    """`encode_prompt(render_request(body))` with a cache of earlier requests' ids (module doc).

    `tokenizer` (default: the V4.1 tokenizer) must be the V4.1 tokenizer or have its special
    token ids; text is encoded with its BPE without the added vocabulary. Thread-safe.
    """

    def __init__(self, tokenizer: Tokenizer | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if tokenizer is None:
            from sglang_ds41.assets import v41_tokenizer

            tokenizer = v41_tokenizer()
        self._text = text_encoder_of(tokenizer)
        self.max_bytes = max_bytes
        self._checkpoints: OrderedDict[bytes, _Checkpoint] = OrderedDict()
        self._settings: OrderedDict[bytes, RequestSettings] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    def encode(self, body: dict[str, Any] | str | bytes) -> EncodedPrompt:
        """The prompt ids of a Chat Completions body; raises `EncodingError` as `render_request`."""
        try:
            return self._incremental(body)
        except (EncodingError, json_text.JsonTextError, _NotIncremental):
            pass
        from . import render_request

        rendered = render_request(body)
        return EncodedPrompt(prompt_ids(rendered.prompt, self._text), rendered.prompt.image_sources, 0)

    def clear(self) -> None:
        with self._lock:
            self._checkpoints.clear()
            self._settings.clear()
            self._bytes = 0

    def _incremental(self, body: dict[str, Any] | str | bytes) -> EncodedPrompt:
        if isinstance(body, (str, bytes)):
            body = json_text.loads(body)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise _NotIncremental
        messages: list[Any] = body["messages"]
        rest = {key: value for key, value in body.items() if key != "messages"}
        json_text.check_value(rest)
        key = _exact_json_bytes(rest)
        settings = self._settings_of(key, body)
        serialized = _json_bytes_of(messages)
        digests = _prefix_digests(key, serialized)

        start, found = self._longest_prefix(digests)
        if found is None:
            converter, writer = MessageConverter(), PromptWriter(settings.conversation())
            ids: list[int] = []
            images: tuple[ImageSource, ...] = ()
            values: list[Any] = []
        else:
            if messages[:start] != found.messages:
                raise _NotIncremental  # the same bytes, not the same JSON (NaN is written as null)
            converter, writer = copy.copy(found.converter), copy.copy(found.writer)
            ids, images, values = found.ids, found.images, found.messages
        reused = len(ids)

        if start < len(messages):
            out = PromptBuilder()
            for index in range(start, len(messages)):
                json_text.check_value(messages[index])  # as render_request checks a whole body
                message = converter.add(typed_message(messages[index], index), index)
                if message is not None:
                    writer.add(out, message)
            if not out.starts_with_special():
                raise _NotIncremental  # the writer's contract broken: never reuse across it
            ids = ids + out.ids(self._text.encode)
            images = images + tuple(out.images)
            values = values + [_json_value(data) for data in serialized[start:]]
            json_size = sum(map(len, serialized))
            self._store(digests[-1], ids, images, values, json_size, converter, writer)

        converter.finish()
        converter.check_settings(settings)
        tail = PromptBuilder()
        writer.finish(tail)
        if not tail.starts_with_special():
            raise _NotIncremental
        return EncodedPrompt(ids + tail.ids(self._text.encode), images + tuple(tail.images), reused)

    def _settings_of(self, key: bytes, body: dict[str, Any]) -> RequestSettings:
        with self._lock:
            found = self._settings.get(key)
            if found is not None:
                self._settings.move_to_end(key)
                return found
        settings = request_settings(body)
        with self._lock:
            self._settings[key] = settings
            while len(self._settings) > SETTINGS_ENTRIES:
                self._settings.popitem(last=False)
        return settings

    def _longest_prefix(self, digests: list[bytes]) -> tuple[int, _Checkpoint | None]:
        with self._lock:
            for count in range(len(digests), 0, -1):
                found = self._checkpoints.get(digests[count - 1])
                if found is not None:
                    self._checkpoints.move_to_end(digests[count - 1])
                    return count, found
        return 0, None

    def _store(
        self,
        digest: bytes,
        ids: list[int],
        images: tuple[ImageSource, ...],
        values: list[Any],
        json_size: int,
        converter: MessageConverter,
        writer: PromptWriter,
    ) -> None:
        """Keep where encoding stands (copies of the states) within `max_bytes`; `json_size`:
        the bytes of the messages' JSON."""
        nbytes = (
            BYTES_PER_ID * len(ids)
            + BYTES_PER_MESSAGE * len(values)
            + BYTES_PER_JSON_BYTE * json_size
            + sum(len(source.url) for source in images)
            + _held_text(writer)
        )
        if nbytes > self.max_bytes:
            return
        checkpoint = _Checkpoint(ids, images, values, copy.copy(converter), copy.copy(writer), nbytes)
        with self._lock:
            old = self._checkpoints.pop(digest, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._checkpoints[digest] = checkpoint
            self._bytes += nbytes
            while self._bytes > self.max_bytes:
                _, evicted = self._checkpoints.popitem(last=False)
                self._bytes -= evicted.nbytes


def _json_bytes_of(values: list[Any]) -> list[bytes]:
    """Each value's JSON bytes (a value with none, e.g. a lone surrogate or a 65-bit integer,
    is not encoded incrementally)."""
    try:
        return [_json_bytes(value) for value in values]
    except (TypeError, ValueError, RecursionError):
        raise _NotIncremental from None


def _exact_json_bytes(value: Any) -> bytes:
    """`value`'s JSON bytes, checked to read back as an equal value: two values with the same
    bytes are then the same JSON value (NaN is written as null, a tuple as an array)."""
    data = _json_bytes_of([value])[0]
    if _json_value(data) != value:
        raise _NotIncremental
    return data


def _prefix_digests(settings_key: bytes, serialized: list[bytes]) -> list[bytes]:
    """digest[k]: the hash of the settings and messages[..k], chained (module docstring).

    Equal digests mean equal bytes, not equal values: the caller compares a matched prefix with
    the values its checkpoint read back from those bytes (a message can differ from its JSON,
    e.g. NaN written as null), and checks messages past it as `render_request` checks them.
    """
    state = hashlib.sha256(b"ds41-prompt-ids\0" + len(settings_key).to_bytes(8, "little") + settings_key)
    digests = []
    for data in serialized:
        state.update(len(data).to_bytes(8, "little"))
        state.update(data)
        digests.append(state.copy().digest())
    return digests


def _held_text(writer: PromptWriter) -> int:
    """Characters of the messages a writer holds back (an open user/tool run, a prefix)."""
    size = sum(len(p.source.url) if isinstance(p, ImagePart) else len(p) for m in writer.run for p in m.parts)
    if writer.prefix is not None:
        size += len(writer.prefix.content) + len(writer.prefix.reasoning_content or "")
    return size
