"""Image geometry: from an image's pixel size to its canvas, ViT patch grid and LLM token grid
(MODEL.md §7.1 steps 1-3, ENCODING.md §2.9).

Pure integer/float arithmetic with no PIL and no torch, so a server can count an image's
prompt positions (`image_token_count`) from its header alone, before decoding any pixels.
`fit_once` is one pass of the spec's rule; `resolve_grid` is what the official pipeline ends
with (the recipe resolver's canvas, which SGLang's pass then keeps).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Literal

from sglang_ds41.config import VisionConfig
from sglang_ds41.errors import Ds41Error

Detail = Literal["low", "high", "auto", "original"]
DETAILS: tuple[str, ...] = ("low", "high", "auto", "original")

# deepseek-recipe's resolver (ENCODING.md §2.9): `detail: "low"` first caps the longer side at
# this many pixels (the upscale to `min_pixels` may then grow it again); the resolver re-encodes
# images as WebP, whose sides are at most 16383 px.
LOW_DETAIL_MAX_SIDE = 512
WEBP_MAX_SIDE = 16383
_FIT_ROUNDS = 10
_WEBP_ROUNDS = 6


@dataclass(frozen=True)
class GridSpec:
    """The preprocessing constants of one vision tower (`vision_config`)."""

    patch_size: int = 14
    downsample_ratio: int = 3
    max_image_tokens: int = 1024
    min_pixels: int = 295936
    max_wh_ratio: float | None = None

    @classmethod
    def from_config(cls, config: VisionConfig) -> GridSpec:
        return cls(
            config.patch_size,
            config.downsample_ratio,
            config.max_image_tokens,
            config.min_pixels,
            config.max_wh_ratio,
        )

    @property
    def cell(self) -> int:
        """Pixels per side of one LLM token (a downsample_ratio x downsample_ratio patch cell)."""
        return self.patch_size * self.downsample_ratio


OFFICIAL_GRID = GridSpec()


@dataclass(frozen=True)
class ImageGrid:
    """Where an image ends up: a `width x height` canvas cut into patches, merged into cells."""

    width: int  # canvas W*, a multiple of patch_size
    height: int  # canvas H*
    spec: GridSpec

    @property
    def n_vit_w(self) -> int:
        return self.width // self.spec.patch_size

    @property
    def n_vit_h(self) -> int:
        return self.height // self.spec.patch_size

    @property
    def n_patches(self) -> int:
        return self.n_vit_h * self.n_vit_w

    @property
    def n_w(self) -> int:
        """LLM cells per row: partial 3x3 cells at the right edge count (zero-padded)."""
        return -(-self.n_vit_w // self.spec.downsample_ratio)

    @property
    def n_h(self) -> int:
        return -(-self.n_vit_h // self.spec.downsample_ratio)

    @property
    def token_count(self) -> int:
        """Prompt positions of the image: START + n_h rows of (n_w cells + NEWLINE) + END."""
        return span_length(self.n_h, self.n_w)


def span_length(n_h: int, n_w: int) -> int:
    return n_h * (n_w + 1) + 2


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _canvas(width: int, height: int, spec: GridSpec) -> ImageGrid:
    p = spec.patch_size
    return ImageGrid(_round_up(width, p), _round_up(height, p), spec)


def _shrink(width: int, height: int, spec: GridSpec) -> ImageGrid:
    """The largest aspect-preserving canvas with at most `max_image_tokens` positions (§7.1 step 3).

    Solves n_h * (n_w + 1) + 2 = N for a grid of aspect rho = H / W; degenerate aspects get a
    single row or column of cells."""
    n, c, p = spec.max_image_tokens, spec.cell, spec.patch_size
    rho = height / width
    w_f = math.sqrt((n - 2) / rho + 0.25) - 0.5
    h_f = w_f * rho
    if w_f < 1:
        return ImageGrid(c, ((n - 2) // 2) * c, spec)
    if h_f < 1:
        return ImageGrid((n - 3) * c, c, spec)
    beta = min(math.floor(w_f) * c / width, math.floor(h_f) * c / height)
    return ImageGrid(math.floor(width * beta / p) * p, math.floor(height * beta / p) * p, spec)


def fit_once(width: int, height: int, spec: GridSpec = OFFICIAL_GRID) -> ImageGrid:
    """One pass of §7.1 steps 1-3, as SGLang's processor plans an image it receives: clamp the
    aspect (if `max_wh_ratio`), upscale to `min_pixels` (truncating), round up to the patch grid,
    shrink if over `max_image_tokens`."""
    _check_size(width, height)
    if spec.max_image_tokens < span_length(1, 2):
        raise Ds41Error(f"max_image_tokens must be at least {span_length(1, 2)}, got {spec.max_image_tokens}")
    if spec.max_wh_ratio is not None and width > height * spec.max_wh_ratio:
        width = max(1, int(height * spec.max_wh_ratio))
    if width * height < spec.min_pixels:
        scale = math.sqrt(spec.min_pixels / (width * height))
        width, height = max(1, int(width * scale)), max(1, int(height * scale))
    grid = _canvas(width, height, spec)
    if grid.token_count > spec.max_image_tokens:
        grid = _shrink(width, height, spec)
    if grid.token_count > spec.max_image_tokens:  # the closed form guarantees this never happens
        raise Ds41Error(
            f"image {width}x{height}: the shrink rule gave a {grid.width}x{grid.height} canvas with "
            f"{grid.token_count} positions, over the limit of {spec.max_image_tokens}"
        )
    return grid


def resolve_grid(
    width: int,
    height: int,
    spec: GridSpec = OFFICIAL_GRID,
    detail: Detail = "high",
    max_side: int | None = WEBP_MAX_SIDE,
) -> ImageGrid:
    """The canvas an image is letterboxed onto, as deepseek-recipe's resolver chooses it.

    The official pipeline resizes every image to this canvas (re-encoded as WebP) before SGLang's
    processor sees it, and the processor's single pass (`fit_once`) leaves it unchanged. So the
    canvas is a fixed point of `fit_once`: one pass is not always one, because a canvas can fall
    just under `min_pixels` and be upscaled again (41x1 -> 3486x84 -> ... -> 3528x84). Sides are
    kept within `max_side` (WebP's limit; None: no limit, the recipe's bare token arithmetic,
    which differs only for images more elongated than about 40:1). `detail="low"` first caps
    the longer side at `LOW_DETAIL_MAX_SIDE`; "auto" and "original" are "high" (ENCODING.md
    §2.9)."""
    if detail not in DETAILS:
        raise Ds41Error(f"image detail must be one of {list(DETAILS)}, got {detail!r}")
    _check_size(width, height)
    if detail == "low":
        width, height = cap_longer_side(width, height, LOW_DETAIL_MAX_SIDE)
    for _ in range(_WEBP_ROUNDS):
        grid = _fixed_point(width, height, spec)
        if max_side is None or max(grid.width, grid.height) <= max_side:
            return grid
        width, height = _into_limit(grid, max_side)
    raise Ds41Error(f"image {width}x{height}: no canvas within {max_side} px per side fits the token budget")


def _fixed_point(width: int, height: int, spec: GridSpec) -> ImageGrid:
    grid = fit_once(width, height, spec)
    for _ in range(_FIT_ROUNDS):
        again = fit_once(grid.width, grid.height, spec)
        if again == grid:
            return grid
        grid = again
    raise Ds41Error(f"image {width}x{height}: the canvas did not settle after {_FIT_ROUNDS} passes")


def _into_limit(grid: ImageGrid, max_side: int) -> tuple[int, int]:
    """Scale the long side down onto the patch grid within `max_side`; round the short side up
    onto the grid, so the area stays above `min_pixels` and the next pass does not regrow it."""
    p = grid.spec.patch_size
    long_side, short_side = max(grid.width, grid.height), min(grid.width, grid.height)
    new_long = max_side // p * p
    new_short = _round_up(max(1, math.floor(short_side * new_long / long_side + 0.5)), p)
    return (new_long, new_short) if grid.width >= grid.height else (new_short, new_long)


def _check_size(width: int, height: int) -> None:
    ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (width, height))
    if not ok or width < 1 or height < 1:
        raise Ds41Error(f"image size must be positive integers, got {width!r}x{height!r}")


def cap_longer_side(width: int, height: int, limit: int) -> tuple[int, int]:
    """The size after scaling the longer side down to `limit` (halves round away from zero)."""
    longer = max(width, height)
    if longer <= limit:
        return width, height
    scale = limit / longer
    return max(1, math.floor(width * scale + 0.5)), max(1, math.floor(height * scale + 0.5))


def image_token_count(
    width: int, height: int, spec: GridSpec = OFFICIAL_GRID, detail: Detail = "high"
) -> int:
    """Prompt positions one `width x height` image expands to: n_h * (n_w + 1) + 2."""
    return resolve_grid(width, height, spec, detail).token_count
