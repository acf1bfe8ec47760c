"""What one connection may cost before the token is checked (uvicorn's h11 protocol, bounded).

uvicorn's default parser reads request headers without a size limit or a deadline, and an idle
or half-sent connection stays open forever. This protocol, used by `serve`:
- caps the request line and headers together (`max_header_bytes`, h11's incomplete-event limit:
  over it the client gets 400 and the connection is closed);
- closes a connection whose request line and headers have not fully arrived `header_timeout_s`
  after it opened or after its previous response (a drip of header bytes does not restart it);
- closes a kept-alive connection idle for `keep_alive_timeout_s` (uvicorn's own timer);
- closes at once any connection beyond `max_connections` open ones.
A body's pace is the guard's (guard.py: silence and a minimum rate).
"""
from __future__ import annotations

import asyncio
import logging
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

from ...logonce import RateLimitedLog

log = logging.getLogger("starvewatch.collector")
refusals = RateLimitedLog(log, interval_s=60.0)
# Open connections by client (host, port), for the guard to give a slot back (below).
_by_client: dict[tuple, "H11Protocol"] = {}


def connection_uid(client, server) -> int | None:
    """The local user at the other end of a loopback connection (peer.py), read once per
    connection and kept with it; None when it cannot be known."""
    from .peer import peer_uid
    protocol = _by_client.get(tuple(client)) if client else None
    if protocol is not None and hasattr(protocol, "_starvewatch_uid"):
        return protocol._starvewatch_uid
    uid = peer_uid(client, server)
    if protocol is not None:
        protocol._starvewatch_uid = uid
    return uid


def release_slot(client) -> None:
    """The connection of `client` stops counting toward `max_connections` (a wrong token's
    answer waits, slowed, guard.py: it must not keep clients with the right token out)."""
    protocol = _by_client.get(tuple(client)) if client else None
    if protocol is not None:
        protocol.connections.discard(protocol)


class _OncePerInterval(logging.Filter):
    """uvicorn says "Invalid HTTP request received." for every refused request: a stranger could
    fill the log with it. The first one passes, then at most one a minute with a count."""

    def __init__(self, interval_s: float = 60.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.last_s: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(("Invalid HTTP request", "Exceeded concurrency",
                                   "ASGI callable returned without completing")):
            return True
        now = time.monotonic()
        if now - self.last_s.get(message, -self.interval_s) < self.interval_s:
            self.held[message] = self.held.get(message, 0) + 1
            return False
        self.last_s[message] = now
        held = self.held.pop(message, 0)
        if held:
            record.msg, record.args = f"{message} ({held} more like this in the last minute)", ()
        return True


def quiet_refusals() -> None:
    """Install the filter above on uvicorn's error logger (once)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _OncePerInterval) for f in logger.filters):
        logger.addFilter(_OncePerInterval())


def bounded_protocol(settings) -> type:
    """An H11Protocol class carrying `settings`' limits (uvicorn builds one per connection)."""

    class BoundedH11Protocol(H11Protocol):
        header_timeout_s = settings.header_timeout_s
        max_connections = settings.max_connections

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._header_deadline = None
            if len(self.connections) > self.max_connections:
                refusals.error("max-connections", "%d connections open: closing new ones (--max-connections)",
                               self.max_connections)
                transport.close()
                return
            if self.client:
                _by_client[tuple(self.client)] = self
            self._arm_header_deadline()

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_deadline_passed)

        def _header_deadline_passed(self) -> None:
            self._header_deadline = None
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return  # closed already, or upgraded to a WebSocket (its own protocol now)
            if self.cycle is None or self.cycle.response_complete:
                # No request in progress: the next one's headers did not arrive in time.
                self.transport.close()

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._arm_header_deadline()  # before: a pipelined next request may start inside
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.client and _by_client.get(tuple(self.client)) is self:
                del _by_client[tuple(self.client)]
            if getattr(self, "_header_deadline", None) is not None:
                self._header_deadline.cancel()
                self._header_deadline = None
            super().connection_lost(exc)

    return BoundedH11Protocol
