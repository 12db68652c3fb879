"""The CPU serving environment (`scripts/setup.sh`: constraints/cpu.txt, the `serve` extra and
sglang 0.5.23 installed with --no-deps) is one that sglang itself accepts.

Oracles: the installed sglang wheel's own metadata (its `Requires-Dist`), pyproject.toml, and the
environment this suite runs in (which setup.sh built from those pins)."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, distribution, version

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests._constraints import REPO, applicable, assert_pinned_compatibly, read_pins

CONSTRAINTS = REPO / "constraints" / "cpu.txt"

# sglang 0.5.23 requirements that the CPU environment leaves out, and why. The CPU backend
# serves without them (tests/integration/ starts real servers in this very environment).
NOT_NEEDED_ON_CPU = {
    # CUDA kernels, libraries and their tooling
    "cuda-python": "CUDA", "flash-attn-4": "CUDA", "flashinfer-python": "CUDA",
    "humming-kernels": "CUDA", "kernels": "CUDA kernel hub", "ninja": "kernel JIT builds",
    "nvidia-cutlass-dsl": "CUDA", "nvidia-mathdx": "CUDA", "nvidia-ml-py": "NVML",
    "nvshmem4py-cu13": "CUDA", "quack-kernels": "CUDA", "sgl-deep-ep": "CUDA",
    "sgl-deep-gemm": "CUDA", "sgl-flash-mla": "CUDA", "sglang-kernel": "CUDA", "tilelang": "CUDA",
    "torch-memory-saver": "CUDA", "torchaudio": "audio models", "torchcodec": "video models",
    # features of SGLang the V4.1 CPU backend does not use
    "anthropic": "Anthropic API front end", "blobfile": "remote weights", "build": "packaging",
    "datasets": "benchmarks", "easydict": "other models", "interegular": "outlines grammar",
    "llguidance": "llguidance grammar backend", "mistral-common": "Mistral tokenizers",
    "modelscope": "ModelScope hub", "outlines": "outlines grammar backend",
    "prometheus-client": "--enable-metrics", "py-spy": "profiling", "scipy": "other models",
    "smg-grpc-servicer": "gRPC server", "tiktoken": "tiktoken tokenizers", "timm": "other vision models",
    "tml-renderers": "other chat renderers", "watchfiles": "weight hot reload", "xxhash": "other caches",
    "zstandard": "compressed weights",
}  # fmt: skip


def pins() -> dict[str, str]:
    return read_pins(CONSTRAINTS)


def sglang_requirements() -> list[Requirement]:
    return applicable(distribution("sglang").requires or [])


def test_every_sglang_requirement_is_pinned_where_sglang_accepts_it_or_known_to_be_cuda_only():
    pinned = pins()
    assert pinned["sglang"] == "0.5.23" == version("sglang")
    names = set()
    for req in sglang_requirements():
        name = canonicalize_name(req.name)
        names.add(name)
        if name in NOT_NEEDED_ON_CPU:
            assert name not in pinned, f"{name} is pinned in {CONSTRAINTS.name} but listed as not needed"
            continue
        assert name in pinned, f"sglang requires {req}: pin it in {CONSTRAINTS.name} or say why not"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{CONSTRAINTS.name} pins {name}=={pinned[name]}, sglang 0.5.23 requires {req}"
        )
    stale = sorted(set(NOT_NEEDED_ON_CPU) - names)
    assert not stale, f"not sglang requirements (any more): {stale}"


def test_base_serve_and_test_requirements_are_pinned_compatibly():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pinned = pins()
    ours = applicable(project["dependencies"] + extras["serve"] + extras["test"])
    assert_pinned_compatibly(ours, pinned, CONSTRAINTS.name, "sglang-ds41")


def test_the_serve_extra_keeps_sglangs_own_pins():
    """The extra alone (no constraints file) must not let pip pick what sglang refuses."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ours = {canonicalize_name(Requirement(r).name): Requirement(r) for r in extras["serve"]}
    for req in sglang_requirements():
        theirs = str(req.specifier)
        name = canonicalize_name(req.name)
        if "==" in theirs or "<" in theirs:  # an exact pin or a cap of sglang's
            assert name in ours or name in NOT_NEEDED_ON_CPU, f"the serve extra lacks sglang's {req}"
            if name in ours:
                assert str(ours[name].specifier) == theirs, f"serve extra {ours[name]} vs sglang's {req}"


def test_this_environment_is_the_pinned_one():
    """What setup.sh installed is what constraints/cpu.txt says (so CI runs the tested set)."""
    wrong = {}
    for name, pinned in pins().items():
        try:
            got = version(name)
        except PackageNotFoundError:
            got = None
        if got != pinned:
            wrong[name] = (pinned, got)
    assert not wrong, f"installed versions differ from {CONSTRAINTS.name} (pinned, installed): {wrong}"
