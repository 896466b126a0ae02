"""Commands: exit codes, exact bytes both ways, streaming, limits."""

from __future__ import annotations

import hashlib
import io
import os

import pytest

import sandtree
from sandtree import ExitEvent, StartedEvent, StderrEvent, StdoutEvent


def test_exit_code_and_output(sandbox: sandtree.Sandbox) -> None:
    result = sandbox.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert result.exit_code == 3
    assert result.signal is None
    assert result.stdout == b"out\n"
    assert result.stderr == b"err\n"
    assert not result.ok
    assert result.pid > 0


def test_string_command_runs_through_sh(sandbox: sandtree.Sandbox) -> None:
    result = sandbox.exec("x=6; echo $((x * 7)) | tr 4 f")
    assert result.ok
    assert result.text == "f2\n"


def test_env_cwd_and_user(sandbox: sandtree.Sandbox) -> None:
    result = sandbox.exec(["sh", "-c", 'echo "$GREETING $(pwd) $(id -u)"'], env={"GREETING": "hi"}, cwd="/tmp")
    assert result.check().stdout_text == "hi /tmp 0\n"
    nobody = sandbox.exec(["id", "-u"], user="nobody").check()
    assert nobody.text.strip() == "65534"


def test_binary_output_is_exact(sandbox: sandtree.Sandbox) -> None:
    # Every byte value, invalid UTF-8 included, comes back as written.
    result = sandbox.exec(["python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)) * 4)"])
    assert result.check().stdout == bytes(range(256)) * 4


def test_binary_stdin_round_trip(sandbox: sandtree.Sandbox) -> None:
    data = os.urandom(300_000) + b"\x00\xff\xfe" + bytes(range(256))
    echoed = sandbox.exec(["cat"], stdin=data).check()
    assert echoed.stdout == data
    digest = sandbox.exec(["sha256sum"], stdin=data).check()
    assert digest.text.split()[0] == hashlib.sha256(data).hexdigest()


def test_text_stdin(sandbox: sandtree.Sandbox) -> None:
    assert sandbox.exec(["wc", "-l"], stdin="a\nb\nc\n").check().text.strip() == "3"


def test_large_stdin_streams_from_a_file_object(sandbox: sandtree.Sandbox) -> None:
    data = os.urandom(20 * 1024 * 1024)
    result = sandbox.exec(["sha256sum"], stdin=io.BytesIO(data)).check()
    assert result.text.split()[0] == hashlib.sha256(data).hexdigest()


def test_timeout_kills_the_command(sandbox: sandtree.Sandbox) -> None:
    result = sandbox.exec(["sleep", "10"], timeout=0.3)
    assert result.timed_out
    assert result.exit_code is None
    assert result.signal == 9
    assert result.duration_ms < 5000
    with pytest.raises(sandtree.CommandError, match="timed out"):
        result.check()


def test_max_output_bytes_truncates(sandbox: sandtree.Sandbox) -> None:
    result = sandbox.exec(["sh", "-c", "head -c 100000 /dev/zero"], max_output_bytes=1000)
    assert result.ok
    assert result.stdout == b"\x00" * 1000
    assert result.stdout_truncated
    assert not result.stderr_truncated


def test_check_raises_with_the_result(sandbox: sandtree.Sandbox) -> None:
    with pytest.raises(sandtree.CommandError) as info:
        sandbox.exec("echo boom >&2; exit 4").check()
    assert info.value.code == "command_failed"
    assert "exited 4" in info.value.message and "boom" in info.value.message
    assert isinstance(info.value.result, sandtree.ExecResult)
    assert info.value.result.exit_code == 4


def test_missing_program_exits_127(sandbox: sandtree.Sandbox) -> None:
    result = sandbox.exec(["no-such-program"])
    assert result.exit_code == 127
    assert b"not found" in result.stderr


def test_stream_events_in_order(sandbox: sandtree.Sandbox) -> None:
    events = list(sandbox.exec_stream("printf one; sleep 0.2; printf two >&2; sleep 0.2; printf three; exit 5"))
    assert isinstance(events[0], StartedEvent) and events[0].pid > 0
    assert isinstance(events[-1], ExitEvent)
    assert events[-1].result.exit_code == 5
    middle = [(e.type, e.data) for e in events[1:-1] if isinstance(e, (StdoutEvent, StderrEvent))]
    assert len(middle) == len(events) - 2
    assert b"".join(d for t, d in middle if t == "stdout") == b"onethree"
    assert b"".join(d for t, d in middle if t == "stderr") == b"two"
    kinds = [t for t, _ in middle]
    # stdout "one" before stderr "two" before stdout "three"
    assert kinds.index("stderr") > kinds.index("stdout")
    assert max(i for i, k in enumerate(kinds) if k == "stdout") > kinds.index("stderr")


def test_stream_binary_data(sandbox: sandtree.Sandbox) -> None:
    data = bytes(range(256)) * 64
    events = list(sandbox.exec_stream(["cat"], stdin=data))
    out = b"".join(e.data for e in events if isinstance(e, StdoutEvent))
    assert out == data
    last = events[-1]
    assert isinstance(last, ExitEvent) and last.result.ok


def test_stream_of_a_deleted_sandbox_raises(client: sandtree.Sandtree) -> None:
    sb = client.create()
    sb.delete()
    with pytest.raises(sandtree.NotFoundError) as info:
        list(sb.exec_stream(["true"]))
    assert info.value.code == "sandbox_not_found"
    assert info.value.status == 404
