"""Bundled file tools: confined to the workspace root, size-limited, delete needs approval."""

from __future__ import annotations

import json
import os
import threading

import pytest
from sglang_ds41.agents import ToolContext, workspace_tools
from sglang_ds41.agents.workspace_tools import Workspace, WorkspaceError


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("hello")
    (tmp_path / "secret.txt").write_text("top secret")
    return Workspace(root, max_file_bytes=100)


def test_reads_writes_and_lists_inside_the_root(ws):
    assert ws.read("sub/a.txt") == "hello"
    assert ws.read("./sub/./a.txt") == "hello"
    assert ws.write("new/dir/b.txt", "data") == "wrote 4 bytes to new/dir/b.txt"
    assert (ws.root / "new" / "dir" / "b.txt").read_text() == "data"
    ws.write("new/dir/b.txt", "+more", append=True)
    assert ws.read("new/dir/b.txt") == "data+more"
    assert ws.listing(".") == "new/\nsub/"
    assert ws.listing("sub") == "a.txt (5 bytes)"


@pytest.mark.parametrize(
    "path", ["../secret.txt", "sub/../../secret.txt", "/etc/passwd", "~/x", "..\\secret.txt", ""]
)
def test_paths_outside_the_root_are_refused(ws, path):
    with pytest.raises(WorkspaceError):
        ws.read(path)
    with pytest.raises(WorkspaceError):
        ws.write(path, "x")


def test_symlinks_are_never_followed(ws, tmp_path):
    os.symlink(tmp_path / "secret.txt", ws.root / "link.txt")
    os.symlink(tmp_path, ws.root / "linkdir")
    with pytest.raises(WorkspaceError, match="symlinks are not followed"):
        ws.read("link.txt")
    with pytest.raises(WorkspaceError, match="symlinks are not followed"):
        ws.read("linkdir/secret.txt")
    with pytest.raises(WorkspaceError):
        ws.write("link.txt", "overwrite the target")
    with pytest.raises(WorkspaceError):
        ws.write("linkdir/new.txt", "escape")
    assert (tmp_path / "secret.txt").read_text() == "top secret"
    assert not (tmp_path / "new.txt").exists()
    assert "link.txt (symlink, not followed)" in ws.listing(".")
    ws.delete("link.txt")  # removes the link, not its target
    assert (tmp_path / "secret.txt").exists()


def test_size_limits(ws):
    (ws.root / "big.txt").write_text("x" * 101)
    with pytest.raises(WorkspaceError, match="has 101 bytes; the limit is 100"):
        ws.read("big.txt")
    with pytest.raises(WorkspaceError, match="would have 101 bytes"):
        ws.write("c.txt", "y" * 101)
    ws.write("d.txt", "z" * 60)
    with pytest.raises(WorkspaceError, match="would have 120 bytes"):
        ws.write("d.txt", "z" * 60, append=True)


def test_a_refused_write_changes_nothing(ws):
    """The size check comes before the file is opened for writing: an existing file keeps its
    content, and no empty file is left behind."""
    for append in (False, True):
        with pytest.raises(WorkspaceError, match="would have 101 bytes"):
            ws.write("sub/a.txt", "y" * 101, append=append)
        assert (ws.root / "sub" / "a.txt").read_text() == "hello"
        with pytest.raises(WorkspaceError, match="would have 101 bytes"):
            ws.write("sub/new.txt", "y" * 101, append=append)
        assert not (ws.root / "sub" / "new.txt").exists()
    ws.write("sub/a.txt", "z" * 96)
    with pytest.raises(WorkspaceError, match="would have 101 bytes"):
        ws.write("sub/a.txt", "hello", append=True)
    assert (ws.root / "sub" / "a.txt").read_text() == "z" * 96


def test_a_fifo_is_refused_without_waiting_for_a_writer(ws):
    """A named pipe in the tree: opening it must not block the tool (it would wait forever for
    the other end); it is refused as not a regular file."""
    os.mkfifo(ws.root / "pipe")
    outcomes: list[str] = []

    def attempt(operation) -> None:
        try:
            operation()
            outcomes.append("done")
        except WorkspaceError as error:
            outcomes.append(str(error))

    operations = (lambda: ws.read("pipe"), lambda: ws.write("pipe", "x"), lambda: ws.write("pipe", "x", True))
    for operation in operations:
        worker = threading.Thread(target=attempt, args=(operation,), daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), "the tool blocked on a FIFO"
    assert len(outcomes) == 3 and all("regular file" in outcome for outcome in outcomes), outcomes


def test_tool_set_has_no_shell_and_delete_needs_approval(tmp_path):
    tools = {t.name: t for t in workspace_tools(tmp_path)}
    assert set(tools) == {"list_dir", "read_file", "write_file", "append_file", "delete_file"}
    assert [n for n, t in tools.items() if t.needs_approval] == ["delete_file"]
    assert set(t.name for t in workspace_tools(tmp_path, writable=False)) == {"list_dir", "read_file"}
    call = tools["write_file"].prepare("c", '{"path": "n.txt", "content": "hi"}')
    assert tools["write_file"].invoke(call.kwargs, ToolContext("c", "write_file")) == "wrote 2 bytes to n.txt"


def test_a_file_name_that_is_not_utf8_is_listed_and_the_run_goes_on(serve, tmp_path):
    """Attack: a file planted with a name that is not UTF-8. Python lists it with a lone
    surrogate, which no request body or UTF-8 log line can hold: the run used to fail with an
    encoding error as the tool result reached its log. The listing shows the byte escaped, the
    model gets it, and the run log reads back whole."""
    from sglang_ds41.agents import Agent, Runner
    from sglang_ds41.agents.log import read_log
    from sglang_ds41.agents.testing import Reply, by_turn

    from .conftest import fast_policies

    root = tmp_path / "ws"
    root.mkdir()
    (root / os.fsdecode(b"\xffbad.txt")).write_bytes(b"x")
    seen: list[str] = []

    def script(body, index):
        seen.extend(m["content"] for m in body["messages"] if m["role"] == "tool")
        return by_turn(
            [Reply(tool_calls=[("list_dir", {"path": "."})]), Reply(content="listed")]
        )(body, index)

    agent = Agent(name="w", tools=workspace_tools(root, writable=False), policies=fast_policies())
    result = Runner.run_sync(agent, "list it", base_url=serve(script).base_url, run_dir=tmp_path / "run")
    assert result.final_output == "listed"
    assert seen == ["\\xffbad.txt (1 bytes)"]
    finished = [e for e in read_log(tmp_path / "run") if e.type == "tool_finished"]
    assert "\\xffbad.txt (1 bytes)" in json.dumps([e.data for e in finished])


def test_tool_results_and_the_run_log_hold_any_python_text(tmp_path):
    """A tool may return text with a lone surrogate (its own bytes decoded with
    surrogateescape): the model gets it escaped; the log keeps any event's text exactly."""
    from sglang_ds41.agents.events import Event
    from sglang_ds41.agents.log import EventLog, read_log
    from sglang_ds41.agents.tools import result_text

    assert result_text("a\udcffb") == "a\\udcffb" and result_text({"k": "\ud800"}) == '{"k": "\\ud800"}'
    assert result_text("plain ü") == "plain ü"
    log = EventLog(tmp_path, resume=False)
    log.append(Event("note", {"text": "a\udcffb ü"}))
    log.append(Event("note", {"text": "next"}))
    log.close()
    assert [e.data["text"] for e in read_log(tmp_path)] == ["a\udcffb ü", "next"]
