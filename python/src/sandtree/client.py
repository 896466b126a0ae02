"""The synchronous client: :class:`Sandtree` and the handles it returns
(:class:`Sandbox`, :class:`Checkpoint`, :class:`Session`, :class:`Process`,
:class:`Files`).

::

    from sandtree import Sandtree

    with Sandtree() as client, client.create() as sb:
        print(sb.exec("python3 -c 'print(6*7)'").text)
        ck = sb.checkpoint(label="clean")
        sb.files.write("/root/notes.txt", "draft")
        sb.rollback(ck)
"""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _ops as ops
from ._handles import CheckpointFields, SandboxFields, checkpoint_id, fork_error, labels_match
from ._ops import Command, FileData, Stdin
from ._transport import Call, Endpoint, body_headers, check, sync_chunks, timeout_for, transport_error
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

__all__ = ["Sandtree", "Sandbox", "Checkpoint", "Session", "Process", "Files"]

T = TypeVar("T")

DEFAULT_TIMEOUT = 30.0
"""Seconds a quick call (a lookup, a listing) waits for the daemon. Calls
that take their own time (create, exec, checkpoint, rollback, fork, delete,
file transfers) have no read timeout, or the command's timeout plus a margin."""

POLL_INTERVAL = 0.05
"""Seconds between two polls of :meth:`Process.wait`."""


class Sandtree:
    """A connection to the Sandtree daemon.

    ``Sandtree()`` talks to the unix socket in ``SANDTREE_SOCKET``, else
    ``/var/lib/sandtree/sandtree.sock`` (no token needed); ``url=`` (or
    ``SANDTREE_URL``) talks TCP with the bearer ``token=`` (or
    ``SANDTREE_TOKEN``). Close it, or use it as a context manager.

    Args:
        socket: path of the daemon's unix socket.
        url: ``http://HOST:PORT`` of the daemon's TCP listener.
        token: bearer token of the TCP listener (the daemon's ``<data-dir>/token``).
        timeout: seconds a quick call waits for an answer (see :data:`DEFAULT_TIMEOUT`).
    """

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
        transport = httpx.HTTPTransport(uds=self.endpoint.socket) if self.endpoint.socket else None
        self._http = httpx.Client(
            base_url=self.endpoint.base_url,
            transport=transport,
            headers=self.endpoint.headers,
            timeout=timeout_for("default", timeout),
        )

    # -------------------------------------------------------- plumbing

    def _send(self, call: Call[Any], stream: bool) -> httpx.Response:
        request = self._http.build_request(
            call.method,
            call.path,
            params=call.params,
            json=call.json,
            content=sync_chunks(call.body) if call.body is not None else None,
            headers=body_headers(call),
            timeout=timeout_for(call.wait, self.timeout),
        )
        try:
            resp = self._http.send(request, stream=stream)
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e, call.wait, self.timeout) from e
        if not resp.is_success and stream:
            try:
                resp.read()
            finally:
                resp.close()
        return check(resp)

    def _run(self, call: Call[T]) -> T:
        """Sends ``call`` and parses its answer; raises the daemon's error."""
        return call.parse(self._send(call, stream=False))

    @contextmanager
    def _stream(self, call: Call[Any]) -> Iterator[httpx.Response]:
        """Sends ``call`` and yields the response as it streams (after
        raising the daemon's error for a non-2xx answer)."""
        resp = self._send(call, stream=True)
        try:
            yield resp
        except httpx.TransportError as e:
            raise transport_error(self.endpoint, e, call.wait, self.timeout) from e
        finally:
            resp.close()

    def close(self) -> None:
        """Closes the connections (the sandboxes keep running)."""
        self._http.close()

    def __enter__(self) -> Sandtree:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Sandtree({self.endpoint.describe()})"

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
    ) -> Sandbox:
        """Creates and starts a sandbox (from the image ``default``, the host's
        userland, unless ``image`` names another). Use it as a context manager
        to delete it at the end::

            with client.create(labels={"run": "42"}) as sb:
                ...

        ``network`` is ``"egress"`` (the daemon's default) or ``"none"``;
        ``allow`` and ``deny`` are its egress policy (see :class:`NetworkInfo`).
        """
        return Sandbox(self, self._run(ops.create_sandbox(image, labels, limits, network, allow, deny)))

    def get(self, sandbox_id: str) -> Sandbox:
        """The sandbox with that id (``NotFoundError`` if there is none)."""
        return Sandbox(self, self._run(ops.get_sandbox(sandbox_id)))

    def list(self, labels: Mapping[str, str] | None = None) -> builtins.list[Sandbox]:
        """Every sandbox, or those whose labels include all of ``labels``."""
        return [Sandbox(self, info) for info in self._run(ops.list_sandboxes()) if labels_match(info, labels)]

    # -------------------------------------------------------- checkpoints

    def checkpoint(self, checkpoint_id: str) -> Checkpoint:
        """The checkpoint with that id (``NotFoundError`` if there is none)."""
        return Checkpoint(self, self._run(ops.get_checkpoint(checkpoint_id)))

    def checkpoints(self) -> CheckpointTree[Checkpoint]:
        """Every checkpoint of every sandbox, as a forest."""
        return CheckpointTree([Checkpoint(self, c) for c in self._run(ops.all_checkpoints())])

    # -------------------------------------------------------- daemon

    def info(self) -> DaemonInfo:
        """The daemon's version, state store and counts."""
        return self._run(ops.info())

    def gc(self) -> GcReport:
        """Deletes orphaned subvolumes and stale runtime state (never a checkpoint)."""
        return self._run(ops.gc())

    def images(self) -> builtins.list[ImageInfo]:
        """The images sandboxes can start from."""
        return self._run(ops.images())

    def import_image(
        self, name: str, source: str, on_progress: Callable[[ImportProgress], None] | None = None
    ) -> ImageInfo:
        """Imports a root filesystem as image ``name`` from ``source``, a
        directory, ``.tar``, ``.tar.gz`` or ``.tgz`` on the daemon's host.
        ``on_progress`` is called with each progress event."""
        with self._stream(ops.import_image(name, source)) as resp:
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                event = ops.import_event(line)
                if isinstance(event, ImageInfo):
                    return event
                if on_progress is not None:
                    on_progress(event)
        raise SandtreeError("internal", "the daemon's import stream ended without a result", 500)

    def delete_image(self, name: str) -> None:
        """Deletes an image no sandbox or checkpoint uses."""
        self._run(ops.delete_image(name))


class Sandbox(SandboxFields):
    """A sandbox: run commands, read and write files, checkpoint, roll back.

    Get one from :meth:`Sandtree.create`, :meth:`Sandtree.get`,
    :meth:`Sandtree.list` or :meth:`Checkpoint.fork`. As a context manager it
    deletes the sandbox (and those of its checkpoints nothing else needs) on
    exit.

    ``status``, ``labels``, ``base_checkpoint`` come from ``last_info``, the
    last description the daemon gave (:meth:`refresh` fetches a new one);
    ``restored_pids`` are, in a fork, the pids of the checkpoint's processes
    that run in it; ``files`` reads and writes its files.
    """

    def __init__(self, client: Sandtree, info: SandboxInfo, restored_pids: Sequence[int] = ()) -> None:
        super().__init__(info, restored_pids)
        self.client = client
        self.files = Files(self)

    def info(self) -> SandboxInfo:
        """A fresh description, with resource usage."""
        self.last_info = self.client._run(ops.get_sandbox(self.id))
        return self.last_info

    def refresh(self) -> Sandbox:
        """Fetches a fresh description; returns ``self``."""
        self.info()
        return self

    # -------------------------------------------------------- lifecycle

    def start(self) -> Sandbox:
        """Starts a stopped sandbox from its files; returns ``self``."""
        self.last_info = self.client._run(ops.start_sandbox(self.id))
        return self

    def stop(self) -> Sandbox:
        """Stops its processes (the files stay); returns ``self``."""
        self.last_info = self.client._run(ops.stop_sandbox(self.id))
        return self

    def network(self) -> NetworkInfo:
        """Its network: mode, policy, addresses, bytes in and out."""
        return self.client._run(ops.get_network(self.id))

    def set_network(self, allow: Sequence[str] = (), deny: Sequence[str] = ()) -> NetworkInfo:
        """Replaces its egress policy (at once, for new connections; kept for
        its next start and its forks). A malformed rule raises
        ``InvalidArgumentError`` and changes nothing."""
        return self.client._run(ops.set_network(self.id, allow, deny))

    def expose(self, port: int) -> PortInfo:
        """Makes ``port`` (a server inside) reachable on the daemon's host:
        connect to ``.address`` (``127.0.0.1:<port>``)."""
        return self.client._run(ops.expose_port(self.id, port))

    def ports(self) -> builtins.list[PortInfo]:
        """Its exposed ports."""
        return self.client._run(ops.ports(self.id))

    def close_port(self, port: int) -> None:
        """Closes an exposed port."""
        self.client._run(ops.close_port(self.id, port))

    def delete(self, checkpoints: bool = False) -> DeleteSandboxResult:
        """Deletes the sandbox. Its checkpoints stay (they can seed forks)
        unless ``checkpoints=True``; even then those another sandbox or a
        kept checkpoint needs stay, as the result says."""
        return self.client._run(ops.delete_sandbox(self.id, checkpoints))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.delete(checkpoints=True)
        except NotFoundError:
            pass

    # -------------------------------------------------------- commands

    def exec(
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
        """Runs a command to its end and returns its exit status and output
        (bytes, exact).

        Args:
            cmd: ``["prog", "arg", ...]`` (looked up in ``PATH``), or a string
                run by ``/bin/sh -c``.
            env: variables added to the sandbox's default environment.
            cwd: working directory (default the user's home, ``/root``).
            user: a user name or uid of the sandbox (default root).
            stdin: text, bytes, or a binary file object / iterable of bytes
                streamed as it is read (any size). Default: empty.
            timeout: seconds after which the command is killed (the result
                then has ``timed_out=True``).
            max_output_bytes: bytes kept of each of stdout and stderr
                (default 1 MiB; the rest is dropped, ``stdout_truncated``).
        """
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
        return self.client._run(call)

    def exec_stream(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
    ) -> Iterator[ExecEvent]:
        """Runs a command and yields its events as they happen:
        :class:`StartedEvent`, then :class:`StdoutEvent` / :class:`StderrEvent`
        (bytes), then :class:`ExitEvent`. Arguments as :meth:`exec`.

        ::

            for event in sb.exec_stream(["make", "-j2"]):
                if isinstance(event, StdoutEvent):
                    sys.stdout.buffer.write(event.data)

        Leaving the loop early closes the stream; the command is not killed
        (pass ``timeout`` to bound it).
        """
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
        with self.client._stream(call) as resp:
            for line in resp.iter_lines():
                if line.strip():
                    yield ops.exec_event(line)

    def spawn(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        stdin: str | bytes | None = None,
    ) -> Process:
        """Starts a command in the background and returns at once. Its output
        is kept (the last MiB) and read with :meth:`Process.output`."""
        pid = self.client._run(ops.spawn(self.id, cmd, env=env, cwd=cwd, user=user, stdin=stdin))
        return Process(self, pid, tuple(ops.command(cmd)))

    def processes(self) -> builtins.list[Process]:
        """The processes started with :meth:`spawn` (running or exited)."""
        return [Process(self, p.pid, p.cmd) for p in self.client._run(ops.processes(self.id))]

    # -------------------------------------------------------- sessions

    def session(
        self, *, cwd: str | None = None, user: str | None = None, env: Mapping[str, str] | None = None
    ) -> Session:
        """Opens a persistent shell (bash on a terminal) that keeps its cwd,
        variables and jobs between :meth:`Session.run` calls. Close it, or
        use it as a context manager."""
        return Session(self, self.client._run(ops.create_session(self.id, cwd=cwd, user=user, env=env)))

    def sessions(self) -> builtins.list[Session]:
        """The sandbox's open sessions."""
        return [Session(self, s) for s in self.client._run(ops.sessions(self.id))]

    # -------------------------------------------------------- checkpoints

    def checkpoint(
        self,
        label: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        best_effort: bool = False,
        wait_durable: bool = False,
    ) -> Checkpoint:
        """Checkpoints the sandbox: its files and its live processes.

        Args:
            label: a name shown in trees.
            labels: free-form metadata.
            best_effort: checkpoint even if a process cannot be captured (it
                is then listed in ``unrestorable``); without it such a
                checkpoint raises ``ConflictError`` (``process_not_restorable``).
            wait_durable: return once the processes' durable image is written.
        """
        info, note = self.client._run(
            ops.checkpoint(self.id, label=label, labels=labels, best_effort=best_effort, wait_durable=wait_durable)
        )
        self._based_on(info.id)
        return Checkpoint(self.client, info, note)

    def checkpoints(self) -> CheckpointTree[Checkpoint]:
        """The sandbox's checkpoint tree (parents first)."""
        return CheckpointTree([Checkpoint(self.client, c) for c in self.client._run(ops.sandbox_checkpoints(self.id))])

    def rollback(self, checkpoint: CheckpointFields | str, *, allow_restart: bool = False) -> RollbackResult:
        """Brings the sandbox back to ``checkpoint`` (or its id): its files and
        its processes, with their pids and memory.

        If the checkpoint's processes cannot be restored this raises
        ``ConflictError`` (``processes_lost``) and changes nothing, unless
        ``allow_restart=True``: then the files are restored and the sandbox
        restarts with only its init (``result.processes == "restarted"``).
        """
        result = self.client._run(ops.rollback(self.id, checkpoint_id(checkpoint), allow_restart))
        self.last_info = result.sandbox
        return result


class Files:
    """The files of a sandbox (``sb.files``), read and written by the daemon
    without running a program in the sandbox.

    Paths are the sandbox's: absolute, or relative to the home of ``user``
    (every method takes one; default root, ``/root``); they never leave the
    sandbox (``..`` and symlinks resolve inside it). Missing paths raise
    ``NotFoundError`` with code ``file_not_found``.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    @property
    def _client(self) -> Sandtree:
        return self._sandbox.client

    def read(self, path: str, *, user: str | None = None) -> bytes:
        """The file's bytes."""
        return self._client._run(ops.read_file(self._sandbox.id, path, user))

    def read_text(self, path: str, encoding: str = "utf-8", *, user: str | None = None) -> str:
        """The file decoded as text."""
        return self.read(path, user=user).decode(encoding)

    def write(
        self,
        path: str,
        data: FileData,
        *,
        user: str | None = None,
        mode: int | str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> FileInfo:
        """Writes a file, at once (never half: readers see the old file or the
        new one), making missing parent directories.

        Args:
            data: ``str`` (written as UTF-8), ``bytes``, or a binary file
                object / iterable of bytes, streamed as it is read (any size).
            user: owner of a new file (default root); ``path`` relative to its home.
            mode: permission bits, ``0o644`` or ``"644"`` (a new file: 644;
                a replaced file keeps its mode unless given).
            metadata: the file's metadata (key → printable ASCII), which
                replaces the old file's; ``FileInfo.metadata`` shows it.
        """
        call = ops.write_file(self._sandbox.id, path, data, user=user, mode=mode, metadata=metadata)
        return self._client._run(call)

    def stat(self, path: str, *, user: str | None = None) -> FileInfo:
        """What ``path`` is (a symlink is described, not followed)."""
        return self._client._run(ops.stat_file(self._sandbox.id, path, user))

    def exists(self, path: str, *, user: str | None = None) -> bool:
        """Whether ``path`` exists (a dangling symlink exists)."""
        try:
            self.stat(path, user=user)
        except NotFoundError as e:
            if e.code == "file_not_found":
                return False
            raise
        return True

    def list(self, path: str = ".", depth: int = 1, *, user: str | None = None) -> builtins.list[FileInfo]:
        """The entries of a directory, sorted by path; with ``depth`` > 1 those
        of its subdirectories too, each after its directory."""
        return self._client._run(ops.list_dir(self._sandbox.id, path, depth, user))

    def mkdir(
        self, path: str, *, parents: bool = True, user: str | None = None, mode: int | str | None = None
    ) -> FileInfo:
        """Makes a directory (with ``parents``, as ``mkdir -p``: missing
        parents too, and an existing directory is fine; without, exactly one,
        and an existing path raises ``ConflictError``)."""
        return self._client._run(ops.make_dir(self._sandbox.id, path, parents=parents, user=user, mode=mode))

    def move(self, src: str, dst: str, *, overwrite: bool = False, user: str | None = None) -> FileInfo:
        """Renames ``src`` to ``dst`` inside the sandbox; an existing ``dst``
        raises ``ConflictError`` unless ``overwrite``."""
        return self._client._run(ops.move_file(self._sandbox.id, src, dst, overwrite=overwrite, user=user))

    def remove(self, path: str, *, recursive: bool = False, user: str | None = None) -> None:
        """Removes a file, an empty directory, or with ``recursive`` a tree."""
        self._client._run(ops.remove_file(self._sandbox.id, path, recursive, user))


class Process:
    """A background process started with :meth:`Sandbox.spawn`."""

    def __init__(self, sandbox: Sandbox, pid: int, cmd: Sequence[str]) -> None:
        self.sandbox = sandbox
        self.pid = pid
        self.cmd = tuple(cmd)

    def poll(self) -> ProcessInfo:
        """Its state now: ``running``, ``exit_code``, ``signal``."""
        return self.output().process

    def output(self) -> ProcessOutput:
        """Its state and its buffered output (bytes)."""
        return self.sandbox.client._run(ops.process_output(self.sandbox.id, self.pid))

    def wait(self, timeout: float | None = None) -> ProcessOutput:
        """Waits until it exits (polling) and returns its final state and
        output; raises ``ClientTimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            out = self.output()
            if not out.process.running:
                return out
            if deadline is not None and time.monotonic() >= deadline:
                raise ClientTimeoutError(
                    "client_timeout", f"process {self.pid} in {self.sandbox.id} still runs after {timeout} s"
                )
            time.sleep(POLL_INTERVAL)

    def kill(self, signal: int = 9) -> None:
        """Sends ``signal`` (default SIGKILL)."""
        self.sandbox.client._run(ops.kill(self.sandbox.id, self.pid, signal))

    def __repr__(self) -> str:
        return f"Process(pid={self.pid}, cmd={list(self.cmd)!r}, sandbox={self.sandbox.id!r})"


class Session:
    """A persistent shell in a sandbox: each :meth:`run` is one command line
    typed in the same bash, so ``cd``, variables and functions carry over."""

    def __init__(self, sandbox: Sandbox, info: SessionInfo) -> None:
        self.sandbox = sandbox
        self.id = info.id
        self.info = info

    def run(self, command: str, timeout: float | None = None) -> SessionResult:
        """Runs one command line and returns what it printed (stdout and
        stderr interleaved) and its exit code. After ``timeout`` seconds the
        command is interrupted and the result has ``timed_out=True``."""
        return self.sandbox.client._run(ops.session_run(self.sandbox.id, self.id, command, timeout))

    def close(self) -> None:
        """Kills the shell (a closed or vanished session is fine)."""
        try:
            self.sandbox.client._run(ops.close_session(self.sandbox.id, self.id))
        except NotFoundError:
            pass

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session({self.id!r}, sandbox={self.sandbox.id!r})"


class Checkpoint(CheckpointFields):
    """A checkpoint: a sandbox's files and processes at one moment, to roll
    back to (:meth:`Sandbox.rollback`) or fork from (:meth:`fork`).

    Its fields are those of :class:`CheckpointInfo` (``id``, ``label``,
    ``parent``, ``process_state``, ...; ``info`` is the whole description);
    ``note`` is the daemon's word on what was captured (set when it was
    just taken).
    """

    def __init__(self, client: Sandtree, info: CheckpointInfo, note: str | None = None) -> None:
        super().__init__(info, note)
        self.client = client

    def refresh(self) -> Checkpoint:
        """Fetches a fresh description (size, process image state); returns ``self``."""
        self.info = self.client._run(ops.get_checkpoint(self.info.id))
        return self

    def fork(
        self,
        n: int = 1,
        *,
        labels: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        files_only: bool = False,
    ) -> builtins.list[Sandbox]:
        """Creates ``n`` sandboxes from this checkpoint, each with its files
        and running copies of its processes (``sandbox.restored_pids``).

        All or nothing: if any fork fails, the ones made are deleted and
        :class:`ForkError` is raised. A checkpoint whose processes cannot be
        copied raises ``ConflictError`` (``processes_lost``) and creates
        nothing; ``files_only=True`` forks the files alone (each fork then
        runs only its init).

        Args:
            labels: labels of the new sandboxes.
            limits: their limits (default: those of the checkpointed sandbox).
        """
        answer = self.client._run(ops.fork(self.info.id, n, labels, limits, files_only))
        made = [Sandbox(self.client, r.sandbox, r.restored_pids) for r in answer.results if r.sandbox is not None]
        errors = [r.error for r in answer.results if r.error is not None]
        if not errors and len(made) == n:
            return made
        for sb in made:
            try:
                sb.delete()
            except SandtreeError:
                pass
        raise fork_error(errors, len(made), n)

    def delete(self, force: bool = False) -> DeleteCheckpointResult:
        """Deletes the checkpoint; one that children or sandboxes depend on
        raises ``ConflictError`` (``checkpoint_in_use``) unless ``force``
        (children are then relinked to its parent)."""
        return self.client._run(ops.delete_checkpoint(self.info.id, force))

    def inspect(self) -> ProcessImageSummary:
        """Reads back and checks its durable process image: its processes and
        where their pages are."""
        return self.client._run(ops.inspect_image(self.info.id))
