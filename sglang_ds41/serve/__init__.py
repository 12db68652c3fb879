"""Starting SGLang servers for V4.1 checkpoints, apart from the model code SGLang imports.

`launcher.py` builds and runs `python -m sglang.launch_server` with the flags each engine needs
(upstream's V4.1 model with our plugin on GPUs, our `backend/` on CPUs); `_pythonpath/` holds the
`sitecustomize.py` it puts on every server process's PYTHONPATH, which installs
`launch_hooks.py` (SGLang patches for our backend) and, on CPU-only machines, the `cpu/` op
shim; `server_process.py` starts a server, waits until it answers and stops it (tests and
benchmarks use it).
"""
