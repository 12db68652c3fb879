"""Reading the constraints files (`constraints/*.txt`) against requirement lists, for the
environment tests: one exact pin per line, judged on the platform the pins were resolved for."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]

# The platform both constraints files were resolved for: CPython 3.11 on linux x86_64.
TARGET = {
    "python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
    "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
    "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": "",
}  # fmt: skip


def read_pins(path: Path) -> dict[str, str]:
    """{canonical name: version} of a constraints file; anything but one exact pin per name fails."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not an exact pin"
            assert canonicalize_name(name) not in found, f"{name} pinned twice"
            found[canonicalize_name(name)] = version
    return found


def applicable(requirements: Iterable[str]) -> list[Requirement]:
    """The requirements whose markers hold on `TARGET`."""
    reqs = [Requirement(r) for r in requirements]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET)]


def assert_pinned_compatibly(
    requirements: Iterable[Requirement], pinned: dict[str, str], where: str, who: str
) -> None:
    """Each requirement is pinned in `where` at a version its specifier accepts."""
    for req in requirements:
        name = canonicalize_name(req.name)
        assert name in pinned, f"{who} requires {req}, which {where} does not pin"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{where} pins {name}=={pinned[name]}, {who} requires {req}"
        )
