"""Validation of `image_url.url`, matching the official renderer's accept/reject decisions.

Rendering never fetches or decodes an image, but the official renderer refuses some URLs up
front, and a request it refuses must be refused here too. Rules found by probing it:

* a URL that starts with `http` (any case, no leading space) is accepted as is;
* a `data:` URL must contain `base64,` (case-sensitive) somewhere, else "Unsupported format";
  it is then read the WHATWG way: surrounding controls/spaces trimmed, tabs and newlines
  removed, header up to the first comma, `;base64` suffix detected after `;` and spaces;
* its MIME essence must be image/png, jpeg, jpg, gif or webp (any case);
* a base64 body is percent-decoded, then decoded "forgivingly": ASCII whitespace ignored,
  at most two trailing `=` when the length is a multiple of 4, no length of the form 4k+1.
  A header without a real `;base64` suffix makes the body plain percent-encoded data, which
  is never invalid.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from .conversation import ImageSource

ALLOWED_MIME = frozenset({"image/png", "image/jpeg", "image/jpg", "image/gif", "image/webp"})
_BASE64_SUFFIX = re.compile(r";[ ]*base64$", re.IGNORECASE)
_BASE64_ALPHABET = re.compile(rb"[A-Za-z0-9+/]*")
_WHITESPACE = b" \t\n\r\f"

UNSUPPORTED_FORMAT = "Unsupported image_url format"
UNSUPPORTED_IMAGE = (
    "You have uploaded an unsupported image. Please make sure your image is valid and has one"
    " of the following formats: webp, png, jpeg, and gif."
)
INVALID_BASE64 = "Invalid base64 data"


def image_url_problem(url: str) -> str | None:
    """The official renderer's complaint about `url`, or None when it accepts it."""
    if url[:4].lower() == "http":
        return None
    trimmed = url.strip("".join(chr(c) for c in range(0x21)))
    if trimmed[:5].lower() != "data:" or "base64," not in url:
        return UNSUPPORTED_FORMAT
    rest = re.sub(r"[\t\n\r]", "", trimmed[5:])
    header, _, body = rest.partition(",")
    header = header.strip(" \t\n\r\f")
    is_base64 = _BASE64_SUFFIX.search(header) is not None
    if is_base64:
        header = _BASE64_SUFFIX.sub("", header)
    essence = header.split(";", 1)[0].strip(" \t\n\r\f").lower()
    if essence not in ALLOWED_MIME:
        return UNSUPPORTED_IMAGE
    if is_base64 and not _forgiving_base64_ok(unquote_to_bytes(body)):
        return INVALID_BASE64
    return None


def _forgiving_base64_ok(data: bytes) -> bool:
    data = bytes(b for b in data if b not in _WHITESPACE)
    if len(data) % 4 == 0:
        if data.endswith(b"=="):
            data = data[:-2]
        elif data.endswith(b"="):
            data = data[:-1]
    if len(data) % 4 == 1:
        return False
    return _BASE64_ALPHABET.fullmatch(data) is not None


def image_source(url: str, detail: str, path: str) -> ImageSource:
    kind = "url" if url[:4].lower() == "http" else "data_url"
    return ImageSource(kind=kind, url=url, detail=detail, path=path)
