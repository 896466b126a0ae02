"""Sandtree's MCP server, driven by the official ``mcp`` Python client.

Two transports serve the same tools (``crates/sandtree/src/mcp``):

- **stdio**: ``sandtree mcp``, a child process that reaches the test daemon
  through its unix socket (``SANDTREE_SOCKET``);
- **streamable HTTP**: the daemon's ``POST /mcp`` on its TCP listener, with
  the bearer token.

The tool tests run on both (the ``connect`` fixture is parametrized) and check
each tool's effect, most of them also through the SDK (``sandtree``). Every
successful result is checked against the tool's ``outputSchema``
(``jsonschema``, a dependency of ``mcp``) and must carry a non-empty text
copy. The HTTP and stdio specifics (token, ``Origin``, status codes,
JSON-RPC errors, version negotiation, a daemon that is not running) are
checked with raw requests, without the client.

The tests are synchronous, like the rest of the suite: each one runs its
MCP conversation with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

import sandtree
from conftest import Daemon, start_counter

mcp = pytest.importorskip("mcp", reason="the MCP tests need the mcp client library (pip install mcp)")
httpx2 = pytest.importorskip("httpx2", reason="the mcp client's HTTP transport needs httpx2")
jsonschema = pytest.importorskip("jsonschema")

from mcp import Client, MCPError, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.types import CallToolResult, TextContent, Tool  # noqa: E402

T = TypeVar("T")

TOOLS = {
    "create_sandbox",
    "list_sandboxes",
    "run_command",
    "read_file",
    "write_file",
    "list_files",
    "checkpoint",
    "rollback",
    "fork",
    "show_tree",
    "delete_sandbox",
}
READ_ONLY = {"list_sandboxes", "read_file", "list_files", "show_tree"}
DESTRUCTIVE = {"run_command", "write_file", "rollback", "delete_sandbox"}
IDEMPOTENT = READ_ONLY | {"write_file", "rollback", "delete_sandbox"}
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
LABELS = {"test": "pytest-mcp"}


# ------------------------------------------------------------------ the client


@dataclass
class Mcp:
    """An MCP conversation: the connected client, and the tools it listed."""

    client: Client
    tools: dict[str, Tool] = field(default_factory=dict)

    async def result(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        result = await self.client.call_tool(name, arguments)
        assert result.content, f"{name}: a result without content"
        first = result.content[0]
        assert isinstance(first, TextContent), f"{name}: content[0] is {first!r}"
        assert first.text, f"{name}: empty text"
        return result

    async def ok(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Calls a tool that must succeed; its structured output, checked
        against the tool's output schema."""
        result = await self.result(name, arguments)
        assert not result.is_error, f"{name}({arguments}) failed: {text(result)}"
        out = result.structured_content
        assert isinstance(out, dict), f"{name}: structuredContent is {out!r}"
        schema = self.tools[name].output_schema
        assert schema is not None
        jsonschema.validate(out, schema, cls=jsonschema.Draft202012Validator)
        return out

    async def fails(self, name: str, arguments: dict[str, Any]) -> str:
        """Calls a tool that must answer a tool error; the error's text."""
        result = await self.result(name, arguments)
        assert result.is_error, f"{name}({arguments}) did not fail: {text(result)}"
        return text(result)


def text(result: CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return first.text


Connect = Callable[[], Client]
"""Makes a new (unentered) client of one transport."""


def stdio_client(binary: Path, socket: str | Path) -> Client:
    return Client(
        StdioServerParameters(command=str(binary), args=["mcp"], env={"SANDTREE_SOCKET": str(socket)})
    )


@asynccontextmanager
async def http_transport(url: str, **http_options: Any) -> AsyncIterator[Any]:
    """Streamable HTTP over an ``httpx2`` client of our own, closed at the end
    (the transport leaves a client it is given open); yields the transport's
    (read, write) streams."""
    async with httpx2.AsyncClient(timeout=60, **http_options) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def http_client(daemon: Daemon) -> Client:
    return Client(http_transport(daemon.url + "/mcp", headers={"Authorization": f"Bearer {daemon.token}"}))


@asynccontextmanager
async def connected(connect: Connect) -> AsyncIterator[Mcp]:
    async with connect() as client:
        listed = await client.list_tools()
        yield Mcp(client, {t.name: t for t in listed.tools})


def converse(connect: Connect, body: Callable[[Mcp], Awaitable[T]]) -> T:
    """Runs ``body`` in one MCP conversation."""

    async def main() -> T:
        async with connected(connect) as session:
            return await body(session)

    return asyncio.run(main())


@pytest.fixture(params=["stdio", "http"])
def connect(request: pytest.FixtureRequest, daemon: Daemon) -> Connect:
    """A client maker for each transport."""
    if request.param == "stdio":
        return lambda: stdio_client(daemon.binary, daemon.socket)
    return lambda: http_client(daemon)


@pytest.fixture
def cleanup(client: sandtree.Sandtree) -> Iterator[list[str]]:
    """Sandbox ids to delete (with their checkpoints) after the test."""
    ids: list[str] = []
    yield ids
    for sandbox_id in reversed(ids):
        try:
            client.get(sandbox_id).delete(checkpoints=True)
        except sandtree.NotFoundError:
            pass


# ------------------------------------------------------------------ tools/list


def test_initialize_and_tools_list(connect: Connect) -> None:
    async def body(s: Mcp) -> None:
        c = s.client
        assert c.protocol_version in PROTOCOL_VERSIONS
        assert c.server_info is not None and c.server_info.name == "sandtree"
        assert c.server_capabilities.tools is not None
        assert c.instructions and "checkpoint" in c.instructions

        assert set(s.tools) == TOOLS
        for name, tool in s.tools.items():
            assert tool.title, name
            assert tool.description, name
            for schema in (tool.input_schema, tool.output_schema):
                assert schema is not None and schema["type"] == "object", name
                jsonschema.Draft202012Validator.check_schema(schema)
                for required in schema.get("required", []):
                    assert required in schema["properties"], f"{name}: {required}"
            a = tool.annotations
            assert a is not None, name
            assert a.read_only_hint is (name in READ_ONLY), name
            assert a.destructive_hint is (name in DESTRUCTIVE), name
            assert a.idempotent_hint is (name in IDEMPOTENT), name
            assert a.open_world_hint is False, name
        assert s.tools["run_command"].input_schema["required"] == ["sandbox_id", "command"]
        assert s.tools["fork"].input_schema["properties"]["count"]["maximum"] == 64

    converse(connect, body)


# ------------------------------------------------------------------ sandboxes


def test_create_list_and_delete(connect: Connect, client: sandtree.Sandtree, cleanup: list[str]) -> None:
    async def body(s: Mcp) -> None:
        made = await s.ok("create_sandbox", {"labels": {**LABELS, "case": "create"}})
        sandbox_id = made["sandbox_id"]
        cleanup.append(sandbox_id)
        assert sandbox_id.startswith("sb-")
        assert made["status"] == "running"

        # The SDK sees it, with its labels.
        sb = client.get(sandbox_id)
        assert sb.labels == {**LABELS, "case": "create"}
        assert sb.image == made["image"]

        listed = await s.ok("list_sandboxes", {})
        rows = {row["sandbox_id"]: row for row in listed["sandboxes"]}
        assert rows[sandbox_id]["labels"] == {**LABELS, "case": "create"}
        assert rows[sandbox_id]["status"] == "running"

        gone = await s.ok("delete_sandbox", {"sandbox_id": sandbox_id})
        assert gone["sandbox_id"] == sandbox_id
        listed = await s.ok("list_sandboxes", {})
        assert sandbox_id not in {row["sandbox_id"] for row in listed["sandboxes"]}
        with pytest.raises(sandtree.NotFoundError):
            client.get(sandbox_id)
        # Deleting it again is a tool error naming the code.
        assert "sandbox_not_found" in await s.fails("delete_sandbox", {"sandbox_id": sandbox_id})

    converse(connect, body)


# ------------------------------------------------------------------ commands


def test_run_command(connect: Connect, sandbox: sandtree.Sandbox) -> None:
    sid = sandbox.id

    async def body(s: Mcp) -> None:
        out = await s.ok("run_command", {"sandbox_id": sid, "command": "echo hi; echo err >&2; exit 3"})
        assert out["exit_code"] == 3
        assert out["stdout"] == "hi\n"
        assert out["stderr"] == "err\n"
        assert out["timed_out"] is False
        assert out["stdout_truncated"] is False and out["stderr_truncated"] is False
        result = await s.result("run_command", {"sandbox_id": sid, "command": "echo hi; echo err >&2; exit 3"})
        assert not result.is_error  # a failing command is not a tool error
        assert "hi" in text(result) and "[stderr]" in text(result) and "[exit code 3]" in text(result)

        # The default working directory is /root; cwd, env and stdin are passed.
        out = await s.ok("run_command", {"sandbox_id": sid, "command": "pwd; id -un"})
        assert out["stdout"] == "/root\nroot\n" and out["exit_code"] == 0
        out = await s.ok(
            "run_command",
            {
                "sandbox_id": sid,
                "command": 'pwd; echo "$GREETING $WHO"; cat',
                "cwd": "/tmp",
                "env": {"GREETING": "hello", "WHO": "mcp"},
                "stdin": "from stdin\n",
            },
        )
        assert out["stdout"] == "/tmp\nhello mcp\nfrom stdin\n"

        # Another user of the sandbox.
        out = await s.ok("run_command", {"sandbox_id": sid, "command": "id -un; id -u", "user": "nobody"})
        assert out["exit_code"] == 0, out
        assert out["stdout"].split()[0] == "nobody"
        assert out["stdout"].split()[1] != "0"

        # A command killed at its time limit.
        started = time.monotonic()
        out = await s.ok("run_command", {"sandbox_id": sid, "command": "echo started; sleep 5", "timeout_ms": 300})
        assert out["timed_out"] is True
        assert out["exit_code"] != 0
        assert time.monotonic() - started < 4
        result = await s.result("run_command", {"sandbox_id": sid, "command": "sleep 5", "timeout_ms": 200})
        assert "timed out" in text(result)

        # Effects are real: a file the command wrote.
        await s.ok("run_command", {"sandbox_id": sid, "command": "echo made > /root/by-mcp.txt"})
        assert sandbox.files.read_text("/root/by-mcp.txt") == "made\n"

    converse(connect, body)


# ------------------------------------------------------------------ files


def test_write_and_read_files(connect: Connect, sandbox: sandtree.Sandbox) -> None:
    sid = sandbox.id
    binary = b"\x00\x01\xff\xfe\x80 not utf-8 \x00\xc3\x28"

    async def body(s: Mcp) -> None:
        # Text, at a relative path (under /root), in a directory that is made.
        content = "héllo, wörld ✓\nline two\n"
        info = await s.ok("write_file", {"sandbox_id": sid, "path": "notes/a.txt", "content": content})
        assert info["path"] == "/root/notes/a.txt"
        assert info["kind"] == "file"
        assert info["size"] == len(content.encode())
        assert info["mode"] == "644"
        assert sandbox.files.read("/root/notes/a.txt") == content.encode()

        read = await s.ok("read_file", {"sandbox_id": sid, "path": "notes/a.txt"})
        assert read == {"path": "/root/notes/a.txt", "size": len(content.encode()), "encoding": "utf-8",
                        "content": content}
        assert text(await s.result("read_file", {"sandbox_id": sid, "path": "/root/notes/a.txt"})) == content

        # Replaced whole.
        await s.ok("write_file", {"sandbox_id": sid, "path": "/root/notes/a.txt", "content": "short"})
        assert (await s.ok("read_file", {"sandbox_id": sid, "path": "notes/a.txt"}))["content"] == "short"

        # Binary bytes (NULs, invalid UTF-8) as base64, both ways.
        encoded = base64.b64encode(binary).decode()
        info = await s.ok(
            "write_file", {"sandbox_id": sid, "path": "/tmp/blob.bin", "content": encoded, "encoding": "base64"}
        )
        assert info["size"] == len(binary)
        assert sandbox.files.read("/tmp/blob.bin") == binary
        read = await s.ok("read_file", {"sandbox_id": sid, "path": "/tmp/blob.bin"})
        assert read["encoding"] == "base64"
        assert read["size"] == len(binary)
        assert base64.b64decode(read["content"]) == binary
        # A binary file the SDK wrote reads back the same.
        sandbox.files.write("/tmp/sdk.bin", bytes(range(256)))
        read = await s.ok("read_file", {"sandbox_id": sid, "path": "/tmp/sdk.bin"})
        assert read["encoding"] == "base64" and base64.b64decode(read["content"]) == bytes(range(256))

        # A mode: an executable script.
        info = await s.ok(
            "write_file",
            {"sandbox_id": sid, "path": "bin/hello.sh", "content": "#!/bin/sh\necho script ran\n", "mode": "755"},
        )
        assert info["mode"] == "755"
        assert sandbox.files.stat("/root/bin/hello.sh").mode == "755"
        out = await s.ok("run_command", {"sandbox_id": sid, "command": "./bin/hello.sh"})
        assert out["stdout"] == "script ran\n"

    converse(connect, body)


def test_empty_file(connect: Connect, sandbox: sandtree.Sandbox) -> None:
    """An empty file reads back empty, and the text copy still says something
    (a blank text block reads, to an agent, like no answer at all)."""
    sid = sandbox.id

    async def body(s: Mcp) -> None:
        info = await s.ok("write_file", {"sandbox_id": sid, "path": "/tmp/empty", "content": ""})
        assert info["size"] == 0
        assert sandbox.files.read("/tmp/empty") == b""
        result = await s.client.call_tool("read_file", {"sandbox_id": sid, "path": "/tmp/empty"})
        assert not result.is_error
        assert result.structured_content == {"path": "/tmp/empty", "size": 0, "encoding": "utf-8", "content": ""}
        assert text(result), "read_file of an empty file answers an empty text block"

    converse(connect, body)


def test_read_file_through_a_symlink(connect: Connect, sandbox: sandtree.Sandbox) -> None:
    """read_file follows a symlink: its size is the target's (the bytes it
    answers), and its 4 MiB limit is the target's size too."""
    sid = sandbox.id
    sandbox.exec(
        "printf 'twelve bytes' > /root/target.txt; ln -s /root/target.txt /root/link.txt;"
        "head -c 5000000 /dev/zero > /tmp/big.bin; ln -s /tmp/big.bin /root/big-link"
    ).check()

    async def body(s: Mcp) -> None:
        read = await s.ok("read_file", {"sandbox_id": sid, "path": "link.txt"})
        assert read["content"] == "twelve bytes"
        assert read["size"] == 12, f"size {read['size']} is the symlink's own, not the file's"
        big = await s.result("read_file", {"sandbox_id": sid, "path": "big-link"})
        assert big.is_error, "a symlink to a 5 MB file gets around the 4 MiB limit of read_file"
        assert "invalid_argument" in text(big)

    converse(connect, body)


def test_list_files(connect: Connect, sandbox: sandtree.Sandbox) -> None:
    sid = sandbox.id
    sandbox.files.write("/root/proj/top.txt", "top")
    sandbox.files.write("/root/proj/src/main.py", "print('hi')\n")
    sandbox.files.write("/root/proj/src/deep/leaf.txt", "leaf")

    async def body(s: Mcp) -> None:
        one = await s.ok("list_files", {"sandbox_id": sid, "path": "/root/proj"})
        assert one["path"] == "/root/proj"
        entries = {e["path"]: e for e in one["entries"]}
        assert set(entries) == {"/root/proj/top.txt", "/root/proj/src"}
        assert entries["/root/proj/top.txt"]["kind"] == "file" and entries["/root/proj/top.txt"]["size"] == 3
        assert entries["/root/proj/src"]["kind"] == "dir"

        three = await s.ok("list_files", {"sandbox_id": sid, "path": "/root/proj", "depth": 3})
        assert {e["path"] for e in three["entries"]} == {
            "/root/proj/top.txt",
            "/root/proj/src",
            "/root/proj/src/main.py",
            "/root/proj/src/deep",
            "/root/proj/src/deep/leaf.txt",
        }
        two = await s.ok("list_files", {"sandbox_id": sid, "path": "proj", "depth": 2})
        assert "/root/proj/src/main.py" in {e["path"] for e in two["entries"]}
        assert "/root/proj/src/deep/leaf.txt" not in {e["path"] for e in two["entries"]}

        # The default directory is /root.
        home = await s.ok("list_files", {"sandbox_id": sid})
        assert home["path"] == "/root"
        assert "/root/proj" in {e["path"] for e in home["entries"]}
        result = await s.result("list_files", {"sandbox_id": sid, "path": "/root/proj"})
        assert "/root/proj/top.txt" in text(result)

    converse(connect, body)


# ------------------------------------------------------------------ checkpoints

# A Python server that keeps a counter in memory: each connection gets the
# next value. Its memory is what a rollback must bring back.
HIT = "python3 -c \"import socket; print(socket.create_connection(('127.0.0.1', 7000)).recv(16).decode())\""


def test_checkpoint_and_rollback_restore_files_and_a_live_process(
    connect: Connect, sandbox: sandtree.Sandbox
) -> None:
    sid = sandbox.id
    server = start_counter(sandbox)

    async def hit(s: Mcp) -> int:
        out = await s.ok("run_command", {"sandbox_id": sid, "command": HIT, "timeout_ms": 10_000})
        assert out["exit_code"] == 0, out
        return int(out["stdout"])

    async def body(s: Mcp) -> None:
        await s.ok("write_file", {"sandbox_id": sid, "path": "state.txt", "content": "original\n"})
        assert await hit(s) == 1

        ck = await s.ok("checkpoint", {"sandbox_id": sid, "label": "one-hit"})
        assert ck["checkpoint_id"].startswith("ck-")
        assert ck["sandbox_id"] == sid
        assert ck["label"] == "one-hit"
        assert ck["process_state"] == "captured"
        assert server.pid in ck["processes"]
        assert sandbox.refresh().base_checkpoint == ck["checkpoint_id"]

        # Change everything: the file, a new file, the server's memory, a new process.
        await s.ok("write_file", {"sandbox_id": sid, "path": "state.txt", "content": "changed\n"})
        await s.ok("write_file", {"sandbox_id": sid, "path": "new.txt", "content": "new"})
        assert await hit(s) == 2
        assert await hit(s) == 3
        sandbox.spawn(["sleep", "300"])
        out = await s.ok("run_command", {"sandbox_id": sid, "command": "grep -la 'slee[p]' /proc/[0-9]*/cmdline"})
        assert out["stdout"].strip(), "the sleep did not start"

        back = await s.ok("rollback", {"sandbox_id": sid, "checkpoint_id": ck["checkpoint_id"]})
        assert back["sandbox_id"] == sid
        assert back["checkpoint_id"] == ck["checkpoint_id"]
        assert back["processes"] == "restored"
        assert server.pid in back["restored_pids"]

        read = await s.ok("read_file", {"sandbox_id": sid, "path": "/root/state.txt"})
        assert read["content"] == "original\n"
        assert "file_not_found" in await s.fails("read_file", {"sandbox_id": sid, "path": "new.txt"})
        assert not sandbox.files.exists("/root/new.txt")
        # The server's memory is as at the checkpoint (one hit), and the
        # process started after it is gone.
        assert await hit(s) == 2
        out = await s.ok("run_command", {"sandbox_id": sid, "command": "grep -la 'slee[p]' /proc/[0-9]*/cmdline"})
        assert out["stdout"] == ""
        assert server.poll().running

        # Rolling back again to the same checkpoint is fine (idempotent).
        again = await s.ok("rollback", {"sandbox_id": sid, "checkpoint_id": ck["checkpoint_id"]})
        assert again["processes"] == "restored"
        assert await hit(s) == 2

    converse(connect, body)


def test_rollback_restores_a_shell_variable(connect: Connect, sandbox: sandtree.Sandbox) -> None:
    sid = sandbox.id
    with sandbox.session() as session:
        session.run("cd /tmp; X=1").check()

        async def checkpoint(s: Mcp) -> str:
            ck: str = (await s.ok("checkpoint", {"sandbox_id": sid}))["checkpoint_id"]
            return ck

        ck = converse(connect, checkpoint)
        session.run("cd /; X=2").check()
        assert session.run("echo $X").text == "2\n"

        async def rollback(s: Mcp) -> None:
            await s.ok("rollback", {"sandbox_id": sid, "checkpoint_id": ck})

        converse(connect, rollback)
        assert session.run("echo $X $(pwd)").text == "1 /tmp\n"


def test_fork_three_that_diverge_and_show_tree(
    connect: Connect, client: sandtree.Sandtree, cleanup: list[str]
) -> None:
    async def body(s: Mcp) -> None:
        origin = (await s.ok("create_sandbox", {"labels": LABELS}))["sandbox_id"]
        cleanup.append(origin)
        await s.ok("write_file", {"sandbox_id": origin, "path": "shared.txt", "content": "from the checkpoint\n"})
        root = await s.ok("checkpoint", {"sandbox_id": origin, "label": "root"})
        await s.ok("write_file", {"sandbox_id": origin, "path": "shared.txt", "content": "after the checkpoint\n"})
        left = await s.ok("checkpoint", {"sandbox_id": origin, "label": "left"})
        root_id, left_id = root["checkpoint_id"], left["checkpoint_id"]

        forked = await s.ok("fork", {"checkpoint_id": root_id, "count": 3})
        ids = forked["sandbox_ids"]
        cleanup.extend(ids)
        assert forked["checkpoint_id"] == root_id
        assert forked.get("errors", []) == []
        assert len(ids) == 3 and len(set(ids)) == 3 and origin not in ids
        assert all(i.startswith("sb-") for i in ids)
        result = await s.result("fork", {"checkpoint_id": root_id, "count": 1})
        extra = result.structured_content["sandbox_ids"]
        cleanup.extend(extra)
        assert all(i in text(result) for i in extra)

        # Each fork has the checkpoint's files, then goes its own way.
        for n, sandbox_id in enumerate(ids):
            assert client.get(sandbox_id).base_checkpoint == root_id
            read = await s.ok("read_file", {"sandbox_id": sandbox_id, "path": "shared.txt"})
            assert read["content"] == "from the checkpoint\n"
            await s.ok("write_file", {"sandbox_id": sandbox_id, "path": "shared.txt", "content": f"fork {n}\n"})
        for n, sandbox_id in enumerate(ids):
            read = await s.ok("read_file", {"sandbox_id": sandbox_id, "path": "shared.txt"})
            assert read["content"] == f"fork {n}\n"
            out = await s.ok("run_command", {"sandbox_id": sandbox_id, "command": "cat /root/shared.txt"})
            assert out["stdout"] == f"fork {n}\n"
        assert (await s.ok("read_file", {"sandbox_id": origin, "path": "shared.txt"}))["content"] == (
            "after the checkpoint\n"
        )

        # The tree: root, left on root; the forks stand on root, the origin on left.
        tree = await s.ok("show_tree", {"sandbox_id": origin})
        rows = {row["checkpoint_id"]: row for row in tree["checkpoints"]}
        assert set(rows) == {root_id, left_id}
        assert rows[root_id]["parent"] is None
        assert rows[left_id]["parent"] == root_id
        assert rows[root_id]["label"] == "root" and rows[left_id]["label"] == "left"
        assert set(rows[root_id]["sandboxes_on_it"]) == {*ids, *extra}
        assert rows[left_id]["sandboxes_on_it"] == [origin]
        shown = text(await s.result("show_tree", {"sandbox_id": origin}))
        lines = shown.splitlines()
        assert lines[0].startswith(root_id) and '"root"' in lines[0]
        assert all(i in lines[0] for i in ids)
        assert left_id in lines[1] and origin in lines[1]
        # Without a sandbox: every checkpoint of the daemon, these among them.
        everything = await s.ok("show_tree", {})
        assert {root_id, left_id} <= {row["checkpoint_id"] for row in everything["checkpoints"]}
        # A fork's own tree is the one of its origin's checkpoints.
        fork_tree = await s.ok("show_tree", {"sandbox_id": ids[0]})
        assert root_id in {row["checkpoint_id"] for row in fork_tree["checkpoints"]}

        # Out of bounds counts are refused before anything is made.
        assert "invalid_argument" in await s.fails("fork", {"checkpoint_id": root_id, "count": 0})
        assert "invalid_argument" in await s.fails("fork", {"checkpoint_id": root_id, "count": 1000})

        # Delete the forks.
        for sandbox_id in [*ids, *extra]:
            gone = await s.ok("delete_sandbox", {"sandbox_id": sandbox_id})
            assert gone["sandbox_id"] == sandbox_id
        listed = {row["sandbox_id"] for row in (await s.ok("list_sandboxes", {}))["sandboxes"]}
        assert not listed & {*ids, *extra}
        assert origin in listed

    converse(connect, body)


def test_delete_keeps_or_deletes_checkpoints(
    connect: Connect, client: sandtree.Sandtree, cleanup: list[str]
) -> None:
    async def body(s: Mcp) -> None:
        # Without delete_checkpoints: the checkpoint stays, and can be forked.
        kept_sb = (await s.ok("create_sandbox", {"labels": LABELS}))["sandbox_id"]
        cleanup.append(kept_sb)
        await s.ok("write_file", {"sandbox_id": kept_sb, "path": "f.txt", "content": "kept"})
        kept_ck = (await s.ok("checkpoint", {"sandbox_id": kept_sb}))["checkpoint_id"]
        gone = await s.ok("delete_sandbox", {"sandbox_id": kept_sb})
        assert gone["checkpoints_kept"] == [kept_ck]
        assert gone.get("checkpoints_deleted", []) == []
        assert client.checkpoint(kept_ck).id == kept_ck
        child = (await s.ok("fork", {"checkpoint_id": kept_ck, "count": 1}))["sandbox_ids"]
        cleanup.extend(child)
        assert (await s.ok("read_file", {"sandbox_id": child[0], "path": "f.txt"}))["content"] == "kept"
        gone = await s.ok("delete_sandbox", {"sandbox_id": child[0], "delete_checkpoints": True})
        client.checkpoint(kept_ck).delete()

        # With delete_checkpoints: it goes too.
        sandbox_id = (await s.ok("create_sandbox", {"labels": LABELS}))["sandbox_id"]
        cleanup.append(sandbox_id)
        ck = (await s.ok("checkpoint", {"sandbox_id": sandbox_id}))["checkpoint_id"]
        gone = await s.ok("delete_sandbox", {"sandbox_id": sandbox_id, "delete_checkpoints": True})
        assert gone["sandbox_id"] == sandbox_id
        assert gone["checkpoints_deleted"] == [ck]
        assert gone.get("checkpoints_kept", []) == []
        with pytest.raises(sandtree.NotFoundError):
            client.checkpoint(ck)
        assert "checkpoint_not_found" in await s.fails("fork", {"checkpoint_id": ck, "count": 1})
        assert ck not in {row["checkpoint_id"] for row in (await s.ok("show_tree", {}))["checkpoints"]}

    converse(connect, body)


# ------------------------------------------------------------------ errors


def check_errors(connect: Connect, sandbox: sandtree.Sandbox, cases: list[tuple[str, dict[str, Any], str]]) -> None:
    """Each call must be a tool error whose text names the code; none may
    change the sandbox."""

    async def body(s: Mcp) -> list[str]:
        wrong = []
        for name, arguments, code in cases:
            result = await s.result(name, arguments)
            if not result.is_error:
                wrong.append(f"{name}({json.dumps(arguments)}): expected a tool error, got {text(result)!r}")
            elif code not in text(result):
                wrong.append(f"{name}({json.dumps(arguments)}): expected {code!r} in {text(result)!r}")
        out = await s.ok("run_command", {"sandbox_id": sandbox.id, "command": "echo alive"})
        assert out["stdout"] == "alive\n"
        assert not sandbox.files.exists("/root/b.bin")
        return wrong

    wrong = converse(connect, body)
    assert not wrong, "\n".join(wrong)


def test_api_errors(connect: Connect, sandbox: sandtree.Sandbox) -> None:
    sid = sandbox.id
    sandbox.exec("head -c 5000000 /dev/zero > /tmp/big.bin").check()
    check_errors(
        connect,
        sandbox,
        [
            ("run_command", {"sandbox_id": "sb-doesnotexist", "command": "true"}, "sandbox_not_found"),
            ("read_file", {"sandbox_id": "sb-doesnotexist", "path": "x"}, "sandbox_not_found"),
            ("write_file", {"sandbox_id": "sb-doesnotexist", "path": "x", "content": ""}, "sandbox_not_found"),
            ("checkpoint", {"sandbox_id": "sb-doesnotexist"}, "sandbox_not_found"),
            ("show_tree", {"sandbox_id": "sb-doesnotexist"}, "sandbox_not_found"),
            ("rollback", {"sandbox_id": sid, "checkpoint_id": "ck-nope"}, "checkpoint_not_found"),
            ("fork", {"checkpoint_id": "ck-nope", "count": 1}, "checkpoint_not_found"),
            ("create_sandbox", {"image": "no-such-image"}, "image_not_found"),
            ("read_file", {"sandbox_id": sid, "path": "/root/no/such/file"}, "file_not_found"),
            ("list_files", {"sandbox_id": sid, "path": "/no/such/dir"}, "file_not_found"),
            ("read_file", {"sandbox_id": sid, "path": "/root"}, "invalid_argument"),
            ("read_file", {"sandbox_id": sid, "path": "/tmp/big.bin"}, "invalid_argument"),
            ("read_file", {"sandbox_id": sid, "path": ""}, "invalid_argument"),
            ("write_file", {"sandbox_id": sid, "path": "b.bin", "content": "!!not base64!!", "encoding": "base64"},
             "invalid_argument"),
            ("write_file", {"sandbox_id": sid, "path": "b.bin", "content": "x", "encoding": "latin-1"},
             "invalid_argument"),
            ("write_file", {"sandbox_id": sid, "path": "b.bin", "content": "x", "mode": "999"}, "invalid_argument"),
            ("write_file", {"sandbox_id": sid, "path": "/", "content": "x"}, "invalid_argument"),
            ("fork", {"checkpoint_id": "ck-nope", "count": 0}, "invalid_argument"),
            ("fork", {"checkpoint_id": "ck-nope", "count": 1000}, "invalid_argument"),
            ("list_files", {"sandbox_id": sid, "depth": 0}, "invalid_argument"),
            ("list_files", {"sandbox_id": sid, "depth": 65}, "invalid_argument"),
            ("list_files", {"sandbox_id": sid, "path": "/etc/passwd"}, "invalid_argument"),
        ],
    )


def test_bad_arguments_are_invalid_argument(connect: Connect, sandbox: sandtree.Sandbox) -> None:
    """Arguments the input schema refuses (a missing one, a wrong type, an id
    with characters ids never have) are tool errors with the same code the API
    gives such mistakes, ``invalid_argument``, as the agent gets for a fork
    count out of bounds."""
    sid = sandbox.id
    check_errors(
        connect,
        sandbox,
        [
            ("read_file", {"sandbox_id": "../x", "path": "x"}, "invalid_argument"),
            ("checkpoint", {"sandbox_id": "sb-a/../../v1"}, "invalid_argument"),
            ("rollback", {"sandbox_id": sid, "checkpoint_id": "ck-1?x=y"}, "invalid_argument"),
            ("run_command", {"sandbox_id": sid}, "invalid_argument"),
            ("run_command", {"command": "true"}, "invalid_argument"),
            ("write_file", {"sandbox_id": sid, "path": "b.bin"}, "invalid_argument"),
            ("fork", {"checkpoint_id": "ck-nope"}, "invalid_argument"),
            ("run_command", {"sandbox_id": sid, "command": 42}, "invalid_argument"),
            ("run_command", {"sandbox_id": sid, "command": "true", "timeout_ms": "soon"}, "invalid_argument"),
            ("run_command", {"sandbox_id": sid, "command": "true", "timeout_ms": 0}, "invalid_argument"),
            ("run_command", {"sandbox_id": sid, "command": "true", "env": {"A": 1}}, "invalid_argument"),
            ("create_sandbox", {"labels": {"a": 1}}, "invalid_argument"),
            ("checkpoint", {"sandbox_id": sid, "label": 5}, "invalid_argument"),
            ("delete_sandbox", {"sandbox_id": sid, "delete_checkpoints": "yes"}, "invalid_argument"),
            ("fork", {"checkpoint_id": "ck-nope", "count": -1}, "invalid_argument"),
        ],
    )


def test_unknown_tool_is_a_jsonrpc_error(connect: Connect) -> None:
    async def body(s: Mcp) -> None:
        with pytest.raises(MCPError) as info:
            await s.client.call_tool("no_such_tool", {})
        assert info.value.code == -32602
        assert "no_such_tool" in info.value.message
        # The conversation goes on.
        assert {t.name for t in (await s.client.list_tools()).tools} == TOOLS

    converse(connect, body)


# ------------------------------------------------------------------ HTTP, raw


def rpc(method: str, params: dict[str, Any] | None = None, id: int | str | None = 1) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    if id is not None:
        msg["id"] = id
    return msg


HEADERS = {"Accept": "application/json, text/event-stream"}
CLIENT_INFO = {"name": "pytest", "version": "0"}


@pytest.fixture
def tcp(daemon: Daemon) -> Iterator[httpx.Client]:
    """Raw HTTP to the daemon's TCP listener, with the token."""
    with httpx.Client(
        base_url=daemon.url, headers={**HEADERS, "Authorization": f"Bearer {daemon.token}"}, timeout=30
    ) as c:
        yield c


def test_http_needs_the_token_on_tcp(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url, headers=HEADERS, timeout=30) as c:
        assert c.post("/mcp", json=rpc("tools/list")).status_code == 401
        wrong = c.post("/mcp", json=rpc("tools/list"), headers={"Authorization": "Bearer wrong"})
        assert wrong.status_code == 401
        call = rpc("tools/call", {"name": "list_sandboxes", "arguments": {}})
        assert c.post("/mcp", json=call).status_code == 401


def test_http_status_codes(tcp: httpx.Client) -> None:
    # No stream, no session.
    get = tcp.get("/mcp")
    assert get.status_code == 405
    assert get.headers.get("allow") == "POST"
    assert tcp.delete("/mcp").status_code == 405

    # A request: 200 with a JSON answer, no session id.
    r = tcp.post("/mcp", json=rpc("ping", id=7))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in r.headers
    assert r.json() == {"jsonrpc": "2.0", "id": 7, "result": {}}

    # A notification, and a response: 202 and no body.
    for msg in (
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}},
        {"jsonrpc": "2.0", "id": 5, "result": {}},
    ):
        r = tcp.post("/mcp", json=msg)
        assert r.status_code == 202, msg
        assert r.content == b""

    # Not JSON: 400 and a parse error.
    r = tcp.post("/mcp", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    body = r.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    assert body["error"]["code"] == -32700

    # A batch (not supported by MCP since 2025-06-18) and a message without a method.
    r = tcp.post("/mcp", json=[rpc("ping")])
    assert r.json()["error"]["code"] == -32600
    r = tcp.post("/mcp", json={"jsonrpc": "2.0"})
    assert r.json()["error"]["code"] == -32600


def test_http_refuses_an_unsupported_protocol_version_header(tcp: httpx.Client) -> None:
    """Streamable HTTP (2025-06-18 and 2025-11-25): a request whose
    ``MCP-Protocol-Version`` header is invalid or unsupported MUST get 400; a
    supported one, or none (a client before 2025-06-18), is served."""
    for version in (*PROTOCOL_VERSIONS, None):
        headers = {} if version is None else {"MCP-Protocol-Version": version}
        assert tcp.post("/mcp", json=rpc("tools/list"), headers=headers).status_code == 200, version
    for version in ("1999-01-01", "not-a-version"):
        r = tcp.post("/mcp", json=rpc("tools/list"), headers={"MCP-Protocol-Version": version})
        assert r.status_code == 400, f"MCP-Protocol-Version: {version} answered {r.status_code}"


def test_invalid_jsonrpc_messages(tcp: httpx.Client) -> None:
    """Messages that are neither a request, a notification nor a response are
    answered ``-32600`` (JSON-RPC 2.0: an id is a string or a number, MCP: never
    null; ``jsonrpc`` is exactly "2.0")."""
    wrong = []
    for msg in (
        {"jsonrpc": "2.0", "id": None, "method": "ping"},
        {"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"},
        {"jsonrpc": "2.0", "id": True, "method": "ping"},
        {"jsonrpc": "1.0", "id": 1, "method": "ping"},
        {"id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1},
    ):
        r = tcp.post("/mcp", json=msg)
        code = r.json().get("error", {}).get("code") if r.content else None
        if code != -32600:
            wrong.append(f"{json.dumps(msg)}: expected a -32600 error, got {r.status_code} {r.text!r}")
    assert not wrong, "\n".join(wrong)


def test_http_refuses_a_web_page_origin(tcp: httpx.Client) -> None:
    for origin in ("http://evil.example", "https://localhost.evil.example", "null"):
        r = tcp.post("/mcp", json=rpc("tools/list"), headers={"Origin": origin})
        assert r.status_code == 403, origin
        assert "tools" not in r.text
    for origin in ("http://localhost:3000", "http://127.0.0.1", "http://[::1]:8080"):
        r = tcp.post("/mcp", json=rpc("tools/list"), headers={"Origin": origin})
        assert r.status_code == 200, origin


def test_http_methods_and_version_negotiation(tcp: httpx.Client) -> None:
    r = tcp.post("/mcp", json=rpc("server/discover", {}))
    assert r.status_code == 200
    assert r.json()["error"]["code"] == -32601
    assert r.json()["id"] == 1
    assert tcp.post("/mcp", json=rpc("resources/list")).json()["error"]["code"] == -32601

    def negotiated(asked: str) -> dict[str, Any]:
        params = {"protocolVersion": asked, "capabilities": {}, "clientInfo": CLIENT_INFO}
        r = tcp.post("/mcp", json=rpc("initialize", params))
        assert r.status_code == 200
        result: dict[str, Any] = r.json()["result"]
        return result

    for version in PROTOCOL_VERSIONS:
        assert negotiated(version)["protocolVersion"] == version
    old = negotiated("1999-01-01")
    assert old["protocolVersion"] == "2025-11-25"
    assert old["serverInfo"]["name"] == "sandtree"
    assert old["capabilities"]["tools"] == {"listChanged": False}

    r = tcp.post("/mcp", json=rpc("tools/call", {"name": "nope", "arguments": {}}))
    assert r.json()["error"]["code"] == -32602
    r = tcp.post("/mcp", json=rpc("tools/call", {"arguments": {}}))
    assert r.json()["error"]["code"] == -32602
    r = tcp.post("/mcp", json=rpc("tools/call", {"name": "list_sandboxes", "arguments": []}))
    result = r.json()["result"]
    assert result["isError"] is True and result["content"][0]["text"]


def test_http_on_the_unix_socket_needs_no_token(daemon: Daemon) -> None:
    transport = httpx.HTTPTransport(uds=str(daemon.socket))
    with httpx.Client(transport=transport, base_url="http://sandtree", headers=HEADERS, timeout=30) as c:
        r = c.post("/mcp", json=rpc("tools/list"))
        assert r.status_code == 200
        assert {t["name"] for t in r.json()["result"]["tools"]} == TOOLS
        r = c.post("/mcp", json=rpc("tools/call", {"name": "list_sandboxes", "arguments": {}}))
        result = r.json()["result"]
        assert result["isError"] is False
        assert isinstance(result["structuredContent"]["sandboxes"], list)
        assert c.post("/mcp", json=rpc("ping"), headers={"Origin": "http://evil.example"}).status_code == 403


def test_mcp_client_over_the_unix_socket(daemon: Daemon) -> None:
    def connect() -> Client:
        uds = httpx2.AsyncHTTPTransport(uds=str(daemon.socket))
        return Client(http_transport("http://sandtree/mcp", transport=uds))

    async def body(s: Mcp) -> None:
        assert set(s.tools) == TOOLS
        assert isinstance((await s.ok("list_sandboxes", {}))["sandboxes"], list)

    converse(connect, body)


# ------------------------------------------------------------------ stdio, raw


def test_stdio_without_a_daemon(daemon: Daemon, tmp_path: Path) -> None:
    def connect() -> Client:
        return stdio_client(daemon.binary, tmp_path / "nobody-here.sock")

    async def body(s: Mcp) -> None:
        assert set(s.tools) == TOOLS
        message = await s.fails("create_sandbox", {})
        assert "cannot connect to the sandtree daemon" in message
        assert "nobody-here.sock" in message
        assert "sandtree daemon" in message and "start" in message
        assert "cannot connect" in await s.fails("list_sandboxes", {})
        # The server is still there.
        assert {t.name for t in (await s.client.list_tools()).tools} == TOOLS

    converse(connect, body)


def test_stdio_lines(daemon: Daemon) -> None:
    """One answer per request line (requests run side by side, so in any
    order); notifications, blank lines and responses get none; a line that
    is not JSON gets a parse error."""
    lines = [
        rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": CLIENT_INFO}),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        "",
        "this is not json",
        rpc("ping", id=2),
        {"jsonrpc": "2.0", "id": 99, "result": {}},
        rpc("server/discover", {}, id=3),
        rpc("tools/call", {"name": "read_file", "arguments": {"sandbox_id": "sb-nope", "path": "x"}}, id="four"),
    ]
    stdin = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    env = {**os.environ, "SANDTREE_SOCKET": str(daemon.socket)}
    env.pop("SANDTREE_URL", None)
    done = subprocess.run(
        [str(daemon.binary), "mcp"], input=stdin.encode(), capture_output=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    answers = {a.get("id"): a for a in (json.loads(line) for line in done.stdout.decode().splitlines())}
    assert len(done.stdout.decode().splitlines()) == 5
    assert sorted(answers, key=str) == sorted([1, None, 2, 3, "four"], key=str)
    assert answers[1]["result"]["protocolVersion"] == "2025-06-18"
    assert answers[None]["error"]["code"] == -32700
    assert answers[2]["result"] == {}
    assert answers[3]["error"]["code"] == -32601
    assert answers["four"]["result"]["isError"] is True
    assert "sandbox_not_found" in answers["four"]["result"]["content"][0]["text"]


def test_stdio_runs_requests_side_by_side_and_cancels(daemon: Daemon, sandbox: sandtree.Sandbox) -> None:
    """A long command holds up no other request; a cancelled request is
    never answered and the server goes on."""
    env = {**os.environ, "SANDTREE_SOCKET": str(daemon.socket)}
    env.pop("SANDTREE_URL", None)
    server = subprocess.Popen(
        [str(daemon.binary), "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert server.stdin is not None and server.stdout is not None

    def send(msg: dict[str, Any]) -> None:
        assert server.stdin is not None
        server.stdin.write((json.dumps(msg) + "\n").encode())
        server.stdin.flush()

    def sleep_call(request_id: int, seconds: int) -> dict[str, Any]:
        arguments = {"sandbox_id": sandbox.id, "command": f"sleep {seconds}"}
        return rpc("tools/call", {"name": "run_command", "arguments": arguments}, id=request_id)

    try:
        send(rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": CLIENT_INFO}))
        assert json.loads(server.stdout.readline())["id"] == 1
        started = time.monotonic()
        send(sleep_call(10, 30))  # cancelled below
        send(sleep_call(11, 1))
        send(sleep_call(12, 1))
        send(rpc("ping", id=13))
        assert json.loads(server.stdout.readline())["id"] == 13, "a ping waited for the commands"
        send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 10}})
        ids = {json.loads(server.stdout.readline())["id"] for _ in range(2)}
        took = time.monotonic() - started
        assert ids == {11, 12}
        assert took < 1.8, f"two 1 s commands took {took:.1f} s: they did not run side by side"
        send(rpc("ping", id=14))
        assert json.loads(server.stdout.readline())["id"] == 14
        server.stdin.close()
        assert server.wait(timeout=30) == 0
        assert server.stdout.read() == b"", "the cancelled request was answered"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
