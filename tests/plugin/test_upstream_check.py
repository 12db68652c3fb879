"""The plugin refuses to hook an SGLang other than the one it is written against, naming why."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sglang_ds41.plugin import upstream


def test_installed_sglang_is_the_one_written_against():
    import sglang

    assert sglang.__version__ == upstream.SGLANG_VERSION
    assert upstream.differences(sglang.__version__) == []


def test_another_version_is_named():
    found = upstream.differences("0.5.24")
    assert found == ["sglang 0.5.24 is installed, the plugin is written against sglang==0.5.23"]


def test_a_changed_signature_and_a_changed_body_are_both_named():
    import sglang

    target = f"{upstream.EMBEDDING}._owned_rows"
    original = upstream.resolve_upstream(target)

    def _owned_rows(self, indices, extra):  # same name, one more parameter
        return original(self, indices)

    def resolve(name):
        return _owned_rows if name == target else upstream.resolve_upstream(name)

    found = upstream.differences(sglang.__version__, resolve=resolve)
    assert len(found) == 2
    assert found[0].startswith(f"{target}: signature (self, indices, extra), expected (self, indices:")
    assert found[1].startswith(f"{target}: source changed")


def test_a_missing_symbol_is_named():
    import sglang

    def resolve(name):
        if name.endswith("._sorted_host_reads"):
            raise AttributeError("module has no attribute '_sorted_host_reads'")
        return upstream.resolve_upstream(name)

    found = upstream.differences(sglang.__version__, resolve=resolve)
    assert found == [
        f"{upstream.ENGRAM}._sorted_host_reads: missing (module has no attribute '_sorted_host_reads')"
    ]


CHANGED_UPSTREAM = textwrap.dedent(
    """
    import logging, sys
    import sglang.srt.layers.engram as engram

    original = engram.EngramEmbedding
    def _owned_rows(self, indices, out=None):
        return None
    engram.EngramEmbedding._owned_rows = _owned_rows   # an SGLang whose method changed

    try:
        import sglang_ds41.plugin.tables.embedding
    except Exception as error:
        print("IMPORT:", type(error).__name__, error)

    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage() + (str(record.exc_info[1]) if record.exc_info else ""))
    logging.getLogger("sglang.srt.plugins").addHandler(Keep())
    from sglang.srt.plugins import load_plugins
    load_plugins()
    print("STILL UPSTREAM:", engram.EngramEmbedding is original)
    print("LOGGED:", any("UpstreamMismatch" in r or "cannot hook this SGLang" in r for r in records))
    """
)


def test_import_refuses_a_changed_upstream_and_sglang_keeps_its_own_class():
    result = subprocess.run(
        [sys.executable, "-c", CHANGED_UPSTREAM], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "IMPORT: UpstreamMismatch" in out and "EngramEmbedding._owned_rows: signature" in out, out
    assert "Install sglang==0.5.23" in out
    assert "STILL UPSTREAM: True" in out and "LOGGED: True" in out, out + result.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(upstream.SOURCE_DIGESTS))
def test_every_digested_method_is_also_signature_checked(name):
    assert name in upstream.SIGNATURES
