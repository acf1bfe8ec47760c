"""Delivery of event batches: to the collector over HTTP, to memory (tests), or to the spool.

The spool is the safety net: when the collector is down or slow, batches are written there
(gzip JSON, one file per sequence number, written atomically; the format is
starvewatch/spool_format.py) and replayed in order when it answers again. The collector dedups by (stream, seq), so a replay never duplicates anything.
"""
from __future__ import annotations

import gzip
import http.client
import json
import os
import time
import urllib.parse
from pathlib import Path

from ...spool_format import SUFFIX, file_name, read_spool_file

_dumps = None


def dumps(obj) -> bytes:
    """orjson when installed (about 10x the stdlib), imported on first use, off the hot path."""
    global _dumps
    if _dumps is None:
        try:
            import orjson
            _dumps = orjson.dumps
        except ImportError:  # pragma: no cover
            _dumps = lambda o: json.dumps(o, separators=(",", ":")).encode()  # noqa: E731
    return _dumps(obj)

GZIP_MIN_BYTES = 1024


class TransportError(Exception):
    pass


class MemoryTransport:
    """Keeps every payload in a list: for tests and in-process consumers."""

    def __init__(self) -> None:
        self.payloads: list[dict] = []

    def send(self, payload: dict, body: bytes | None = None) -> None:
        self.payloads.append(payload)

    def close(self) -> None:
        pass


class HttpTransport:
    """POSTs batches to the collector on one keep-alive connection (stdlib http.client)."""

    path = "/api/v1/ingest"

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 5.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"STARVEWATCH_URL must be an http(s) URL, got {url!r}")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s
        self._conn = None

    def _connection(self):
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.timeout_s)
        return self._conn

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, bytes]:
        all_headers = dict(headers or {})
        if self._token:
            all_headers["Authorization"] = f"Bearer {self._token}"
        try:
            conn = self._connection()
            conn.request(method, self._prefix + path, body=body, headers=all_headers)
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise TransportError(f"{method} {path}: {exc}") from exc

    def send(self, payload: dict, body: bytes | None = None) -> None:
        data = body if body is not None else dumps(payload)
        headers = {"Content-Type": "application/json"}
        if len(data) >= GZIP_MIN_BYTES:
            data = gzip.compress(data, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        status, text = self.request("POST", self.path, data, headers)
        if status >= 500 or status in (408, 429):
            raise TransportError(f"collector answered {status}")
        if status >= 400:
            # A batch the collector rejects would be rejected again: keep it out of the spool
            # replay loop, but say so.
            raise RejectedError(f"collector rejected a batch ({status}): {text[:300]!r}")

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class RejectedError(TransportError):
    pass


class Spool:
    """A bounded directory of pending batches for one process stream."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.dropped_payloads = 0
        self.dropped_records = 0
        self._bytes = None
        # Whether files may be waiting: kept in memory, so a healthy delivery never lists the
        # directory (each syscall on the shipper thread costs the training thread a GIL switch).
        # The collector can ingest the spool itself, so True is a hint that replay corrects.
        self._maybe_pending: bool | None = None

    @property
    def maybe_pending(self) -> bool:
        if self._maybe_pending is None:
            self._maybe_pending = bool(self._files())
        return self._maybe_pending

    def _files(self) -> list[Path]:
        try:
            return sorted(p for p in self.directory.iterdir() if p.name.endswith(SUFFIX))
        except FileNotFoundError:
            return []

    def pending(self) -> list[Path]:
        files = self._files()
        self._maybe_pending = bool(files)
        return files

    def write(self, seq: int, body: bytes, records: int) -> None:
        data = gzip.compress(body, compresslevel=1)
        self._make_room(len(data))
        final = self.directory / file_name(seq)
        tmp = final.with_suffix(".tmp")
        try:
            f = open(tmp, "wb")
        except FileNotFoundError:  # the first write, or the directory was removed (an import)
            self.directory.mkdir(parents=True, exist_ok=True)
            f = open(tmp, "wb")
        with f:
            f.write(data)
        os.replace(tmp, final)  # atomic: a reader never sees half a batch
        self._bytes = (self._bytes or 0) + len(data)
        self._maybe_pending = True

    def _make_room(self, incoming: int) -> None:
        if self._bytes is None:
            self._bytes = sum(p.stat().st_size for p in self._files())
        if self._bytes + incoming <= self.max_bytes:
            return
        for path in self._files():  # oldest first
            if self._bytes + incoming <= self.max_bytes:
                break
            try:
                size = path.stat().st_size
                records = len(read_spool_file(path).get("steps", {}).get("step", []))
                path.unlink()
            except (OSError, ValueError):
                continue
            self._bytes -= size
            self.dropped_payloads += 1
            self.dropped_records += records

    def remove(self, path: Path) -> None:
        try:
            size = path.stat().st_size
            path.unlink()
            if self._bytes is not None:
                self._bytes -= size
        except FileNotFoundError:
            pass


class Delivery:
    """Sends in sequence order; falls back to the spool and replays it with back-off."""

    def __init__(self, transport, spool: Spool, *, min_backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0) -> None:
        self.transport = transport
        self.spool = spool
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self._backoff_s = min_backoff_s
        self._retry_at = 0.0
        self.failures = 0
        self.rejected = 0
        self.last_error: str | None = None

    def _backlog(self) -> bool:
        return self.spool.maybe_pending

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        self.last_error = str(exc)
        self._retry_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(self.max_backoff_s, self._backoff_s * 2)

    def _succeeded(self) -> None:
        self._backoff_s = self.min_backoff_s

    def reset_backoff(self) -> None:
        """The collector was just found: retry at once."""
        self._backoff_s = self.min_backoff_s
        self._retry_at = 0.0

    def deliver(self, payload: dict, body: bytes | None = None, deadline: float | None = None) -> None:
        """Send one batch, or spool it: when the collector is down, backing off, behind a
        backlog (order matters), or the flush `deadline` (monotonic) has passed."""
        body = body if body is not None else dumps(payload)
        records = len(payload.get("steps", {}).get("step", ()))
        if self.transport is None or time.monotonic() < self._retry_at or self._backlog() \
                or (deadline is not None and time.monotonic() > deadline):
            self.spool.write(payload["seq"], body, records)
            return
        try:
            self.transport.send(payload, body)
            self._succeeded()
        except RejectedError as exc:
            self.rejected += 1
            self.last_error = str(exc)
        except TransportError as exc:
            self._failed(exc)
            self.spool.write(payload["seq"], body, records)

    def dropped(self) -> dict:
        return {"spool_payloads": self.spool.dropped_payloads, "spool_records": self.spool.dropped_records}

    def flush(self, deadline: float) -> bool:
        return self.replay(deadline)

    def replay(self, deadline: float | None = None) -> bool:
        """Send spooled batches oldest first; True when the spool is empty."""
        if self.transport is None:
            return False
        if time.monotonic() < self._retry_at:
            return False
        if not self.spool.maybe_pending:
            return True
        for path in self.spool.pending():
            if deadline is not None and time.monotonic() > deadline:
                return False
            try:
                payload = read_spool_file(path)
            except FileNotFoundError:
                continue  # the collector ingested it from the spool directly
            except (OSError, ValueError):
                self.spool.remove(path)  # a torn file from a crash: nothing to replay
                continue
            try:
                self.transport.send(payload)
                self._succeeded()
            except RejectedError as exc:
                self.rejected += 1
                self.last_error = str(exc)
            except TransportError as exc:
                self._failed(exc)
                return False
            self.spool.remove(path)
        self.spool.pending()  # refresh the hint (a batch may have been spooled meanwhile)
        return True
