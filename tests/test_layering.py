"""The package layering: `backend/` is what SGLang's model registry imports in every scheduler
and TP rank, so it holds the model and nothing that starts servers or runs the reference."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import sglang_ds41

PACKAGE = Path(sglang_ds41.__file__).parent
FORBIDDEN = ("sglang_ds41.reference", "sglang_ds41.serve")


def imported_modules(path: Path, package: str) -> set[str]:
    """Every module an `import` / `from ... import` anywhere in the file names (function-level
    imports included), relative imports resolved against `package`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def is_forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


def test_no_backend_module_imports_reference_or_serve():
    offenders = {}
    for path in sorted((PACKAGE / "backend").rglob("*.py")):
        package = ".".join(path.relative_to(PACKAGE.parent).parent.parts)  # a module's or __init__'s
        bad = sorted(m for m in imported_modules(path, package) if is_forbidden(m))
        if bad:
            offenders[str(path.relative_to(PACKAGE.parent))] = bad
    assert not offenders, f"backend/ must not import reference/ or serve/: {offenders}"


def test_the_checker_sees_relative_and_function_level_imports(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from ..serve import launcher\n    import sglang_ds41.reference.model\n")
    found = imported_modules(source, "sglang_ds41.backend")
    assert "sglang_ds41.serve.launcher" in found and "sglang_ds41.reference.model" in found
    assert all(is_forbidden(m) for m in ("sglang_ds41.serve.launcher", "sglang_ds41.reference.model"))


# What SGLang's registry does with SGLANG_EXTERNAL_MODEL_PACKAGE (`import_model_classes`): import
# the package and every module in it; then report what got loaded.
_IMPORT_LIKE_SGLANG = """
import importlib, json, pkgutil, sys
package = importlib.import_module("sglang_ds41.backend")
for info in pkgutil.iter_modules(package.__path__):
    importlib.import_module(f"sglang_ds41.backend.{info.name}")
print(json.dumps(sorted(m for m in sys.modules if m.startswith("sglang_ds41"))))
"""


def test_importing_backend_as_sglang_does_loads_no_reference_or_serve_module():
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_LIKE_SGLANG], capture_output=True, text=True, check=True, timeout=300
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "sglang_ds41.backend.model" in loaded and "sglang_ds41.backend.scripted" in loaded
    assert [m for m in loaded if is_forbidden(m)] == []
    # the scripted model's scripts (test data, the adversarial ones included) are written into
    # its checkpoint; the server's processes load the model alone
    assert "sglang_ds41.checkpoint.scripted" not in loaded
