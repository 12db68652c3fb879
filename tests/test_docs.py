"""Every section reference in the repository resolves to a heading of a document in docs/.

References are written `MODEL.md §5.6`, `docs/ENCODING.md §2.9, §2.10`, `MODEL.md §4.2–4.6`,
`MODEL.md Appendix A and B` / `App. A`, `SGLANG_CPU.md §3.4`; a bare `§5.6` belongs to the last
document named earlier on the same line, else to the file's default document (docs/README.md).
No file may point at documents outside the repository (`shared/spec/...`, INTERNALS, FINDINGS).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DOCUMENTS = ("MODEL.md", "ENCODING.md", "SGLANG_CPU.md", "TRAINING.md")
EXTENSIONS = (".py", ".md", ".sh", ".toml")
SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist"}
THIS_FILE = Path(__file__).resolve()

_NUMBER = r"\d+(?:\.\d+)*"
_LETTERS = r"[A-Z](?:\s*(?:,|/|and|&)\s*[A-Z]\b)*"
# One reference: a section (optionally a range: §4.2–4.6, §2–§6) or appendices (Appendix A and B).
_ITEM = rf"(?:§\s?(?P<a>{_NUMBER})(?:\s*[–-]\s*§?(?P<b>{_NUMBER}))?|(?:Appendix|App\.)\s+(?P<app>{_LETTERS}))"
_ITEM_RE = re.compile(_ITEM)
_ITEM_PLAIN = re.sub(r"\?P<\w+>", "?:", _ITEM)  # the same, without group names, to repeat it
# A document name, then optionally a list of references (which may continue on the next line of
# a docstring or comment, or follow a Markdown link's closing brackets).
_GAP = r"[\s#*\"'`)\]]*"
_NAMED_RE = re.compile(
    rf"(?<![\w/.-])(?:docs/)?(?P<doc>MODEL|ENCODING|SGLANG_CPU|TRAINING)\.md"
    rf"(?:(?P<refs>{_GAP}{_ITEM_PLAIN}(?:\s*(?:,|/|;|and)?[\s#*]*{_ITEM_PLAIN})*)"
    rf"|\s(?P<nosign>\d+\.\d+(?:\.\d+)*)\b)?"  # "ENCODING.md 2.6", without the section sign
)
_BARE_RE = re.compile(rf"§\s?{_NUMBER}(?:\s*[–-]\s*§?{_NUMBER})?")
# Documents that are not ours: a bare § after them on the same line is theirs, not ours.
_FOREIGN_RE = re.compile(r"\bRFC\s*\d+|\b(?:INTERNALS|FINDINGS)\b")
_OUTSIDE_RE = re.compile(
    r"/work/shared\b|(?:\.\./)+shared/|(?<![\w.-])shared/(?:spec|sglang-cpu)\b|\b(?:INTERNALS|FINDINGS)\b"
)
_HEADING_RE = re.compile(rf"^#{{1,6}}\s+(?:(?P<app>Appendix\s+[A-Z])\b|(?P<num>{_NUMBER})\.?(?:\s|$))")


def headings(text: str) -> set[str]:
    """Section ids of a Markdown document: "5.6", "12", "Appendix B" (code blocks skipped)."""
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING_RE.match(line)
        if match:
            found.add(re.sub(r"\s+", " ", match["app"]) if match["app"] else match["num"])
    return found


def default_document(path: str) -> str:
    """The document a bare `§x` refers to in the file at `path` (relative, with '/')."""
    if path.startswith("docs/"):
        name = path.removeprefix("docs/")
        return name if name in DOCUMENTS else "MODEL.md"
    if path.split("/")[0] in ("encoding", "agents") or path.startswith(("tests/encoding/", "tests/agents/")):
        return "ENCODING.md"
    return "MODEL.md"


def _ids(match: re.Match) -> list[str]:
    if match["app"]:
        return [f"Appendix {letter}" for letter in re.findall(r"[A-Z]", match["app"])]
    return [n for n in (match["a"], match["b"]) if n]


def references(text: str, path: str) -> list[tuple[int, str, str | None]]:
    """(line, document, section id or None for the document itself) of every reference in `text`."""
    found: list[tuple[int, str, str | None]] = []
    claimed: set[int] = set()  # offsets of '§' already attributed to a named document
    line_of = [0]
    for i, ch in enumerate(text):
        if ch == "\n":
            line_of.append(i + 1)

    def line_at(offset: int) -> int:
        lo, hi = 0, len(line_of)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if line_of[mid] <= offset else (lo, mid)
        return lo + 1

    for named in _NAMED_RE.finditer(text):
        doc = f"{named['doc']}.md"
        line = line_at(named.start())
        if named["nosign"]:
            found.append((line, doc, named["nosign"]))
            continue
        if not named["refs"]:
            found.append((line, doc, None))
            continue
        start = named.start("refs")
        for item in _ITEM_RE.finditer(named["refs"]):
            claimed.add(start + item.start())
            found.extend((line_at(start + item.start()), doc, ref) for ref in _ids(item))

    default = default_document(path)
    for bare in _BARE_RE.finditer(text):
        if bare.start() in claimed:
            continue
        line_start = text.rfind("\n", 0, bare.start()) + 1
        before = text[line_start : bare.start()]
        names = list(re.finditer(r"(?:MODEL|ENCODING|SGLANG_CPU|TRAINING)\.md", before))
        foreign = list(_FOREIGN_RE.finditer(before))
        if foreign and (not names or foreign[-1].start() > names[-1].start()):
            continue
        doc = names[-1].group(0) if names else default
        item = _ITEM_RE.match(text, bare.start())
        assert item is not None
        found.extend((line_at(bare.start()), doc, ref) for ref in _ids(item))
    return found


def problems_in(text: str, path: str, sections: dict[str, set[str]]) -> list[str]:
    """Every unresolvable reference and every pointer outside the repository, as messages."""
    out = []
    for line, doc, ref in references(text, path):
        if doc not in sections:
            out.append(f"{path}:{line}: {doc} is not a document in docs/")
        elif ref is not None and ref not in sections[doc]:
            shown = ref if ref.startswith("Appendix") else f"§{ref}"
            out.append(f"{path}:{line}: {doc} {shown} is not a heading of docs/{doc}")
    for match in _OUTSIDE_RE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        out.append(f"{path}:{line}: {match.group(0)!r} points outside the repository (use docs/)")
    return out


def repository_files() -> list[Path]:
    files = []
    for directory, subdirs, names in os.walk(ROOT):
        subdirs[:] = [
            d for d in subdirs if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")
        ]
        files += [Path(directory, n) for n in names if n.endswith(EXTENSIONS)]
    return sorted(f for f in files if f.resolve() != THIS_FILE)


@pytest.fixture(scope="module")
def sections() -> dict[str, set[str]]:
    return {name: headings((DOCS / name).read_text(encoding="utf-8")) for name in DOCUMENTS}


def test_documents_exist_with_their_cited_sections(sections) -> None:
    assert (DOCS / "README.md").is_file()
    assert {"1.1", "4.6", "5.6", "8.6.5", "12.5", "13", "Appendix A", "Appendix B"} <= sections["MODEL.md"]
    assert {"1.1", "1.3", "2.6", "2.9", "2.11", "3", "4.2"} <= sections["ENCODING.md"]
    assert {"3.4", "6"} <= sections["SGLANG_CPU.md"]


def test_every_reference_resolves_inside_the_repository(sections) -> None:
    problems, count = [], 0
    for file in repository_files():
        text = file.read_text(encoding="utf-8", errors="replace")
        path = file.relative_to(ROOT).as_posix()
        count += len(references(text, path))
        problems += problems_in(text, path, sections)
    assert count > 100, f"only {count} references found: is the scanner broken?"
    assert not problems, "unresolved documentation references:\n" + "\n".join(problems)


def _short(text: str, path: str) -> list[str]:
    """`references` without line numbers, as "MODEL.md 5.6" / "MODEL.md Appendix A" / "MODEL.md"."""
    return sorted(f"{doc} {ref}".strip() if ref else doc for _, doc, ref in references(text, path))


@pytest.mark.parametrize(
    ("text", "path", "expected"),
    [
        ("see MODEL.md §5.6 and ENCODING.md §2.9", "sglang_ds41/x.py", ["ENCODING.md 2.9", "MODEL.md 5.6"]),
        ("(docs/MODEL.md §4.2–4.6)", "x.py", ["MODEL.md 4.2", "MODEL.md 4.6"]),
        ("(MODEL.md §5.3, §5.4, App. A)", "x.py", ["MODEL.md 5.3", "MODEL.md 5.4", "MODEL.md Appendix A"]),
        ("against MODEL.md Appendix A and B.", "x.py", ["MODEL.md Appendix A", "MODEL.md Appendix B"]),
        ('"high" (ENCODING.md\n    §2.9)."""', "sglang_ds41/v.py", ["ENCODING.md 2.9"]),
        ("# (ENCODING.md §2.1/§2.3): low", "agents/a.py", ["ENCODING.md 2.1", "ENCODING.md 2.3"]),
        ("(MODEL.md §7.1 steps 1-3, ENCODING.md §2.9)", "v.py", ["ENCODING.md 2.9", "MODEL.md 7.1"]),
        ("(MODEL.md §2–§6)", "v.py", ["MODEL.md 2", "MODEL.md 6"]),
        ("the gate (§5.6 step 5)", "sglang_ds41/e.py", ["MODEL.md 5.6"]),
        ("rejected (§2.1)", "encoding/r.py", ["ENCODING.md 2.1"]),
        (
            "rows (§7.3, ENCODING.md §2.9; §2.10)",
            "sglang_ds41/v.py",
            ["ENCODING.md 2.10", "ENCODING.md 2.9", "MODEL.md 7.3"],
        ),
        ("MODEL.md's test vectors", "README.md", ["MODEL.md"]),
        ("doubles (ENCODING.md 2.6).", "tests/x.py", ["ENCODING.md 2.6"]),
        ("# RFC 5321 §4.1.2 local part and §4.1.3 literals", "agents/f.py", []),
        (
            "[SGLANG_CPU.md](SGLANG_CPU.md) §3.4, §6",
            "docs/MODEL.md",
            ["SGLANG_CPU.md", "SGLANG_CPU.md 3.4", "SGLANG_CPU.md 6"],
        ),
    ],
)
def test_reference_grammar(text, path, expected) -> None:
    assert _short(text, path) == expected


def test_references_report_the_line_of_the_section_sign() -> None:
    assert references('x\n"high" (ENCODING.md\n    §2.9)."""', "v.py") == [(3, "ENCODING.md", "2.9")]


@pytest.mark.parametrize(
    "text",
    [
        "see MODEL.md §99.9",
        "see ENCODING.md §2.99",
        "see ENCODING.md 2.99",
        "tables (MODEL.md Appendix Z)",
        "a bare §77 in a model file",
        "read /work/shared/spec/MODEL.md",
        "read ../shared/spec/ENCODING.md",
        "(INTERNALS §3.4)",
        "see shared/sglang-cpu/FINDINGS.md",
    ],
)
def test_a_bad_reference_fails(text, sections) -> None:
    assert problems_in(text, "sglang_ds41/x.py", sections), text


def test_headings_parser() -> None:
    text = "# Title\n## 1. Config\n### 1.1 Root\n```\n## 9.9 in a code block\n```\n## Appendix B — vectors\n"
    assert headings(text) == {"1", "1.1", "Appendix B"}


def _sub_packages() -> list[str]:
    """The `sglang_ds41` sub-packages: its folders with an `__init__.py`, and the two root folders
    pyproject.toml maps into it."""
    inside = [p.parent.name for p in sorted((ROOT / "sglang_ds41").glob("*/__init__.py"))]
    return [*inside, "encoding", "agents"]


def test_the_package_docstring_and_readme_layout_name_every_sub_package() -> None:
    import sglang_ds41

    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    missing_doc = [name for name in _sub_packages() if f"`{name}`" not in sglang_ds41.__doc__]
    missing_layout = [name for name in _sub_packages() if not re.search(rf"^\s*{name}/", layout, re.M)]
    assert not missing_doc, f"sglang_ds41/__init__.py's docstring does not name {missing_doc}"
    assert not missing_layout, f"README's Layout does not list {missing_layout}"
