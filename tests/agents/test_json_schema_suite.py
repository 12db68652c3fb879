"""The runner's schema validation against the official JSON-Schema-Test-Suite (vendored).

Drafts 2020-12 and 7, each schema with its `$schema` declared. The suite's own `valid` flags are
the oracle. A schema may be refused at setup only for a reference to a document that is not in
it (the suite keeps those on http://localhost:1234/); every other schema must compile, and every
instance must get the suite's verdict: no crash, no false accept, no false reject.

`format`: the runner asserts it in every draft. 2020-12 makes it an annotation by default, so its
main `format.json` is checked both ways: in the spec's default mode everything passes, and in the
runner's mode exactly its "only an annotation by default" instances are refused (the deliberate
difference). `optional/format` is run with formats asserted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sglang_ds41.agents import AgentConfigError
from sglang_ds41.agents.validation import SchemaValidator

SUITE = Path(__file__).parent / "data" / "json-schema-test-suite" / "tests"
DRAFTS = {
    "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
    "draft7": "http://json-schema.org/draft-07/schema#",
}
REMOTE = "localhost:1234"
ANNOTATION_ONLY = "only an annotation by default"


def _files(draft: str, sub: str = "") -> list[Path]:
    files = sorted((SUITE / draft / sub).glob("*.json"))
    assert files, f"the vendored suite is missing under {SUITE / draft / sub}"
    return files


def _declared(schema: Any, draft: str) -> Any:
    if isinstance(schema, dict) and "$schema" not in schema:
        return {"$schema": DRAFTS[draft], **schema}
    return schema


def run_file(path: Path, draft: str, assert_formats: bool) -> dict[str, list[str]]:
    """Outcomes of every instance in one suite file: passed / false_accept / false_reject / refused."""
    out: dict[str, list[str]] = {"passed": [], "false_accept": [], "false_reject": [], "refused": []}
    for group in json.loads(path.read_text()):
        schema = _declared(group["schema"], draft)
        try:
            validator = SchemaValidator.compile(schema, "schema", assert_formats=assert_formats)
        except AgentConfigError as error:
            assert REMOTE in json.dumps(schema), (
                f"{group['description']}: a self-contained schema refused: {error}"
            )
            out["refused"].append(group["description"])
            continue
        for test in group["tests"]:
            accepted = not validator.problems(test["data"])
            name = f"{group['description']} / {test['description']}"
            if accepted == test["valid"]:
                out["passed"].append(name)
            else:
                out["false_accept" if accepted else "false_reject"].append(name)
    return out


def _ids(paths: list[tuple[str, Path]]) -> list[str]:
    return [f"{draft}/{path.name}" for draft, path in paths]


MAIN = [(draft, path) for draft in DRAFTS for path in _files(draft)]
FORMAT = [(draft, path) for draft in DRAFTS for path in _files(draft, "optional/format")]


@pytest.mark.parametrize(("draft", "path"), MAIN, ids=_ids(MAIN))
def test_main_suite_in_the_spec_default_mode(draft: str, path: Path) -> None:
    out = run_file(path, draft, assert_formats=draft != "draft2020-12")
    assert out["false_accept"] == [] and out["false_reject"] == []
    assert out["passed"] or out["refused"]


@pytest.mark.parametrize(("draft", "path"), MAIN, ids=_ids(MAIN))
def test_main_suite_with_formats_asserted_differs_only_where_2020_12_calls_format_an_annotation(
    draft: str, path: Path
) -> None:
    out = run_file(path, draft, assert_formats=True)
    assert out["false_accept"] == []
    assert all(ANNOTATION_ONLY in name for name in out["false_reject"]), out["false_reject"]
    expected = draft == "draft2020-12" and path.name == "format.json"
    assert bool(out["false_reject"]) == expected


@pytest.mark.parametrize(("draft", "path"), FORMAT, ids=_ids(FORMAT))
def test_optional_format_is_asserted(draft: str, path: Path) -> None:
    out = run_file(path, draft, assert_formats=True)
    assert out["false_accept"] == [] and out["false_reject"] == [] and out["refused"] == []
    assert out["passed"]


def test_only_remote_references_are_refused_and_they_are_all_counted() -> None:
    refused = {
        draft: sum(len(run_file(p, draft, assert_formats=True)["refused"]) for p in _files(draft))
        for draft in DRAFTS
    }
    # refRemote.json, the remote parts of dynamicRef.json, vocabulary.json's remote meta-schemas.
    assert refused == {"draft2020-12": 22, "draft7": 11}


REGEX = [
    (draft, SUITE / draft / "optional" / name)
    for draft in DRAFTS
    for name in ("ecmascript-regex.json", "non-bmp-regex.json")
]


@pytest.mark.parametrize(("draft", "path"), REGEX, ids=_ids(REGEX))
def test_optional_ecmascript_regex_patterns_have_ecma_262_semantics(draft: str, path: Path) -> None:
    out = run_file(path, draft, assert_formats=True)
    assert out["false_accept"] == [] and out["false_reject"] == [] and out["refused"] == []
    assert out["passed"]


ARABIC_DIGITS = "\u0661\u0662"  # a Unicode digit that ECMA-262's \d (ASCII only) does not take


@pytest.mark.parametrize(
    "schema",
    [
        {"patternProperties": {"^\\d+$": True}, "additionalProperties": False},
        {"patternProperties": {"^\\d+$": True}, "unevaluatedProperties": False},
        {"allOf": [{"patternProperties": {"^\\d+$": True}}], "unevaluatedProperties": False},
    ],
    ids=["additionalProperties", "unevaluatedProperties", "unevaluated-through-allOf"],
)
def test_what_patterns_leave_to_other_keywords_is_decided_by_ecma_262_too(schema: dict) -> None:
    validator = SchemaValidator.compile(schema, "schema")
    assert not validator.problems({"12": 1})
    assert validator.problems({ARABIC_DIGITS: 1})
