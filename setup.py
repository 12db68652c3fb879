"""Package list for setuptools: `encoding/` and `agents/` are mapped into `sglang_ds41` (see pyproject)."""

from setuptools import find_packages, setup


def mapped(folder: str, namespace: str) -> list[str]:
    return [namespace] + [f"{namespace}.{sub}" for sub in find_packages(folder)]


setup(
    packages=find_packages(include=["sglang_ds41", "sglang_ds41.*"])
    + mapped("encoding", "sglang_ds41.encoding")
    + mapped("agents", "sglang_ds41.agents"),
)
