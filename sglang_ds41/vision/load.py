"""Image sources -> decoded RGB pictures, with the limits a server needs (ENCODING.md §2.9).

A source is raw bytes, a `data:` URL (base64 or percent-encoded), or a local file (a `file:`
URL or a `Path`) inside one allow-listed directory. Remote URLs are not fetched here: fetching
is the server's decision (SSRF policy, timeouts), and it hands the bytes in.

Every check that can run before decoding does (byte size, header dimensions), so an oversized
or hostile input costs no pixel memory; failures raise `ImageError` naming the image and what
was expected. Nothing is cached or mutated: a batch either loads completely or raises.

Colour: like deepseek-recipe's resolver, which runs before SGLang's processor in the official
pipeline, transparency is blended onto #FDFDFD and 16-bit samples are scaled to 8 bits; then
the picture is RGB (MODEL.md §7.1 step 1). GIFs contribute their first frame.
"""

from __future__ import annotations

import base64
import binascii
import io
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sglang_ds41.errors import Ds41Error

if TYPE_CHECKING:
    from PIL import Image

ImageSource = bytes | bytearray | memoryview | str | Path

# Formats the official resolver accepts (ENCODING.md §2.9), by PIL's format name.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
# deepseek-recipe blends transparent pixels onto this colour before the model sees them.
ALPHA_BACKGROUND = 0xFD


class ImageError(Ds41Error):
    """An image could not be read: bad source, too large, corrupt, or not an image."""


@dataclass(frozen=True)
class ImageLimits:
    """Per-image limits; the defaults are deepseek-recipe's (32 MiB, 8192 px per side)."""

    max_bytes: int = 32 * 1024 * 1024
    max_side: int = 8192  # also the decompression-bomb guard: at most max_side**2 pixels


DEFAULT_LIMITS = ImageLimits()


def read_source(
    source: ImageSource,
    *,
    allowed_dir: str | Path | None = None,
    limits: ImageLimits = DEFAULT_LIMITS,
    what: str = "image",
) -> bytes:
    """The encoded bytes of one source (no decoding)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, Path):
        data = _read_local(source, allowed_dir, limits, what)
    elif isinstance(source, str):
        scheme = source.split(":", 1)[0].lower() if ":" in source else ""
        if scheme == "data":
            data = _decode_data_url(source, limits, what)
        elif scheme == "file":
            data = _read_local(_file_url_path(source, what), allowed_dir, limits, what)
        elif scheme in ("http", "https"):
            raise ImageError(
                f"{what}: remote URLs are not fetched by image preprocessing; fetch the image and "
                "pass its bytes (or a data: URL)"
            )
        else:
            raise ImageError(
                f"{what}: unsupported image source {_preview(source)}; expected a data: URL, a file: "
                "URL or raw bytes"
            )
    else:
        raise ImageError(
            f"{what}: unsupported image source type {type(source).__name__}; expected a str (URL) or bytes"
        )
    if not data:
        raise ImageError(f"{what}: the image is empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise ImageError(f"{what}: {len(data)} bytes is over the limit of {limits.max_bytes} bytes")
    return data


def decode_image(data: bytes, *, limits: ImageLimits = DEFAULT_LIMITS, what: str = "image") -> Image.Image:
    """Encoded bytes -> a loaded RGB picture; header checks run before any pixel is decoded."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ImageError(f"{what}: the image is empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise ImageError(f"{what}: {len(data)} bytes is over the limit of {limits.max_bytes} bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        fmt = _sniff(data)
        if fmt is not None:  # PIL refuses headers it finds invalid, e.g. a zero width
            raise ImageError(f"{what}: corrupt {fmt} header (unreadable or zero-size image)") from None
        raise ImageError(
            f"{what}: not an image in a known format (expected one of {', '.join(FORMATS)})"
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ImageError(
            f"{what}: too many pixels, over the limit of {limits.max_side} pixels per side ({error})"
        ) from None
    except Exception as error:  # PIL raises many types for malformed headers
        raise ImageError(f"{what}: corrupt image header ({type(error).__name__}: {error})") from None
    if image.format not in FORMATS:
        raise ImageError(
            f"{what}: unsupported image format {image.format}, expected one of {', '.join(FORMATS)}"
        )
    width, height = image.size
    if width < 1 or height < 1:
        raise ImageError(f"{what}: the image has zero size ({width}x{height})")
    if max(width, height) > limits.max_side:
        raise ImageError(
            f"{what}: {width}x{height} pixels is over the limit of {limits.max_side} pixels per side"
        )
    try:
        image.load()
    except Exception as error:
        raise ImageError(
            f"{what}: corrupt or truncated {image.format} data ({type(error).__name__}: {error})"
        ) from None
    return to_rgb(image, what)


def load_image(
    source: ImageSource,
    *,
    allowed_dir: str | Path | None = None,
    limits: ImageLimits = DEFAULT_LIMITS,
    what: str = "image",
) -> Image.Image:
    """One source -> a loaded RGB picture (`read_source` then `decode_image`)."""
    data = read_source(source, allowed_dir=allowed_dir, limits=limits, what=what)
    return decode_image(data, limits=limits, what=what)


def to_rgb(image: Image.Image, what: str = "image") -> Image.Image:
    """8-bit RGB, transparency blended onto #FDFDFD (not dropped, as a bare `convert` would)."""
    from PIL import Image

    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        gray = np.asarray(image, dtype=np.float64)
        image = Image.fromarray(np.clip(np.rint(gray / 257), 0, 255).astype(np.uint8))
    has_alpha = image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info
    try:
        if not has_alpha:
            return image if image.mode == "RGB" else image.convert("RGB")
        rgba = np.asarray(image.convert("RGBA"), dtype=np.uint32)
    except (ValueError, OSError) as error:
        raise ImageError(f"{what}: cannot convert image mode {image.mode} to RGB ({error})") from None
    alpha = rgba[..., 3:]
    blended = (rgba[..., :3] * alpha + ALPHA_BACKGROUND * (255 - alpha) + 127) // 255
    return Image.fromarray(blended.astype(np.uint8))


def _decode_data_url(url: str, limits: ImageLimits, what: str) -> bytes:
    header, sep, payload = url[len("data:") :].partition(",")
    if not sep:
        raise ImageError(f"{what}: malformed data URL (no ',' after the header {_preview(header)})")
    params = [p.strip().lower() for p in header.split(";")]
    media_type = params[0]
    if media_type and not media_type.startswith("image/"):
        raise ImageError(f"{what}: data URL media type {media_type!r} is not an image type")
    if "base64" in params[1:]:
        payload = "".join(payload.split())
        if len(payload) // 4 * 3 > limits.max_bytes + 2:  # reject before decoding
            raise ImageError(
                f"{what}: data URL holds about {len(payload) // 4 * 3} bytes, over the limit of "
                f"{limits.max_bytes} bytes"
            )
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as error:
            raise ImageError(f"{what}: data URL is not valid base64 ({error})") from None
    if len(payload) > 3 * limits.max_bytes:  # each byte takes at most 3 characters
        raise ImageError(f"{what}: data URL is over the limit of {limits.max_bytes} bytes")
    return urllib.parse.unquote_to_bytes(payload)


def _file_url_path(url: str, what: str) -> Path:
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise ImageError(f"{what}: file URL {_preview(url)} names a remote host {parsed.netloc!r}")
    return Path(urllib.request.url2pathname(parsed.path))


def _read_local(path: Path, allowed_dir: str | Path | None, limits: ImageLimits, what: str) -> bytes:
    if allowed_dir is None:
        raise ImageError(
            f"{what}: local image files are disabled (no allowed directory configured), got {path}"
        )
    root = Path(allowed_dir).resolve()
    candidate = path if path.is_absolute() else root / path
    try:
        real = candidate.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ImageError(f"{what}: no such image file {path}") from None
    if not real.is_relative_to(root):
        raise ImageError(f"{what}: {path} is outside the allowed image directory {root}")
    if not real.is_file():
        raise ImageError(f"{what}: {path} is not a regular file")
    size = real.stat().st_size
    if size > limits.max_bytes:
        raise ImageError(f"{what}: {path} has {size} bytes, over the limit of {limits.max_bytes} bytes")
    with real.open("rb") as f:
        return f.read(limits.max_bytes + 1)


def _sniff(data: bytes) -> str | None:
    """The format a file's magic bytes claim, among the accepted ones."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def _preview(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")
