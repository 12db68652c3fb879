"""Image sources and their limits: every bad input is an ImageError naming the image."""

from __future__ import annotations

import base64
import os
import struct
import urllib.parse
import zlib

import numpy as np
import pytest
from PIL import Image

from sglang_ds41.errors import Ds41Error
from sglang_ds41.vision.load import ImageError, ImageLimits, decode_image, load_image, read_source
from sglang_ds41.vision.preprocess import preprocess_images

from .conftest import encode

RED = Image.new("RGB", (5, 3), (255, 0, 0))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares width x height, with one tiny (wrong) data chunk."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 16))
        + chunk(b"IEND", b"")
    )


def test_raw_bytes_and_data_urls_load_the_same_pixels():
    data = encode(RED)
    b64 = "data:image/png;base64," + base64.b64encode(data).decode()
    pct = "data:image/png," + urllib.parse.quote_from_bytes(data)
    for source in (data, bytearray(data), b64, pct):
        image = load_image(source)
        assert image.mode == "RGB" and image.size == (5, 3)
        assert image.getpixel((2, 1)) == (255, 0, 0)


def test_local_file_inside_the_allowed_directory(tmp_path):
    (tmp_path / "a.png").write_bytes(encode(RED))
    assert load_image((tmp_path / "a.png").as_uri(), allowed_dir=tmp_path).size == (5, 3)
    from pathlib import Path

    assert load_image(Path("a.png"), allowed_dir=tmp_path).size == (5, 3)  # relative to the directory


def test_local_files_are_refused_without_an_allowed_directory(tmp_path):
    (tmp_path / "a.png").write_bytes(encode(RED))
    with pytest.raises(ImageError, match="local image files are disabled"):
        load_image((tmp_path / "a.png").as_uri())


def test_local_file_outside_the_allowed_directory_is_refused(tmp_path):
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (outside / "b.png").write_bytes(encode(RED))
    os.symlink(outside / "b.png", allowed / "link.png")  # a symlink may not escape either
    for source in [
        (outside / "b.png").as_uri(),
        (allowed / "link.png").as_uri(),
        f"{allowed.as_uri()}/../outside/b.png",
    ]:
        with pytest.raises(ImageError, match="outside the allowed image directory"):
            load_image(source, allowed_dir=allowed)
    with pytest.raises(ImageError, match="no such image file"):
        load_image((allowed / "missing.png").as_uri(), allowed_dir=allowed)
    with pytest.raises(ImageError, match="remote host"):
        load_image("file://example.com/x.png", allowed_dir=allowed)


def test_remote_and_unknown_sources_are_refused():
    with pytest.raises(ImageError, match="remote URLs are not fetched"):
        read_source("https://example.com/cat.png")
    with pytest.raises(ImageError, match="unsupported image source"):
        read_source("cat.png")
    with pytest.raises(ImageError, match="unsupported image source type"):
        read_source(42)  # type: ignore[arg-type]


def test_malformed_data_urls():
    with pytest.raises(ImageError, match="no ','"):
        read_source("data:image/png;base64")
    with pytest.raises(ImageError, match="not valid base64"):
        read_source("data:image/png;base64,!!!!")
    with pytest.raises(ImageError, match="not an image type"):
        read_source("data:text/plain;base64," + base64.b64encode(encode(RED)).decode())


def test_empty_inputs():
    for source in (b"", "data:image/png;base64,"):
        with pytest.raises(ImageError, match="empty"):
            load_image(source)


def test_oversized_bytes_are_refused_before_decoding():
    limits = ImageLimits(max_bytes=100)
    data = encode(Image.new("RGB", (64, 64), (1, 2, 3)), "PPM")  # 12 kB
    with pytest.raises(ImageError, match="over the limit of 100 bytes"):
        read_source(data, limits=limits)
    with pytest.raises(ImageError, match="over the limit of 100 bytes"):
        read_source("data:image/png;base64," + base64.b64encode(data).decode(), limits=limits)


def test_oversized_dimensions_are_refused_from_the_header():
    # 100000 x 100000 RGB would be 30 GB of pixels; the header alone must reject it.
    with pytest.raises(ImageError, match="too many pixels, over the limit of 8192 pixels per side"):
        decode_image(png_header_only(100_000, 100_000))  # PIL's own bomb guard fires first
    with pytest.raises(ImageError, match="9000x10 pixels is over the limit of 8192 pixels per side"):
        decode_image(png_header_only(9000, 10))
    with pytest.raises(ImageError, match="over the limit of 16 pixels per side"):
        decode_image(encode(RED.resize((17, 3))), limits=ImageLimits(max_side=16))


def test_corrupt_truncated_and_non_image_inputs():
    with pytest.raises(ImageError, match="not an image"):
        decode_image(b"hello, I am text, not pixels")
    with pytest.raises(ImageError, match="corrupt or truncated PNG"):
        decode_image(encode(Image.effect_noise((64, 64), 50))[:200])
    with pytest.raises(ImageError, match="corrupt or truncated PNG"):
        decode_image(png_header_only(64, 64))  # a valid header, too little pixel data


def test_zero_size_header_is_refused():
    with pytest.raises(ImageError, match="corrupt PNG header"):
        decode_image(png_header_only(0, 10))


def test_formats_outside_the_recipe_set_are_refused():
    with pytest.raises(ImageError, match="unsupported image format BMP"):
        decode_image(encode(RED, "BMP"))
    for fmt in ("JPEG", "WEBP", "GIF"):
        assert decode_image(encode(RED, fmt)).size == (5, 3)


def test_transparency_is_blended_onto_fdfdfd():
    rgba = np.array([[[255, 0, 0, 0], [255, 0, 0, 255], [255, 0, 0, 128]]], dtype=np.uint8)
    image = decode_image(encode(Image.fromarray(rgba)))
    # (v * a + 253 * (255 - a) + 127) // 255: a = 128 -> red (32640 + 32131 + 127) // 255 = 254,
    # green/blue (0 + 32131 + 127) // 255 = 126.
    assert [image.getpixel((x, 0)) for x in range(3)] == [(253, 253, 253), (255, 0, 0), (254, 126, 126)]


def test_sixteen_bit_grey_scales_to_eight_bits():
    grey = np.array([[0, 257 * 100, 65535]], dtype=np.uint16)
    image = decode_image(encode(Image.fromarray(grey)))
    assert [image.getpixel((x, 0)) for x in range(3)] == [(0, 0, 0), (100, 100, 100), (255, 255, 255)]


def test_a_batch_names_the_bad_image():
    good = encode(RED)
    with pytest.raises(Ds41Error, match=r"image\[1\]: not an image"):
        preprocess_images([good, b"garbage", good])
