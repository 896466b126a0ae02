"""Background processes and persistent shell sessions."""

from __future__ import annotations

import time

import pytest

import sandtree


def _wait_for_output(process: sandtree.Process, expected: bytes, timeout: float = 10.0) -> sandtree.ProcessOutput:
    deadline = time.monotonic() + timeout
    while True:
        out = process.output()
        if expected in out.stdout or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def test_spawn_output_and_exit(sandbox: sandtree.Sandbox) -> None:
    process = sandbox.spawn("echo first; echo oops >&2; sleep 0.3; echo second; exit 7")
    assert process.pid > 0
    assert process.cmd == ("/bin/sh", "-c", "echo first; echo oops >&2; sleep 0.3; echo second; exit 7")
    final = process.wait(timeout=10)
    assert final.process.running is False
    assert final.process.exit_code == 7
    assert final.stdout == b"first\nsecond\n"
    assert final.stderr == b"oops\n"


def test_spawn_kill_with_a_signal(sandbox: sandtree.Sandbox) -> None:
    process = sandbox.spawn(["sh", "-c", "echo ready; exec sleep 60"])
    out = _wait_for_output(process, b"ready")
    assert out.process.running
    assert [p.pid for p in sandbox.processes()] == [process.pid]
    process.kill(15)
    final = process.wait(timeout=10)
    assert final.process.signal == 15
    assert final.process.exit_code is None
    assert final.stdout == b"ready\n"


def test_wait_times_out(sandbox: sandtree.Sandbox) -> None:
    process = sandbox.spawn(["sleep", "30"])
    with pytest.raises(sandtree.ClientTimeoutError):
        process.wait(timeout=0.2)
    process.kill()
    assert process.wait(timeout=10).process.signal == 9


def test_spawn_with_stdin_bytes(sandbox: sandtree.Sandbox) -> None:
    process = sandbox.spawn(["od", "-An", "-tx1"], stdin=b"\x00\xff")
    assert process.wait(timeout=10).stdout.split() == [b"00", b"ff"]


def test_session_keeps_cwd_and_variables(sandbox: sandtree.Sandbox) -> None:
    with sandbox.session() as session:
        assert session.run("cd /tmp && COUNT=41").check().exit_code == 0
        assert session.run("COUNT=$((COUNT + 1)); export COUNT").ok
        assert session.run("greet() { echo hello $1; }").ok
        result = session.run('echo "$COUNT $(pwd)"; greet you')
        assert result.text == "42 /tmp\nhello you\n"
        assert session.run("false").exit_code == 1
        assert [s.id for s in sandbox.sessions()] == [session.id]
    assert sandbox.sessions() == []


def test_session_options_and_binary_output(sandbox: sandtree.Sandbox) -> None:
    with sandbox.session(cwd="/etc", env={"MARK": "x1"}) as session:
        assert session.run("echo $MARK $(pwd)").text == "x1 /etc\n"
        raw = session.run("printf '\\377\\000\\001'")
        assert raw.output == b"\xff\x00\x01"


def test_session_timeout_interrupts_and_the_shell_goes_on(sandbox: sandtree.Sandbox) -> None:
    with sandbox.session() as session:
        session.run("X=kept")
        result = session.run("sleep 20", timeout=0.3)
        assert result.timed_out
        assert not result.ok
        assert session.run("echo $X").text == "kept\n"
