"""The Engram table formats are declared once (`formats/engram.py`) and every module that names,
checks, sizes or decodes a table takes them from there.

Two checks: the other modules' views agree with the registry (the manifest's table tensors, the
planner's row sizes, the table loader's format detection, the converter's output tensors), and
none of them spells a format name, a table part or a table dtype as a literal of its own (the
way a second definition starts)."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
import torch

from sglang_ds41.checkpoint import manifest
from sglang_ds41.config import V41Config
from sglang_ds41.engram import plan
from sglang_ds41.engram.table import EngramTable
from sglang_ds41.formats import engram as registry
from sglang_ds41.formats.engram import ENGRAM_FORMATS, FP8, MXFP4, NVFP4

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sglang_ds41"
FORMATS = list(ENGRAM_FORMATS.values())

# Every module that handles Engram tables, whole (the registry itself excepted).
READERS = [
    "engram/table.py",
    "engram/gather.py",
    "engram/plan.py",
    "engram/split_gather.py",
    "plugin/tables/embedding.py",
    "plugin/tables/checkpoint_formats.py",
    "commands/convert_engram.py",
    "commands/engram_plan.py",
    *sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "checkpoint" / "convert").glob("*.py")),
]
# The registry's facts as literals: format names, part names, the dtypes a table part is stored as.
SPELLINGS = {f.name for f in FORMATS} | {p.name for f in FORMATS for p in f.parts} | {
    d for f in FORMATS for p in f.parts for d in p.accepted
}


def _literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants that are code, not docstrings."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


@pytest.mark.parametrize("module", READERS)
def test_no_module_spells_a_format_part_or_dtype_itself(module):
    tree = ast.parse((PACKAGE / module).read_text())
    found = [f"line {line}: {value!r}" for line, value in _literals(tree) if value in SPELLINGS]
    assert not found, f"sglang_ds41/{module} spells Engram format facts itself: {found}"


@pytest.mark.parametrize("function", [manifest.engram_table_formats, manifest._Builder.engram_table])
def test_the_manifest_s_table_code_takes_them_from_the_registry(function):
    tree = ast.parse(inspect.getsource(function).strip())
    assert not [value for _, value in _literals(tree) if value in SPELLINGS]


def test_the_reader_list_covers_every_module_that_touches_table_tensors():
    # a new module that names a table's parts joins READERS (or reads them from the registry)
    touching = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(
            value in {NVFP4.scales.name, NVFP4.global_scale.name}
            for _, value in _literals(ast.parse(p.read_text()))
        )
    }
    # formats/nvfp4.py and the manifest's NVFP4 linears: ModelOpt's names, which NVFP4 tables borrow
    assert touching <= {"formats/engram.py", "formats/nvfp4.py", "checkpoint/manifest.py"}


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_manifest_declares_each_table_as_the_registry_does(fmt):
    data = json.loads((ROOT / "tests" / "fixtures" / "official_config.json").read_text())
    if fmt is not FP8:
        data["quantization_config"].update(engram_embed_quant=fmt.name)
    m = manifest.build_manifest(V41Config.from_dict(data, source="test"))
    rows = m.by_name["layers.1.engram.embed.weight"].shape[0]
    specs = {s.name: s for s in m if s.group == manifest.ENGRAM_TABLES and s.name.startswith("layers.1.")}
    want = {
        registry.tensor_name("layers.1.engram", part): (part.dtype, shape)
        for part, shape in fmt.shapes(rows, 256).items()
    }
    assert {name: (s.dtype, s.shape) for name, s in specs.items()} == want
    assert all(manifest.table_format(s) is fmt for s in specs.values())
    for spec in specs.values():
        part = next(p for p in fmt.parts if p.name == spec.role)
        assert all(spec.accepts(d, spec.shape) for d in part.accepted)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_planner_and_the_table_size_rows_as_the_registry_does(fmt):
    assert plan.format_named(fmt.name).bytes_per_row == fmt.bytes_per_row(256)
    assert plan.format_named(fmt.name).bytes_per_table == fmt.bytes_per_table
    assert fmt.bytes_per_row(256) == {FP8: 264, MXFP4: 136, NVFP4: 144}[fmt]  # MODEL.md §8.4


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_table_detects_each_format_from_the_registry_s_tensors(fmt):
    shapes = fmt.shapes(8, 64)
    weight = torch.zeros(shapes[fmt.values], dtype=fmt.values.torch_dtype())
    scale = torch.full(shapes[fmt.scales], 0x30, dtype=torch.uint8).view(fmt.scales.torch_dtype())
    global_scale = None if fmt.global_scale is None else torch.tensor(0.5)
    table = EngramTable.from_tensors(weight, scale, head_dim=64, global_scale=global_scale)
    assert table.fmt.format is fmt and table.nbytes == 8 * fmt.bytes_per_row(64)


def test_unknown_format_names_are_refused_with_the_known_ones():
    with pytest.raises(registry.FormatError, match=r"'int4'.*\['fp8', 'mxfp4', 'nvfp4'\]"):
        registry.engram_format("int4")
