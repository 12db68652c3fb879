"""Not imported as a package: `sglang-ds41 serve` puts this folder itself on the server's
PYTHONPATH so that its `sitecustomize.py` runs in every server process."""
