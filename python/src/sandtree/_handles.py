"""What the sync and async handles share: their descriptive fields, and
the helpers of their methods."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from .errors import ForkError, SandtreeError
from .models import (
    CheckpointInfo,
    ProcessImageInfo,
    ProcessState,
    SandboxInfo,
    SandboxStatus,
    UnrestorableProcess,
)


class SandboxFields:
    """A sandbox's id and its last description (``last_info``).

    ``restored_pids``: when the sandbox is a fork, the pids of the
    checkpoint's processes that run in it.
    """

    def __init__(self, info: SandboxInfo, restored_pids: Sequence[int] = ()) -> None:
        self.id = info.id
        self.last_info = info
        self.restored_pids = tuple(restored_pids)

    @property
    def status(self) -> SandboxStatus:
        """As of the last description (see ``refresh``)."""
        return self.last_info.status

    @property
    def labels(self) -> Mapping[str, str]:
        return self.last_info.labels

    @property
    def image(self) -> str:
        return self.last_info.image

    @property
    def base_checkpoint(self) -> str | None:
        """The checkpoint its files derive from (last checkpoint, rollback or fork)."""
        return self.last_info.base_checkpoint

    def _based_on(self, checkpoint_id: str) -> None:
        self.last_info = dataclasses.replace(self.last_info, base_checkpoint=checkpoint_id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r}, status={self.status!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SandboxFields) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


class CheckpointFields:
    """A checkpoint's description (``info``) and the daemon's ``note`` on
    what it captured (set when it was just taken)."""

    def __init__(self, info: CheckpointInfo, note: str | None = None) -> None:
        self.info = info
        self.note = note

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def sandbox_id(self) -> str:
        """The sandbox it was taken of (may be deleted since)."""
        return self.info.sandbox_id

    @property
    def parent(self) -> str | None:
        """The id of the checkpoint the sandbox derived from when this one was taken."""
        return self.info.parent

    @property
    def label(self) -> str | None:
        return self.info.label

    @property
    def labels(self) -> Mapping[str, str]:
        return self.info.labels

    @property
    def image(self) -> str:
        """The name of the sandbox's image."""
        return self.info.image

    @property
    def created_at(self) -> str:
        return self.info.created_at

    @property
    def size_bytes(self) -> int | None:
        """What it adds over its parent (``None`` while being measured)."""
        return self.info.size_bytes

    @property
    def process_state(self) -> ProcessState:
        return self.info.process_state

    @property
    def processes(self) -> tuple[int, ...]:
        """Pids whose live state it holds."""
        return self.info.processes

    @property
    def unrestorable(self) -> tuple[UnrestorableProcess, ...]:
        return self.info.unrestorable

    @property
    def process_image(self) -> ProcessImageInfo | None:
        return self.info.process_image

    def __repr__(self) -> str:
        label = f", label={self.info.label!r}" if self.info.label is not None else ""
        return f"{type(self).__name__}({self.info.id!r}{label}, process_state={self.info.process_state!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CheckpointFields) and other.info.id == self.info.id

    def __hash__(self) -> int:
        return hash(self.info.id)


def checkpoint_id(checkpoint: CheckpointFields | str) -> str:
    """The id of a checkpoint handle, or the id itself."""
    if isinstance(checkpoint, str):
        return checkpoint
    if isinstance(checkpoint, CheckpointFields):
        return checkpoint.info.id
    raise TypeError(f"expected a Checkpoint or a checkpoint id, got {type(checkpoint).__name__}")


def labels_match(info: SandboxInfo, wanted: Mapping[str, str] | None) -> bool:
    return all(info.labels.get(k) == v for k, v in (wanted or {}).items())


def fork_error(errors: Sequence[SandtreeError], made: int, wanted: int) -> ForkError:
    """The error of a fork that made ``made`` of ``wanted`` sandboxes (deleted since)."""
    if errors:
        first = errors[0]
        message = f"{len(errors)} of {wanted} forks failed (the {made} made were deleted); first: {first.message}"
        return ForkError(first.code, message, first.status, list(errors))
    message = f"the daemon made {made} of {wanted} forks without saying why (the {made} made were deleted)"
    return ForkError("internal", message, 500, [])
