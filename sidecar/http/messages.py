"""A request as the server read it, and the reply a handler writes to it.

`Request` is one parsed request with its body read whole; `Reply` writes its answer, whole
(`send`) or streamed (`start`, `write`... `end`), onto the client's connection, which the
server (`sidecar.http.server`) provides as a `Wire`.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Iterable, Sequence
from http import HTTPStatus
from typing import Protocol

Header = tuple[str, str]


class Request:
    """One parsed request, its body read whole."""

    __slots__ = ("body", "keep_alive", "method", "path", "raw_headers", "target")

    def __init__(self, method: str, target: str, raw_headers: list[tuple[bytes, bytes]],
                 body: bytes, keep_alive: bool) -> None:
        self.method = method
        self.target = target  # as the client sent it: path and query, or an absolute URL
        self.path = path_of(target)
        self.raw_headers = raw_headers  # as they came: (name, value) bytes
        self.body = body
        self.keep_alive = keep_alive

    def header(self, name: bytes) -> str | None:
        """The first value of the header `name` (lower-case), if the request has it."""
        size = len(name)
        for n, v in self.raw_headers:
            if len(n) == size and n.lower() == name:
                return v.decode("utf-8", "surrogateescape")
        return None


def path_of(target: str) -> str:
    """The path of a request target (origin or absolute form), without its query."""
    if not target.startswith("/"):  # absolute form, from a client configured for a proxy
        scheme_end = target.find("://")
        slash = target.find("/", scheme_end + 3) if scheme_end >= 0 else -1
        target = target[slash:] if slash >= 0 else "/"
    query = target.find("?")
    return target if query < 0 else target[:query]


Answer = tuple[int, Sequence[Header], bytes]


class Wire(Protocol):
    """What a `Reply` needs of its client's connection."""

    # Called once when the client's socket takes writes again (`Reply.write_nowait`).
    on_writable: Callable[[], None] | None
    http11_client: bool

    @property
    def writing_paused(self) -> bool: ...

    @property
    def closing(self) -> bool:
        """Whether the connection closes after the answer being written."""
        ...

    def put(self, *data: bytes) -> None:
        """`data` to the client at once; ConnectionResetError if the client is gone."""
        ...

    async def write(self, *data: bytes) -> None:
        """`data` to the client, once its socket buffer can take more."""
        ...

    async def drained(self) -> None: ...

    def abort(self) -> None: ...


class Reply:
    """The answer to one request: `send` a whole one, or `start`, `write`... `end`."""

    __slots__ = ("_chunked", "_conn", "done", "keep_alive", "status", "tail")

    def __init__(self, conn: Wire, keep_alive: bool) -> None:
        self._conn = conn
        self._chunked = False
        self.keep_alive = keep_alive
        self.status = 0  # set once the head is written
        self.done = False
        self.tail = b""  # the body written so far ends with this (see `_keep_tail`)

    @property
    def started(self) -> bool:
        return self.status != 0

    @property
    def waiting(self) -> bool:
        """Whether the client's socket buffer is full (writes wait for it to drain)."""
        return self._conn.writing_paused

    async def send(self, status: int, headers: Iterable[Header] = (), body: bytes = b"", *,
                   reason: str | None = None, lines: bytes = b"") -> None:
        """A whole answer, head and body in one write. `lines` are header lines ready to
        send (a proxied answer's, as they came)."""
        self._check_fresh()
        self.status = status
        head = self._head(status, reason, headers,
                          lines + b"Content-Length: %d\r\n" % len(body))
        self.done = True
        conn = self._conn
        if len(body) < 65536:
            conn.put(head + body)
        else:
            conn.put(head, body)
        if conn.writing_paused:
            await conn.drained()

    async def start(self, status: int, headers: Iterable[Header] = (), *,
                    reason: str | None = None, length: int | None = None,
                    lines: bytes = b"") -> None:
        """The head of an answer whose body follows in `write`s (`length` bytes of it, when
        known). `lines` as for `send`."""
        self._check_fresh()
        self.status = status
        if length is not None:
            framing = b"Content-Length: %d\r\n" % length
        elif self._conn.http11_client:
            self._chunked = True
            framing = b"Transfer-Encoding: chunked\r\n"
        else:
            self.keep_alive = False  # the body ends with the connection
            framing = b""
        await self._conn.write(self._head(status, reason, headers, lines + framing))

    async def write(self, data: bytes) -> None:
        assert self.status and not self.done, "write before start or after end"
        if not data:
            return
        self._keep_tail(data)
        if self._chunked:
            await self._conn.write(b"%x\r\n" % len(data), data, b"\r\n")
        else:
            await self._conn.write(data)

    def write_nowait(self, data: bytes, on_writable: Callable[[], None]) -> bool:
        """Write `data` now, from a callback. True if the client can take more at once;
        False if its socket buffer is full, and then `on_writable` is called once it
        drains. Raises ConnectionResetError if the client is gone."""
        assert self.status and not self.done, "write before start or after end"
        conn = self._conn
        self._keep_tail(data)
        if self._chunked and data:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        conn.put(data)
        if conn.writing_paused:
            conn.on_writable = on_writable
            return False
        return True

    async def end(self, data: bytes = b"") -> None:
        assert self.status and not self.done, "end before start or after end"
        self.done = True
        self._keep_tail(data)
        if self._chunked:
            if data:
                await self._conn.write(b"%x\r\n" % len(data), data, b"\r\n0\r\n\r\n")
            else:
                await self._conn.write(b"0\r\n\r\n")
        elif data:
            await self._conn.write(data)

    def _keep_tail(self, data: bytes) -> None:
        """Enough of the body's end to tell how it ended (an OpenAI stream's last event),
        should the client leave before the end of the body itself. A write of `_TAIL`
        bytes or more is kept by reference, not copied: this runs for every chunk."""
        if len(data) >= _TAIL:
            self.tail = data
        elif data:
            self.tail = (self.tail + data)[-_TAIL:]

    def abort(self) -> None:
        """Close the client's connection at once: what it has is not a whole answer."""
        self.keep_alive = False
        self._conn.abort()

    def _check_fresh(self) -> None:
        if self.status:
            raise RuntimeError("the answer has started already")

    def _head(self, status: int, reason: str | None, headers: Iterable[Header],
              more: bytes) -> bytes:
        if self.keep_alive and self._conn.closing:
            self.keep_alive = False
        named = "".join([f"{name}: {value}\r\n" for name, value in headers])
        return b"".join((
            _status_line(status, reason),
            named.encode("utf-8", "surrogateescape") if named else b"",
            _date_line(),
            b"" if self.keep_alive else b"Connection: close\r\n",
            more,
            b"\r\n",
        ))


_TAIL = 32
_PHRASES = {s.value: s.phrase for s in HTTPStatus}
_status_lines: dict[tuple[int, str | None], bytes] = {}
_date_cache: tuple[int, bytes] = (0, b"")


def _status_line(status: int, reason: str | None) -> bytes:
    key = (status, reason)
    line = _status_lines.get(key)
    if line is None:
        phrase = _PHRASES.get(status, "") if reason is None else reason
        line = f"HTTP/1.1 {status} {phrase}\r\n".encode("utf-8", "surrogateescape")
        if len(_status_lines) < 256:  # an upstream's own reason phrases are few
            _status_lines[key] = line
    return line


def _date_line() -> bytes:
    """The `Date` header line, made once a second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, b"Date: %s\r\n" % email.utils.formatdate(now, usegmt=True).encode())
    return _date_cache[1]
