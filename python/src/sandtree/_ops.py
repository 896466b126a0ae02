"""Every API operation as a :class:`~sandtree._transport.Call`: the request
it makes and how its answer is parsed. Shared by the sync and async clients,
which only send them."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import httpx

from ._transport import Body, Call, Source, Wait, path
from .errors import InvalidArgumentError, SandtreeError, error_for
from .models import (
    CheckpointInfo,
    DaemonInfo,
    DeleteCheckpointResult,
    DeleteSandboxResult,
    ExecEvent,
    ExecResult,
    ExitEvent,
    FileInfo,
    GcReport,
    ImageInfo,
    ImportProgress,
    Limits,
    NetworkInfo,
    PortInfo,
    ProcessImageSummary,
    ProcessInfo,
    ProcessOutcome,
    ProcessOutput,
    RollbackResult,
    SandboxInfo,
    SessionInfo,
    SessionResult,
    StartedEvent,
    StderrEvent,
    StdoutEvent,
    parse,
)

Command = str | Sequence[str]
"""A command: a list of program and arguments, or one string run by ``/bin/sh -c``."""

Stdin = str | bytes | IO[bytes] | Iterable[bytes] | AsyncIterable[bytes]
"""A command's stdin: text, bytes, or a binary file object / iterable of
bytes streamed as it is read (any size)."""

FileData = str | bytes | IO[bytes] | Iterable[bytes] | AsyncIterable[bytes]
"""What :meth:`Files.write` writes: text (UTF-8), bytes, or a binary file
object / iterable of bytes streamed as it is read (any size)."""

EXEC_STDIN_CONTENT_TYPE = "application/vnd.sandtree.exec+stdin"
"""Content type of an exec whose stdin streams in the body, after a JSON line."""

INLINE_STDIN_LIMIT = 8 * 1024 * 1024
"""Bytes of stdin sent inside the JSON request; more streams in the body
(the daemon buffers JSON bodies up to 64 MiB only)."""

TIMEOUT_GRACE = 30.0
"""Seconds the client waits past a command's own timeout for the answer."""

BASE64 = {"encoding": "base64"}


def _json(resp: httpx.Response) -> Any:
    return resp.json()


def _b64(text: str) -> bytes:
    return base64.b64decode(text) if text else b""


def _none(resp: httpx.Response) -> None:
    return None


def command(cmd: Command) -> list[str]:
    """The argv of ``cmd``: a string runs through ``/bin/sh -c``."""
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    return [str(a) for a in cmd]


def _millis(seconds: float | None) -> int | None:
    return None if seconds is None else max(1, round(seconds * 1000))


def _wait_after(timeout: float | None) -> Wait:
    return None if timeout is None else timeout + TIMEOUT_GRACE


def _mode(mode: int | str | None) -> str | None:
    """Permission bits as the daemon wants them: octal text (``0o644`` -> ``"644"``)."""
    if mode is None or isinstance(mode, str):
        return mode
    return format(mode, "o")


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# ---------------------------------------------------------------- daemon


def info() -> Call[DaemonInfo]:
    return Call("GET", path("info"), lambda r: parse(DaemonInfo, _json(r)))


def gc() -> Call[GcReport]:
    return Call("POST", path("gc"), lambda r: parse(GcReport, _json(r)), wait=None)


def images() -> Call[list[ImageInfo]]:
    return Call("GET", path("images"), lambda r: [parse(ImageInfo, i) for i in _json(r)["images"]])


def import_image(name: str, source: str) -> Call[None]:
    """The request of an import; its NDJSON events are read by :func:`import_event`."""
    return Call("POST", path("images"), _none, json={"name": name, "source": source}, wait=None)


def import_event(line: str) -> ImportProgress | ImageInfo:
    """One line of an import's stream: progress, the image, or an error raised."""
    event = json.loads(line)
    kind = event.get("type")
    if kind == "progress":
        return parse(ImportProgress, event)
    if kind == "done":
        return parse(ImageInfo, event)
    raise _stream_error(event)


def delete_image(name: str) -> Call[None]:
    return Call("DELETE", path("images", name), _none, wait=None)


# ---------------------------------------------------------------- sandboxes


def _sandbox(r: httpx.Response) -> SandboxInfo:
    return parse(SandboxInfo, _json(r))


def create_sandbox(
    image: str | None,
    labels: Mapping[str, str] | None,
    limits: Limits | None,
    network: str | None = None,
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
) -> Call[SandboxInfo]:
    body: dict[str, Any] = {"labels": dict(labels or {}), "limits": (limits or Limits()).to_json()}
    if image is not None:
        body["image"] = image
    if network is not None or allow or deny:
        body["network"] = _drop_none({"mode": network, "allow": list(allow), "deny": list(deny)})
    return Call("POST", path("sandboxes"), lambda r: parse(SandboxInfo, _json(r)["sandbox"]), json=body, wait=None)


def list_sandboxes() -> Call[list[SandboxInfo]]:
    return Call("GET", path("sandboxes"), lambda r: [parse(SandboxInfo, s) for s in _json(r)["sandboxes"]])


def get_sandbox(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("GET", path("sandboxes", sandbox_id), _sandbox)


def delete_sandbox(sandbox_id: str, checkpoints: bool) -> Call[DeleteSandboxResult]:
    params = {"checkpoints": "true"} if checkpoints else {}
    return Call(
        "DELETE",
        path("sandboxes", sandbox_id),
        lambda r: parse(DeleteSandboxResult, _json(r)),
        params=params,
        wait=None,
    )


def get_network(sandbox_id: str) -> Call[NetworkInfo]:
    return Call("GET", path("sandboxes", sandbox_id, "network"), lambda r: parse(NetworkInfo, _json(r)))


def set_network(sandbox_id: str, allow: Sequence[str], deny: Sequence[str]) -> Call[NetworkInfo]:
    body = {"allow": list(allow), "deny": list(deny)}
    return Call("PUT", path("sandboxes", sandbox_id, "network"), lambda r: parse(NetworkInfo, _json(r)), json=body)


def expose_port(sandbox_id: str, port: int) -> Call[PortInfo]:
    body = {"port": port}
    return Call("POST", path("sandboxes", sandbox_id, "ports"), lambda r: parse(PortInfo, _json(r)), json=body)


def ports(sandbox_id: str) -> Call[list[PortInfo]]:
    return Call(
        "GET", path("sandboxes", sandbox_id, "ports"), lambda r: [parse(PortInfo, p) for p in _json(r)["ports"]]
    )


def close_port(sandbox_id: str, port: int) -> Call[None]:
    return Call("DELETE", path("sandboxes", sandbox_id, "ports", str(port)), lambda r: None)


def start_sandbox(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("POST", path("sandboxes", sandbox_id, "start"), _sandbox, wait=None)


def stop_sandbox(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("POST", path("sandboxes", sandbox_id, "stop"), _sandbox, wait=None)


# ---------------------------------------------------------------- exec


def _exec_result(d: Mapping[str, Any]) -> ExecResult:
    return ExecResult(
        pid=int(d.get("pid", 0)),
        exit_code=d.get("exit_code"),
        signal=d.get("signal"),
        stdout=_b64(d.get("stdout", "")),
        stderr=_b64(d.get("stderr", "")),
        stdout_truncated=bool(d.get("stdout_truncated", False)),
        stderr_truncated=bool(d.get("stderr_truncated", False)),
        timed_out=bool(d.get("timed_out", False)),
        duration_ms=float(d.get("duration_ms", 0.0)),
    )


def exec_call(
    sandbox_id: str,
    cmd: Command,
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    user: str | None,
    stdin: Stdin | None,
    timeout: float | None,
    max_output_bytes: int | None,
    stream: bool,
) -> Call[ExecResult]:
    """A foreground exec; with ``stream`` its NDJSON events are read by :func:`exec_event`.

    Text stdin goes as ``stdin``, small bytes as ``stdin_base64``, and large
    bytes, file objects and iterables stream in the body after the JSON line
    (not with ``stream``: the client sends a body whole before it reads the
    answer, so a streamed exec's stdin is always inline).
    """
    request: dict[str, Any] = _drop_none(
        {
            "cmd": command(cmd),
            "env": dict(env) if env else None,
            "cwd": cwd,
            "user": user,
            "timeout_ms": _millis(timeout),
            "max_output_bytes": max_output_bytes,
        }
    )
    params = {**BASE64, **({"stream": "true"} if stream else {})}
    url = path("sandboxes", sandbox_id, "exec")

    def parse_result(r: httpx.Response) -> ExecResult:
        return _exec_result(_json(r))

    wait = _wait_after(timeout)
    if stdin is None or isinstance(stdin, str):
        if stdin is not None:
            request["stdin"] = stdin
        return Call("POST", url, parse_result, params=params, json=request, wait=wait)
    if isinstance(stdin, (bytes, bytearray, memoryview)) and (stream or len(stdin) <= INLINE_STDIN_LIMIT):
        request["stdin_base64"] = base64.b64encode(stdin).decode("ascii")
        return Call("POST", url, parse_result, params=params, json=request, wait=wait)
    head = json.dumps(request).encode() + b"\n"
    source: Source = bytes(stdin) if isinstance(stdin, (bytearray, memoryview)) else stdin
    return Call(
        "POST",
        url,
        parse_result,
        params=params,
        body=Body.of(head, source),
        headers={"Content-Type": EXEC_STDIN_CONTENT_TYPE},
        wait=wait,
    )


def exec_event(line: str) -> ExecEvent:
    """One line of a streamed exec, decoded (an ``error`` line is raised)."""
    event = json.loads(line)
    kind = event.get("type")
    if kind == "stdout":
        return StdoutEvent(_b64(event.get("data", "")))
    if kind == "stderr":
        return StderrEvent(_b64(event.get("data", "")))
    if kind == "started":
        return StartedEvent(int(event["pid"]))
    if kind == "exit":
        return ExitEvent(_exec_result(event))
    raise _stream_error(event)


def _stream_error(event: Mapping[str, Any]) -> SandtreeError:
    if event.get("type") == "error":
        return error_for(str(event.get("code", "internal")), str(event.get("message", "")))
    return error_for("internal", f"unexpected event in the daemon's stream: {event!r}")


def spawn(
    sandbox_id: str,
    cmd: Command,
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    user: str | None,
    stdin: str | bytes | None,
) -> Call[int]:
    """A background process; the answer is its pid."""
    request: dict[str, Any] = _drop_none(
        {"cmd": command(cmd), "env": dict(env) if env else None, "cwd": cwd, "user": user, "background": True}
    )
    if isinstance(stdin, str):
        request["stdin"] = stdin
    elif stdin is not None:
        request["stdin_base64"] = base64.b64encode(stdin).decode("ascii")
    return Call("POST", path("sandboxes", sandbox_id, "exec"), lambda r: int(_json(r)["pid"]), json=request)


def processes(sandbox_id: str) -> Call[list[ProcessInfo]]:
    return Call(
        "GET",
        path("sandboxes", sandbox_id, "processes"),
        lambda r: [parse(ProcessInfo, p) for p in _json(r)["processes"]],
    )


def process_output(sandbox_id: str, pid: int) -> Call[ProcessOutput]:
    def read(r: httpx.Response) -> ProcessOutput:
        d = _json(r)
        return ProcessOutput(parse(ProcessInfo, d["process"]), _b64(d.get("stdout", "")), _b64(d.get("stderr", "")))

    return Call("GET", path("sandboxes", sandbox_id, "processes", str(pid)), read, params=BASE64)


def kill(sandbox_id: str, pid: int, signal: int) -> Call[None]:
    return Call("DELETE", path("sandboxes", sandbox_id, "processes", str(pid)), _none, params={"signal": str(signal)})


# ---------------------------------------------------------------- sessions


def create_session(
    sandbox_id: str, *, cwd: str | None, user: str | None, env: Mapping[str, str] | None
) -> Call[SessionInfo]:
    body = _drop_none({"cwd": cwd, "user": user, "env": dict(env) if env else None})
    return Call("POST", path("sandboxes", sandbox_id, "sessions"), lambda r: parse(SessionInfo, _json(r)), json=body)


def sessions(sandbox_id: str) -> Call[list[SessionInfo]]:
    return Call(
        "GET",
        path("sandboxes", sandbox_id, "sessions"),
        lambda r: [parse(SessionInfo, s) for s in _json(r)["sessions"]],
    )


def session_run(sandbox_id: str, session_id: str, command_line: str, timeout: float | None) -> Call[SessionResult]:
    def read(r: httpx.Response) -> SessionResult:
        d = _json(r)
        return SessionResult(
            output=_b64(d.get("output", "")),
            exit_code=d.get("exit_code"),
            timed_out=bool(d.get("timed_out", False)),
            duration_ms=float(d.get("duration_ms", 0.0)),
        )

    body = _drop_none({"command": command_line, "timeout_ms": _millis(timeout)})
    return Call(
        "POST",
        path("sandboxes", sandbox_id, "sessions", session_id, "run"),
        read,
        params=BASE64,
        json=body,
        wait=_wait_after(timeout),
    )


def close_session(sandbox_id: str, session_id: str) -> Call[None]:
    return Call("DELETE", path("sandboxes", sandbox_id, "sessions", session_id), _none)


# ---------------------------------------------------------------- checkpoints


def checkpoint(
    sandbox_id: str, *, label: str | None, labels: Mapping[str, str] | None, best_effort: bool, wait_durable: bool
) -> Call[tuple[CheckpointInfo, str]]:
    """A checkpoint; the answer is its description and the daemon's note."""
    body: dict[str, Any] = {"labels": dict(labels or {}), "best_effort": best_effort, "wait_durable": wait_durable}
    if label is not None:
        body["label"] = label

    def read(r: httpx.Response) -> tuple[CheckpointInfo, str]:
        d = _json(r)
        return parse(CheckpointInfo, d["checkpoint"]), str(d.get("note", ""))

    return Call("POST", path("sandboxes", sandbox_id, "checkpoints"), read, json=body, wait=None)


def _checkpoint_list(r: httpx.Response) -> list[CheckpointInfo]:
    return [parse(CheckpointInfo, c) for c in _json(r)["checkpoints"]]


def sandbox_checkpoints(sandbox_id: str) -> Call[list[CheckpointInfo]]:
    return Call("GET", path("sandboxes", sandbox_id, "checkpoints"), _checkpoint_list)


def all_checkpoints() -> Call[list[CheckpointInfo]]:
    return Call("GET", path("checkpoints"), _checkpoint_list)


def get_checkpoint(checkpoint_id: str) -> Call[CheckpointInfo]:
    return Call("GET", path("checkpoints", checkpoint_id), lambda r: parse(CheckpointInfo, _json(r)))


def rollback(sandbox_id: str, checkpoint_id: str, allow_restart: bool) -> Call[RollbackResult]:
    return Call(
        "POST",
        path("sandboxes", sandbox_id, "rollback"),
        lambda r: parse(RollbackResult, _json(r)),
        json={"checkpoint": checkpoint_id, "allow_restart": allow_restart},
        wait=None,
    )


def inspect_image(checkpoint_id: str) -> Call[ProcessImageSummary]:
    return Call(
        "GET", path("checkpoints", checkpoint_id, "image"), lambda r: parse(ProcessImageSummary, _json(r)), wait=None
    )


def delete_checkpoint(checkpoint_id: str, force: bool) -> Call[DeleteCheckpointResult]:
    return Call(
        "DELETE",
        path("checkpoints", checkpoint_id),
        lambda r: parse(DeleteCheckpointResult, _json(r)),
        params={"force": "true"} if force else {},
        wait=None,
    )


@dataclass(frozen=True)
class Forked:
    """One fork's outcome: its sandbox and restored pids, or its error."""

    sandbox: SandboxInfo | None
    error: SandtreeError | None
    restored_pids: tuple[int, ...]


@dataclass(frozen=True)
class ForkAnswer:
    """A fork request's answer, before the client makes sandboxes of it."""

    results: list[Forked]
    processes: ProcessOutcome
    note: str


def fork(
    checkpoint_id: str, count: int, labels: Mapping[str, str] | None, limits: Limits | None, files_only: bool
) -> Call[ForkAnswer]:
    body: dict[str, Any] = {"count": count, "labels": dict(labels or {}), "files_only": files_only}
    if limits is not None:
        body["limits"] = limits.to_json()

    def read(r: httpx.Response) -> ForkAnswer:
        d = _json(r)
        results = []
        for res in d["results"]:
            err = res.get("error")
            results.append(
                Forked(
                    sandbox=parse(SandboxInfo, res["sandbox"]) if res.get("sandbox") else None,
                    error=error_for(str(err["code"]), str(err["message"])) if err else None,
                    restored_pids=tuple(res.get("restored_pids") or ()),
                )
            )
        return ForkAnswer(results, d.get("processes", "none_captured"), str(d.get("note", "")))

    return Call("POST", path("checkpoints", checkpoint_id, "fork"), read, json=body, wait=None)


# ---------------------------------------------------------------- files


def _file_params(file_path: str, user: str | None, **extra: str) -> dict[str, str]:
    return _drop_none({"path": file_path, "user": user, **extra})


def read_file(sandbox_id: str, file_path: str, user: str | None) -> Call[bytes]:
    params = _file_params(file_path, user)
    return Call("GET", path("sandboxes", sandbox_id, "files"), lambda r: r.content, params=params, wait=None)


_METADATA_KEY = re.compile(r"[A-Za-z0-9!#$%&'*+\-.^_`|~]+")
_METADATA_VALUE = re.compile(r"[\x20-\x7e]*")


def write_file(
    sandbox_id: str,
    file_path: str,
    data: FileData,
    *,
    user: str | None,
    mode: int | str | None,
    metadata: Mapping[str, str] | None = None,
) -> Call[FileInfo]:
    params = _drop_none({"path": file_path, "user": user, "mode": _mode(mode)})
    source: Source = data.encode() if isinstance(data, str) else data
    headers = {"Content-Type": "application/octet-stream"}
    for key, value in (metadata or {}).items():
        # (They travel as headers: checked here as the daemon checks them.)
        if not _METADATA_KEY.fullmatch(key):
            raise InvalidArgumentError(
                "invalid_argument", f"file metadata key {key!r}: letters, digits or !#$%&'*+-.^_`|~ only"
            )
        if not _METADATA_VALUE.fullmatch(value):
            raise InvalidArgumentError(
                "invalid_argument", f"file metadata value of {key!r}: printable ASCII characters only"
            )
        headers[f"X-Metadata-{key}"] = value
    return Call(
        "PUT",
        path("sandboxes", sandbox_id, "files"),
        lambda r: parse(FileInfo, _json(r)),
        params=params,
        body=Body.of(b"", source),
        headers=headers,
        wait=None,
    )


def remove_file(sandbox_id: str, file_path: str, recursive: bool, user: str | None) -> Call[None]:
    params = _file_params(file_path, user, **({"recursive": "true"} if recursive else {}))
    return Call("DELETE", path("sandboxes", sandbox_id, "files"), _none, params=params, wait=None)


def stat_file(sandbox_id: str, file_path: str, user: str | None) -> Call[FileInfo]:
    return Call(
        "GET",
        path("sandboxes", sandbox_id, "files", "stat"),
        lambda r: parse(FileInfo, _json(r)),
        params=_file_params(file_path, user),
    )


def list_dir(sandbox_id: str, dir_path: str, depth: int, user: str | None) -> Call[list[FileInfo]]:
    return Call(
        "GET",
        path("sandboxes", sandbox_id, "files", "list"),
        lambda r: [parse(FileInfo, e) for e in _json(r)["entries"]],
        params=_file_params(dir_path, user, depth=str(depth)),
        wait=None,
    )


def make_dir(
    sandbox_id: str, dir_path: str, *, parents: bool, user: str | None, mode: int | str | None
) -> Call[FileInfo]:
    body = _drop_none({"path": dir_path, "parents": parents, "user": user, "mode": _mode(mode)})
    return Call("POST", path("sandboxes", sandbox_id, "files", "mkdir"), lambda r: parse(FileInfo, _json(r)), json=body)


def move_file(sandbox_id: str, src: str, dst: str, *, overwrite: bool, user: str | None) -> Call[FileInfo]:
    body = _drop_none({"from": src, "to": dst, "overwrite": overwrite, "user": user})
    return Call("POST", path("sandboxes", sandbox_id, "files", "move"), lambda r: parse(FileInfo, _json(r)), json=body)
