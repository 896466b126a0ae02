"""The API's data, as frozen dataclasses parsed from the daemon's JSON.

Parsing ignores fields it does not know (the daemon adds fields over time)
and fills fields the daemon left out with their defaults. Enumerations are
``Literal`` strings of the API's snake_case values, so a value added by a
newer daemon still parses. Output bytes (exec, processes, sessions) are
``bytes``: the SDK asks the daemon for base64 and decodes it.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union

from .errors import CommandError

__all__ = [
    "SandboxStatus",
    "ProcessState",
    "ProcessOutcome",
    "RestoreSource",
    "ImageState",
    "FileKind",
    "Limits",
    "Usage",
    "SandboxInfo",
    "KeptCheckpoint",
    "DeleteSandboxResult",
    "ExecResult",
    "StartedEvent",
    "StdoutEvent",
    "StderrEvent",
    "ExitEvent",
    "ExecEvent",
    "ProcessInfo",
    "ProcessOutput",
    "SessionInfo",
    "SessionResult",
    "UnrestorableProcess",
    "ProcessImageInfo",
    "CheckpointInfo",
    "RollbackResult",
    "DeleteCheckpointResult",
    "ProcessSummary",
    "ProcessImageSummary",
    "GcReport",
    "VolumeInfo",
    "DaemonInfo",
    "ImageInfo",
    "ImportProgress",
    "FileInfo",
]

SandboxStatus = Literal["running", "stopped"]
"""``running``: its init runs. ``stopped``: its processes are gone, its files
intact; an exec or :meth:`Sandbox.start` starts it again."""

ProcessState = Literal["not_captured", "captured", "partial", "evicted"]
"""What a checkpoint holds of the sandbox's processes."""

ProcessOutcome = Literal["restored", "none_captured", "not_copied", "restarted"]
"""What became of a checkpoint's processes in a rollback or a fork."""

RestoreSource = Literal["templates", "image"]
"""Where a rollback restored processes from: live templates, or the durable image."""

ImageState = Literal["writing", "durable", "failed"]
"""Where a checkpoint's durable process image stands."""

FileKind = Literal["file", "dir", "symlink", "other"]
"""What a path in a sandbox names (``other``: a FIFO, socket or device)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of a sandbox; ``None`` means the daemon's default."""

    memory_bytes: int | None = None
    """Memory limit in bytes (page cache included)."""
    pids: int | None = None
    """Maximum number of tasks (processes and threads)."""
    cpu_millicores: int | None = None
    """CPU quota in thousandths of a core (1000 = one core)."""

    def to_json(self) -> dict[str, int]:
        """The request form: only the limits that are set."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Usage:
    """Resource usage of a sandbox (from its cgroup and its btrfs layer)."""

    memory_bytes: int
    pids: int
    cpu_usec: int
    disk_bytes: int
    """Bytes written to its writable layer since its base."""
    memory_limit_bytes: int | None = None
    pids_limit: int | None = None


@dataclass(frozen=True)
class NetworkInfo:
    """A sandbox's network: ``egress`` (an interface, NAT out through the
    host, DNS) or ``none`` (loopback alone), and its egress policy.

    ``allow`` and ``deny`` hold IPv4 addresses, CIDRs and domain names
    (``*.example.com`` for the names under it); an allowed destination is
    reached whatever ``deny`` says, and ``0.0.0.0/0`` in ``deny`` refuses
    everything not allowed."""

    mode: str = "none"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    address: str | None = None
    """Its address inside (``10.0.2.15``), while it runs with a network."""
    gateway: str | None = None
    """Its gateway and DNS server."""
    outward_address: str | None = None
    """The address it reaches the outside from (its own; forks each have one)."""
    rx_bytes: int = 0
    tx_bytes: int = 0


@dataclass(frozen=True)
class PortInfo:
    """A port of a sandbox reachable on the daemon's host."""

    port: int
    address: str
    """``127.0.0.1:<port>`` on the daemon's host."""
    url: str
    connections: int = 0


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the daemon describes it."""

    id: str
    image: str
    status: SandboxStatus
    created_at: str
    labels: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    status_reason: str | None = None
    """Why it is not running, or what happened to its processes."""
    base_checkpoint: str | None = None
    """The checkpoint its filesystem derives from (last checkpoint, rollback or fork)."""
    init_pid: int | None = None
    """Host pid of its init (for operators)."""
    usage: Usage | None = None
    """Resource usage (only from :meth:`Sandbox.info` / ``client.get``)."""
    network: NetworkInfo = field(default_factory=NetworkInfo)


@dataclass(frozen=True)
class KeptCheckpoint:
    """A checkpoint that outlives its deleted sandbox, and what needs it."""

    id: str
    size_bytes: int | None = None
    needed_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeleteSandboxResult:
    """What deleting a sandbox removed, and which of its checkpoints stay."""

    id: str
    checkpoints_deleted: tuple[str, ...] = ()
    checkpoints_deleted_bytes: int = 0
    checkpoints_kept: tuple[KeptCheckpoint, ...] = ()
    checkpoints_kept_bytes: int = 0
    note: str = ""
    duration_ms: float = 0.0


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


@dataclass(frozen=True)
class ExecResult:
    """A finished command: exit status and its output, byte for byte."""

    pid: int
    """Its pid inside the sandbox (0 when the program was not found)."""
    exit_code: int | None
    """Exit status when it exited; ``None`` when a signal killed it."""
    signal: int | None
    """The signal that killed it (9 after a timeout)."""
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool = False
    """True when more than ``max_output_bytes`` were written (the rest was dropped)."""
    stderr_truncated: bool = False
    timed_out: bool = False
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        """True when it exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def stdout_text(self) -> str:
        """``stdout`` decoded as UTF-8 (invalid bytes replaced)."""
        return _text(self.stdout)

    @property
    def stderr_text(self) -> str:
        """``stderr`` decoded as UTF-8 (invalid bytes replaced)."""
        return _text(self.stderr)

    @property
    def text(self) -> str:
        """Shorthand for :attr:`stdout_text`."""
        return self.stdout_text

    def check(self) -> ExecResult:
        """Returns ``self`` if :attr:`ok`, else raises :class:`CommandError`
        (its message ends with the command's stderr)."""
        if self.ok:
            return self
        if self.timed_out:
            how = f"timed out after {self.duration_ms:.0f} ms"
        elif self.exit_code is None:
            how = f"was killed by signal {self.signal}"
        else:
            how = f"exited {self.exit_code}"
        tail = self.stderr_text.strip()[-2000:]
        raise CommandError(f"the command {how}" + (f": {tail}" if tail else ""), self)


@dataclass(frozen=True)
class StartedEvent:
    """The command started (first event of :meth:`Sandbox.exec_stream`)."""

    pid: int
    type: Literal["started"] = "started"


@dataclass(frozen=True)
class StdoutEvent:
    """Bytes the command wrote on stdout."""

    data: bytes
    type: Literal["stdout"] = "stdout"


@dataclass(frozen=True)
class StderrEvent:
    """Bytes the command wrote on stderr."""

    data: bytes
    type: Literal["stderr"] = "stderr"


@dataclass(frozen=True)
class ExitEvent:
    """The command ended (last event); ``result.stdout``/``stderr`` are empty:
    the output came as events."""

    result: ExecResult
    type: Literal["exit"] = "exit"


ExecEvent = StartedEvent | StdoutEvent | StderrEvent | ExitEvent
"""One event of a streamed exec."""


@dataclass(frozen=True)
class ProcessInfo:
    """A background process started with :meth:`Sandbox.spawn`."""

    pid: int
    cmd: tuple[str, ...]
    started_at: str
    running: bool
    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class ProcessOutput:
    """A background process's state and its buffered output (the last MiB)."""

    process: ProcessInfo
    stdout: bytes
    stderr: bytes

    @property
    def stdout_text(self) -> str:
        return _text(self.stdout)

    @property
    def stderr_text(self) -> str:
        return _text(self.stderr)


@dataclass(frozen=True)
class SessionInfo:
    """A persistent shell session."""

    id: str
    sandbox_id: str
    pid: int
    shell: str
    created_at: str
    running: bool


@dataclass(frozen=True)
class SessionResult:
    """What one command line printed in a session (stdout and stderr
    interleaved, as on a terminal) and how it ended."""

    output: bytes
    exit_code: int | None
    timed_out: bool = False
    duration_ms: float = 0.0

    @property
    def text(self) -> str:
        """``output`` decoded as UTF-8 (invalid bytes replaced)."""
        return _text(self.output)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def check(self) -> SessionResult:
        """Returns ``self`` if :attr:`ok`, else raises :class:`CommandError`."""
        if self.ok:
            return self
        how = "timed out" if self.timed_out else f"exited {self.exit_code}"
        tail = self.text.strip()[-2000:]
        raise CommandError(f"the session command {how}" + (f": {tail}" if tail else ""), self)


@dataclass(frozen=True)
class UnrestorableProcess:
    """A process a checkpoint could not capture exactly, and why."""

    pid: int
    comm: str
    resource: str
    reason: str


@dataclass(frozen=True)
class ProcessImageInfo:
    """A checkpoint's durable process image (written after the checkpoint)."""

    state: ImageState
    bytes: int | None = None
    pages: int | None = None
    pages_written: int | None = None
    write_ms: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint as the daemon describes it."""

    id: str
    sandbox_id: str
    """The sandbox it was taken of (may be deleted since)."""
    parent: str | None
    """The checkpoint the sandbox derived from when this one was taken."""
    image: str
    """The image (root filesystem) of the sandbox."""
    created_at: str
    process_state: ProcessState
    label: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    size_bytes: int | None = None
    """What it adds over its parent; ``None`` while being measured."""
    processes: tuple[int, ...] = ()
    """Pids (inside the sandbox) whose live state was captured."""
    unrestorable: tuple[UnrestorableProcess, ...] = ()
    reparented: tuple[UnrestorableProcess, ...] = ()
    frozen_ms: float = 0.0
    """How long the sandbox's processes were stopped."""
    duration_ms: float = 0.0
    process_image: ProcessImageInfo | None = None


@dataclass(frozen=True)
class RollbackResult:
    """What a rollback did."""

    sandbox: SandboxInfo
    checkpoint: str
    processes: ProcessOutcome
    processes_restarted: bool
    """True only when ``processes == "restarted"`` (files restored, processes not)."""
    restored_pids: tuple[int, ...] = ()
    restored_from: RestoreSource | None = None
    connections_reset: tuple[str, ...] = ()
    """Connections to the outside its processes find reset (a peer outside is
    not part of a checkpoint): ``pid N fd F: local → remote``."""
    note: str = ""
    duration_ms: float = 0.0


@dataclass(frozen=True)
class DeleteCheckpointResult:
    """Every checkpoint removed (more than one with ``force=True``)."""

    deleted: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProcessSummary:
    """One process in a checkpoint's durable process image."""

    pid: int
    ppid: int
    comm: str
    exe: str
    threads: int
    descriptors: int
    mappings: int
    pages: int
    pages_here: int
    pages_in_parents: int
    pages_zero: int


@dataclass(frozen=True)
class ProcessImageSummary:
    """A checkpoint's durable process image, read back and checked."""

    checkpoint: str
    format_version: int
    file_bytes: int
    parent: str | None = None
    sources: tuple[str, ...] = ()
    pages_written: int = 0
    processes: tuple[ProcessSummary, ...] = ()
    blob_bytes: int = 0


@dataclass(frozen=True)
class GcReport:
    """What ``client.gc()`` removed (it never deletes a checkpoint)."""

    orphans_removed: tuple[str, ...] = ()
    stale_runtime_removed: tuple[str, ...] = ()
    bytes_freed: int = 0
    checkpoints_of_deleted_sandboxes: tuple[str, ...] = ()
    checkpoints_of_deleted_sandboxes_bytes: int = 0
    duration_ms: float = 0.0


@dataclass(frozen=True)
class VolumeInfo:
    """The daemon's btrfs state store."""

    path: str
    backing: str
    total_bytes: int
    used_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class DaemonInfo:
    """``client.info()``: version, state store and counts."""

    version: str
    data_dir: str
    volume: VolumeInfo
    cgroup: str
    uid_base: int
    sandboxes: int
    running: int
    checkpoints: int
    images: int
    metadata_bytes: int = 0
    spare_layers: int = 0
    uid_count: int = 65536
    uid_claim: str | None = None
    process_checkpoints: int = 0
    template_bytes: int = 0


@dataclass(frozen=True)
class ImageInfo:
    """An image: a read-only root filesystem sandboxes start from."""

    name: str
    kind: str
    """``default`` (the host's userland) or ``imported``."""
    created_at: str
    size_bytes: int
    source: str | None = None


@dataclass(frozen=True)
class ImportProgress:
    """A progress event of :meth:`Sandtree.import_image`."""

    phase: str
    done_bytes: int
    total_bytes: int
    files: int


@dataclass(frozen=True)
class FileInfo:
    """A file or directory of a sandbox (a symlink is described, not followed)."""

    path: str
    """Absolute path inside the sandbox."""
    name: str
    kind: FileKind
    size: int
    mode: str
    """Permission bits as octal text (``"644"``)."""
    uid: int
    gid: int
    modified_at: str
    symlink_target: str | None = None
    owner: str | None = None
    """The owner's name in the sandbox's ``/etc/passwd``, when it names one."""
    group: str | None = None
    """The group's name in the sandbox's ``/etc/group``, when it names one."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """User-defined metadata (``files.write(metadata=...)``), stored on the
    file as ``user.e2b.<key>`` extended attributes; keys are lowercase."""

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        return self.kind == "file"


# ---------------------------------------------------------------- parsing

T = TypeVar("T")


def parse(cls: type[T], data: Any) -> T:
    """Builds dataclass ``cls`` from a JSON object, recursively.

    Unknown keys are ignored; missing keys take the field's default (a
    missing required field raises ``ValueError``).
    """
    value: T = _convert(cls, data)
    return value


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
        if f.init
    )


def _convert(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(inner, value)
    if value is None:
        return None
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ValueError(f"{tp.__name__}: expected a JSON object, got {value!r}")
        kwargs: dict[str, Any] = {}
        for name, hint, required in _fields(tp):
            if name in value:
                kwargs[name] = _convert(hint, value[name])
            elif required:
                raise ValueError(f"{tp.__name__}: the daemon's answer has no {name!r}")
        return tp(**kwargs)
    if origin is tuple:
        (item, _) = typing.get_args(tp)
        return tuple(_convert(item, v) for v in value)
    if origin is Mapping or origin is dict:
        (_, item) = typing.get_args(tp)
        return {str(k): _convert(item, v) for k, v in value.items()}
    if tp is float:
        return float(value)
    return value
