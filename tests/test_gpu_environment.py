"""The GPU environment (`pip install '.[gpu]' -c constraints/gpu-cu13.txt`, scripts/setup-gpu.sh)
pins everything upstream SGLang 0.5.23 declares, at versions its own requirements accept.

The oracle is the installed sglang wheel's own metadata (its `Requires-Dist`), evaluated for the
platform the constraints were resolved for (CPython 3.11, linux x86_64)."""

from __future__ import annotations

import tomllib
from importlib.metadata import distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints" / "gpu-cu13.txt"
TARGET = {
    "python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
    "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
    "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": "",
}  # fmt: skip


def pins() -> dict[str, str]:
    found = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{CONSTRAINTS.name}: {line!r} is not an exact pin"
            assert canonicalize_name(name) not in found, f"{name} pinned twice"
            found[canonicalize_name(name)] = version
    return found


def applicable(requirements: list[str]) -> list[Requirement]:
    reqs = [Requirement(r) for r in requirements]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET)]


def test_every_sglang_requirement_is_pinned_to_a_version_it_accepts():
    pinned = pins()
    required = applicable(distribution("sglang").requires or [])
    assert len(required) > 60  # the whole CUDA stack, not a slim subset
    for req in required:
        name = canonicalize_name(req.name)
        assert name in pinned, f"sglang requires {req}, which {CONSTRAINTS.name} does not pin"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{CONSTRAINTS.name} pins {name}=={pinned[name]}, sglang 0.5.23 requires {req}"
        )
    for kernel in ("sglang-kernel", "flashinfer-python", "sgl-deep-gemm", "sgl-flash-mla", "tilelang"):
        assert canonicalize_name(kernel) in pinned


def test_gpu_extra_and_our_own_requirements_are_pinned_compatibly():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = pins()
    assert pinned["sglang"] == "0.5.23" and pinned["torch"] == "2.14.1"
    for req in applicable(project["dependencies"] + project["optional-dependencies"]["gpu"]):
        name = canonicalize_name(req.name)
        assert name in pinned, f"sglang-ds41 requires {req}, which {CONSTRAINTS.name} does not pin"
        assert req.specifier.contains(pinned[name], prereleases=True), f"{name}=={pinned[name]} vs {req}"
