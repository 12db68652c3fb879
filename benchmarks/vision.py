"""Vision CPU throughput: image preprocessing and the tiny vision tower, images/s.

    .venv/bin/python benchmarks/vision.py [--repeats 10] [--threads 1]

Measures, in one run on this machine:

* preprocess: `preprocess_image` on encoded bytes (decode + letterbox + normalise + patchify)
  with the official grid, for common photo sizes and formats, and on an already decoded
  picture (no decode), images/s and the canvas / token count it produced;
* tower: the tiny checkpoint's one-block ViT + aligner + placement (`make-tiny`, float32) on
  the tiny grid (patch 2): a 12x12 image (8 positions) and the largest the tiny cap allows,
  images/s; plus `build_image_prompt` (two images expanded into a prompt).

Writes `benchmarks/results/vision.json` and prints a short markdown table. Timings are medians
over `--repeats` calls after a warm-up call.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import PIL
import torch
from PIL import Image

from sglang_ds41.checkpoint.tiny import write_tiny
from sglang_ds41.vision.expand import build_image_prompt
from sglang_ds41.vision.grid import GridSpec
from sglang_ds41.vision.preprocess import preprocess_image
from sglang_ds41.vision.weights import load_vision_tower

RESULTS = Path(__file__).resolve().parent / "results" / "vision.json"
PHOTO_SIZES = [(640, 480, "JPEG"), (1024, 768, "PNG"), (1920, 1080, "JPEG"), (3000, 3000, "JPEG")]
TINY_SIZES = [(12, 12), (48, 40)]


def median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def photo(width: int, height: int) -> Image.Image:
    """Smooth gradients plus noise: compresses like a photo, unlike flat colour or pure noise."""
    y, x = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(0)
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))


def bench_preprocess(repeats: int) -> list[dict]:
    rows = []
    for w, h, fmt in PHOTO_SIZES:
        picture = photo(w, h)
        buf = io.BytesIO()
        picture.save(buf, fmt)
        data = buf.getvalue()
        out = preprocess_image(data)
        from_bytes = median_s(lambda data=data: preprocess_image(data), repeats)
        decoded = median_s(lambda picture=picture: preprocess_image(picture), repeats)
        rows.append({
            "size": f"{w}x{h}", "format": fmt, "bytes": len(data),
            "canvas": f"{out.grid.width}x{out.grid.height}", "tokens": out.token_count,
            "patches": out.patches.shape[0],
            "from_bytes_images_per_s": 1 / from_bytes, "decoded_images_per_s": 1 / decoded,
        })  # fmt: skip
    return rows


def bench_tower(repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_tiny(Path(tmp), seed=0)
        tower = load_vision_tower(ckpt, torch.float32)
        spec = GridSpec.from_config(tower.config)
    rows = []
    images = []
    for w, h in TINY_SIZES:
        image = preprocess_image(photo(w, h), spec, dtype=torch.float32)
        images.append(image)
        g = image.grid
        t = median_s(lambda image=image, g=g: tower(image.patches, g.n_vit_h, g.n_vit_w), repeats)
        rows.append({"size": f"{w}x{h}", "patches": g.n_patches, "tokens": image.token_count,
                     "images_per_s": 1 / t})  # fmt: skip
    image_id = 129264
    ids = [5, image_id, 6, image_id, 7]
    t = median_s(lambda: build_image_prompt(ids, images, tower, image_id), repeats)
    return {"config": "tiny (hidden 32, 1 block, patch 2)", "rows": rows, "two_image_prompt_per_s": 1 / t}


def markdown(result: dict) -> str:
    lines = [
        "| preprocess | bytes | canvas | tokens | from bytes (img/s) | decoded (img/s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["preprocess"]:
        lines.append(
            f"| {r['size']} {r['format']} | {r['bytes']} | {r['canvas']} | {r['tokens']} | "
            f"{r['from_bytes_images_per_s']:.1f} | {r['decoded_images_per_s']:.1f} |"
        )
    lines += ["", "| tiny tower | patches | tokens | img/s |", "|---|---|---|---|"]
    for r in result["tower"]["rows"]:
        lines.append(f"| {r['size']} | {r['patches']} | {r['tokens']} | {r['images_per_s']:.0f} |")
    rate = result["tower"]["two_image_prompt_per_s"]
    lines.append(f"\ntwo-image prompt expansion (tiny tower): {rate:.0f}/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {
        "machine": {"machine": platform.machine(), "processor": platform.processor(),
                    "torch": torch.__version__, "pillow": PIL.__version__,
                    "torch_threads": torch.get_num_threads()},
        "preprocess": bench_preprocess(args.repeats),
        "tower": bench_tower(args.repeats),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
