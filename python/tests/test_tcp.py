"""The daemon's TCP listener: the bearer token, sync and async."""

from __future__ import annotations

import asyncio

import pytest

import sandtree
from conftest import Daemon


def test_tcp_with_the_token(daemon: Daemon) -> None:
    with sandtree.Sandtree(url=daemon.url, token=daemon.token) as client, client.create() as sb:
        assert client.endpoint.socket is None
        assert sb.exec(["echo", "over tcp"]).check().text == "over tcp\n"
        sb.files.write("/root/t.bin", b"\x00\x01")
        assert sb.files.read("/root/t.bin") == b"\x00\x01"


def test_tcp_from_the_environment(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDTREE_URL", daemon.url)
    monkeypatch.setenv("SANDTREE_TOKEN", daemon.token)
    monkeypatch.setenv("SANDTREE_SOCKET", "/nonexistent.sock")  # the URL wins

    async def main() -> str:
        async with sandtree.AsyncSandtree() as client:
            return (await client.info()).version

    assert asyncio.run(main())


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_tcp_without_the_right_token(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, token: str | None) -> None:
    monkeypatch.delenv("SANDTREE_TOKEN", raising=False)
    with sandtree.Sandtree(url=daemon.url, token=token) as client, pytest.raises(sandtree.UnauthorizedError) as info:
        client.list()
    assert info.value.code == "unauthorized"
    assert info.value.status == 401
