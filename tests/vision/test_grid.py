"""Image geometry against hand-computed grids (MODEL.md §7.1, ENCODING.md §2.9) and against
deepseek-recipe's resolver over a sweep of sizes and aspect ratios."""

from __future__ import annotations

import random

import pytest
from PIL import Image

from sglang_ds41.config import VisionConfig
from sglang_ds41.errors import Ds41Error
from sglang_ds41.vision.grid import GridSpec, fit_once, image_token_count, resolve_grid

from .conftest import encode

recipe = pytest.importorskip("deepseek_recipe._native")

TINY = GridSpec(patch_size=2, downsample_ratio=3, max_image_tokens=64, min_pixels=16)


def recipe_tokens(width: int, height: int) -> int:
    """The recipe's token count for an image of this size (its bare token arithmetic)."""
    info = recipe.ImageInfo(b"", width, height)
    return recipe.MultiModalData([info]).image_token_adjustment() + 1


def recipe_canvas(width: int, height: int, detail: str = "high") -> tuple[int, int]:
    """The size the recipe's image preprocessor resizes a real image of this size to."""
    data = encode(Image.new("L", (width, height), 90))
    info = recipe.OpenCvImagePreprocessor().preprocess(data, recipe.PreprocessOptions(detail, 100_000, 512))
    return info.width, info.height


# (width, height) -> canvas (W*, H*), tokens: ENCODING.md §2.9's table, recomputed by hand:
# 640x480 is over min_pixels, rounds up to 644x490 = 46x35 patches -> 16x12 cells -> 12*17+2;
# 8x8 scales by sqrt(295936/64) = 68 to 544x544 -> 546x546 = 39x39 patches -> 13*14+2;
# 3000x3000 rounds to 215x215 patches = 72*73+2 > 1024, so shrinks: w_f = sqrt(1022.25)-0.5 =
# 31.47, beta = 31*42/3000, 3000*beta/14 = 93 patches -> 1302 px, 31 cells -> 31*32+2.
SPEC_TABLE = [
    ((8, 8), (546, 546), 184),
    ((640, 480), (644, 490), 206),
    ((1024, 768), (1036, 770), 496),
    ((3000, 3000), (1302, 1302), 994),
    ((1920, 1080), (1708, 966), 968),
    ((2000, 100), (2436, 126), 179),
]
LOW_TABLE = [((640, 480), (630, 476), 194), ((1920, 1080), (728, 420), 192), ((3000, 3000), (546, 546), 184)]


@pytest.mark.parametrize(("size", "canvas", "tokens"), SPEC_TABLE)
def test_spec_table_canvas_and_token_count(size, canvas, tokens):
    grid = resolve_grid(*size)
    assert (grid.width, grid.height) == canvas
    assert grid.token_count == image_token_count(*size) == tokens
    assert fit_once(*size) == grid  # ordinary images settle in one pass


@pytest.mark.parametrize(("size", "canvas", "tokens"), LOW_TABLE)
def test_low_detail_shrinks_to_about_min_pixels(size, canvas, tokens):
    grid = resolve_grid(*size, detail="low")
    assert ((grid.width, grid.height), grid.token_count) == (canvas, tokens)


def test_grid_counts_patches_and_partial_cells():
    grid = resolve_grid(640, 480)
    assert (grid.n_vit_w, grid.n_vit_h, grid.n_patches) == (46, 35, 46 * 35)
    assert (grid.n_w, grid.n_h) == (16, 12)  # 46/3 and 35/3 rounded up: partial cells count


def test_tiny_config_grid_matches_spec_section_11():
    # §11: a 12x12 image -> 6x6 patches -> 2x2 LLM grid -> 8 image positions.
    grid = resolve_grid(12, 12, TINY)
    assert (grid.n_vit_h, grid.n_vit_w, grid.n_h, grid.n_w, grid.token_count) == (6, 6, 2, 2, 8)
    cfg = VisionConfig("deepseek_v41_vision", 1, 32, 2, 32, 2, 10000, 3, 64, 16)
    assert GridSpec.from_config(cfg) == TINY


def test_one_pass_can_fall_under_min_pixels_and_the_canvas_settles_later():
    # 41x1: x sqrt(295936/41) = 84.96 -> 3483x84 -> 3486x84 (249 patches, 83 cells): 2*84+2.
    assert (fit_once(41, 1).width, fit_once(41, 1).height, fit_once(41, 1).token_count) == (3486, 84, 170)
    # 3486*84 = 292824 < 295936, so a second pass grows it: 3504x84 -> 3514, then 3518 -> 3528
    # (252 patches, 84 cells), which is over min_pixels and stays.
    grid = resolve_grid(41, 1)
    assert (grid.width, grid.height, grid.token_count) == (3528, 84, 172)
    assert fit_once(grid.width, grid.height) == grid
    assert recipe_tokens(41, 1) == 172


def test_token_count_never_exceeds_the_cap():
    for w, h in [(1, 100_000), (100_000, 1), (50_000, 50_000), (13, 7)]:
        assert resolve_grid(w, h, max_side=None).token_count <= 1024
        assert resolve_grid(w, h).token_count <= 1024


def test_token_count_matches_recipe_over_a_sweep():
    rng = random.Random(0)
    sizes = [
        (w, h)
        for w in (1, 2, 13, 14, 15, 41, 42, 43, 544, 545, 1000, 4096)
        for h in (1, 3, 28, 480, 1080, 9000)
    ]
    sizes += [(rng.randint(1, 12_000), rng.randint(1, 12_000)) for _ in range(3000)]
    sizes += [(rng.randint(1, 60), rng.randint(1, 30_000)) for _ in range(1000)]  # elongated
    sizes += [(rng.randint(1, 30_000), rng.randint(1, 60)) for _ in range(1000)]
    wrong = [(w, h) for w, h in sizes if resolve_grid(w, h, max_side=None).token_count != recipe_tokens(w, h)]
    assert not wrong, f"{len(wrong)} sizes differ from the recipe, e.g. {wrong[:5]}"


def test_resolved_canvas_is_a_fixed_point_of_one_pass():
    rng = random.Random(1)
    for _ in range(2000):
        w, h = rng.randint(1, 20_000), rng.randint(1, 400)
        if rng.random() < 0.5:
            w, h = h, w
        grid = resolve_grid(w, h)
        assert fit_once(grid.width, grid.height) == grid, (w, h)
        assert max(grid.width, grid.height) <= 16383


@pytest.mark.parametrize("detail", ["high", "low"])
def test_canvas_matches_recipe_preprocessor(detail):
    rng = random.Random(2)
    sizes = [(2, 3000), (3000, 2), (41, 1), (2437, 59), (472, 2759), (1598, 1), (513, 512), (8, 8)]
    sizes += [(rng.randint(1, 3000), rng.randint(1, 3000)) for _ in range(12)]
    sizes += [(rng.randint(1, 60), rng.randint(1, 6000)) for _ in range(6)]
    for w, h in sizes:
        grid = resolve_grid(w, h, detail=detail)
        assert (grid.width, grid.height) == recipe_canvas(w, h, detail), (w, h)


@pytest.mark.parametrize("bad", [(0, 5), (5, -1), (2.5, 3), (True, 4)])
def test_rejects_non_positive_or_non_integer_sizes(bad):
    with pytest.raises(Ds41Error, match="positive integers"):
        resolve_grid(*bad)


def test_rejects_unknown_detail():
    with pytest.raises(Ds41Error, match="detail"):
        resolve_grid(10, 10, detail="medium")
