"""The GPU environment (`pip install '.[gpu]' -c constraints/gpu-cu13.txt`, scripts/setup-gpu.sh)
pins everything upstream SGLang 0.5.23 declares, at versions its own requirements accept.

The oracle is the installed sglang wheel's own metadata (its `Requires-Dist`), evaluated for the
platform the constraints were resolved for (CPython 3.11, linux x86_64)."""

from __future__ import annotations

import tomllib
from importlib.metadata import distribution

from packaging.utils import canonicalize_name

from tests._constraints import REPO, applicable, assert_pinned_compatibly, read_pins

CONSTRAINTS = REPO / "constraints" / "gpu-cu13.txt"


def pins() -> dict[str, str]:
    return read_pins(CONSTRAINTS)


def test_every_sglang_requirement_is_pinned_to_a_version_it_accepts():
    pinned = pins()
    required = applicable(distribution("sglang").requires or [])
    assert len(required) > 60  # the whole CUDA stack, not a slim subset
    assert_pinned_compatibly(required, pinned, CONSTRAINTS.name, "sglang 0.5.23")
    for kernel in ("sglang-kernel", "flashinfer-python", "sgl-deep-gemm", "sgl-flash-mla", "tilelang"):
        assert canonicalize_name(kernel) in pinned


def test_gpu_extra_and_our_own_requirements_are_pinned_compatibly():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = pins()
    assert pinned["sglang"] == "0.5.23" and pinned["torch"] == "2.14.1"
    ours = applicable(project["dependencies"] + project["optional-dependencies"]["gpu"])
    assert_pinned_compatibly(ours, pinned, CONSTRAINTS.name, "sglang-ds41")
