"""Event log and resume: kill the runner at every event boundary and resume.

The runner kills itself with SIGKILL right after the N-th event is on disk
(SGLANG_DS41_AGENT_KILL_AFTER_EVENT); the child is forked from the test process, which keeps the
scripted server. `by_turn` makes the server's answers depend only on the conversation, as a
deterministic model would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_ds41.agents import ApproveWith, RunLogError, Runner
from sglang_ds41.agents.log import KILL_ENV, EventLog, log_path, read_log
from sglang_ds41.agents.testing import by_turn
from sglang_ds41.agents.tool_turn import INTERRUPTED

from .crash_agent import SCRIPT, make_agent

REPO = Path(__file__).resolve().parents[2]


def run_killed(
    base_url: str, run_dir: Path, notes: Path, kill_after: int, idempotent: bool = True, approval=None
) -> int:
    """Run in a forked child that SIGKILLs itself after event `kill_after`; its wait status."""
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.environ[KILL_ENV] = str(kill_after)
            agent = make_agent(str(notes), idempotent=idempotent, approval=approval)
            Runner.run_sync(agent, "go", base_url=base_url, run_dir=run_dir)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.fixture
def reference(serve, tmp_path):
    """An uninterrupted run: (result, number of events, notes file lines)."""
    server = serve(by_turn(SCRIPT))
    notes = tmp_path / "ref-notes"
    result = Runner.run_sync(make_agent(str(notes)), "go", base_url=server.base_url, run_dir=tmp_path / "ref")
    return result, len(read_log(tmp_path / "ref")), notes.read_text().splitlines()


def test_resume_after_a_kill_at_every_event_boundary(serve, tmp_path, reference):
    expected, n_events, expected_notes = reference
    assert n_events == 14  # started, 3 reminders, 3 responses, 3 starts, 3 results, finished
    assert sorted(expected_notes) == ["call_0_0 A", "call_0_1 B", "call_1_0 C"]
    server = serve(by_turn(SCRIPT))
    for kill_after in range(1, n_events + 1):
        run_dir, notes = tmp_path / f"run{kill_after}", tmp_path / f"notes{kill_after}"
        status = run_killed(server.base_url, run_dir, notes, kill_after)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, kill_after
        assert len(read_log(run_dir)) == kill_after
        result = Runner.resume_sync(make_agent(str(notes)), run_dir, base_url=server.base_url)
        assert result.messages == expected.messages, f"transcript differs after a kill at event {kill_after}"
        assert result.final_output == expected.final_output
        lines = notes.read_text().splitlines()
        assert sorted(lines) == sorted(expected_notes), (
            f"side effects after a kill at event {kill_after}: {lines}"
        )


def test_a_started_call_of_a_non_idempotent_tool_gets_an_explicit_result_and_never_reruns(serve, tmp_path):
    server = serve(by_turn(SCRIPT))
    run_dir, notes = tmp_path / "run", tmp_path / "notes"
    status = run_killed(server.base_url, run_dir, notes, kill_after=4, idempotent=False)
    assert os.WTERMSIG(status) == signal.SIGKILL
    assert [e.type for e in read_log(run_dir)][-1] == "tool_started"
    result = Runner.resume_sync(make_agent(str(notes), idempotent=False), run_dir, base_url=server.base_url)
    tool_results = {m["tool_call_id"]: m["content"] for m in result.messages if m["role"] == "tool"}
    assert tool_results["call_0_0"] == INTERRUPTED
    assert tool_results["call_0_1"] == "noted B"
    assert sorted(notes.read_text().splitlines()) == ["call_0_1 B", "call_1_0 C"]  # A: at most once
    assert [e.type for e in read_log(run_dir)].count("run_resumed") == 1


def test_an_approval_given_before_a_crash_is_kept_and_never_asked_again(serve, tmp_path):
    server = serve(by_turn(SCRIPT))
    run_dir, notes = tmp_path / "run", tmp_path / "notes"
    grant = ApproveWith(lambda name, arguments: True)
    status = run_killed(server.base_url, run_dir, notes, kill_after=4, approval=grant)
    assert os.WTERMSIG(status) == signal.SIGKILL
    approval = read_log(run_dir)[-1]
    assert approval.type == "approval" and approval.data["call_id"] == "call_0_0"
    assert approval.data["granted"] is True and approval.data["rule"] == "needs approval"
    asked: list[tuple[str, str]] = []

    def refuse(name, arguments, why):
        asked.append((arguments["text"], why.rule))
        return False

    result = Runner.resume_sync(
        make_agent(str(notes), approval=ApproveWith(refuse)), run_dir, base_url=server.base_url
    )
    assert asked == [("B", "needs approval"), ("C", "needs approval")]  # A's answer came from the log
    assert notes.read_text().splitlines() == ["call_0_0 A"]
    assert [(a["call_id"], a["granted"]) for a in result.approvals] == [
        ("call_0_0", True),
        ("call_0_1", False),
        ("call_1_0", False),
    ]


def test_a_run_stopped_while_the_approver_decides_has_started_no_call(serve, tmp_path):
    """Parallel calls are all approved before any is marked started, so stopping at the second
    question (Ctrl-C at `--ask`) leaves the first call to run on resume, not "interrupted"."""
    server = serve(by_turn(SCRIPT))
    run_dir, notes = tmp_path / "run", tmp_path / "notes"

    def grant_a_then_stop(name, arguments):
        if arguments["text"] == "B":
            raise KeyboardInterrupt
        return True

    agent = make_agent(str(notes), idempotent=False, approval=ApproveWith(grant_a_then_stop))
    with pytest.raises(KeyboardInterrupt):
        Runner.run_sync(agent, "go", base_url=server.base_url, run_dir=run_dir)
    assert "tool_started" not in [e.type for e in read_log(run_dir)]
    agent = make_agent(str(notes), idempotent=False, approval=ApproveWith(lambda name, arguments: True))
    result = Runner.resume_sync(agent, run_dir, base_url=server.base_url)
    assert sorted(notes.read_text().splitlines()) == ["call_0_0 A", "call_0_1 B", "call_1_0 C"]
    assert INTERRUPTED not in [m["content"] for m in result.messages if m["role"] == "tool"]


def test_resuming_a_finished_run_sends_nothing(serve, tmp_path):
    server = serve(by_turn(SCRIPT))
    first = Runner.run_sync(
        make_agent(str(tmp_path / "n")), "go", base_url=server.base_url, run_dir=tmp_path / "r"
    )
    sent = len(server.requests)
    again = Runner.resume_sync(make_agent(str(tmp_path / "n")), tmp_path / "r", base_url=server.base_url)
    assert (
        len(server.requests) == sent
        and again.messages == first.messages
        and again.final_output == first.final_output
    )


def test_a_torn_last_line_is_dropped_and_the_log_repaired(tmp_path):
    log = EventLog(tmp_path, resume=False)
    from sglang_ds41.agents.events import Event

    log.append(Event("run_started", {"messages": [], "fingerprint": {}}))
    log.close()
    with open(log_path(tmp_path), "ab") as handle:
        handle.write(b'{"seq":2,"type":"mess')
    assert [e.type for e in read_log(tmp_path)] == ["run_started"]
    EventLog(tmp_path, resume=True).append(Event("run_resumed", {}))
    lines = log_path(tmp_path).read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [1, 2]


def test_a_damaged_line_in_the_middle_is_refused(tmp_path):
    log_path(tmp_path).write_text(
        '{"seq":1,"type":"run_started","messages":[]}\nGARBAGE\n{"seq":3,"type":"x"}\n'
    )
    with pytest.raises(RunLogError, match="line 2 is not a valid event"):
        read_log(tmp_path)


def test_resume_refuses_a_log_of_another_agent(serve, tmp_path):
    server = serve(by_turn(SCRIPT))
    Runner.run_sync(make_agent(str(tmp_path / "n")), "go", base_url=server.base_url, run_dir=tmp_path / "r")
    other = dataclasses.replace(make_agent(str(tmp_path / "n")), name="someone-else")
    with pytest.raises(RunLogError, match="different agent configuration"):
        Runner.resume_sync(other, tmp_path / "r", base_url=server.base_url)


def test_a_fresh_run_refuses_a_used_run_dir(serve, tmp_path):
    server = serve(by_turn(SCRIPT))
    Runner.run_sync(make_agent(str(tmp_path / "n")), "go", base_url=server.base_url, run_dir=tmp_path / "r")
    with pytest.raises(RunLogError, match="already holds a run"):
        Runner.run_sync(
            make_agent(str(tmp_path / "n")), "go", base_url=server.base_url, run_dir=tmp_path / "r"
        )


def test_cli_run_killed_then_resumed_in_real_processes(serve, tmp_path):
    server = serve(by_turn(SCRIPT))
    notes = tmp_path / "notes"
    env = {**os.environ, "CRASH_AGENT_FILE": str(notes), KILL_ENV: "7"}
    cmd = [
        sys.executable,
        "-m",
        "sglang_ds41.cli",
        "agent",
        "tests.agents.crash_agent:make_agent",
        "--base-url",
        server.base_url,
    ]
    killed = subprocess.run(
        [*cmd, "--input", "go", "--run-dir", str(tmp_path / "r")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    del env[KILL_ENV]
    resumed = subprocess.run(
        [*cmd, "--resume", str(tmp_path / "r"), "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["final_output"] == "wrote A, B and C" and summary["tool_calls"] == 3
    assert sorted(notes.read_text().splitlines()) == ["call_0_0 A", "call_0_1 B", "call_1_0 C"]
