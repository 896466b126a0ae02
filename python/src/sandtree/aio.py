"""The asyncio client: :class:`AsyncSandtree` and its handles, the mirror
of :mod:`sandtree.client` (same names and arguments; methods that talk to
the daemon are coroutines).

::

    import asyncio
    from sandtree import AsyncSandtree

    async def main() -> None:
        async with AsyncSandtree() as client, client.create() as sb:
            ck = await sb.checkpoint()
            forks = await ck.fork(8)
            results = await asyncio.gather(*(f.exec(["python3", "-c", "print(1)"]) for f in forks))
            await asyncio.gather(*(f.delete() for f in forks))

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _ops as ops
from ._handles import CheckpointFields, SandboxFields, checkpoint_id, fork_error, labels_match
from ._ops import Command, FileData, Stdin
from ._transport import Call, Endpoint, async_chunks, body_headers, check, timeout_for, transport_error
from .client import DEFAULT_TIMEOUT, POLL_INTERVAL
from .errors import ClientTimeoutError, NotFoundError, SandtreeError
from .models import (
    CheckpointInfo,
    DaemonInfo,
    DeleteCheckpointResult,
    DeleteSandboxResult,
    ExecEvent,
    ExecResult,
    FileInfo,
    GcReport,
    ImageInfo,
    ImportProgress,
    Limits,
    ProcessImageSummary,
    ProcessInfo,
    ProcessOutput,
    RollbackResult,
    SandboxInfo,
    SessionInfo,
    SessionResult,
    NetworkInfo,
    PortInfo,
)
from .tree import CheckpointTree

__all__ = [
    "AsyncSandtree",
    "AsyncSandbox",
    "AsyncCheckpoint",
    "AsyncSession",
    "AsyncProcess",
    "AsyncFiles",
    "SandboxCreation",
]

T = TypeVar("T")


class AsyncSandtree:
    """A connection to the Sandtree daemon, for asyncio. Arguments as
    :class:`sandtree.Sandtree`; close it with ``await client.aclose()`` or
    use ``async with``. One client serves any number of concurrent calls."""

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.endpoint = Endpoint.resolve(socket, url, token)
        self.timeout = timeout
        transport = httpx.AsyncHTTPTransport(uds=self.endpoint.socket) if self.endpoint.socket else None
        self._http = httpx.AsyncClient(
            base_url=self.endpoint.base_url,
            transport=transport,
            headers=self.endpoint.headers,
            timeout=timeout_for("default", timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    # -------------------------------------------------------- plumbing

    async def _send(self, call: Call[Any], stream: bool) -> httpx.Response:
        request = self._http.build_request(
            call.method,
            call.path,
            params=call.params,
            json=call.json,
            content=async_chunks(call.body) if call.body is not None else None,
            headers=body_headers(call),
            timeout=timeout_for(call.wait, self.timeout),
        )
        try:
            resp = await self._http.send(request, stream=stream)
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e, call.wait, self.timeout) from e
        if not resp.is_success and stream:
            try:
                await resp.aread()
            finally:
                await resp.aclose()
        return check(resp)

    async def _run(self, call: Call[T]) -> T:
        """Sends ``call`` and parses its answer; raises the daemon's error."""
        return call.parse(await self._send(call, stream=False))

    @asynccontextmanager
    async def _stream(self, call: Call[Any]) -> AsyncIterator[httpx.Response]:
        """Sends ``call`` and yields the response as it streams."""
        resp = await self._send(call, stream=True)
        try:
            yield resp
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e, call.wait, self.timeout) from e
        finally:
            await resp.aclose()

    async def aclose(self) -> None:
        """Closes the connections (the sandboxes keep running)."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSandtree:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncSandtree({self.endpoint.describe()})"

    # -------------------------------------------------------- sandboxes

    def create(
        self,
        image: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        network: str | None = None,
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
    ) -> SandboxCreation:
        """Creates and starts a sandbox. Await it (``sb = await client.create()``)
        or enter it (``async with client.create() as sb:``, which deletes the
        sandbox on exit)."""
        return SandboxCreation(self._create(ops.create_sandbox(image, labels, limits, network, allow, deny)))

    async def _create(self, call: Call[SandboxInfo]) -> AsyncSandbox:
        return AsyncSandbox(self, await self._run(call))

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        """The sandbox with that id (``NotFoundError`` if there is none)."""
        return AsyncSandbox(self, await self._run(ops.get_sandbox(sandbox_id)))

    async def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[AsyncSandbox]:
        """Every sandbox, or those whose labels include all of ``labels``."""
        infos = await self._run(ops.list_sandboxes())
        return [AsyncSandbox(self, info) for info in infos if labels_match(info, labels)]

    # -------------------------------------------------------- checkpoints

    async def checkpoint(self, checkpoint_id: str) -> AsyncCheckpoint:
        """The checkpoint with that id (``NotFoundError`` if there is none)."""
        return AsyncCheckpoint(self, await self._run(ops.get_checkpoint(checkpoint_id)))

    async def checkpoints(self) -> CheckpointTree[AsyncCheckpoint]:
        """Every checkpoint of every sandbox, as a forest."""
        return CheckpointTree([AsyncCheckpoint(self, c) for c in await self._run(ops.all_checkpoints())])

    # -------------------------------------------------------- daemon

    async def info(self) -> DaemonInfo:
        """The daemon's version, state store and counts."""
        return await self._run(ops.info())

    async def gc(self) -> GcReport:
        """Deletes orphaned subvolumes and stale runtime state (never a checkpoint)."""
        return await self._run(ops.gc())

    async def images(self) -> builtins.list[ImageInfo]:
        """The images sandboxes can start from."""
        return await self._run(ops.images())

    async def import_image(
        self, name: str, source: str, on_progress: Callable[[ImportProgress], None] | None = None
    ) -> ImageInfo:
        """Imports a root filesystem (a directory or tarball on the daemon's
        host) as image ``name``; ``on_progress`` gets each progress event."""
        async with self._stream(ops.import_image(name, source)) as resp:
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                event = ops.import_event(line)
                if isinstance(event, ImageInfo):
                    return event
                if on_progress is not None:
                    on_progress(event)
        raise SandtreeError("internal", "the daemon's import stream ended without a result", 500)

    async def delete_image(self, name: str) -> None:
        """Deletes an image no sandbox or checkpoint uses."""
        await self._run(ops.delete_image(name))


class SandboxCreation(Awaitable["AsyncSandbox"]):
    """A sandbox being created: await it for the :class:`AsyncSandbox`, or use
    it with ``async with`` to delete the sandbox at the end."""

    def __init__(self, creating: Coroutine[Any, Any, AsyncSandbox]) -> None:
        self._creating = creating
        self._sandbox: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._creating.__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sandbox = await self._creating
        return self._sandbox

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._sandbox is not None:
            await self._sandbox.__aexit__(exc_type, exc, tb)


class AsyncSandbox(SandboxFields):
    """A sandbox, for asyncio: the mirror of :class:`sandtree.Sandbox`.

    ``async with sandbox:`` deletes it (and those of its checkpoints nothing
    else needs) on exit.
    """

    def __init__(self, client: AsyncSandtree, info: SandboxInfo, restored_pids: Sequence[int] = ()) -> None:
        super().__init__(info, restored_pids)
        self.client = client
        self.files = AsyncFiles(self)

    async def info(self) -> SandboxInfo:
        """A fresh description, with resource usage."""
        self.last_info = await self.client._run(ops.get_sandbox(self.id))
        return self.last_info

    async def refresh(self) -> AsyncSandbox:
        """Fetches a fresh description; returns ``self``."""
        await self.info()
        return self

    # -------------------------------------------------------- lifecycle

    async def start(self) -> AsyncSandbox:
        """Starts a stopped sandbox from its files; returns ``self``."""
        self.last_info = await self.client._run(ops.start_sandbox(self.id))
        return self

    async def stop(self) -> AsyncSandbox:
        """Stops its processes (the files stay); returns ``self``."""
        self.last_info = await self.client._run(ops.stop_sandbox(self.id))
        return self

    async def network(self) -> NetworkInfo:
        """Its network: mode, policy, addresses, bytes in and out."""
        return await self.client._run(ops.get_network(self.id))

    async def set_network(self, allow: Sequence[str] = (), deny: Sequence[str] = ()) -> NetworkInfo:
        """Replaces its egress policy (at once, for new connections; kept for
        its next start and its forks). A malformed rule raises
        ``InvalidArgumentError`` and changes nothing."""
        return await self.client._run(ops.set_network(self.id, allow, deny))

    async def expose(self, port: int) -> PortInfo:
        """Makes ``port`` (a server inside) reachable on the daemon's host:
        connect to ``.address`` (``127.0.0.1:<port>``)."""
        return await self.client._run(ops.expose_port(self.id, port))

    async def ports(self) -> builtins.list[PortInfo]:
        """Its exposed ports."""
        return await self.client._run(ops.ports(self.id))

    async def close_port(self, port: int) -> None:
        """Closes an exposed port."""
        await self.client._run(ops.close_port(self.id, port))

    async def delete(self, checkpoints: bool = False) -> DeleteSandboxResult:
        """Deletes the sandbox; its checkpoints stay unless ``checkpoints=True``
        (see :meth:`sandtree.Sandbox.delete`)."""
        return await self.client._run(ops.delete_sandbox(self.id, checkpoints))

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.delete(checkpoints=True)
        except NotFoundError:
            pass

    # -------------------------------------------------------- commands

    async def exec(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        stdin: Stdin | None = None,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Runs a command to its end (see :meth:`sandtree.Sandbox.exec`)."""
        call = ops.exec_call(
            self.id,
            cmd,
            env=env,
            cwd=cwd,
            user=user,
            stdin=stdin,
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            stream=False,
        )
        return await self.client._run(call)

    async def exec_stream(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
    ) -> AsyncIterator[ExecEvent]:
        """Runs a command and yields its events as they happen (not awaited:
        ``async for event in sb.exec_stream(cmd):``). See
        :meth:`sandtree.Sandbox.exec_stream`."""
        call = ops.exec_call(
            self.id,
            cmd,
            env=env,
            cwd=cwd,
            user=user,
            stdin=stdin,
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            stream=True,
        )
        async with self.client._stream(call) as resp:
            async for line in resp.aiter_lines():
                if line.strip():
                    yield ops.exec_event(line)

    async def spawn(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        stdin: str | bytes | None = None,
    ) -> AsyncProcess:
        """Starts a command in the background and returns at once."""
        pid = await self.client._run(ops.spawn(self.id, cmd, env=env, cwd=cwd, user=user, stdin=stdin))
        return AsyncProcess(self, pid, tuple(ops.command(cmd)))

    async def processes(self) -> builtins.list[AsyncProcess]:
        """The processes started with :meth:`spawn` (running or exited)."""
        return [AsyncProcess(self, p.pid, p.cmd) for p in await self.client._run(ops.processes(self.id))]

    # -------------------------------------------------------- sessions

    async def session(
        self, *, cwd: str | None = None, user: str | None = None, env: Mapping[str, str] | None = None
    ) -> AsyncSession:
        """Opens a persistent shell (see :meth:`sandtree.Sandbox.session`)."""
        info = await self.client._run(ops.create_session(self.id, cwd=cwd, user=user, env=env))
        return AsyncSession(self, info)

    async def sessions(self) -> builtins.list[AsyncSession]:
        """The sandbox's open sessions."""
        return [AsyncSession(self, s) for s in await self.client._run(ops.sessions(self.id))]

    # -------------------------------------------------------- checkpoints

    async def checkpoint(
        self,
        label: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        best_effort: bool = False,
        wait_durable: bool = False,
    ) -> AsyncCheckpoint:
        """Checkpoints the sandbox (see :meth:`sandtree.Sandbox.checkpoint`)."""
        info, note = await self.client._run(
            ops.checkpoint(self.id, label=label, labels=labels, best_effort=best_effort, wait_durable=wait_durable)
        )
        self._based_on(info.id)
        return AsyncCheckpoint(self.client, info, note)

    async def checkpoints(self) -> CheckpointTree[AsyncCheckpoint]:
        """The sandbox's checkpoint tree (parents first)."""
        infos = await self.client._run(ops.sandbox_checkpoints(self.id))
        return CheckpointTree([AsyncCheckpoint(self.client, c) for c in infos])

    async def rollback(self, checkpoint: CheckpointFields | str, *, allow_restart: bool = False) -> RollbackResult:
        """Brings the sandbox back to ``checkpoint`` (see :meth:`sandtree.Sandbox.rollback`)."""
        result = await self.client._run(ops.rollback(self.id, checkpoint_id(checkpoint), allow_restart))
        self.last_info = result.sandbox
        return result


class AsyncFiles:
    """The files of a sandbox (``sb.files``), for asyncio (see :class:`sandtree.Files`).

    :meth:`write` also takes an async iterable of bytes; a file object is
    read in a worker thread.
    """

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    @property
    def _client(self) -> AsyncSandtree:
        return self._sandbox.client

    async def read(self, path: str, *, user: str | None = None) -> bytes:
        """The file's bytes."""
        return await self._client._run(ops.read_file(self._sandbox.id, path, user))

    async def read_text(self, path: str, encoding: str = "utf-8", *, user: str | None = None) -> str:
        """The file decoded as text."""
        return (await self.read(path, user=user)).decode(encoding)

    async def write(
        self,
        path: str,
        data: FileData,
        *,
        user: str | None = None,
        mode: int | str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> FileInfo:
        """Writes a file at once, making missing parent directories (see
        the sync client's ``files.write``)."""
        call = ops.write_file(self._sandbox.id, path, data, user=user, mode=mode, metadata=metadata)
        return await self._client._run(call)

    async def stat(self, path: str, *, user: str | None = None) -> FileInfo:
        """What ``path`` is (a symlink is described, not followed)."""
        return await self._client._run(ops.stat_file(self._sandbox.id, path, user))

    async def exists(self, path: str, *, user: str | None = None) -> bool:
        """Whether ``path`` exists (a dangling symlink exists)."""
        try:
            await self.stat(path, user=user)
        except NotFoundError as e:
            if e.code == "file_not_found":
                return False
            raise
        return True

    async def list(self, path: str = ".", depth: int = 1, *, user: str | None = None) -> builtins.list[FileInfo]:
        """The entries of a directory (and of its subdirectories with ``depth`` > 1)."""
        return await self._client._run(ops.list_dir(self._sandbox.id, path, depth, user))

    async def mkdir(
        self, path: str, *, parents: bool = True, user: str | None = None, mode: int | str | None = None
    ) -> FileInfo:
        """Makes a directory (with ``parents``, as ``mkdir -p``)."""
        return await self._client._run(ops.make_dir(self._sandbox.id, path, parents=parents, user=user, mode=mode))

    async def move(self, src: str, dst: str, *, overwrite: bool = False, user: str | None = None) -> FileInfo:
        """Renames ``src`` to ``dst``; an existing ``dst`` raises unless ``overwrite``."""
        return await self._client._run(ops.move_file(self._sandbox.id, src, dst, overwrite=overwrite, user=user))

    async def remove(self, path: str, *, recursive: bool = False, user: str | None = None) -> None:
        """Removes a file, an empty directory, or with ``recursive`` a tree."""
        await self._client._run(ops.remove_file(self._sandbox.id, path, recursive, user))


class AsyncProcess:
    """A background process started with :meth:`AsyncSandbox.spawn`."""

    def __init__(self, sandbox: AsyncSandbox, pid: int, cmd: Sequence[str]) -> None:
        self.sandbox = sandbox
        self.pid = pid
        self.cmd = tuple(cmd)

    async def poll(self) -> ProcessInfo:
        """Its state now: ``running``, ``exit_code``, ``signal``."""
        return (await self.output()).process

    async def output(self) -> ProcessOutput:
        """Its state and its buffered output (bytes)."""
        return await self.sandbox.client._run(ops.process_output(self.sandbox.id, self.pid))

    async def wait(self, timeout: float | None = None) -> ProcessOutput:
        """Waits until it exits (polling) and returns its final state and
        output; raises ``ClientTimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            out = await self.output()
            if not out.process.running:
                return out
            if deadline is not None and time.monotonic() >= deadline:
                raise ClientTimeoutError(
                    "client_timeout", f"process {self.pid} in {self.sandbox.id} still runs after {timeout} s"
                )
            await asyncio.sleep(POLL_INTERVAL)

    async def kill(self, signal: int = 9) -> None:
        """Sends ``signal`` (default SIGKILL)."""
        await self.sandbox.client._run(ops.kill(self.sandbox.id, self.pid, signal))

    def __repr__(self) -> str:
        return f"AsyncProcess(pid={self.pid}, cmd={list(self.cmd)!r}, sandbox={self.sandbox.id!r})"


class AsyncSession:
    """A persistent shell in a sandbox, for asyncio (see :class:`sandtree.Session`)."""

    def __init__(self, sandbox: AsyncSandbox, info: SessionInfo) -> None:
        self.sandbox = sandbox
        self.id = info.id
        self.info = info

    async def run(self, command: str, timeout: float | None = None) -> SessionResult:
        """Runs one command line; returns what it printed and its exit code."""
        return await self.sandbox.client._run(ops.session_run(self.sandbox.id, self.id, command, timeout))

    async def close(self) -> None:
        """Kills the shell (a closed or vanished session is fine)."""
        try:
            await self.sandbox.client._run(ops.close_session(self.sandbox.id, self.id))
        except NotFoundError:
            pass

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncSession({self.id!r}, sandbox={self.sandbox.id!r})"


class AsyncCheckpoint(CheckpointFields):
    """A checkpoint, for asyncio (see :class:`sandtree.Checkpoint`)."""

    def __init__(self, client: AsyncSandtree, info: CheckpointInfo, note: str | None = None) -> None:
        super().__init__(info, note)
        self.client = client

    async def refresh(self) -> AsyncCheckpoint:
        """Fetches a fresh description; returns ``self``."""
        self.info = await self.client._run(ops.get_checkpoint(self.info.id))
        return self

    async def fork(
        self,
        n: int = 1,
        *,
        labels: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        files_only: bool = False,
    ) -> builtins.list[AsyncSandbox]:
        """Creates ``n`` sandboxes from this checkpoint, all or nothing (see
        :meth:`sandtree.Checkpoint.fork`)."""
        answer = await self.client._run(ops.fork(self.info.id, n, labels, limits, files_only))
        made = [AsyncSandbox(self.client, r.sandbox, r.restored_pids) for r in answer.results if r.sandbox is not None]
        errors = [r.error for r in answer.results if r.error is not None]
        if not errors and len(made) == n:
            return made
        await asyncio.gather(*(sb.delete() for sb in made), return_exceptions=True)
        raise fork_error(errors, len(made), n)

    async def delete(self, force: bool = False) -> DeleteCheckpointResult:
        """Deletes the checkpoint (see :meth:`sandtree.Checkpoint.delete`)."""
        return await self.client._run(ops.delete_checkpoint(self.info.id, force))

    async def inspect(self) -> ProcessImageSummary:
        """Reads back and checks its durable process image."""
        return await self.client._run(ops.inspect_image(self.info.id))
