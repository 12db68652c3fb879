"""Images in the prompt: sources -> pixels -> patches -> span embeddings (MODEL.md §7).

`grid` (canvas and token counts, no PIL/torch), `load` (sources and limits -> RGB),
`preprocess` (letterbox, normalise, patchify), `expand` (placeholders -> image spans with the
tower's embeddings), `weights` (the tower from a checkpoint). The tower's math lives in
`sglang_ds41.model.vision`, shared with the SGLang backend.
"""

from .expand import ImagePrompt, build_image_prompt, expand_image_ids
from .grid import OFFICIAL_GRID, GridSpec, ImageGrid, fit_once, image_token_count, resolve_grid
from .load import DEFAULT_LIMITS, ImageError, ImageLimits, decode_image, load_image, read_source
from .preprocess import PreprocessedImage, preprocess_image, preprocess_images
from .weights import load_vision_tower

__all__ = [
    "DEFAULT_LIMITS",
    "OFFICIAL_GRID",
    "GridSpec",
    "ImageError",
    "ImageGrid",
    "ImageLimits",
    "ImagePrompt",
    "PreprocessedImage",
    "build_image_prompt",
    "decode_image",
    "expand_image_ids",
    "fit_once",
    "image_token_count",
    "load_image",
    "load_vision_tower",
    "preprocess_image",
    "preprocess_images",
    "read_source",
    "resolve_grid",
]
