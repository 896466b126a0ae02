"""Errors raised by the SDK.

Every error the daemon answers (``{"error": {"code": ..., "message": ...}}``)
is raised as a :class:`SandtreeError` whose ``code`` is the daemon's stable
snake_case code (``sandbox_not_found``, ``processes_lost``, ...) and whose
``status`` is the HTTP status. The class tells the family, the code tells
the case::

    try:
        sb.rollback(ck)
    except sandtree.ConflictError as e:
        if e.code == "processes_lost":
            sb.rollback(ck, allow_restart=True)

Errors found by the SDK itself have ``status == 0``:
:class:`DaemonUnavailableError` (no daemon answers), :class:`ClientTimeoutError`
(the daemon did not answer in time) and :class:`CommandError` (a command that
``check()`` found failed). :class:`ForkError` (a fork that could not make
every sandbox) has the code and status of the first fork that failed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import ExecResult, SessionResult

__all__ = [
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
]


class SandtreeError(Exception):
    """Base of every SDK error.

    Attributes:
        code: the daemon's error code (``sandbox_not_found``, ...), or the
            SDK's own for errors it finds itself (``daemon_unavailable``,
            ``client_timeout``, ``command_failed``).
        message: what happened and, usually, what to do.
        status: the HTTP status, 0 when the error did not come from the daemon.
    """

    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(code, message, status)
        self.code = code
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take other arguments: rebuild from the state, so that
        # errors cross process boundaries (multiprocessing) intact.
        return (_rebuild, (type(self), self.__dict__.copy()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, status={self.status})"


class InvalidArgumentError(SandtreeError):
    """A malformed request: ``invalid_argument``, ``checkpoint_not_in_tree``
    (400) or ``payload_too_large`` (413)."""


class UnauthorizedError(SandtreeError):
    """``unauthorized`` (401): the TCP listener needs the right bearer token."""


class NotFoundError(SandtreeError):
    """A missing resource (404): ``sandbox_not_found``, ``checkpoint_not_found``,
    ``image_not_found``, ``session_not_found``, ``process_not_found``,
    ``file_not_found``."""


class ConflictError(SandtreeError):
    """The resource's state forbids the request (409): ``already_exists``,
    ``checkpoint_in_use``, ``image_in_use``, ``sandbox_not_running``,
    ``process_not_restorable`` (retry with ``best_effort=True``),
    ``processes_lost`` (retry with ``allow_restart=True`` or ``files_only=True``).
    Nothing was changed."""


class ResourceExhaustedError(SandtreeError):
    """The host or the sandbox ran out of something: ``no_space`` and
    ``not_enough_memory`` (507), ``pid_limit_reached`` (429). Nothing was
    changed."""


class SandtreeTimeoutError(SandtreeError):
    """A bounded wait expired: ``timeout`` or ``freeze_timeout`` (504), or
    the SDK's :class:`ClientTimeoutError`."""


class ClientTimeoutError(SandtreeTimeoutError):
    """``client_timeout``: the daemon did not answer within the client's timeout,
    or a :meth:`Process.wait` deadline passed."""


class UnsupportedError(SandtreeError):
    """The host or the daemon cannot do this: ``unsupported`` (501), or the
    daemon does not know the route (``route_not_found``,
    ``method_not_allowed``: a daemon older than the SDK)."""


class InternalError(SandtreeError):
    """An unexpected failure in the daemon (``internal``), or a rollback that
    restored the files but restarted the processes (``rollback_incomplete``)."""


class DaemonUnavailableError(SandtreeError):
    """No daemon answers at the configured socket or URL (``daemon_unavailable``).

    The message names the endpoint and what to do: start a daemon
    (``sudo sandtree daemon &``), point ``SANDTREE_SOCKET`` / ``SANDTREE_URL``
    at one, or, for a socket that refuses a non-root user, run as root.
    """

    def __init__(self, endpoint: str, reason: str, kind: str = "refused") -> None:
        """``kind``: ``refused`` (nothing listens), ``permission`` (the socket
        is root's) or ``broken`` (the connection broke during the call)."""
        if kind == "permission":
            message = (
                f"cannot connect to the sandtree daemon at {endpoint} ({reason}): its socket is root's "
                "(mode 0600): run as root, or use its TCP listener (SANDTREE_URL and SANDTREE_TOKEN)"
            )
        elif kind == "broken":
            message = (
                f"the connection to the sandtree daemon at {endpoint} broke during the call ({reason}): "
                "did it stop or restart? Its log says why"
            )
        else:
            message = (
                f"the sandtree daemon is not running at {endpoint} ({reason}): start it with "
                "`sudo sandtree daemon &`, or point SANDTREE_SOCKET (or SANDTREE_URL and "
                "SANDTREE_TOKEN) at a running one"
            )
        super().__init__("daemon_unavailable", message)
        self.endpoint = endpoint


class CommandError(SandtreeError):
    """A command that exited non-zero, was killed or timed out, raised by
    ``ExecResult.check()`` and ``SessionResult.check()``; ``result`` holds
    its output."""

    def __init__(self, message: str, result: ExecResult | SessionResult) -> None:
        super().__init__("command_failed", message)
        self.result = result


class ForkError(SandtreeError):
    """A fork that could not create every sandbox asked for.

    ``code``, ``message`` and ``status`` are those of the first failed fork;
    ``errors`` lists every failure. The sandboxes that were created were
    deleted before this was raised, so a failed fork leaves nothing behind.
    """

    def __init__(self, code: str, message: str, status: int, errors: list[SandtreeError]) -> None:
        super().__init__(code, message, status)
        self.errors = errors


def _rebuild(cls: type[SandtreeError], state: dict[str, Any]) -> SandtreeError:
    err = cls.__new__(cls)
    Exception.__init__(err, state["code"], state["message"], state["status"])
    err.__dict__.update(state)
    return err


_BY_CODE: dict[str, type[SandtreeError]] = {
    "invalid_argument": InvalidArgumentError,
    "checkpoint_not_in_tree": InvalidArgumentError,
    "payload_too_large": InvalidArgumentError,
    "unauthorized": UnauthorizedError,
    "sandbox_not_found": NotFoundError,
    "checkpoint_not_found": NotFoundError,
    "image_not_found": NotFoundError,
    "session_not_found": NotFoundError,
    "process_not_found": NotFoundError,
    "file_not_found": NotFoundError,
    "already_exists": ConflictError,
    "checkpoint_in_use": ConflictError,
    "image_in_use": ConflictError,
    "sandbox_not_running": ConflictError,
    "process_not_restorable": ConflictError,
    "processes_lost": ConflictError,
    "no_space": ResourceExhaustedError,
    "not_enough_memory": ResourceExhaustedError,
    "pid_limit_reached": ResourceExhaustedError,
    "timeout": SandtreeTimeoutError,
    "freeze_timeout": SandtreeTimeoutError,
    "unsupported": UnsupportedError,
    "route_not_found": UnsupportedError,
    "method_not_allowed": UnsupportedError,
    "internal": InternalError,
    "rollback_incomplete": InternalError,
}

_BY_STATUS: dict[int, type[SandtreeError]] = {
    400: InvalidArgumentError,
    401: UnauthorizedError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidArgumentError,
    429: ResourceExhaustedError,
    501: UnsupportedError,
    504: SandtreeTimeoutError,
    507: ResourceExhaustedError,
}


_STATUS: dict[type[SandtreeError], int] = {
    InvalidArgumentError: 400,
    UnauthorizedError: 401,
    NotFoundError: 404,
    ConflictError: 409,
    ResourceExhaustedError: 507,
    SandtreeTimeoutError: 504,
    UnsupportedError: 501,
    InternalError: 500,
}

_STATUS_EXCEPTIONS = {"payload_too_large": 413, "pid_limit_reached": 429, "method_not_allowed": 405}


# The options a daemon message names, as the API spells them, and as the
# SDK's methods do (the CLI translates them to its flags the same way).
_REMEDIES = {
    '"best_effort": true': "best_effort=True",
    '"allow_restart": true': "allow_restart=True",
    '"files_only": true': "files_only=True",
    "?force=true": "force=True",
}


def error_for(code: str, message: str, status: int | None = None) -> SandtreeError:
    """The :class:`SandtreeError` subclass instance for a daemon error.

    ``status`` is the HTTP status; errors that came inside a stream or a
    fork's results have none, and get the status the daemon serves their
    code with. Unknown codes (a daemon newer than the SDK) fall back on the
    HTTP status. The options the message names are spelled as the SDK's
    arguments (``allow_restart=True``).
    """
    for api, sdk in _REMEDIES.items():
        message = message.replace(api, sdk)
    if status is None:
        cls = _BY_CODE.get(code, InternalError)
        return cls(code, message, _STATUS_EXCEPTIONS.get(code) or _STATUS.get(cls, 500))
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or (InternalError if status >= 500 else SandtreeError)
    return cls(code, message, status)


def error_from_body(status: int, body: bytes) -> SandtreeError:
    """The error of a non-2xx response: its ``{"error": ...}`` body, or its
    status and text when the body is not one (a proxy in front, say)."""
    try:
        payload: Any = json.loads(body)
        err = payload["error"]
        return error_for(str(err["code"]), str(err["message"]), status)
    except (ValueError, TypeError, KeyError):
        text = body.decode("utf-8", "replace").strip() or "(no body)"
        code = "unauthorized" if status == 401 else "internal" if status >= 500 else "http_error"
        return error_for(code, f"the daemon answered HTTP {status}: {text}", status)
