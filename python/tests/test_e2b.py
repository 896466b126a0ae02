"""Sandtree's E2B door, driven by the official ``e2b`` Python SDK (2.63.0).

``sandtree daemon --e2b ADDR:PORT`` serves E2B's control plane and envd on
one listener (``crates/sandtree/src/e2b``). The SDK is used unchanged, set
up by environment variables alone, as a user of the door would:

    E2B_API_URL=http://ADDR:PORT  E2B_SANDBOX_URL=http://ADDR:PORT
    E2B_API_KEY=<the daemon's token>

(``E2B_DEBUG`` is never set: it would bypass the control plane.)

Every sandbox a test makes carries the metadata ``e2b-suite: <run>`` or is
tracked by id (forks), and is killed at the end of its test or of the module;
every snapshot made is deleted. A test of a feature the door lacks is
``xfail(strict=True)`` (none at present), so that it flips when the feature
comes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import os
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from conftest import Daemon, stop_daemon

e2b = pytest.importorskip("e2b", reason="the E2B door tests need the official e2b SDK (pip install e2b==2.63.0)")

from e2b import (  # noqa: E402
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b.sandbox.filesystem.filesystem import WriteEntry  # noqa: E402

T = TypeVar("T")

RUN = uuid.uuid4().hex[:12]
"""This run's value of the ``e2b-suite`` metadata, on every sandbox it makes."""
SUITE = {"e2b-suite": RUN}

_sandboxes: set[str] = set()
"""Ids of the sandboxes made (forks carry no metadata): killed at the end."""
_snapshots: list[str] = []
"""Ids of the snapshots made, in order: deleted (newest first) at the end."""


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def e2b_env(daemon: Daemon) -> Iterator[None]:
    """The SDK's configuration (environment only), and the final cleanup."""
    mp = pytest.MonkeyPatch()
    point_sdk_at(mp, daemon)
    for name in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_HTTP_VERSION"):
        mp.delenv(name, raising=False)
    before: set[str] = set()
    try:
        before = {s.snapshot_id for s in _all(Sandbox.list_snapshots())}
        yield
    finally:
        try:
            _cleanup(before)
        finally:
            mp.undo()


def point_sdk_at(mp: pytest.MonkeyPatch, d: Daemon) -> None:
    """The SDK's variables for daemon ``d``'s door."""
    mp.setenv("E2B_API_URL", d.e2b_url)
    mp.setenv("E2B_SANDBOX_URL", d.e2b_url)
    mp.setenv("E2B_API_KEY", d.token)


def _cleanup(before: set[str]) -> None:
    """Kills what this run made and deletes its snapshots, and the
    checkpoints the door took for its pauses and forks: every snapshot
    that was not there before this module (its tests run one at a time)."""
    ids = set(_sandboxes)
    try:
        ids |= {s.sandbox_id for s in _all(Sandbox.list(query=SandboxQuery(metadata=SUITE)))}
    except Exception:  # noqa: BLE001 (best effort)
        pass
    for sid in ids:
        try:
            Sandbox.kill(sid)
        except Exception:  # noqa: BLE001
            pass
    extra: list[str] = []
    try:
        extra = [s.snapshot_id for s in _all(Sandbox.list_snapshots()) if s.snapshot_id not in before]
    except Exception:  # noqa: BLE001
        pass
    # A snapshot another one (or a sandbox made from it) stands on may be
    # refused until that one is gone: passes, newest first, while any goes.
    left = list(reversed(list(dict.fromkeys(_snapshots + extra))))
    for _ in range(len(left)):
        refused = []
        for snap in left:
            try:
                Sandbox.delete_snapshot(snap)
            except Exception:  # noqa: BLE001
                refused.append(snap)
        if len(refused) in (0, len(left)):
            break
        left = refused


def new(**kwargs: Any) -> Sandbox:
    """A sandbox of this run (its metadata carries ``e2b-suite``)."""
    kwargs["metadata"] = {**SUITE, **kwargs.get("metadata", {})}
    kwargs.setdefault("timeout", 120)
    sbx: Sandbox = Sandbox.create(**kwargs)
    _sandboxes.add(sbx.sandbox_id)
    return sbx


def track(sbx: T) -> T:
    if isinstance(sbx, (Sandbox, AsyncSandbox)):
        _sandboxes.add(sbx.sandbox_id)
    return sbx


def forked(result: list[Sandbox | Exception]) -> list[Sandbox]:
    """The sandboxes a fork made (tracked), checked to be all it was asked for."""
    for f in result:
        track(f)
    made = [f for f in result if isinstance(f, Sandbox)]
    assert len(made) == len(result), result
    return made


def snapshot(sbx: Sandbox, name: str | None = None) -> str:
    snap = sbx.create_snapshot(name=name) if name else sbx.create_snapshot()
    _snapshots.append(snap.snapshot_id)
    return snap.snapshot_id


@pytest.fixture
def sbx() -> Iterator[Sandbox]:
    """A fresh sandbox, killed after the test."""
    s = new()
    try:
        yield s
    finally:
        Sandbox.kill(s.sandbox_id)


def _all(paginator: Any) -> list[Any]:
    items: list[Any] = []
    while paginator.has_next:
        items += paginator.next_items()
    return items


def wait_for(check: Callable[[], T], timeout: float = 5.0, interval: float = 0.05) -> T:
    """``check()``'s first truthy value within ``timeout`` seconds (else its last)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def near(a: datetime, b: datetime, seconds: float) -> bool:
    return abs((a - b).total_seconds()) <= seconds


# A process whose state lives only in its memory: a token drawn at its start
# and a counter. SIGUSR1 makes it write "<token> <counter>" to count.txt
# (atomically): the token tells the same process (or a copy of its memory)
# from one started again.
COUNTER = r"""
import os, secrets, signal, time
token, n = secrets.token_hex(8), 0
def dump(*_):
    with open("/root/count.tmp", "w") as f:
        f.write(f"{token} {n}")
    os.rename("/root/count.tmp", "/root/count.txt")
signal.signal(signal.SIGUSR1, dump)
with open("/root/counter.pid", "w") as f:
    f.write(str(os.getpid()))
while True:
    n += 1
    time.sleep(0.005)
"""


def start_counter(s: Sandbox) -> int:
    s.files.write("/root/counter.py", COUNTER)
    s.commands.run("python3 /root/counter.py", background=True, timeout=0)
    assert wait_for(lambda: s.files.exists("/root/counter.pid")), "the counter did not start"
    return int(s.files.read("/root/counter.pid"))


def probe_counter(s: Sandbox) -> tuple[str, int]:
    """The counter's (token, count), asked by SIGUSR1."""
    out = s.commands.run(
        "rm -f /root/count.txt; kill -USR1 $(cat /root/counter.pid) || exit 9; "
        "for i in $(seq 200); do [ -e /root/count.txt ] && break; sleep 0.01; done; cat /root/count.txt"
    ).stdout
    token, n = out.split()
    return token, int(n)


# ---------------------------------------------------------------- 1. lifecycle


def test_create_run_and_get_info() -> None:
    before = datetime.now(timezone.utc)
    s = new(template="base", timeout=120, metadata={"who": "test"}, envs={"FOO": "bar"})
    try:
        assert s.sandbox_id
        r = s.commands.run("echo hello $FOO")
        assert (r.stdout, r.stderr, r.exit_code, r.error) == ("hello bar\n", "", 0, None)

        for info in (s.get_info(), Sandbox.get_info(s.sandbox_id)):
            assert info.sandbox_id == s.sandbox_id
            assert info.template_id == "base"
            assert info.state == SandboxState.RUNNING
            assert info.metadata == {**SUITE, "who": "test"}
            assert info.cpu_count >= 1
            assert info.memory_mb > 0
            assert info.envd_version == "0.6.4"
            assert near(info.started_at, before, 30)
            assert abs((info.end_at - info.started_at).total_seconds() - 120) <= 2
    finally:
        assert s.kill() is True


def test_context_manager_kills_on_exit() -> None:
    with new() as s:
        sid = s.sandbox_id
        assert s.commands.run("echo inside").stdout == "inside\n"
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sid)


def test_connect_then_run_through_the_new_instance(sbx: Sandbox) -> None:
    sbx.files.write("/root/from-first.txt", "first")
    other = Sandbox.connect(sbx.sandbox_id)
    assert other.sandbox_id == sbx.sandbox_id
    assert other.commands.run("echo hi; cat /root/from-first.txt").stdout == "hi\nfirst"
    other.files.write("/root/from-second.txt", "second")
    assert sbx.files.read("/root/from-second.txt") == "second"
    assert other.is_running()


def test_envs_given_at_create_reach_a_connected_instance() -> None:
    s = new(envs={"FOO": "bar", "SPACED": "a b"})
    try:
        other = Sandbox.connect(s.sandbox_id)
        assert other.commands.run('echo "$FOO|$SPACED"').stdout == "bar|a b\n"
    finally:
        s.kill()


def test_unknown_sandbox() -> None:
    unknown = "sb-doesnotexist"
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(unknown)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(unknown)
    assert Sandbox.kill(unknown) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(unknown, 30)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics(unknown)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(unknown)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot(unknown)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork(unknown)
    assert Sandbox.delete_snapshot("ck-doesnotexist") is False


def test_unknown_template() -> None:
    with pytest.raises(SandboxException) as info:
        new(template="no-such-template-" + RUN)
    assert info.value.status_code == 404
    assert "no-such-template" in str(info.value)


def test_wrong_api_key(sbx: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", "not-the-token")
    with pytest.raises(AuthenticationException) as info:
        Sandbox.create(metadata=SUITE)
    assert "E2B_API_KEY" in str(info.value)
    with pytest.raises(AuthenticationException):
        Sandbox.get_info(sbx.sandbox_id)
    with pytest.raises(AuthenticationException):
        Sandbox.list().next_items()
    with pytest.raises(AuthenticationException):
        Sandbox.kill(sbx.sandbox_id)
    monkeypatch.undo()
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING


def test_kill() -> None:
    s = new()
    assert s.kill() is True
    assert Sandbox.kill(s.sandbox_id) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(s.sandbox_id)
    assert s.is_running() is False


def test_is_running_metrics_and_set_timeout(sbx: Sandbox) -> None:
    assert sbx.is_running() is True

    metrics = sbx.get_metrics()
    assert len(metrics) >= 1
    m = metrics[-1]
    assert m.cpu_count >= 1
    assert m.mem_total > 0
    assert 0 < m.mem_used <= m.mem_total
    assert 0 <= m.cpu_used_pct <= 100
    assert near(m.timestamp, datetime.now(timezone.utc), 30)
    # The CPU used since the last sample: a busy second shows, an idle one not.
    sbx.commands.run("timeout 1 sh -c 'while :; do :; done'; true")
    busy = sbx.get_metrics()[-1].cpu_used_pct
    assert 10 < busy <= 100, busy
    time.sleep(1)
    idle = sbx.get_metrics()[-1].cpu_used_pct
    assert idle < busy / 2, (idle, busy)

    sbx.set_timeout(60)
    assert near(sbx.get_info().end_at, datetime.now(timezone.utc) + timedelta(seconds=60), 5)
    Sandbox.set_timeout(sbx.sandbox_id, 90)
    assert near(sbx.get_info().end_at, datetime.now(timezone.utc) + timedelta(seconds=90), 5)


# ---------------------------------------------------------------- 2. list


def test_list_by_metadata() -> None:
    tag = uuid.uuid4().hex
    odd = {"key with space&=": "value w/ space & = %20"}
    mine = {new(metadata={"e2b-list": tag, **odd}).sandbox_id for _ in range(3)}
    others = {new(metadata={"e2b-list": tag + "-other"}).sandbox_id}
    try:
        listed = _all(Sandbox.list(query=SandboxQuery(metadata={"e2b-list": tag})))
        assert sorted(s.sandbox_id for s in listed) == sorted(mine)
        for s in listed:
            assert s.metadata == {**SUITE, "e2b-list": tag, **odd}
            assert s.state == SandboxState.RUNNING
            assert s.template_id == "base"
        # Both keys, the odd one escaped twice by the SDK.
        both = _all(Sandbox.list(query=SandboxQuery(metadata={"e2b-list": tag, **odd})))
        assert sorted(s.sandbox_id for s in both) == sorted(mine)
        running = _all(Sandbox.list(query=SandboxQuery(metadata={"e2b-list": tag}, state=[SandboxState.RUNNING])))
        assert sorted(s.sandbox_id for s in running) == sorted(mine)
        assert _all(Sandbox.list(query=SandboxQuery(metadata={"e2b-list": tag}, state=[SandboxState.PAUSED]))) == []
    finally:
        for sid in mine | others:
            Sandbox.kill(sid)
    assert _all(Sandbox.list(query=SandboxQuery(metadata={"e2b-list": tag}))) == []


def test_list_by_template_start_and_order() -> None:
    tag = uuid.uuid4().hex
    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    mine = []
    for _ in range(3):
        mine.append(new(metadata={"e2b-order": tag}).sandbox_id)
        time.sleep(1.1)  # (startedAt has whole seconds for the filter)
    try:
        meta = {"e2b-order": tag}
        asc = [s.sandbox_id for s in _all(Sandbox.list(query=SandboxQuery(metadata=meta), order="asc"))]
        desc = [s.sandbox_id for s in _all(Sandbox.list(query=SandboxQuery(metadata=meta), order="desc"))]
        assert asc == mine and desc == list(reversed(mine))
        assert len(_all(Sandbox.list(query=SandboxQuery(metadata=meta, template="base")))) == 3
        assert _all(Sandbox.list(query=SandboxQuery(metadata=meta, template="no-such-template"))) == []
        assert len(_all(Sandbox.list(query=SandboxQuery(metadata=meta, started_after=before)))) == 3
        later = datetime.now(timezone.utc) + timedelta(hours=1)
        assert _all(Sandbox.list(query=SandboxQuery(metadata=meta, started_after=later))) == []
    finally:
        for sid in mine:
            Sandbox.kill(sid)


def test_list_pagination() -> None:
    tag = uuid.uuid4().hex
    mine = [new(metadata={"e2b-page": tag}).sandbox_id for _ in range(3)]
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"e2b-page": tag}), limit=1)
        seen: list[str] = []
        pages = 0
        while paginator.has_next:
            page = paginator.next_items()
            pages += 1
            assert len(page) == 1
            seen += [s.sandbox_id for s in page]
            assert pages <= 3, "more pages than sandboxes"
        assert sorted(seen) == sorted(mine)
        assert len(set(seen)) == 3
        with pytest.raises(Exception, match="No more items"):
            paginator.next_items()
        page2 = Sandbox.list(query=SandboxQuery(metadata={"e2b-page": tag}), limit=2)
        assert len(page2.next_items()) == 2 and page2.has_next
        assert len(page2.next_items()) == 1 and not page2.has_next
    finally:
        for sid in mine:
            Sandbox.kill(sid)


# ---------------------------------------------------------------- 3. timeouts


def test_the_timeout_ends_the_sandbox() -> None:
    ending = new(timeout=3)
    extended = new(timeout=3)
    connected = new(timeout=3)
    shortened = new(timeout=120)
    extended.set_timeout(60)
    Sandbox.connect(connected.sandbox_id, timeout=60)
    shortened.set_timeout(3)
    assert ending.get_info().state == SandboxState.RUNNING
    time.sleep(5.5)
    for gone in (ending, shortened):
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(gone.sandbox_id)
        assert Sandbox.kill(gone.sandbox_id) is False
        assert gone.is_running() is False
    for alive in (extended, connected):
        assert alive.get_info().state == SandboxState.RUNNING
        assert alive.commands.run("echo alive").stdout == "alive\n"
        alive.kill()


def test_a_paused_sandbox_does_not_time_out() -> None:
    # E2B keeps a paused sandbox until it is resumed or killed: the timeout
    # is that of a running one.
    s = new(timeout=3)
    s.files.write("/root/kept.txt", "kept")
    assert s.pause() is True
    time.sleep(5)
    assert Sandbox.get_info(s.sandbox_id).state == SandboxState.PAUSED
    resumed = Sandbox.connect(s.sandbox_id, timeout=60)
    assert resumed.files.read("/root/kept.txt") == "kept"
    resumed.kill()


def test_auto_pause_at_the_timeout() -> None:
    # lifecycle on_timeout "pause": the timeout pauses (processes kept)
    # instead of killing; without auto-resume, envd waits for a connect.
    s = new(timeout=2, lifecycle={"on_timeout": "pause"})
    s.files.write("/root/kept.txt", "kept")
    s.commands.run("nohup sleep 1000 > /dev/null 2>&1 &")
    assert wait_for(lambda: Sandbox.get_info(s.sandbox_id).state == SandboxState.PAUSED, timeout=20)
    with pytest.raises(SandboxException, match="paused"):
        s.commands.run("true")
    resumed = Sandbox.connect(s.sandbox_id, timeout=60)
    assert resumed.files.read("/root/kept.txt") == "kept"
    assert resumed.commands.run("pgrep -x sleep").exit_code == 0
    resumed.kill()


def test_auto_resume_at_the_first_request() -> None:
    s = new(timeout=2, lifecycle={"on_timeout": "pause", "auto_resume": True})
    s.commands.run("echo 41 > /root/n && nohup sleep 1000 > /dev/null 2>&1 &")
    assert wait_for(lambda: Sandbox.get_info(s.sandbox_id).state == SandboxState.PAUSED, timeout=20)
    # Requests arriving together resume it once.
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda _: s.files.read("/root/n"), range(4))) == ["41\n"] * 4
    assert s.commands.run("cat /root/n; pgrep -x sleep > /dev/null && echo alive").stdout == "41\nalive\n"
    assert Sandbox.get_info(s.sandbox_id).state == SandboxState.RUNNING
    assert s.files.read("/root/n") == "41\n"
    # Its timeout runs again: it pauses again.
    assert wait_for(lambda: Sandbox.get_info(s.sandbox_id).state == SandboxState.PAUSED, timeout=20)
    assert s.files.read("/root/n") == "41\n"
    s.kill()


def test_auto_resume_needs_auto_pause() -> None:
    body = {"templateID": "base", "autoPause": False, "autoResume": {"enabled": True}, "metadata": SUITE}
    r = httpx.post(f"{os.environ['E2B_API_URL']}/v2/sandboxes", json=body,
                   headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=10)
    assert r.status_code == 400 and "autoResume needs autoPause" in r.json()["message"], r.text


def test_the_door_keeps_its_state_across_a_restart(
    own_daemon: Callable[[], Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A daemon of its own, killed (SIGKILL) and started again on its data:
    # each sandbox keeps its template, start, end, envs and paused state;
    # a sandbox whose end passes while the daemon is down is gone.
    first = own_daemon()
    point_sdk_at(monkeypatch, first)
    kept = Sandbox.create(timeout=600, envs={"KEPT": "env-kept"}, metadata={"who": "kept"})
    ending = Sandbox.create(timeout=2)
    paused = Sandbox.create(timeout=600)
    paused.commands.run("nohup sleep 1000 > /dev/null 2>&1 &")
    paused.files.write("/root/before.txt", "before the pause")
    assert paused.pause() is True
    before = kept.get_info()
    stop_daemon(first, signal.SIGKILL)
    time.sleep(2.5)

    second = own_daemon()
    point_sdk_at(monkeypatch, second)
    after = Sandbox.get_info(kept.sandbox_id)
    assert after.state == SandboxState.RUNNING
    assert after.metadata == {"who": "kept"}
    assert after.template_id == before.template_id
    assert near(after.started_at, before.started_at, 0.01)
    assert near(after.end_at, before.end_at, 0.01)
    again = Sandbox.connect(kept.sandbox_id, timeout=10)
    assert again.commands.run("echo $KEPT").stdout == "env-kept\n"
    # (Its timeout only grows: the end stays.)
    assert near(again.get_info().end_at, before.end_at, 0.01)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(ending.sandbox_id)
    assert Sandbox.get_info(paused.sandbox_id).state == SandboxState.PAUSED
    resumed = Sandbox.connect(paused.sandbox_id, timeout=60)
    assert resumed.files.read("/root/before.txt") == "before the pause"
    assert resumed.commands.run("pgrep -x sleep").exit_code == 0
    # A clean stop and start too.
    stop_daemon(second)
    third = own_daemon()
    point_sdk_at(monkeypatch, third)
    assert Sandbox.get_info(resumed.sandbox_id).state == SandboxState.RUNNING
    assert Sandbox.connect(kept.sandbox_id).commands.run("echo $KEPT").stdout == "env-kept\n"


# ---------------------------------------------------------------- 4. commands


def test_stdout_stderr_and_exit_code(sbx: Sandbox) -> None:
    r = sbx.commands.run("echo out; echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code, r.error) == ("out\n", "err\n", 0, None)

    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("echo o; echo e >&2; exit 3")
    assert info.value.exit_code == 3
    assert info.value.stdout == "o\n"
    assert info.value.stderr == "e\n"

    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("no-such-command-here")
    assert info.value.exit_code == 127
    assert "not found" in info.value.stderr

    # bash -l -c, as envd runs a command
    assert sbx.commands.run("echo $0; shopt -q login_shell && echo login").stdout == "/bin/bash\nlogin\n"


def test_envs_cwd_and_user() -> None:
    s = new(envs={"FOO": "bar"})
    try:
        assert s.commands.run("echo $FOO $BAR", envs={"BAR": "baz"}).stdout == "bar baz\n"
        assert s.commands.run("echo $FOO", envs={"FOO": "override"}).stdout == "override\n"
        assert s.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
        assert s.commands.run("id -u; id -un; echo $HOME", user="root").stdout == "0\nroot\n/root\n"
        # Without a user, the door's default: root, in its home.
        assert s.commands.run("id -un; pwd").stdout == "root\n/root\n"
    finally:
        s.kill()


def test_command_timeout(sbx: Sandbox) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 31.5", timeout=1)
    assert time.monotonic() - start < 5

    h = sbx.commands.run("sleep 32.5", background=True, timeout=1)
    with pytest.raises(TimeoutException):
        h.wait()

    # envd ends a process at its deadline (the Start's Connect-Timeout-Ms),
    # foreground or background (whose `timeout` is 60 s by default).
    def ended() -> bool:
        ps = sbx.commands.run("ps -eo args").stdout
        return "sleep 31.5" not in ps and "sleep 32.5" not in ps

    assert wait_for(ended, timeout=3), "a command outlived its timeout: " + sbx.commands.run("ps -eo pid,args").stdout


def test_background_list_and_kill(sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 30", background=True, envs={"K": "v"}, cwd="/tmp")
    assert h.pid > 0
    listed = {p.pid: p for p in sbx.commands.list()}
    assert h.pid in listed
    p = listed[h.pid]
    assert (p.cmd, p.args, p.envs, p.cwd) == ("/bin/bash", ["-l", "-c", "sleep 30"], {"K": "v"}, "/tmp")

    assert h.kill() is True
    with pytest.raises(CommandExitException) as info:
        h.wait()
    assert info.value.exit_code != 0
    assert wait_for(lambda: h.pid not in [q.pid for q in sbx.commands.list()])
    assert sbx.commands.kill(h.pid) is False
    assert sbx.commands.kill(999999) is False

    h2 = sbx.commands.run("sleep 30", background=True)
    assert sbx.commands.kill(h2.pid) is True
    with pytest.raises(CommandExitException):
        h2.wait()


def test_stdin(sbx: Sandbox) -> None:
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "piped\n")
    h.send_stdin(b"bytes\n")
    sbx.commands.stream_input(h.pid, ["a", b"b", "c\n"])
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "piped\nbytes\nabc\n"

    # A command started without stdin has none to write to.
    h2 = sbx.commands.run("sleep 5", background=True)
    with pytest.raises(SandboxException):
        sbx.commands.send_stdin(h2.pid, "x")
    h2.kill()


def test_connect_to_a_background_command_from_another_handle(sbx: Sandbox) -> None:
    h = sbx.commands.run(
        "echo before; while [ ! -e /tmp/go ]; do sleep 0.02; done; echo after; echo err-after >&2", background=True
    )
    other = Sandbox.connect(sbx.sandbox_id)
    h2 = other.commands.connect(h.pid)
    assert h2.pid == h.pid
    sbx.files.write("/tmp/go", "")
    r2 = h2.wait()
    assert r2.exit_code == 0
    assert r2.stdout.endswith("after\n") and "after\n" in r2.stdout
    assert r2.stderr == "err-after\n"
    r1 = h.wait()
    assert r1.stdout == "before\nafter\n"
    assert r1.stderr == "err-after\n"
    with pytest.raises(Exception):  # noqa: B017 (the SDK's NotFound, or a SandboxException)
        other.commands.connect(999999).wait()


def test_output_callbacks(sbx: Sandbox) -> None:
    outs: list[str] = []
    errs: list[str] = []
    r = sbx.commands.run(
        "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.01; done", on_stdout=outs.append, on_stderr=errs.append
    )
    assert "".join(outs) == r.stdout == "out1\nout2\nout3\n"
    assert "".join(errs) == r.stderr == "err1\nerr2\nerr3\n"

    bg_out: list[str] = []
    h = sbx.commands.run("echo one; sleep 0.1; echo two", background=True)
    h.wait(on_stdout=bg_out.append)
    assert "".join(bg_out) == "one\ntwo\n"


def test_large_output_arrives_complete(sbx: Sandbox) -> None:
    r = sbx.commands.run("head -c 5000000 /dev/zero | base64")
    expected = base64.encodebytes(b"\0" * 5_000_000).decode()
    assert len(r.stdout) == len(expected)
    assert r.stdout == expected

    chunks: list[str] = []
    r = sbx.commands.run("head -c 3000000 /dev/zero | tr '\\0' x >&2", on_stderr=chunks.append)
    assert r.stderr == "x" * 3_000_000
    assert "".join(chunks) == r.stderr


# ---------------------------------------------------------------- 5. files


def test_text_and_bytes(sbx: Sandbox) -> None:
    text = "héllo ✓\nline 2\n"
    info = sbx.files.write("/root/t.txt", text)
    assert (info.name, info.path, info.type) == ("t.txt", "/root/t.txt", FileType.FILE)
    assert sbx.files.read("/root/t.txt") == text
    assert sbx.commands.run("cat /root/t.txt").stdout == text

    every = bytes(range(256)) * 4
    sbx.files.write("/root/all.bin", every)
    assert bytes(sbx.files.read("/root/all.bin", format="bytes")) == every
    assert sbx.commands.run("sha256sum < /root/all.bin").stdout.split()[0] == hashlib.sha256(every).hexdigest()

    # Overwrites; makes the missing directories; as a user named.
    sbx.files.write("/root/t.txt", "short")
    assert sbx.files.read("/root/t.txt") == "short"
    sbx.files.write("/root/new/deep/dir/f.txt", "deep", user="root")
    assert sbx.files.read("/root/new/deep/dir/f.txt", user="root") == "deep"
    sbx.files.write("/root/empty", "")
    assert sbx.files.read("/root/empty") == ""
    assert sbx.files.get_info("/root/empty").size == 0
    # A file-like text object and an iterable of bytes.
    sbx.files.write("/root/io.txt", io.StringIO("from StringIO"))
    assert sbx.files.read("/root/io.txt") == "from StringIO"
    sbx.files.write("/root/it.bin", iter([b"a", b"\x00", b"b"]))
    assert bytes(sbx.files.read("/root/it.bin", format="bytes")) == b"a\x00b"


def test_20_mb_from_a_file_object(sbx: Sandbox, tmp_path: Path) -> None:
    data = os.urandom(20 << 20)
    local = tmp_path / "big.bin"
    local.write_bytes(data)
    with open(local, "rb") as f:
        info = sbx.files.write("/root/big.bin", f)
    assert info.path == "/root/big.bin"
    sbx.files.write("/root/big2.bin", io.BytesIO(data))
    assert sbx.files.get_info("/root/big.bin").size == len(data)

    assert bytes(sbx.files.read("/root/big.bin", format="bytes")) == data
    chunks = list(sbx.files.read("/root/big2.bin", format="stream"))
    assert len(chunks) > 1
    assert b"".join(chunks) == data
    assert sbx.commands.run("cmp /root/big.bin /root/big2.bin && echo same").stdout == "same\n"


def test_write_files_in_one_request(sbx: Sandbox) -> None:
    entries = [
        WriteEntry(path="/root/multi/a.txt", data="A"),
        WriteEntry(path="/root/multi/b.bin", data=b"B\x00\xff"),
        WriteEntry(path="/root/multi/sub/c.txt", data="C"),
    ]
    infos = sbx.files.write_files(entries)
    assert [(i.name, i.path, i.type) for i in infos] == [
        ("a.txt", "/root/multi/a.txt", FileType.FILE),
        ("b.bin", "/root/multi/b.bin", FileType.FILE),
        ("c.txt", "/root/multi/sub/c.txt", FileType.FILE),
    ]
    assert sbx.files.read("/root/multi/a.txt") == "A"
    assert bytes(sbx.files.read("/root/multi/b.bin", format="bytes")) == b"B\x00\xff"
    assert sbx.files.read("/root/multi/sub/c.txt") == "C"
    assert sbx.files.write_files([]) == []


def test_relative_paths_resolve_against_the_home(sbx: Sandbox) -> None:
    info = sbx.files.write("rel/dir/a.txt", "relative")
    assert info.path == "/root/rel/dir/a.txt"
    assert sbx.files.read("rel/dir/a.txt") == "relative"
    assert sbx.commands.run("cat /root/rel/dir/a.txt").stdout == "relative"
    assert sbx.files.exists("rel/dir")
    assert sbx.files.get_info("rel/dir/a.txt").path == "/root/rel/dir/a.txt"
    assert [e.path for e in sbx.files.list("rel")] == ["/root/rel/dir"]
    assert sbx.files.make_dir("rel/made") is True
    assert sbx.commands.run("test -d /root/rel/made && echo yes").stdout == "yes\n"
    sbx.files.rename("rel/dir/a.txt", "rel/b.txt")
    assert sbx.files.read("/root/rel/b.txt") == "relative"
    sbx.files.remove("rel/b.txt")
    assert not sbx.files.exists("/root/rel/b.txt")


def test_missing_files(sbx: Sandbox) -> None:
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/root/missing.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/root/missing.txt", format="bytes")
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/root/missing.txt", format="stream")
    with pytest.raises(FileNotFoundException):
        sbx.files.get_info("/root/missing.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.list("/root/missing-dir")
    with pytest.raises(FileNotFoundException):
        sbx.files.rename("/root/missing.txt", "/root/other.txt")
    assert sbx.files.exists("/root/missing.txt") is False


def test_list_depth(sbx: Sandbox) -> None:
    sbx.commands.run("mkdir -p /root/tree/sub/deep && echo a > /root/tree/a.txt && echo b > /root/tree/sub/b.txt "
                     "&& echo c > /root/tree/sub/deep/c.txt")
    one = {e.path: e.type for e in sbx.files.list("/root/tree")}
    assert one == {"/root/tree/a.txt": FileType.FILE, "/root/tree/sub": FileType.DIR}
    two = {e.path: e.type for e in sbx.files.list("/root/tree", depth=2)}
    assert two == {
        "/root/tree/a.txt": FileType.FILE,
        "/root/tree/sub": FileType.DIR,
        "/root/tree/sub/b.txt": FileType.FILE,
        "/root/tree/sub/deep": FileType.DIR,
    }
    three = {e.path for e in sbx.files.list("/root/tree", depth=3)}
    assert three == set(two) | {"/root/tree/sub/deep/c.txt"}
    names = {e.name for e in sbx.files.list("/root/tree", depth=2)}
    assert names == {"a.txt", "sub", "b.txt", "deep"}


def test_get_info_fields(sbx: Sandbox) -> None:
    sbx.commands.run("printf 12345 > /root/f && chmod 640 /root/f && mkdir -p /root/d && chmod 755 /root/d "
                     "&& ln -sfn /root/f /root/link")
    now = datetime.now(timezone.utc)
    f = sbx.files.get_info("/root/f")
    assert (f.name, f.path, f.type, f.size) == ("f", "/root/f", FileType.FILE, 5)
    assert (f.mode, f.permissions) == (0o640, "-rw-r-----")
    assert (f.owner, f.group) == ("root", "root")
    assert near(f.modified_time, now, 60)
    assert f.symlink_target is None

    d = sbx.files.get_info("/root/d")
    assert (d.name, d.type, d.mode, d.permissions) == ("d", FileType.DIR, 0o755, "drwxr-xr-x")

    link = sbx.files.get_info("/root/link")
    assert link.symlink_target == "/root/f"

    # list gives the same fields
    listed = {e.name: e for e in sbx.files.list("/root")}
    assert (listed["f"].size, listed["f"].permissions, listed["f"].type) == (5, "-rw-r-----", FileType.FILE)


def test_make_dir_rename_remove_exists(sbx: Sandbox) -> None:
    assert sbx.files.make_dir("/root/newdir") is True
    assert sbx.files.make_dir("/root/newdir") is False
    assert sbx.files.get_info("/root/newdir").type == FileType.DIR
    assert sbx.files.make_dir("/root/a/b/c") is True
    assert sbx.files.exists("/root/a/b/c")

    sbx.files.write("/root/newdir/x.txt", "x")
    moved = sbx.files.rename("/root/newdir/x.txt", "/root/newdir/y.txt")
    assert (moved.name, moved.path, moved.type) == ("y.txt", "/root/newdir/y.txt", FileType.FILE)
    assert not sbx.files.exists("/root/newdir/x.txt")
    assert sbx.files.read("/root/newdir/y.txt") == "x"
    # a directory moves too
    sbx.files.rename("/root/newdir", "/root/renamed")
    assert sbx.files.read("/root/renamed/y.txt") == "x"
    assert not sbx.files.exists("/root/newdir")

    assert sbx.files.exists("/root/renamed/y.txt") is True
    sbx.files.remove("/root/renamed/y.txt")
    assert sbx.files.exists("/root/renamed/y.txt") is False
    sbx.files.remove("/root/a")  # recursively
    assert sbx.files.exists("/root/a") is False


def test_rename_makes_the_missing_parent_directories(sbx: Sandbox) -> None:
    # envd's Move makes the destination's parents (permissions.EnsureDirs).
    sbx.files.write("/root/src.txt", "moved")
    sbx.files.rename("/root/src.txt", "/root/made/on/the/way.txt")
    assert sbx.files.read("/root/made/on/the/way.txt") == "moved"


# ---------------------------------------------------------------- 6. snapshots, pause, fork


def test_snapshot_carries_files_and_a_live_process() -> None:
    s = new()
    try:
        pid = start_counter(s)
        s.files.write("/root/data.txt", "before")
        token, n0 = probe_counter(s)
        snap = snapshot(s)
        assert snap
        s.files.write("/root/data.txt", "after")

        c = track(Sandbox.create(template=snap, timeout=120, metadata={**SUITE, "from": "snapshot"}))
        try:
            info = c.get_info()
            assert info.template_id == snap
            assert info.state == SandboxState.RUNNING
            assert info.metadata == {**SUITE, "from": "snapshot"}
            assert c.files.read("/root/data.txt") == "before"
            assert int(c.files.read("/root/counter.pid")) == pid
            # The counter runs on, from the memory it had.
            assert c.commands.run(f"grep State /proc/{pid}/status").stdout.split()[1] in ("S", "R")
            t1, n1 = probe_counter(c)
            time.sleep(0.1)
            t2, n2 = probe_counter(c)
            assert t1 == t2 == token
            assert n0 <= n1 < n2
            # The original is untouched by it.
            assert s.files.read("/root/data.txt") == "after"
            assert probe_counter(s)[0] == token
        finally:
            c.kill()

        listed = [x.snapshot_id for x in Sandbox.list_snapshots().next_items()]
        assert snap in listed
        assert snap in [x.snapshot_id for x in Sandbox.list_snapshots(sandbox_id=s.sandbox_id).next_items()]
        assert snap in [x.snapshot_id for x in s.list_snapshots().next_items()]  # type: ignore[misc]
    finally:
        s.kill()


def test_create_snapshot_names_and_delete() -> None:
    s = new()
    s.files.write("/root/f.txt", "snap")
    name = "named-" + RUN
    snap = s.create_snapshot(name=name)
    _snapshots.append(snap.snapshot_id)
    assert snap.snapshot_id and name in snap.names[0]
    mine = {x.snapshot_id: x for x in Sandbox.list_snapshots(sandbox_id=s.sandbox_id).next_items()}
    assert snap.snapshot_id in mine
    assert any(name in n for n in mine[snap.snapshot_id].names)
    # A snapshot outlives its sandbox.
    s.kill()
    made = track(Sandbox.create(template=snap.snapshot_id, timeout=60, metadata=SUITE))
    assert made.files.read("/root/f.txt") == "snap"
    made.kill()
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert snap.snapshot_id not in [x.snapshot_id for x in Sandbox.list_snapshots().next_items()]
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    with pytest.raises(SandboxException):
        track(Sandbox.create(template=snap.snapshot_id, metadata=SUITE))


def test_snapshots_are_independent_of_each_other_and_of_their_sandboxes() -> None:
    # E2B's snapshots are templates of their own: one can be deleted while
    # its sandbox, a later snapshot of that sandbox, or a sandbox made from
    # it lives on.
    s = new()
    try:
        s.files.write("/root/f.txt", "one")
        first = snapshot(s)
        assert Sandbox.delete_snapshot(first) is True, "a snapshot of a live sandbox"
        first = snapshot(s)
        s.files.write("/root/f.txt", "two")
        second = snapshot(s)
        made = track(Sandbox.create(template=first, timeout=60, metadata=SUITE))
        assert Sandbox.delete_snapshot(first) is True, "a snapshot with a later one and a sandbox made from it"
        assert made.files.read("/root/f.txt") == "one"
        again = track(Sandbox.create(template=second, timeout=60, metadata=SUITE))
        assert again.files.read("/root/f.txt") == "two"
        assert s.files.read("/root/f.txt") == "two"
        made.kill()
        again.kill()
    finally:
        s.kill()


def test_list_snapshots_shows_the_snapshots_only() -> None:
    # The checkpoints the door takes for a pause or a fork are not snapshots.
    s = new()
    try:
        snap = snapshot(s)
        for f in forked(s.fork(count=1)):
            f.kill()
        assert s.pause() is True
        Sandbox.connect(s.sandbox_id)
        listed = [x.snapshot_id for x in Sandbox.list_snapshots(sandbox_id=s.sandbox_id).next_items()]
        assert listed == [snap]
    finally:
        s.kill()


def test_list_snapshots_filters_by_name() -> None:
    s = new()
    try:
        names = [f"byname-{RUN}-{i}" for i in range(3)]
        ids = [snapshot(s, name=n) for n in names]
        by_name = Sandbox.list_snapshots(name=names[1]).next_items()
        assert [x.snapshot_id for x in by_name] == [ids[1]]
    finally:
        s.kill()


def test_list_snapshots_pages() -> None:
    s = new()
    try:
        ids = [snapshot(s, name=f"page-{RUN}-{i}") for i in range(3)]
        paginator = Sandbox.list_snapshots(sandbox_id=s.sandbox_id, limit=1)
        seen: list[str] = []
        while paginator.has_next:
            page = paginator.next_items()
            assert len(page) == 1, f"limit=1 gave {len(page)} snapshots in a page"
            seen += [x.snapshot_id for x in page]
            assert len(seen) <= 3
        assert sorted(seen) == sorted(ids)
    finally:
        s.kill()


def test_pause_and_resume_keep_files_and_memory() -> None:
    s = new()
    try:
        pid = start_counter(s)
        s.files.write("/root/kept.txt", "kept")
        token, n0 = probe_counter(s)

        assert s.pause() is True
        assert s.pause() is False
        assert Sandbox.pause(s.sandbox_id) is False
        info = Sandbox.get_info(s.sandbox_id)
        assert info.state == SandboxState.PAUSED
        paused = _all(Sandbox.list(query=SandboxQuery(metadata=SUITE, state=[SandboxState.PAUSED])))
        assert s.sandbox_id in [x.sandbox_id for x in paused]
        running = _all(Sandbox.list(query=SandboxQuery(metadata=SUITE, state=[SandboxState.RUNNING])))
        assert s.sandbox_id not in [x.sandbox_id for x in running]

        resumed = Sandbox.connect(s.sandbox_id)
        assert Sandbox.get_info(s.sandbox_id).state == SandboxState.RUNNING
        assert resumed.files.read("/root/kept.txt") == "kept"
        assert int(resumed.files.read("/root/counter.pid")) == pid
        t1, n1 = probe_counter(resumed)
        assert t1 == token, "the process was started again, its memory lost"
        assert n1 >= n0
        assert resumed.commands.run("echo resumed").stdout == "resumed\n"
    finally:
        Sandbox.kill(s.sandbox_id)


def test_pause_and_resume_twice() -> None:
    s = new()
    try:
        start_counter(s)
        token, _ = probe_counter(s)
        for _ in range(2):
            assert s.pause() is True
            Sandbox.connect(s.sandbox_id)
            assert probe_counter(s)[0] == token
    finally:
        Sandbox.kill(s.sandbox_id)


def test_envd_on_a_paused_sandbox() -> None:
    # On E2B a paused sandbox's envd either does not answer until a connect
    # resumes it (is_running() False, commands fail), or, with auto-resume,
    # the traffic resumes it. Either way nothing done through it is lost.
    # The door serves envd on it still: a command restarts the stopped
    # sandbox while get_info says "paused", and the next connect rolls it
    # back to the pause, over what the command did.
    s = new()
    try:
        s.files.write("/root/f.txt", "before the pause")
        assert s.pause() is True
        try:
            s.commands.run("echo during the pause > /root/f.txt")
        except SandboxException:
            assert s.is_running() is False
            assert Sandbox.get_info(s.sandbox_id).state == SandboxState.PAUSED
            Sandbox.connect(s.sandbox_id)
            assert s.files.read("/root/f.txt") == "before the pause"
        else:
            assert Sandbox.get_info(s.sandbox_id).state == SandboxState.RUNNING, "ran in a 'paused' sandbox"
            Sandbox.connect(s.sandbox_id)
            assert s.files.read("/root/f.txt") == "during the pause\n", "the resume undid a command"
    finally:
        Sandbox.kill(s.sandbox_id)


def test_fork_makes_sandboxes_that_diverge() -> None:
    s = new()
    try:
        pid = start_counter(s)
        s.files.write("/root/shared.txt", "shared")
        token, _ = probe_counter(s)

        forks = forked(s.fork(count=2))
        assert len(forks) == 2
        ids = {f.sandbox_id for f in forks}
        assert len(ids) == 2 and s.sandbox_id not in ids
        try:
            for i, f in enumerate(forks):
                assert f.get_info().state == SandboxState.RUNNING
                assert f.files.read("/root/shared.txt") == "shared"
                f.files.write("/root/mine.txt", f"fork {i}")
                f.commands.run(f"echo {i} > /root/shared.txt")
            for i, f in enumerate(forks):
                assert f.files.read("/root/mine.txt") == f"fork {i}"
                assert f.files.read("/root/shared.txt") == f"{i}\n"
                # The live process, copied with its memory.
                assert int(f.files.read("/root/counter.pid")) == pid
                assert probe_counter(f)[0] == token
            assert s.files.read("/root/shared.txt") == "shared"
            assert not s.files.exists("/root/mine.txt")
            assert probe_counter(s)[0] == token
            # The source keeps running, its id and state unchanged.
            assert s.get_info().state == SandboxState.RUNNING
            # Class form.
            more = forked(Sandbox.fork(s.sandbox_id, count=1))
            assert len(more) == 1
            assert more[0].files.read("/root/shared.txt") == "shared"
            more[0].kill()
        finally:
            for f in forks:
                f.kill()
    finally:
        s.kill()


def test_pause_with_a_zombie_and_resume() -> None:
    # `true` exits at once and `sleep`, which the shell became, never waits
    # for it: a zombie for good. The pause keeps it, the resume brings it
    # back as the child of `sleep` it was, with its exit status.
    s = new()
    try:
        s.commands.run("sh -c '/bin/true & exec sleep 1000'", background=True, timeout=0)
        zombies = "ps -eo stat,comm,ppid --no-headers | awk '$1 ~ /^Z/ {print $2}'"
        for _ in range(100):
            if s.commands.run(zombies).stdout.strip() == "true":
                break
            time.sleep(0.05)
        assert s.commands.run(zombies).stdout.strip() == "true"
        assert s.pause() is True
        back = Sandbox.connect(s.sandbox_id)
        assert back.commands.run(zombies).stdout.strip() == "true"
        parent = back.commands.run("ps -o comm= -p $(ps -o ppid= -C true)").stdout.strip()
        assert parent == "sleep"
    finally:
        s.kill()


def test_fork_after_a_pause_and_resume() -> None:
    s = new()
    try:
        s.commands.run("sleep 1000", background=True, timeout=0)
        assert s.pause() is True
        Sandbox.connect(s.sandbox_id)
        forks = forked(s.fork(count=1))
        assert "sleep 1000" in forks[0].commands.run("ps -eo stat,args | grep '^S'").stdout
        forks[0].kill()
    finally:
        s.kill()


# ---------------------------------------------------------------- 7. async


def test_async_sandbox() -> None:
    async def main() -> None:
        s = track(await AsyncSandbox.create(metadata={**SUITE, "async": "1"}, timeout=120, envs={"A": "1"}))
        try:
            r = await s.commands.run("echo $A; echo err >&2")
            assert (r.stdout, r.stderr, r.exit_code) == ("1\n", "err\n", 0)
            with pytest.raises(CommandExitException) as info:
                await s.commands.run("exit 4")
            assert info.value.exit_code == 4

            await s.files.write("/root/async.txt", "async text")
            assert await s.files.read("/root/async.txt") == "async text"
            every = bytes(range(256))
            await s.files.write("/root/async.bin", every)
            assert bytes(await s.files.read("/root/async.bin", format="bytes")) == every
            assert sorted(e.name for e in await s.files.list("/root") if e.name.startswith("async")) == [
                "async.bin",
                "async.txt",
            ]

            h = await s.commands.run("cat", background=True, stdin=True)
            await s.commands.send_stdin(h.pid, "through stdin\n")
            await s.commands.close_stdin(h.pid)
            assert (await h.wait()).stdout == "through stdin\n"

            info2 = await s.get_info()
            assert info2.state == SandboxState.RUNNING and info2.metadata["async"] == "1"
            assert await s.is_running()
            other = await AsyncSandbox.connect(s.sandbox_id)
            assert (await other.commands.run("cat /root/async.txt")).stdout == "async text"
        finally:
            assert await s.kill() is True
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.get_info(s.sandbox_id)

    asyncio.run(main())


def test_async_gather_over_four_sandboxes() -> None:
    async def main() -> None:
        tag = uuid.uuid4().hex
        sandboxes = await asyncio.gather(
            *(AsyncSandbox.create(metadata={**SUITE, "gather": tag}, timeout=120) for _ in range(4))
        )
        for s in sandboxes:
            track(s)
        try:
            assert len({s.sandbox_id for s in sandboxes}) == 4
            results = await asyncio.gather(
                *(s.commands.run(f"sleep 0.2; echo {i} | tee /root/i.txt") for i, s in enumerate(sandboxes))
            )
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
            reads = await asyncio.gather(*(s.files.read("/root/i.txt") for s in sandboxes))
            assert reads == [f"{i}\n" for i in range(4)]
            listed = await AsyncSandbox.list(query=SandboxQuery(metadata={"gather": tag})).next_items()
            assert sorted(x.sandbox_id for x in listed) == sorted(s.sandbox_id for s in sandboxes)
        finally:
            killed = await asyncio.gather(*(s.kill() for s in sandboxes))
            assert killed == [True] * 4

    asyncio.run(main())


# ---------------------------------------------------------------- 8. refused


@pytest.mark.parametrize(
    "option",
    [
        {"network": {"mask_request_host": "example.com"}},
        {"volume_mounts": {"/mnt/data": "a-volume"}},
        {"mcp": {"exa": {"apiKey": "key"}}},
    ],
    ids=["network mask_request_host", "volume_mounts", "mcp"],
)
def test_unsupported_create_options_are_refused_clearly(option: dict[str, Any]) -> None:
    tag = uuid.uuid4().hex
    with pytest.raises(SandboxException) as info:
        track(Sandbox.create(metadata={**SUITE, "refused": tag}, **option))
    assert "not supported by Sandtree" in str(info.value)
    assert info.value.status_code == 400
    assert _all(Sandbox.list(query=SandboxQuery(metadata={"refused": tag}))) == []


def test_workload_identity_is_refused_clearly() -> None:
    # iam= (workload identity tokens) is not refused: the door creates the
    # sandbox without it.
    tag = uuid.uuid4().hex
    token = e2b.Secret.iam_token(audience="sts.amazonaws.com", token_type="JWT-SVID")
    with pytest.raises(SandboxException) as info:
        track(Sandbox.create(metadata={**SUITE, "refused": tag}, iam={"tokens": {"aws": token}}))
    assert "not supported by Sandtree" in str(info.value)
    assert _all(Sandbox.list(query=SandboxQuery(metadata={"refused": tag}))) == []


def test_options_that_ask_for_nothing_are_accepted() -> None:
    s = new(allow_internet_access=False, lifecycle={"on_timeout": "kill"}, secure=True)
    try:
        assert s.commands.run("echo ok").stdout == "ok\n"
    finally:
        s.kill()


def _native_network(daemon: Daemon, sandbox_id: str) -> dict[str, Any]:
    r = httpx.get(f"{daemon.url}/v1/sandboxes/{sandbox_id}/network", headers={"Authorization": f"Bearer {daemon.token}"})
    r.raise_for_status()
    value: dict[str, Any] = r.json()
    return value


def test_network_settings_become_the_sandboxs_policy(daemon: Daemon) -> None:
    # allow_out / deny_out are Sandtree's allow / deny; allow_internet_access
    # False denies everything not allowed; update_network replaces them.
    s = new(network={"allow_out": ["pypi.org"], "deny_out": [e2b.ALL_TRAFFIC]})
    try:
        n = _native_network(daemon, s.sandbox_id)
        assert (n["mode"], n["allow"], n["deny"]) == ("egress", ["pypi.org"], ["0.0.0.0/0"])
        s.update_network({"allow_out": ["10.0.0.0/8"], "deny_out": ["192.0.2.0/24"]})
        n = _native_network(daemon, s.sandbox_id)
        assert (n["allow"], n["deny"]) == (["10.0.0.0/8"], ["192.0.2.0/24"])
        with pytest.raises(SandboxException) as info:
            s.update_network({"deny_out": ["10.0.0.0/40"]})
        assert "prefix length" in str(info.value)
        assert _native_network(daemon, s.sandbox_id)["deny"] == ["192.0.2.0/24"]
    finally:
        s.kill()
    closed = new(allow_internet_access=False)
    try:
        assert _native_network(daemon, closed.sandbox_id)["deny"] == ["0.0.0.0/0"]
        assert closed.commands.run("echo ok").stdout == "ok\n"
    finally:
        closed.kill()


def test_idempotent_create() -> None:
    # The SDK sends Idempotency-Key so that a retried create makes one
    # sandbox: the door must honour it, or refuse it.
    key = "sandtree-" + uuid.uuid4().hex
    tag = uuid.uuid4().hex
    try:
        first = track(Sandbox.create(metadata={**SUITE, "idem": tag}, idempotency_key=key))
    except SandboxException as e:
        assert "not supported by Sandtree" in str(e)
        return
    second = track(Sandbox.create(metadata={**SUITE, "idem": tag}, idempotency_key=key))
    try:
        assert second.sandbox_id == first.sandbox_id
        assert len(_all(Sandbox.list(query=SandboxQuery(metadata={"idem": tag})))) == 1
    finally:
        first.kill()
        second.kill()


# ---------------------------------------------------------------- PTYs, compressed uploads, file metadata, URLs


def test_pty(sbx: Sandbox) -> None:
    out = bytearray()
    h = sbx.pty.create(PtySize(rows=24, cols=80), envs={"PTYVAR": "v"}, cwd="/tmp")
    assert h.pid > 0
    sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(h.pid, b"echo pty-$((6*7)) $PTYVAR; stty size; pwd; tty; exit 0\n")
    r = h.wait(on_pty=out.extend)
    assert r.exit_code == 0
    text = out.decode(errors="replace")
    assert "pty-42 v" in text
    assert "30 100" in text
    assert "/tmp" in text
    assert re.search(r"/dev/pts/\d+", text), text


def test_pty_exit_codes(sbx: Sandbox) -> None:
    # A PTY's end carries its shell's exit code, as a command's does; a
    # killed one ends by its signal (envd: exitCode -1, "signal: killed").
    h = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(h.pid, b"exit 5\n")
    with pytest.raises(CommandExitException) as info:
        h.wait()
    assert info.value.exit_code == 5

    h2 = sbx.pty.create(PtySize(rows=24, cols=80))
    assert sbx.pty.kill(h2.pid) is True
    with pytest.raises(CommandExitException) as info:
        h2.wait()
    assert info.value.exit_code != 0
    assert sbx.pty.kill(h2.pid) is False


def test_watch_dir(sbx: Sandbox) -> None:
    sbx.files.make_dir("/root/watched/sub")
    w = sbx.files.watch_dir("/root/watched", recursive=True)
    try:
        sbx.files.write("/root/watched/new.txt", "x")
        sbx.commands.run("echo deep > /root/watched/sub/deep.txt; rm /root/watched/new.txt")
        events: list[Any] = []

        def seen() -> set[tuple[str, FilesystemEventType]]:
            events.extend(w.get_new_events())
            return {(e.name, e.type) for e in events}

        wanted = {
            ("new.txt", FilesystemEventType.CREATE),
            ("new.txt", FilesystemEventType.REMOVE),
            ("sub/deep.txt", FilesystemEventType.CREATE),
        }
        assert wait_for(lambda: wanted <= seen(), timeout=3), events
    finally:
        w.stop()


def test_async_watch_dir() -> None:
    async def main() -> None:
        s = track(await AsyncSandbox.create(metadata=SUITE, timeout=60))
        try:
            await s.files.make_dir("/root/watched")
            events: list[Any] = []
            w = await s.files.watch_dir("/root/watched", on_event=events.append)
            await s.files.write("/root/watched/new.txt", "x")
            for _ in range(60):
                if any(e.name == "new.txt" for e in events):
                    break
                await asyncio.sleep(0.05)
            await w.stop()
            assert ("new.txt", FilesystemEventType.CREATE) in {(e.name, e.type) for e in events}
        finally:
            await s.kill()

    asyncio.run(main())


def test_gzip_upload(sbx: Sandbox) -> None:
    sbx.files.write("/root/gz.txt", "compressed on the way", gzip=True)
    assert sbx.files.read("/root/gz.txt") == "compressed on the way"
    # Large and streamed, as a file object: decoded as it comes.
    data = bytes(range(256)) * 40_000 + os.urandom(1 << 20)
    info = sbx.files.write("/root/gz.bin", io.BytesIO(data), gzip=True)
    assert info.path == "/root/gz.bin"
    assert sbx.files.read("/root/gz.bin", format="bytes") == data
    assert sbx.files.read("/root/gz.bin", format="bytes", gzip=True) == data


def test_gzip_upload_that_is_not_gzip_writes_nothing(sbx: Sandbox) -> None:
    sbx.files.write("/root/kept.txt", "old")
    url = f"{os.environ['E2B_SANDBOX_URL']}/files"
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token or "",
               "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
    r = httpx.post(url, params={"path": "/root/kept.txt"}, content=b"plain, not gzip", headers=headers, timeout=10)
    assert r.status_code == 400, r.text
    assert "not gzip" in r.json()["message"]
    r = httpx.post(url, params={"path": "/root/kept.txt"}, content=b"x",
                   headers={**headers, "Content-Encoding": "br"}, timeout=10)
    assert r.status_code == 400 and "not supported" in r.json()["message"], r.text
    assert sbx.files.read("/root/kept.txt") == "old"


def test_file_metadata(sbx: Sandbox) -> None:
    info = sbx.files.write("/root/meta.txt", "m", metadata={"owner": "me", "Run-Id": "run 7"})
    assert info.metadata == {"owner": "me", "run-id": "run 7"}
    assert sbx.files.get_info("/root/meta.txt").metadata == {"owner": "me", "run-id": "run 7"}
    listed = {e.name: e for e in sbx.files.list("/root")}
    assert listed["meta.txt"].metadata == {"owner": "me", "run-id": "run 7"}
    # Stored as user.e2b.* attributes, which the sandbox's programs see.
    out = sbx.commands.run("python3 -c \"import os; print(os.getxattr('/root/meta.txt', 'user.e2b.owner').decode())\"")
    assert out.stdout.strip() == "me"
    # A rename keeps them; an overwrite replaces the whole set.
    moved = sbx.files.rename("/root/meta.txt", "/root/meta2.txt")
    assert moved.metadata == {"owner": "me", "run-id": "run 7"}
    again = sbx.files.write("/root/meta2.txt", "n", metadata={"stage": "2"})
    assert again.metadata == {"stage": "2"}
    assert sbx.files.get_info("/root/meta2.txt").metadata == {"stage": "2"}
    sbx.files.write("/root/meta2.txt", "plain")
    assert sbx.files.get_info("/root/meta2.txt").metadata is None
    # Out of band: set by a program in the sandbox, shown all the same.
    sbx.commands.run("mkdir -p /root/d && python3 -c \"import os; os.setxattr('/root/d', 'user.e2b.tag', b'dir')\"")
    assert sbx.files.get_info("/root/d").metadata == {"tag": "dir"}
    # Several files of one upload share it.
    infos = sbx.files.write_files([{"path": "/root/a.txt", "data": "a"}, {"path": "/root/b.txt", "data": "b"}],
                                  metadata={"batch": "1"})
    assert [i.metadata for i in infos] == [{"batch": "1"}, {"batch": "1"}]
    # A fork's files carry it too.
    (copy,) = forked(sbx.fork(count=1))
    try:
        assert copy.files.get_info("/root/a.txt").metadata == {"batch": "1"}
    finally:
        copy.kill()


def test_file_metadata_is_checked(sbx: Sandbox) -> None:
    # (The SDK checks keys and values too; the door checks them for any client.)
    url = f"{os.environ['E2B_SANDBOX_URL']}/files"
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token or "",
               "Content-Type": "application/octet-stream", "X-Metadata-big": "v" * 5000}
    r = httpx.post(url, params={"path": "/root/m.txt"}, content=b"x", headers=headers, timeout=10)
    assert r.status_code == 400 and "printable ASCII" in r.json()["message"], r.text
    assert not sbx.files.exists("/root/m.txt")


def test_signed_download_and_upload_urls(sbx: Sandbox) -> None:
    sbx.files.write("/root/url.txt", "by url")
    r = httpx.get(sbx.download_url("/root/url.txt"), timeout=10)
    assert r.status_code == 200 and r.text == "by url"
    up = httpx.post(sbx.upload_url("/root/up.txt"), files={"file": ("up.txt", b"uploaded")}, timeout=10)
    assert up.status_code == 200
    assert sbx.files.read("/root/up.txt") == "uploaded"
    # As a user, and with an expiration.
    sbx.files.write("/home/user/mine.txt", "user's", user="user")
    r = httpx.get(sbx.download_url("mine.txt", user="user", use_signature_expiration=60), timeout=10)
    assert r.status_code == 200 and r.text == "user's"
    # A signature is for its path, its operation, and until its expiration.
    url = sbx.download_url("/root/url.txt")
    assert httpx.get(url.replace("url.txt", "up.txt"), timeout=10).status_code == 401
    forged = url.replace("signature=v1_", "signature=v1_x")
    assert httpx.get(forged, timeout=10).status_code == 401
    read_as_write = sbx.download_url("/root/up.txt")
    assert httpx.post(read_as_write, files={"file": ("up.txt", b"no")}, timeout=10).status_code == 401
    expired = sbx.download_url("/root/url.txt", use_signature_expiration=-10)
    assert httpx.get(expired, timeout=10).status_code == 401
    assert sbx.files.read("/root/up.txt") == "uploaded"


def test_the_e2b_default_user(sbx: Sandbox) -> None:
    r = sbx.commands.run("id -un; echo $HOME", user="user")
    assert r.stdout == "user\n/home/user\n"
    info = sbx.files.write("notes.txt", "mine", user="user")
    assert info.path == "/home/user/notes.txt"
    assert sbx.files.get_info("/home/user/notes.txt", user="user").owner == "user"
