"""Errors: the daemon's codes as exception classes, and a missing daemon."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import pytest

import sandtree
from sandtree.errors import error_for, error_from_body


def test_unknown_sandbox_is_not_found(client: sandtree.Sandtree) -> None:
    with pytest.raises(sandtree.NotFoundError) as info:
        client.get("sb-doesnotexist")
    err = info.value
    assert err.code == "sandbox_not_found"
    assert err.status == 404
    assert "sb-doesnotexist" in err.message
    assert str(err).startswith("sandbox_not_found: ")
    assert isinstance(err, sandtree.SandtreeError)


def test_odd_ids_are_sent_escaped(client: sandtree.Sandtree) -> None:
    # Slashes, dots and spaces stay inside the id's path segment.
    for odd in ("../../info", "a b", "x?y=1#z"):
        with pytest.raises(sandtree.NotFoundError) as info:
            client.get(odd)
        assert info.value.code == "sandbox_not_found"


def test_unknown_checkpoint(client: sandtree.Sandtree, sandbox: sandtree.Sandbox) -> None:
    with pytest.raises(sandtree.NotFoundError) as info:
        sandbox.rollback("ck-doesnotexist")
    assert info.value.code == "checkpoint_not_found"


def test_invalid_arguments(client: sandtree.Sandtree, sandbox: sandtree.Sandbox) -> None:
    with pytest.raises(sandtree.InvalidArgumentError) as info:
        sandbox.exec([])
    assert info.value.code == "invalid_argument" and info.value.status == 400
    ck = sandbox.checkpoint()
    with pytest.raises(sandtree.InvalidArgumentError) as info:
        ck.fork(0)
    assert "count" in info.value.message


def test_checkpoint_of_another_tree(client: sandtree.Sandtree, sandbox: sandtree.Sandbox) -> None:
    with client.create() as other:
        foreign = other.checkpoint()
        with pytest.raises(sandtree.InvalidArgumentError) as info:
            sandbox.rollback(foreign)
        assert info.value.code == "checkpoint_not_in_tree"


def test_unknown_image(client: sandtree.Sandtree) -> None:
    with pytest.raises(sandtree.NotFoundError) as info:
        client.create(image="no-such-image")
    assert info.value.code == "image_not_found"


def test_daemon_not_running(tmp_path: Path) -> None:
    socket = tmp_path / "nothing.sock"
    with sandtree.Sandtree(socket) as client, pytest.raises(sandtree.DaemonUnavailableError) as info:
        client.info()
    err = info.value
    assert err.code == "daemon_unavailable"
    assert str(socket) in err.message
    assert "sandtree daemon &" in err.message
    assert "SANDTREE_SOCKET" in err.message


def test_daemon_not_running_async(tmp_path: Path) -> None:
    async def main() -> None:
        async with sandtree.AsyncSandtree(tmp_path / "nothing.sock") as client:
            await client.list()

    with pytest.raises(sandtree.DaemonUnavailableError, match="not running"):
        asyncio.run(main())


def test_socket_from_the_environment(monkeypatch: pytest.MonkeyPatch, socket_path: str) -> None:
    monkeypatch.delenv("SANDTREE_URL", raising=False)
    monkeypatch.setenv("SANDTREE_SOCKET", socket_path)
    with sandtree.Sandtree() as client:
        assert client.endpoint.socket == socket_path
        assert client.info().version


def test_url_without_a_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDTREE_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("SANDTREE_TOKEN", "secret")
    with sandtree.Sandtree(timeout=2) as client:
        assert client.endpoint.url == "http://127.0.0.1:9"
        assert client.endpoint.headers == {"Authorization": "Bearer secret"}
        with pytest.raises(sandtree.DaemonUnavailableError, match=r"http://127\.0\.0\.1:9"):
            client.info()


def test_context_manager_deletes_the_sandbox(client: sandtree.Sandtree) -> None:
    with client.create(labels={"test": "ctx"}) as sb:
        assert sb.exec("true").ok
        sb.checkpoint()
    with pytest.raises(sandtree.NotFoundError):
        client.get(sb.id)
    assert all(c.sandbox_id != sb.id for c in client.checkpoints())


def test_context_manager_deletes_on_error(client: sandtree.Sandtree) -> None:
    with pytest.raises(RuntimeError), client.create() as sb:
        raise RuntimeError("agent crashed")
    with pytest.raises(sandtree.NotFoundError):
        client.get(sb.id)


def test_codes_map_to_classes() -> None:
    cases = {
        "processes_lost": sandtree.ConflictError,
        "process_not_restorable": sandtree.ConflictError,
        "file_not_found": sandtree.NotFoundError,
        "freeze_timeout": sandtree.SandtreeTimeoutError,
        "no_space": sandtree.ResourceExhaustedError,
        "not_enough_memory": sandtree.ResourceExhaustedError,
        "unauthorized": sandtree.UnauthorizedError,
        "route_not_found": sandtree.UnsupportedError,
        "rollback_incomplete": sandtree.InternalError,
    }
    for code, cls in cases.items():
        assert type(error_for(code, "m")) is cls, code
    assert error_for("not_enough_memory", "m").status == 507
    assert error_for("pid_limit_reached", "m").status == 429
    # A code newer than the SDK falls back on its status.
    assert type(error_for("brand_new_conflict", "m", 409)) is sandtree.ConflictError
    proxy = error_from_body(502, b"<html>bad gateway</html>")
    assert type(proxy) is sandtree.InternalError and "502" in proxy.message


def test_errors_pickle_intact() -> None:
    # Workers of a multiprocessing pool send errors back pickled.
    errors = [
        sandtree.DaemonUnavailableError("unix socket /x.sock", "refused"),
        sandtree.ForkError("processes_lost", "m", 409, [sandtree.ConflictError("processes_lost", "m", 409)]),
        error_for("file_not_found", "no such file"),
    ]
    for err in errors:
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err)
        assert (copy.code, copy.message, copy.status) == (err.code, err.message, err.status)
    assert pickle.loads(pickle.dumps(errors[0])).endpoint == "unix socket /x.sock"
