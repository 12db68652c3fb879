"""Our models as out-of-tree SGLang models: only what SGLang's model registry imports.

SGLang finds the models through `SGLANG_EXTERNAL_MODEL_PACKAGE=sglang_ds41.backend`: in every
scheduler and TP rank its registry imports every module of this package and registers the
classes listed in a module's `EntryClass`, by class name (`model.py`: the V4.1 model;
`scripted.py`: a test-only model with scripted output). So the modules here are the model and
what it needs (state in SGLang's pools, TP, weights, images), cheap to import and free of side
effects; they never import `reference/` or `serve/` (`tests/test_layering.py`). Starting a
server is `sglang_ds41.serve`'s job.
"""

EXTERNAL_MODEL_PACKAGE = "sglang_ds41.backend"
