"""sglang-ds41: DeepSeek-V4.1-Flash on SGLang, its prompt format, and an agent runner.

Sub-packages, from the format up to the servers (README, Layout, has the tree):

* `encoding` -- the V4.1 prompt format and output parsing (folder `encoding/` at the
  repository root, mapped here by pyproject.toml's `package-dir`);
* `agents` -- the agent runner over the OpenAI client (folder `agents/`, mapped the same way);
* `formats` -- FP8 / MXFP4 / NVFP4 / KV quantisers, and the Engram table formats (`formats.engram`);
* `checkpoint` -- the official layout (manifest), the validating reader, the loader, make-tiny,
  the scripted test checkpoint, convert-engram (`checkpoint.convert`);
* `engram` -- token map, n-gram hashing, the table store and its TP shards, the gate;
* `model` -- the model's math, written once (mHC, RoPE/YaRN, attention, MoE, ViT);
* `reference` -- the pure-PyTorch runtime over `model` (the oracle); `fast` -- compiled fast
  paths of `model`, each equal to its oracle;
* `training` -- the trainer over `model` (batched, differentiable), its synthetic agent corpus
  and the export of the trained tiny model (docs/TRAINING.md);
* `vision` -- image loading and preprocessing;
* `backend` -- the model SGLang imports on the CPU engine (slot-indexed state, TP, weights);
* `serve` -- the launcher behind `sglang-ds41 serve`, its launch hooks and CPU shim;
* `plugin` -- the SGLang plugin for upstream's V4.1 model (`tables`, `serving`);
* `commands` -- one module per `sglang-ds41` subcommand (`cli`);
* `assets` -- the real V4.1 tokenizer.

Modules: `cli`, `config` (the V4.1 config as typed objects), `errors` (`Ds41Error`),
`cache` (what is built once and reused, and where), `install` (what a command needs beyond
the base install, as the exact pip command).
"""

__version__ = "0.1.0"
