"""SGLang glue: our models as out-of-tree SGLang models, and the launch of a server for them.

SGLang finds the models through `SGLANG_EXTERNAL_MODEL_PACKAGE=sglang_ds41.backend`: its
registry imports every module of this package and registers the classes listed in a
module's `EntryClass`, by class name (`model.py`: the V4.1 model; `scripted.py`: a test-only
model with scripted output). So keep the modules here cheap to import and free of side
effects. `serve.py` starts `python -m sglang.launch_server` with the right flags; `cpu/` is
the op shim for machines without a GPU; `launch_hooks.py` patches SGLang in the server's
processes.
"""

EXTERNAL_MODEL_PACKAGE = "sglang_ds41.backend"
