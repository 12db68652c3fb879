"""Pixels for the ViT: letterbox onto the canvas, normalise, cut into patches (MODEL.md §7.1).

`preprocess_image` is the one entry point both runtimes call: the reference model's prompt
builder (`vision.expand`) and the SGLang backend's multimodal processor. It takes a source or
an already decoded picture and returns a `PreprocessedImage` (patches + grid), nothing else.

    canvas  = letterbox(image, W* x H*)         PIL ImageOps.pad, bicubic, centred, grey 127
    x       = (pixel / 255 - 0.5) / 0.5          float32 math, stored bf16
    patches = x cut into P x P tiles             row-major tiles, each [3, P, P] channel-major
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .grid import (
    LOW_DETAIL_MAX_SIDE,
    OFFICIAL_GRID,
    Detail,
    GridSpec,
    ImageGrid,
    cap_longer_side,
    resolve_grid,
)
from .load import DEFAULT_LIMITS, ImageLimits, ImageSource, load_image

if TYPE_CHECKING:
    from PIL import Image

PAD_GREY = (127, 127, 127)


@dataclass(frozen=True)
class PreprocessedImage:
    """One image ready for the vision tower."""

    patches: torch.Tensor  # [n_vit_h * n_vit_w, 3, P, P], row-major patch order
    grid: ImageGrid
    source_size: tuple[int, int]  # (width, height) of the decoded picture

    @property
    def token_count(self) -> int:
        return self.grid.token_count


def letterbox(image: Image.Image, grid: ImageGrid) -> Image.Image:
    """Scale to fit the canvas keeping the aspect ratio (bicubic), centre it on grey."""
    from PIL import ImageOps

    return ImageOps.pad(image, (grid.width, grid.height), color=PAD_GREY, centering=(0.5, 0.5))


def normalize(canvas: Image.Image, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """RGB picture -> [3, H, W] in [-1, 1]: (pixel / 255 - 0.5) / 0.5."""
    x = torch.from_numpy(np.asarray(canvas, dtype=np.float32).copy()).permute(2, 0, 1)
    return ((x / 255 - 0.5) / 0.5).to(dtype)


def patchify(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[3, H, W] -> [(H/P) * (W/P), 3, P, P]: tile (row r, column c) at index r * (W/P) + c."""
    c, h, w = x.shape
    p = patch_size
    tiles = x.reshape(c, h // p, p, w // p, p).permute(1, 3, 0, 2, 4)  # [h/p, w/p, 3, p, p]
    return tiles.reshape(-1, c, p, p)


def preprocess_image(
    image: Image.Image | ImageSource,
    spec: GridSpec = OFFICIAL_GRID,
    detail: Detail = "high",
    dtype: torch.dtype = torch.bfloat16,
    *,
    allowed_dir: str | Path | None = None,
    limits: ImageLimits = DEFAULT_LIMITS,
    what: str = "image",
) -> PreprocessedImage:
    """A picture or a source (bytes, data: URL, allowed local file) -> patches and grid."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = load_image(image, allowed_dir=allowed_dir, limits=limits, what=what)
    elif image.mode != "RGB":
        from .load import to_rgb

        image = to_rgb(image, what)
    source_size = image.size
    grid = resolve_grid(*source_size, spec=spec, detail=detail)
    if detail == "low":
        # The resolver shrinks the picture itself before fitting, so the letterbox starts from
        # the shrunken picture's (rounded) aspect ratio.
        capped = cap_longer_side(*source_size, LOW_DETAIL_MAX_SIDE)
        if capped != source_size:
            image = image.resize(capped, Image.Resampling.BICUBIC)
    patches = patchify(normalize(letterbox(image, grid), dtype), spec.patch_size)
    return PreprocessedImage(patches, grid, source_size)


def preprocess_images(
    images: Sequence[Image.Image | ImageSource],
    spec: GridSpec = OFFICIAL_GRID,
    detail: Detail = "high",
    dtype: torch.dtype = torch.bfloat16,
    *,
    allowed_dir: str | Path | None = None,
    limits: ImageLimits = DEFAULT_LIMITS,
) -> list[PreprocessedImage]:
    """All images of one request, or an `ImageError` naming the first bad one (`image[i]`)."""
    return [
        preprocess_image(
            image, spec, detail, dtype, allowed_dir=allowed_dir, limits=limits, what=f"image[{i}]"
        )
        for i, image in enumerate(images)
    ]
