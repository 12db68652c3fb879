"""The distribution's import names: ours live under `sglang_ds41`, never clashing with others."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, agents, sglang_ds41.agents, sglang_ds41.encoding
print(json.dumps({
    "agents": agents.__file__,
    "has_runner": hasattr(agents, "Runner") and hasattr(agents, "Agent"),
    "ours_agents": sglang_ds41.agents.__file__,
    "ours_encoding": sglang_ds41.encoding.__file__,
}))
"""


def test_openai_agents_and_our_agents_import_side_by_side(tmp_path: Path) -> None:
    # Run outside the repository, as an installed user would: the cwd must not shadow anything.
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    found = json.loads(out)
    assert found["has_runner"], "`import agents` must still be openai-agents"
    assert "site-packages" in found["agents"]
    assert Path(found["ours_agents"]).resolve() == REPO / "agents" / "__init__.py"
    assert Path(found["ours_encoding"]).resolve() == REPO / "encoding" / "__init__.py"


def test_cli_lists_its_subcommands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sglang_ds41", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name in ("render", "parse", "engram-plan"):
        assert name in out
