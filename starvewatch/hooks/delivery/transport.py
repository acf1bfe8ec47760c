"""Delivery of event batches: to the collector over HTTP, to memory (tests), or to the spool.

The spool is the safety net: when the collector is down or slow, batches are written there
(gzip JSON, one file per sequence number, written atomically; the format is
starvewatch/spool_format.py, the directory spool.py) and replayed in order when it answers
again. Every batch sent or spooled keeps within the collector's limits (starvewatch/limits.py):
a larger one is split into parts by record range (starvewatch/batch_parts.py), and the collector
stores each record range of a (stream, seq) once, so a replay never duplicates anything.
"""
from __future__ import annotations

import gzip
import http.client
import json
import logging
import os
import random
import threading
import time
import urllib.parse
import zlib
from pathlib import Path

from .account import SlowWatch, Warnings, drop_reason, rejected_dir
from ...batch_parts import split
from ...limits import MAX_DECOMPRESSED_BYTES, MAX_LIST_RECORDS
from ...logonce import RateLimitedLog
from ...private_files import make_private_dirs, private_opener
from ...spool_format import SpoolFileError, file_name, read_spool_file
from .spool import Spool, _records_in

_replay_errors = RateLimitedLog(logging.getLogger("starvewatch.delivery"))


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
GZIP_LEVEL = 1  # the fastest: a batch's JSON shrinks ~6x


class GzippedJSON(bytes):
    """A body's JSON, its gzip (`gzipped`) made already (BodyAhead)."""

    gzipped: bytes

    def __new__(cls, data: bytes, gzipped: bytes) -> "GzippedJSON":
        body = super().__new__(cls, data)
        body.gzipped = gzipped
        return body


class BodyAhead:
    """A batch's JSON and gzip made before it is sent, all but its last fields (the delivery
    account, read as the batch leaves). The sidecar encodes a batch while the one before is in
    flight; once the collector has answered, only those fields are left to encode (the whole
    body's JSON and gzip were ~5 ms of each gap between two requests, issue 41)."""

    def __init__(self, payload: dict, last: tuple[str, ...]) -> None:
        self.last = last
        head = dumps({k: v for k, v in payload.items() if k not in last})
        self._head = head[:-1]  # without its closing brace
        self._more = b"," if len(head) > 2 else b""
        self._compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        self._gzipped = self._compressor.compress(self._head)

    def finish(self, payload: dict) -> GzippedJSON:
        """The body of `payload` (its `last` fields as they stand now; the others as they were)."""
        tail = self._more + b",".join(dumps(k) + b":" + dumps(payload[k]) for k in self.last) + b"}"
        compressor = self._compressor.copy()  # the same batch may be finished again (a retry)
        return GzippedJSON(self._head + tail, self._gzipped + compressor.compress(tail) + compressor.flush())


class TransportError(Exception):
    """The collector could not take the batch now (down, slow, 5xx): keep it and retry."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class MemoryTransport:
    """Keeps every payload in a list: for tests and in-process consumers."""

    def __init__(self) -> None:
        self.payloads: list[dict] = []

    def send(self, payload: dict, body: bytes | None = None) -> None:
        self.payloads.append(payload)

    def close(self) -> None:
        pass


MAX_ANSWER_BYTES = 8 * 2**20  # the largest answer training reads (a run list for the compare link)


class HttpTransport:
    """POSTs batches to the collector on one keep-alive connection (stdlib http.client)."""

    path = "/api/v1/ingest"

    def without_token(self) -> "HttpTransport":
        """The same collector, asked without the token (before it has proved it is ours)."""
        return HttpTransport(self.url, None, timeout_s=self.timeout_s)

    @property
    def has_token(self) -> bool:
        return bool(self._token)

    def use_token(self, token: str) -> None:
        self._token = token

    def require_proof(self, key: str) -> None:
        """From now on, every new connection must prove it reaches the user's own collector
        (local_secrets.py: the answer to a fresh challenge under the collector key) before a
        token or a record goes over it: whoever holds the port otherwise gets neither."""
        self._key = key
        self.close()

    def _prove(self, conn) -> None:
        from ...local_secrets import new_challenge, proof_ok
        challenge = new_challenge()
        conn.request("GET", f"{self._prefix}/healthz?challenge={challenge}")
        response = conn.getresponse()
        data = response.read(64 * 1024 + 1)
        try:
            answer = json.loads(data) if len(data) <= 64 * 1024 else None
        except ValueError:
            answer = None
        if response.status >= 500 or response.status in (408, 429):
            self.close()  # a collector in trouble (or a proxy's error): retried, as any delivery
            raise TransportError(f"collector answered {response.status}", response.status)
        if response.status != 200 or not isinstance(answer, dict) or not proof_ok(self._key, challenge,
                                                                                   answer.get("proof")):
            self.close()
            raise TransportError(f"{self.url} cannot prove it is your collector (another user's, or another "
                                 f"program on the port): nothing sent to it")
        self._proved = True

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
        self._key: str | None = None  # require_proof()
        self._proved = False
        # Set once each request is written, before its answer is awaited (the sidecar builds
        # the next batch then: sidecar.py).
        self.request_sent: threading.Event | None = None

    def _connection(self):
        if self._conn is None:
            if self._https:  # verified: the system's CAs or STARVEWATCH_CA_FILE (tls.py)
                from ...tls import client_context
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout_s,
                                                         context=client_context())
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
            self._proved = False
        return self._conn

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, bytes]:
        all_headers = dict(headers or {})
        if self._token:
            all_headers["Authorization"] = f"Bearer {self._token}"
        for attempt in (1, 2):
            reused = self._conn is not None
            try:
                conn = self._connection()
                if self._key is not None and not self._proved:
                    self._prove(conn)
                conn.request(method, self._prefix + path, body=body, headers=all_headers)
                if self.request_sent is not None:
                    self.request_sent.set()
                response = conn.getresponse()
                # Read within a bound: whatever answers on the port cannot make training's
                # memory grow with it (a 512 MiB answer once took a process to 1 GiB).
                data = response.read(MAX_ANSWER_BYTES + 1)
                if len(data) > MAX_ANSWER_BYTES:
                    self.close()
                    raise TransportError(f"{method} {path}: answer over {MAX_ANSWER_BYTES} bytes; not a collector's")
                return response.status, data
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine) as exc:
                self.close()
                # A kept-alive connection to a collector that restarted fails once; a new one
                # may not (every request here is idempotent: the collector deduplicates).
                if not (reused and attempt == 1):
                    raise TransportError(f"{method} {path}: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise TransportError(f"{method} {path}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def send(self, payload: dict, body: bytes | None = None) -> None:
        data = body if body is not None else dumps(payload)
        headers = {"Content-Type": "application/json"}
        if len(data) >= GZIP_MIN_BYTES:
            data = getattr(data, "gzipped", None) or gzip.compress(data, compresslevel=GZIP_LEVEL)
            headers["Content-Encoding"] = "gzip"
        status, text = self.request("POST", self.path, data, headers)
        if status < 400:
            return
        detail = text[:300].decode("utf-8", "replace")
        if status in (401, 403):
            raise AuthError(f"collector answered {status}: {detail}", status)
        if status == 413:
            raise TooLargeError(f"collector answered 413: {detail}", status)
        if status >= 500 or status in (408, 429):
            raise TransportError(f"collector answered {status}", status)
        # Invalid (422, 400, 415): it would be refused again, so it leaves the replay loop.
        raise RejectedError(f"collector rejected a batch ({status}): {detail}", status)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class RejectedError(TransportError):
    """The collector refused the batch as invalid: it would be refused again."""


class AuthError(TransportError):
    """401/403: a missing or wrong token. The batch is fine; keep it until one is accepted."""


class TooLargeError(TransportError):
    """413: the body is over the collector's limit; smaller batches will pass."""


class Delivery:
    """Sends in sequence order; falls back to the spool and replays it with back-off; keeps
    the account of where every step record went (account.py)."""

    # A send in flight longer than this is worth one console line ("behind"), and its end one
    # more ("caught up"); a sub-second hiccup of a busy collector says nothing.
    SLOW_S = 1.5

    def __init__(self, transport, spool: Spool, *, min_backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, warnings: Warnings | None = None) -> None:
        self.transport = transport
        self.spool = spool
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.warnings = warnings if warnings is not None else Warnings(quiet=True)
        self._backoff_s = min_backoff_s
        self._retry_at = 0.0
        self.failures = 0
        self.acknowledged = 0
        self._dropped: dict[str, int] = {}
        # Learned from a 413: batches with more step records are split before sending, so a
        # known limit is never sent over again.
        self.max_records: int | None = None
        self._slow = SlowWatch(self.SLOW_S, self._say_slow)
        self._behind_since: float | None = None  # monotonic start of a slow spell that was said
        self._last_send_s = 0.0  # how long the last successful send took
        # Jitter on every back-off: hundreds of ranks that lost the collector together must not
        # come back to it in lockstep.
        self.random = random.Random()
        self._failing_since: float | None = None  # wall clock of the first failure of an outage

    def _say_slow(self, elapsed_s: float) -> None:
        url = getattr(self.transport, "url", "the collector")
        self._behind_since = time.monotonic() - elapsed_s
        self.warnings.note("behind", f"delivery is running behind: the collector at {url} has taken "
                                     f"{elapsed_s:.1f} s for one batch so far. Nothing is lost: records wait "
                                     f"and are sent in order (a line follows when delivery has caught up)")

    def _maybe_caught_up(self) -> None:
        """After a send that went through: when delivery was said to be behind and nothing
        waits any more, say it caught up (and watch for the next slow spell)."""
        if self._behind_since is None or self._last_send_s >= self.SLOW_S or self._backlog():
            return  # still behind: a slow send, or batches waiting in the spool
        behind_s = time.monotonic() - self._behind_since
        self._behind_since = None
        self._slow = SlowWatch(self.SLOW_S, self._say_slow)
        self.warnings.recovered(f"delivery caught up: the collector at {getattr(self.transport, 'url', '?')} "
                                f"has everything so far (it was behind for {behind_s:.0f} s)")

    # ---- the account --------------------------------------------------------------------------
    def account(self) -> dict:
        spooled = self.spool.records  # first: the listing updates what the collector took or set aside
        dropped = dict(self._dropped)
        if self.spool.dropped_records:
            dropped["spool_full"] = self.spool.dropped_records
        if self.spool.set_aside_records:
            dropped["unreadable_spool"] = self.spool.set_aside_records
        return {"acknowledged": self.acknowledged + self.spool.vanished_records, "spooled": spooled,
                "dropped": dropped}

    def _drop(self, reason: str, records: int) -> None:
        if records:
            self._dropped[reason] = self._dropped.get(reason, 0) + records

    def dropped(self) -> dict:
        return {"spool_payloads": self.spool.dropped_payloads, "spool_records": self.spool.dropped_records}

    # ---- back-off -----------------------------------------------------------------------------
    def _backlog(self) -> bool:
        return self.spool.maybe_pending

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        if self._failing_since is None:
            self._failing_since = time.time()
        # "Equal jitter": between half and all of the back-off, so a retry never comes sooner
        # than half of it, and retries of many processes spread over the other half.
        self._retry_at = time.monotonic() + self._backoff_s * (0.5 + 0.5 * self.random.random())
        self._backoff_s = min(self.max_backoff_s, self._backoff_s * 2)

    def _succeeded(self) -> None:
        self._backoff_s = self.min_backoff_s
        if self._failing_since is not None:
            lasted_s = time.time() - self._failing_since
            self._failing_since = None
            self._slow = SlowWatch(self.SLOW_S, self._say_slow)  # a later slow spell is said again
            self._behind_since = None
            self.warnings.recovered(f"delivery recovered: the collector at {getattr(self.transport, 'url', '?')} "
                                    f"accepts batches again (after {lasted_s:.0f} s); the spool is replayed")

    def spool_only(self) -> None:
        """The URL answers, but not as a starvewatch collector: sending there could only fail
        and say so (a "sent when it recovers" that never comes). Everything goes to the spool,
        which `starvewatch import` or a collector reading this directory takes in."""
        if self.transport is not None:
            self.transport.close()
        self.transport = None

    def reset_backoff(self) -> None:
        """The collector was just found: retry at once."""
        self._backoff_s = self.min_backoff_s
        self._retry_at = 0.0

    # ---- sending ----------------------------------------------------------------------------
    def deliver(self, payload: dict, body: bytes | None = None, deadline: float | None = None) -> None:
        """Send one batch, or spool it: when the collector is down, backing off, behind a
        backlog (order matters), or the flush `deadline` (monotonic) has passed."""
        for part, part_body in self._fit(payload, body):
            records = _records_in(part)
            if self.transport is None or time.monotonic() < self._retry_at or self._backlog() \
                    or (deadline is not None and time.monotonic() > deadline):
                self._spool(part, part_body, records)
            elif not self._try_send(part, part_body, records):
                self._spool(part, part_body, records)

    def _fit(self, payload: dict, body: bytes | None = None):
        """The batch as parts within the collector's limits (records per list, the inflated
        body's size, the step records per request learned from a 413), each with its body;
        one at a time, so a big backlog is never held twice in memory."""
        parts = split(payload, MAX_LIST_RECORDS, self.max_records)
        for part in parts:
            part_body = body if body is not None and len(parts) == 1 else dumps(part)
            yield from self._within_bytes(part, part_body)

    def _within_bytes(self, part: dict, part_body: bytes):
        steps = _records_in(part)
        if len(part_body) <= MAX_DECOMPRESSED_BYTES or steps <= 1:
            yield part, part_body
            return
        for half in split(part, MAX_LIST_RECORDS, steps // 2):  # long names, many phases
            yield from self._within_bytes(half, dumps(half))

    def _spool(self, payload: dict, body: bytes, records: int) -> None:
        part = payload.get("part")
        try:
            self.spool.write(payload["seq"], body, records, first=None if part is None else part[0])
        except OSError as exc:
            reason = drop_reason(exc)
            self._drop(reason, records)
            where = self.spool.directory
            text = {"disk_full": f"the disk holding the spool at {where} is full",
                    "spool_unwritable": f"cannot write the spool at {where} ({exc.strerror or exc})"}.get(
                reason, f"cannot write the spool at {where} ({exc})")
            self.warnings.once(reason, f"{text}: step records that cannot be delivered are dropped "
                                       f"(counted in the run's delivery account)")
        if self.spool.dropped_records:
            self.warnings.once("spool_full", f"the spool at {self.spool.directory} reached its bound of "
                                             f"{self.spool.max_bytes / 2**20:.0f} MiB: the oldest batches are "
                                             f"dropped (counted)")

    def _try_send(self, payload: dict, body: bytes | None, records: int, spooled: Path | None = None) -> bool:
        """One batch to the collector. True when it is settled (acknowledged, or moved to
        rejected/, or dropped as too large); False when it must wait (spool or keep it)."""
        started = time.monotonic()
        self._slow.begin()
        try:
            too_large = self._send_fitting(payload, body, records)
        except AuthError as exc:
            self._slow.end()
            self._failed(exc)
            self.warnings.once("token", f"the collector rejected our token ({exc.status}): records are kept in "
                                        f"the spool at {self.spool.directory} until it accepts one "
                                        f"(STARVEWATCH_TOKEN must be the collector's --token)")
            return False
        except RejectedError as exc:
            self._slow.end()
            self._reject(payload, body, records, spooled, exc)
            return True
        except TransportError as exc:
            self._slow.end()
            self._failed(exc)
            url = getattr(self.transport, "url", "the collector")
            if exc.status is not None:
                self.warnings.once("unavailable", f"the collector at {url} answered {exc.status}: records are "
                                                  f"kept in the spool at {self.spool.directory} and sent when "
                                                  f"it recovers")
            elif "timed out" in str(exc):
                self.warnings.once("slow", f"the collector at {url} did not answer within "
                                           f"{getattr(self.transport, 'timeout_s', 0):.0f} s: records are kept in "
                                           f"the spool at {self.spool.directory} and sent when it answers in time")
            else:
                self.warnings.once("unreachable", f"the collector at {url} does not answer ({exc}): records are "
                                                  f"kept in the spool at {self.spool.directory} and sent when "
                                                  f"it does")
            return False
        except BaseException:
            self._slow.end()
            raise
        self._slow.end()
        self._last_send_s = time.monotonic() - started
        self._succeeded()
        self.acknowledged += records - too_large
        if spooled is None:
            self._maybe_caught_up()
        self._drop("too_large", too_large)
        if too_large:
            self.warnings.once("too_large", "a step record larger than the collector's body limit was dropped "
                                            "(counted)")
        return True

    def _send_fitting(self, payload: dict, body: bytes | None, records: int) -> int:
        """Send within the collector's limits, splitting by record range on a 413; returns the
        number of single step records dropped as too large. Raises TransportError to retry
        later (the parts already sent are stored once by the collector on a resend: it keeps
        the record ranges of each batch)."""
        parts = split(payload, MAX_LIST_RECORDS, self.max_records)
        if len(parts) > 1:
            return sum(self._send_fitting(part, None, _records_in(part)) for part in parts)
        try:
            self.transport.send(payload, body)
            return 0
        except TooLargeError:
            smaller = max(1, records // 2)
            self.max_records = smaller if self.max_records is None else max(1, min(self.max_records, smaller))
            parts = split(payload, MAX_LIST_RECORDS, self.max_records)
            if len(parts) == 1:
                return records  # one record alone (or the batch's other lists) is over the limit
            return sum(self._send_fitting(part, None, _records_in(part)) for part in parts)

    def _reject(self, payload: dict, body: bytes | None, records: int, spooled: Path | None,
                exc: RejectedError) -> None:
        """An invalid batch: out of the replay loop, into `rejected/` (for a bug report), counted."""
        part = payload.get("part")
        target = Path(rejected_dir(self.spool.directory)) / (
            spooled.name if spooled is not None else file_name(payload["seq"], None if part is None else part[0]))
        try:
            make_private_dirs(target.parent)
            if spooled is not None:
                self.spool.forget(spooled)
                os.replace(spooled, target)
            else:
                with open(target, "wb", opener=private_opener) as out:
                    out.write(gzip.compress(body if body is not None else dumps(payload), compresslevel=1))
        except OSError:
            if spooled is not None:
                self.spool.remove(spooled)
        self._drop("rejected", records)
        self.warnings.once("rejected", f"the collector rejected a batch of {records} step records as invalid "
                                       f"({exc.status}): it is kept in {target.parent} and counted as dropped "
                                       f"({str(exc)[:200]})")

    def _set_aside(self, path: Path, exc: Exception) -> None:
        """A spool file that cannot be read back as a batch: moved to rejected/, its records
        (as the index knows them) counted as `spool_error`."""
        target = Path(rejected_dir(self.spool.directory)) / path.name
        records = self.spool.forget(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
        except OSError:
            self.spool.remove(path)
        self._drop("spool_error", records)
        self.warnings.once("spool_error", f"spool file {path.name} cannot be read back ({exc}): it is kept in "
                                          f"{target.parent} and its {records} step records are counted as dropped")

    def flush(self, deadline: float) -> bool:
        """At the end of the run: one more try whatever the back-off, then the spool keeps
        what is left (the collector sweeps it, or the next run with this spool replays it)."""
        self._retry_at = 0.0
        return self.replay(deadline)

    def replay(self, deadline: float | None = None) -> bool:
        """Send spooled batches oldest first; True when the spool is empty."""
        if self.transport is None:
            return False
        if time.monotonic() < self._retry_at:
            return False
        if not self.spool.maybe_pending:
            self._maybe_caught_up()
            return True
        for path in self.spool.pending():
            if deadline is not None and time.monotonic() > deadline:
                return False
            try:
                payload = read_spool_file(path)
            except FileNotFoundError:
                continue  # the collector ingested it from the spool directly
            except SpoolFileError as exc:  # its content is not a batch: kept for a bug report, counted
                self._set_aside(path, exc)
                continue
            except OSError as exc:  # the file may be fine: keep it, try again at the next replay
                _replay_errors.error("read", "starvewatch: cannot read spool file %s now (%s); "
                                     "trying again later", path, exc)
                return False
            records = _records_in(payload)
            rejected = self._dropped.get("rejected", 0)
            if not self._try_send(payload, None, records, spooled=path):
                return False
            if self._dropped.get("rejected", 0) == rejected:  # not moved to rejected/: delivered
                self.spool.delivered(path)
        self.spool.pending()  # refresh the hint (a batch may have been spooled meanwhile)
        self._maybe_caught_up()
        return True
