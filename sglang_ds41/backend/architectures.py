"""The architecture names (config.json `architectures[0]`) that our backend serves."""

from __future__ import annotations

# The official V4.1 checkpoints' own name: `backend/model.py`.
V41 = "DeepseekV41ForCausalLM"
# Test-only: ignores its weights and emits scripted tokens (`backend/scripted.py`).
V41_SCRIPTED = "DeepseekV41ScriptedForCausalLM"
# The scripted checkpoint's config.json field holding its scripts (`checkpoint/scripted.py`).
SCRIPT_FIELD = "ds41_scripts"

OUR_ARCHITECTURES = (V41, V41_SCRIPTED)
