"""Bounds that keep `reprogate serve` answering when clients misbehave.

uvicorn closes a keep-alive connection that sits idle between requests, but not one that sends
half a request line and then nothing (slowloris): such sockets used to stay open for ever, until
the process ran out of file descriptors and every accept failed, logging each failure. Here:
- the header deadline: a connection must complete its request's headers within
  `header_timeout` seconds of connecting (or of its previous response), else it is closed;
- the body deadline: once the headers are in, the body must be complete within `body_timeout`
  seconds (a client trickling a byte at a time held its socket for ever);
- a connection cap below the process's file limit: at the cap, the oldest connection that still
  owes us bytes (headers or body) is closed to make room (a normal client sends its request at
  once, so a flood of half-open or trickling sockets evicts itself, not the clients being served);
- log volume: each kind of log line at most `LOG_BURST` times per `LOG_WINDOW_S`, then one line
  that says how many were left out.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from reprogate.serve import admission
from reprogate.serve.batching import MAX_QUEUED_ROWS

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0  # a body of MAX_BODY_BYTES at ~35 KB/s; on loopback or a LAN, milliseconds
# File descriptors kept for the model's files, logs and the watcher, and for one accept batch
# (ACCEPT_BATCH) taken before the cap is enforced, under the process's limit.
RESERVED_FDS = 256
ACCEPT_BATCH = 64
LOG_BURST, LOG_WINDOW_S = 20, 10.0
log = logging.getLogger("reprogate.serve.app")


@dataclass(frozen=True)
class Limits:
    """`reprogate serve`'s options that bound it (see the module)."""

    watch_interval: float = 1.0  # seconds between looks at models/production.json
    header_timeout: float = HEADER_TIMEOUT_S
    max_connections: int | None = None  # None: under the open-file limit (default_max_connections)
    batch_wait_ms: float = 2.0  # how long a /predict request waits for others to share its model call
    max_batch: int = 64  # texts in one model call, at most (a request's own are never split)
    body_timeout: float = BODY_TIMEOUT_S
    admit: admission.Bounds = admission.Bounds()  # what one /predict request may cost
    max_queued_rows: int = MAX_QUEUED_ROWS  # model rows waiting in all; past it, 503


def file_limit() -> int:
    """Raise this process's open-file limit to its hard limit (the soft one is often 1,024) and
    return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 65_536 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def default_max_connections() -> int:
    return max(16, min(4096, file_limit() - RESERVED_FDS))


class _Closed:
    """How many connections were closed for want of headers, said at most once per window."""

    def __init__(self) -> None:
        self.timed_out = self.evicted = 0
        self.said_at = 0.0

    def add(self, kind: str, limits: type[GuardedH11]) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        now = time.monotonic()
        if now - self.said_at >= LOG_WINDOW_S:
            log.warning(
                "closed %d connection(s) that did not send their request headers (or body) in time "
                "(--header-timeout %g s, --body-timeout %g s) and evicted %d waiting one(s) at the "
                "connection cap (--max-connections %d): slow or stuck clients; raise those flags for "
                "clients that are slow on purpose",
                self.timed_out,
                limits.header_timeout,
                limits.body_timeout,
                self.evicted,
                limits.max_connections,
            )
            self.timed_out = self.evicted = 0
            self.said_at = now


class GuardedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a header deadline and a connection cap (see module)."""

    header_timeout: float = HEADER_TIMEOUT_S
    body_timeout: float = BODY_TIMEOUT_S
    max_connections: int = 1000
    closed = _Closed()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._reading_body = False
        self._since = self.loop.time()
        if len(self.connections) > self.max_connections:
            self._make_room()
        self._arm()

    def _waiting(self) -> bool:
        """No request of this connection is being read or answered: it owes us headers."""
        return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

    def _owing(self) -> bool:
        """It owes us its headers, or the rest of a body whose headers came."""
        return self._waiting() or self.conn.their_state is h11.SEND_BODY

    def _make_room(self) -> None:
        waiting = [c for c in self.connections if isinstance(c, GuardedH11) and c is not self and c._owing()]
        victim = min(waiting, key=lambda c: c._since) if waiting else self
        victim.transport.close()
        self.closed.add("evicted", type(self))

    def _arm(self, seconds: float | None = None) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds or self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self._owing() and not self.transport.is_closing():
            self.transport.close()
            self.closed.add("timed_out", type(self))

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting():
            return  # still owes its headers: the header deadline stands
        if self.conn.their_state is h11.SEND_BODY:
            if not self._reading_body:  # the headers just came: the body is owed from now
                self._reading_body = True
                self._arm(self.body_timeout)
        else:
            self._disarm()  # the request is in: it is the app's now

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._since = self.loop.time()
        self._reading_body = False
        self._arm()  # the next request's headers are owed within the deadline too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol(
    header_timeout: float, max_connections: int, body_timeout: float = BODY_TIMEOUT_S
) -> type[GuardedH11]:
    bounds = {
        "header_timeout": header_timeout,
        "body_timeout": body_timeout,
        "max_connections": max_connections,
    }
    return type("Guarded", (GuardedH11,), bounds)


def loop_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's error handler: running out of file descriptors while accepting is one
    line (asyncio pauses accepting for a second by itself), not a traceback per refused socket."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        log.warning(
            "out of file descriptors accepting connections (%s); accepting paused for a moment", exc.strerror
        )
        return
    loop.default_exception_handler(context)


class RateLimit(logging.Filter):
    """At most LOG_BURST records of one kind (logger and message template) per LOG_WINDOW_S; the
    first record after a window with drops says how many were dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.windows: dict[tuple[str, Any], list[float | int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = time.monotonic()
        start, count, dropped = self.windows.get(key, (now, 0, 0))
        if now - start >= LOG_WINDOW_S:
            if dropped:
                record.msg = f"{record.msg} (and {int(dropped)} more like it left out of the log)"
            start, count, dropped = now, 0, 0
        count += 1
        keep = count <= LOG_BURST
        self.windows[key] = [start, count, dropped + (not keep)]
        if len(self.windows) > 10_000:  # distinct templates are few; never let this grow unbounded
            self.windows.clear()
        return keep


def limit_logs() -> None:
    """Every handler of the root logger and uvicorn's loggers filters through one RateLimit."""
    limit = RateLimit()
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access", "asyncio"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(limit)
