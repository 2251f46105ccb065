"""What keeps roost's one HTTP server answering when callers misbehave.

* `bind()` takes the port before anything else starts, so a second instance that cannot bind
  stops before it touches Telegram (setWebhook, setMyCommands).
* `GuardedSite` serves a bound socket with a cap on open connections and a deadline for each
  request's head (also the later ones on a kept-alive connection). Each connection is sending
  a head, or awaiting the rest of a body, or served (its whole request in: being answered, or
  kept alive between requests). At the cap one is closed to make room: of the caller holding
  the most connections (an IPv4 address, an IPv6 /64), the oldest sending a head, else
  awaiting a body, else served. So idle sockets (a port scanner, a slowloris, kept-alive
  silence) cannot lock out /healthz or Telegram, a flood pushes out its own connections
  rather than a lone webhook call, and roost never runs out of file descriptors.
* Connections awaiting a body are bounded below the cap too: at most `bodies_per_address` per
  caller and `bodies` in all; past either, the oldest of that caller (or of the caller
  holding the most) is closed. A body that comes with its head (every real webhook call) is
  never among them, so heads that announce a body and send none cannot hold the server.
* `guard_middleware` bounds the time a request body may take, and counts and logs refused
  webhook calls at most once a minute per cause, so a stranger cannot fill the journal.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from daemon.core.logs import http_log as log

LOG_EVERY = 60.0  # seconds between log lines about one cause of refused calls

# Why a webhook call was refused, by the status roost answered.
REJECTION_CAUSES = {400: "malformed body", 401: "bad signature", 403: "wrong secret",
                    408: "body too slow", 413: "too large", 415: "wrong content type"}


@dataclass(frozen=True)
class HttpLimits:
    """Limits of the HTTP server; not user settings (tests make them small)."""

    max_connections: int = 512  # well under the unit's LimitNOFILE and the default 1,024
    header_timeout: float = 10.0  # seconds for a request head, from its first byte (or connect)
    body_timeout: float = 15.0  # seconds to read a request body
    # Connections waiting for the rest of a body: per caller, and in all (a quarter of the cap).
    bodies_per_address: int = 16
    bodies: int = 128
    keepalive_timeout: float = 15.0  # an idle kept-alive connection is closed after this
    lingering_time: float = 1.0  # reading the rest of a refused body before closing
    backlog: int = 128


def bind(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening socket on host:port (OSError when it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class MalformedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse with a traceback; roost makes that one short line
    naming the caller and the problem, at most once a minute (with how many were dropped)."""

    def __init__(self, rejections: RejectionLog) -> None:
        super().__init__()
        self.rejections = rejections

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        problem = (exc.message or type(exc).__name__).strip().splitlines()[0].rstrip(":")
        remote = record.getMessage().rpartition(" from ")[2] or "?"
        line = self.rejections.line("malformed request", problem, remote)
        if line is None:
            return False
        record.msg, record.args, record.exc_info, record.exc_text = line, None, None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.name = log.name
        return True


def install_malformed_filter(rejections: RejectionLog) -> None:
    """Once per process: aiohttp's server logger is global."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequests) for f in server_log.filters):
        server_log.addFilter(MalformedRequests(rejections))


_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LENGTH = re.compile(rb"^content-length[ \t]*:[ \t]*([0-9]+)[ \t]*\r?$", re.I | re.M)
_CHUNKED = re.compile(rb"^transfer-encoding[ \t]*:.*chunked", re.I | re.M)
_HEAD_MAX = 64 * 1024  # aiohttp refuses far smaller heads; only bounds what is kept here


class _Guarded(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection and follows its requests in the byte stream
    (head, then Content-Length bytes of body), so that every request head, not only the
    first, must arrive within the deadline. aiohttp gets every byte unchanged."""

    def __init__(self, site: GuardedSite, inner: asyncio.Protocol) -> None:
        self.site = site
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self._head = b""  # the head so far, while one is arriving
        self._body = 0  # body bytes still to come of the current request
        self._followed = True  # False after a chunked body: its end is aiohttp's to find
        self._timer: asyncio.TimerHandle | None = None
        self.caller = "?"  # the address a caller cannot vary cheaply (IPv6: its /64)
        self.crowd: _Crowd | None = None  # the site's set of connections in the same state
        self.made_room = False  # closed by the site to make room; its socket goes soon

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.caller = _caller(transport.get_extra_info("peername"))
        self.site.opened(self)
        self._arm()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._followed:
            self._follow(data)
        if self._timer is None:  # a whole head is in: its body is awaited, or it is served
            # A chunked body's end is not followed: such a connection stays among the bodies.
            self.site.head_done(self, body_pending=self._body > 0 or not self._followed)
        self.inner.data_received(data)

    def _follow(self, data: bytes) -> None:
        while data and self._followed:
            if self._body:
                taken = min(self._body, len(data))
                self._body -= taken
                data = data[taken:]
                continue
            if self._timer is None:  # the first byte of the next request on this connection
                self._arm()
                self.site.waiting(self)
            self._head += data
            end = _HEAD_END.search(self._head)
            if end is None:
                self._head = self._head[-_HEAD_MAX:]
                return
            head, data = self._head[:end.end()], self._head[end.end():]
            self._head = b""
            assert self._timer is not None
            self._timer.cancel()
            self._timer = None
            if _CHUNKED.search(head):
                self._followed = False
            elif length := _LENGTH.search(head):
                self._body = int(length[1])

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(
            self.site.limits.header_timeout, self.close)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.site.closed(self)
        self.inner.connection_lost(exc)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _caller(peer: object) -> str:
    """Whom a connection counts against: its IPv4 address, or its IPv6 /64 (one host may
    hold a whole /64)."""
    host = peer[0] if isinstance(peer, tuple) and peer else None
    if not isinstance(host, str):
        return "?"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # a dual-stack socket's IPv4 caller
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Crowd:
    """The connections in one state (a head arriving, a body awaited, served), oldest first,
    also by caller, so that the one closed can be the oldest of a given caller."""

    def __init__(self) -> None:
        self.all: OrderedDict[int, _Guarded] = OrderedDict()
        self.of: dict[str, OrderedDict[int, _Guarded]] = {}

    def __len__(self) -> int:
        return len(self.all)

    def add(self, conn: _Guarded) -> int:
        """Add `conn` (where it was, if it is there: its age stays); how many its caller has."""
        same = self.of.setdefault(conn.caller, OrderedDict())
        if id(conn) not in self.all:
            self.all[id(conn)] = conn
            same[id(conn)] = conn
        return len(same)

    def remove(self, conn: _Guarded) -> None:
        if self.all.pop(id(conn), None) is not None:
            same = self.of[conn.caller]
            del same[id(conn)]
            if not same:
                del self.of[conn.caller]

    def oldest_of(self, caller: str) -> _Guarded:
        return next(iter(self.of[caller].values()))

    def oldest_of_heaviest(self) -> _Guarded:
        return self.oldest_of(max(self.of, key=lambda caller: len(self.of[caller])))


class GuardedSite(web.SockSite):
    """A site on an already bound socket, with a connection cap and a header deadline; see the
    module docstring for which connection is closed to make room."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, limits: HttpLimits) -> None:
        super().__init__(runner, sock, backlog=limits.backlog)
        self.limits = limits
        self.open = 0
        self._heads = _Crowd()  # no whole request head yet
        self._bodies = _Crowd()  # a whole head, not all of its body
        self._served = _Crowd()  # a whole request: answered or being answered, or kept alive
        self._held: dict[str, int] = {}  # connections of each caller in any of the three
        self.closing = 0  # closed to make room, their sockets not yet released
        self.evicted = 0
        self.evicted_bodies = 0
        self.refused = 0
        self.rejections = RejectionLog()

    async def start(self) -> None:
        self._runner._reg_site(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, sock=self._sock,
                                                backlog=self._backlog)

    def _protocol(self) -> asyncio.Protocol:
        # Those already closed to make room are gone by the next turn of the loop: not counted.
        if self.open - self.closing >= self.limits.max_connections:
            victim = self._victim()
            if victim is None:
                self.refused += 1
                return _Refused()
            if victim.crowd is self._bodies:
                self._evict_body(victim, "at the connection cap")
            else:
                self._evict(victim)
        server = self._runner.server
        assert server is not None
        return _Guarded(self, server())

    def _victim(self) -> _Guarded | None:
        """The connection to close at the cap: of the caller holding the most, the oldest
        still sending its head, else awaiting its body, else served (kept alive, or with its
        answer late). A caller with a few connections keeps them while another floods."""
        if not self._held:
            return None
        caller = max(self._held, key=self._held.__getitem__)
        for crowd in (self._heads, self._bodies, self._served):
            if caller in crowd.of:
                return crowd.oldest_of(caller)
        return None

    def _move(self, conn: _Guarded, crowd: _Crowd | None) -> int:
        """Put `conn` among `crowd` (None: none); how many of it its caller has there."""
        if conn.crowd is not crowd:
            if conn.crowd is not None:
                conn.crowd.remove(conn)
                if crowd is None:
                    self._held[conn.caller] -= 1
                    if not self._held[conn.caller]:
                        del self._held[conn.caller]
            elif crowd is not None:
                self._held[conn.caller] = self._held.get(conn.caller, 0) + 1
            conn.crowd = crowd
        return crowd.add(conn) if crowd is not None else 0

    def _evict(self, conn: _Guarded) -> None:
        self._move(conn, None)
        self.evicted += 1
        self._closing(conn)

    def _closing(self, conn: _Guarded) -> None:
        if not conn.made_room:
            conn.made_room = True
            self.closing += 1
        conn.close()

    def opened(self, conn: _Guarded) -> None:
        self.open += 1
        self._move(conn, self._heads)

    def waiting(self, conn: _Guarded) -> None:
        """The next request's head has begun on a kept-alive connection."""
        self._move(conn, self._heads)

    def closed(self, conn: _Guarded) -> None:
        self.open -= 1
        self.closing -= conn.made_room
        self._move(conn, None)

    def head_done(self, conn: _Guarded, body_pending: bool) -> None:
        """`conn` has a whole head, and waits for more of its body or has its whole request;
        past a bound on bodies awaited, the oldest of its caller (else of the caller holding
        the most) is closed."""
        if not body_pending:
            self._move(conn, self._served)
        elif self._move(conn, self._bodies) > self.limits.bodies_per_address:
            self._evict_body(self._bodies.oldest_of(conn.caller), "too many from this address")
        elif len(self._bodies) > self.limits.bodies:
            self._evict_body(self._bodies.oldest_of_heaviest(), "too many in all")

    def _evict_body(self, conn: _Guarded, why: str) -> None:
        self._move(conn, None)
        self.evicted_bodies += 1
        if (line := self.rejections.line("closed a connection waiting for its body", why,
                                         conn.caller)) is not None:
            log.warning("%s", line)
        self._closing(conn)


@dataclass
class RejectionLog:
    """One log line per cause per minute, with how many calls it stands for."""

    every: float = LOG_EVERY
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, float] = field(default_factory=dict)
    _unlogged: dict[str, int] = field(default_factory=dict)

    def note(self, path: str, cause: str, remote: str | None) -> None:
        if (line := self.line(f"refused {path}", cause, remote)) is not None:
            log.warning("%s", line)

    def line(self, what: str, cause: str, remote: str | None) -> str | None:
        """The line to log now, or None when this cause was logged less than a minute ago."""
        now = self.clock()
        key = f"{what} {cause}"
        last = self._last.get(key)
        if last is not None and now - last < self.every:
            self._unlogged[key] = self._unlogged.get(key, 0) + 1
            return None
        more = self._unlogged.pop(key, 0)
        self._last[key] = now
        also = f" ({more} more since the last line)" if more else ""
        return (f"{what}: {cause}, from {remote or '?'}{also}; "
                "such calls are logged once a minute")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard_middleware(limits: HttpLimits, rejections: RejectionLog,
                     count: Callable[[str], None]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The body deadline, and the accounting of refused webhook calls (`count(cause)`)."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        length = request.content_length
        if length is not None and length > request.client_max_size:
            # Refused before a byte of it is read: waiting for it would only end in a 408.
            response: web.StreamResponse = web.Response(status=413, text="too large\n")
            response.force_close()
            return _account(request, response, rejections, count)
        if request.body_exists and request.transport is None:
            # Closed before its body was read (evicted, or the caller hung up): aiohttp would
            # raise RuntimeError from read(); there is nobody to answer.
            return _hung_up()
        if request.body_exists:
            try:
                # Read here, bounded in time; the handler gets it from request.read()'s cache.
                async with asyncio.timeout(limits.body_timeout):
                    await request.read()
            except TimeoutError:
                response = web.Response(status=408, text="body too slow\n")
                response.force_close()
                return _account(request, response, rejections, count)
            except ConnectionResetError:  # the caller hung up mid-body: nobody to answer
                return _hung_up()
            except web.HTTPRequestEntityTooLarge:
                response = web.Response(status=413, text="too large\n")
                response.force_close()
                return _account(request, response, rejections, count)
        return _account(request, await handler(request), rejections, count)

    return guard


def _hung_up() -> web.Response:
    response = web.Response(status=400, text="incomplete body\n")
    response.force_close()
    return response


def _account(request: web.Request, response: web.StreamResponse, rejections: RejectionLog,
             count: Callable[[str], None]) -> web.StreamResponse:
    cause = REJECTION_CAUSES.get(response.status)
    if cause and request.path.startswith("/webhooks/"):
        count(cause)
        rejections.note(request.path, cause, request.remote)
    return response
