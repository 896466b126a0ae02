"""Sandtree's Python SDK: sandboxes for AI agents whose files and live
processes can be checkpointed, rolled back and forked in milliseconds.

::

    from sandtree import Sandtree

    with Sandtree() as client, client.create() as sb:
        sb.files.write("/root/task.py", "print(6 * 7)")
        print(sb.exec(["python3", "task.py"]).text)      # 42
        ck = sb.checkpoint(label="ready")
        forks = ck.fork(4)                              # 4 copies, processes included

:class:`Sandtree` is the synchronous client, :class:`AsyncSandtree` the
asyncio one (same methods, awaited). Both find the daemon at
``SANDTREE_SOCKET`` or ``/var/lib/sandtree/sandtree.sock``, or over TCP at
``SANDTREE_URL`` with ``SANDTREE_TOKEN``.
"""

from .aio import AsyncCheckpoint, AsyncFiles, AsyncProcess, AsyncSandbox, AsyncSandtree, AsyncSession, SandboxCreation
from .client import Checkpoint, Files, Process, Sandbox, Sandtree, Session
from .errors import (
    ClientTimeoutError,
    CommandError,
    ConflictError,
    DaemonUnavailableError,
    ForkError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SandtreeError,
    SandtreeTimeoutError,
    UnauthorizedError,
    UnsupportedError,
)
from .models import (
    CheckpointInfo,
    DaemonInfo,
    DeleteCheckpointResult,
    DeleteSandboxResult,
    ExecEvent,
    ExecResult,
    ExitEvent,
    FileInfo,
    FileKind,
    GcReport,
    ImageInfo,
    ImageState,
    ImportProgress,
    KeptCheckpoint,
    Limits,
    NetworkInfo,
    PortInfo,
    ProcessImageInfo,
    ProcessImageSummary,
    ProcessInfo,
    ProcessOutcome,
    ProcessOutput,
    ProcessState,
    ProcessSummary,
    RestoreSource,
    RollbackResult,
    SandboxInfo,
    SandboxStatus,
    SessionInfo,
    SessionResult,
    StartedEvent,
    StderrEvent,
    StdoutEvent,
    UnrestorableProcess,
    Usage,
    VolumeInfo,
)
from .tree import CheckpointTree

__version__ = "0.1.0"

__all__ = [
    # clients and handles
    "Sandtree",
    "Sandbox",
    "Checkpoint",
    "Session",
    "Process",
    "Files",
    "AsyncSandtree",
    "AsyncSandbox",
    "AsyncCheckpoint",
    "AsyncSession",
    "AsyncProcess",
    "AsyncFiles",
    "SandboxCreation",
    "CheckpointTree",
    # errors
    "SandtreeError",
    "InvalidArgumentError",
    "UnauthorizedError",
    "NotFoundError",
    "ConflictError",
    "ResourceExhaustedError",
    "SandtreeTimeoutError",
    "ClientTimeoutError",
    "UnsupportedError",
    "InternalError",
    "DaemonUnavailableError",
    "CommandError",
    "ForkError",
    # data
    "SandboxStatus",
    "ProcessState",
    "ProcessOutcome",
    "RestoreSource",
    "ImageState",
    "FileKind",
    "Limits",
    "NetworkInfo",
    "PortInfo",
    "Usage",
    "SandboxInfo",
    "KeptCheckpoint",
    "DeleteSandboxResult",
    "ExecResult",
    "ExecEvent",
    "StartedEvent",
    "StdoutEvent",
    "StderrEvent",
    "ExitEvent",
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
