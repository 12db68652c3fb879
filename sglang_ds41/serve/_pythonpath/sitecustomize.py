"""Loaded at start-up by every Python process of a server that `sglang-ds41 serve` launched
(this folder is on its PYTHONPATH): installs our patches before SGLang is imported."""

from sglang_ds41.serve.launch_hooks import install

install()
