"""Where the daemon is, and what one API call is, for both clients.

An operation is described once, as a :class:`Call` (method, path, query,
body, how long to wait, how to parse the answer); the sync and the async
client each only send it. Request bodies that stream (a file written from
a file object, an exec's stdin) are a :class:`Body`, turned into chunks by
:func:`sync_chunks` or :func:`async_chunks`.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Generic, Literal, TypeVar
from urllib.parse import quote

import httpx

from .errors import ClientTimeoutError, DaemonUnavailableError, SandtreeError, error_from_body

T = TypeVar("T")

DEFAULT_SOCKET = "/var/lib/sandtree/sandtree.sock"
"""The daemon's default unix socket (``sandtree daemon`` without ``--socket``)."""

UNIX_BASE_URL = "http://sandtree"
"""The base URL of requests over the unix socket (the host part is not used)."""

CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a connection to the daemon."""

CHUNK = 256 * 1024
"""Size of the chunks a streamed request body is read in."""

Wait = float | None | Literal["default"]
"""How long a call may wait for the daemon's answer: seconds, ``None`` (no
limit: the operation's own time, as a fork's or a long command's), or the
client's default timeout."""

Source = bytes | IO[bytes] | Iterable[bytes] | AsyncIterable[bytes]
"""What a streamed body is read from."""


@dataclass(frozen=True)
class Endpoint:
    """Where the daemon listens: a unix socket, or an ``http://`` URL (with
    the bearer token its TCP listener needs)."""

    socket: str | None = None
    url: str | None = None
    token: str | None = None

    @staticmethod
    def resolve(socket: str | os.PathLike[str] | None, url: str | None, token: str | None) -> Endpoint:
        """The endpoint from the arguments, else from the environment.

        Order: ``url=``, ``socket=``, ``SANDTREE_URL`` (with ``SANDTREE_TOKEN``),
        ``SANDTREE_SOCKET``, then :data:`DEFAULT_SOCKET`.
        """
        if url is not None:
            return Endpoint(url=url.rstrip("/"), token=token if token is not None else os.environ.get("SANDTREE_TOKEN"))
        if socket is not None:
            return Endpoint(socket=os.fspath(socket))
        env_url = os.environ.get("SANDTREE_URL")
        if env_url:
            return Endpoint(
                url=env_url.rstrip("/"), token=token if token is not None else os.environ.get("SANDTREE_TOKEN")
            )
        return Endpoint(socket=os.environ.get("SANDTREE_SOCKET") or DEFAULT_SOCKET)

    @property
    def base_url(self) -> str:
        return self.url if self.url is not None else UNIX_BASE_URL

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def describe(self) -> str:
        return self.url if self.url is not None else f"unix socket {self.socket}"

    def unavailable(self, exc: httpx.TransportError) -> DaemonUnavailableError:
        """The error for a daemon that cannot be reached (``exc``: the transport's)."""
        cause: BaseException = exc
        while not isinstance(cause, OSError):
            underlying = cause.__cause__ or cause.__context__
            if underlying is None:
                break
            cause = underlying
        reason = str(cause) or type(cause).__name__
        if isinstance(cause, PermissionError):
            kind = "permission"
        elif isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            kind = "refused"
        else:
            kind = "broken"
        return DaemonUnavailableError(self.describe(), reason, kind)


@dataclass(frozen=True)
class Body:
    """A request body sent as it is read: ``head`` (bytes known up front),
    then everything ``source`` yields. ``length`` is the total when known
    (sent as Content-Length; else the body is chunked)."""

    head: bytes = b""
    source: Source | None = None
    length: int | None = None

    @staticmethod
    def of(head: bytes, source: Source | None) -> Body:
        rest = _remaining_length(source)
        return Body(head, source, None if rest is None else len(head) + rest)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, str] = field(default_factory=dict)
    json: Any = None
    body: Body | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    wait: Wait = "default"


def path(*parts: str) -> str:
    """``/v1/...`` from path segments, each percent-encoded (ids are plain,
    but a user may pass anything)."""
    return "/v1/" + "/".join(quote(p, safe="") for p in parts)


def timeout_for(wait: Wait, default: float) -> httpx.Timeout:
    read = default if wait == "default" else wait
    return httpx.Timeout(read, connect=CONNECT_TIMEOUT)


def check(resp: httpx.Response) -> httpx.Response:
    """Raises the daemon's error for a non-2xx response (whose body was read)."""
    if resp.is_success:
        return resp
    raise error_from_body(resp.status_code, resp.content)


def transport_error(endpoint: Endpoint, exc: httpx.TransportError, wait: Wait, default: float) -> SandtreeError:
    """The SDK error of a transport failure: a timeout, or no daemon."""
    if isinstance(exc, (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)):
        seconds = default if wait == "default" else wait
        return ClientTimeoutError(
            "client_timeout", f"the daemon at {endpoint.describe()} did not answer within {seconds} s ({exc!r})"
        )
    return endpoint.unavailable(exc)


def _remaining_length(source: Source | None) -> int | None:
    if source is None:
        return 0
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source)
    if isinstance(source, io.IOBase) or hasattr(source, "seek"):
        f: Any = source
        try:
            here = f.tell()
            end = f.seek(0, os.SEEK_END)
            f.seek(here)
            return int(end - here)
        except (OSError, ValueError, AttributeError):
            return None
    return None


def _is_reader(source: object) -> bool:
    return hasattr(source, "read")


def sync_chunks(body: Body) -> Iterator[bytes]:
    """The chunks of ``body`` for the sync client."""
    if body.head:
        yield body.head
    source = body.source
    if source is None:
        return
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield bytes(source)
    elif _is_reader(source):
        reader: Any = source
        while chunk := reader.read(CHUNK):
            yield _as_bytes(chunk)
    elif isinstance(source, AsyncIterable):
        raise TypeError("an async iterable body needs AsyncSandtree")
    else:
        for chunk in source:
            yield _as_bytes(chunk)


async def async_chunks(body: Body) -> AsyncIterator[bytes]:
    """The chunks of ``body`` for the async client (a file object is read
    in a worker thread, so the event loop never blocks on disk)."""
    if body.head:
        yield body.head
    source = body.source
    if source is None:
        return
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield bytes(source)
    elif _is_reader(source):
        reader: Any = source
        while chunk := await asyncio.to_thread(reader.read, CHUNK):
            yield _as_bytes(chunk)
    elif isinstance(source, AsyncIterable):
        async for chunk in source:
            yield _as_bytes(chunk)
    else:
        for chunk in source:
            yield _as_bytes(chunk)


def _as_bytes(chunk: object) -> bytes:
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        return bytes(chunk)
    raise TypeError(f"a request body must yield bytes, got {type(chunk).__name__} (open files in binary mode)")


def body_headers(call: Call[Any]) -> dict[str, str]:
    headers = dict(call.headers)
    if call.body is not None and call.body.length is not None:
        headers["Content-Length"] = str(call.body.length)
    return headers
