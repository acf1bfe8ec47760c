"""Where every step record went (the delivery account), and one console line per problem.

Each step record ends in exactly one of: acknowledged by the collector, on disk in the spool,
or dropped with a reason. `Delivery` (transport.py) keeps the counts; the spool's part
is what its files hold right now. Reasons: `spool_full` (the oldest batches made room),
`disk_full`, `spool_unwritable` (read-only or no permission), `spool_error` (another I/O
error), `rejected` (the collector refused the batch as invalid: kept in `rejected/`),
`too_large` (a single record over the collector's body limit), `sidecar_died` (let go past
the bound of unacknowledged bytes, then the sidecar died), `sidecar_error` (the sidecar failed
to build or deliver a batch), `shipper_error` (the training process's shipper could not hand a
chunk on, three times), `buffer_full` (the hot path's buffer was full). `spool_error` also
counts a spool file whose content could not be read back (it is kept in `rejected/`);
`unreadable_spool` a spooled file the collector's sweep took but could not ingest (it set it
aside in `rejected/`).
"""
from __future__ import annotations

import errno
import os
import sys
import threading


def drop_reason(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "disk_full"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "spool_unwritable"
    return "spool_error"


def empty_account() -> dict:
    return {"acknowledged": 0, "spooled": 0, "dropped": {}}


def add_accounts(*accounts: dict) -> dict:
    out = empty_account()
    for account in accounts:
        out["acknowledged"] += account.get("acknowledged", 0)
        out["spooled"] += account.get("spooled", 0)
        for reason, count in account.get("dropped", {}).items():
            if count:
                out["dropped"][reason] = out["dropped"].get(reason, 0) + count
    return out


# Problems that end when the collector answers again: said once per outage, not per process.
OUTAGE_KINDS = frozenset({"unreachable", "unavailable", "slow", "behind", "token"})


class Warnings:
    """One console line per kind of problem, the first time it happens: the training console
    must learn that records are held back or lost, once, not on every batch. A collector
    problem (OUTAGE_KINDS) is said again when it comes back after delivery recovered, and the
    recovery itself is one line."""

    def __init__(self, quiet: bool = False, stream=None) -> None:
        self.quiet = quiet
        self.stream = stream
        self.said: set[str] = set()
        self._lock = threading.Lock()

    def once(self, kind: str, text: str) -> None:
        with self._lock:
            if kind in self.said:
                return
            self.said.add(kind)
        self._print(f"starvewatch: warning: {text}")

    def note(self, kind: str, text: str) -> None:
        """Like once(), for what is no problem yet (delivery running behind): no "warning:"."""
        with self._lock:
            if kind in self.said:
                return
            self.said.add(kind)
        self._print(f"starvewatch: {text}", info=True)

    def recovered(self, text: str) -> None:
        """Delivery works again: say so when an outage was said, and forget the outage's kinds."""
        with self._lock:
            outage = self.said & OUTAGE_KINDS
            if not outage:
                return
            self.said -= outage
        self._print(f"starvewatch: {text}", info=True)

    def _print(self, line: str, info: bool = False) -> None:
        if not self.quiet:
            from ...console import info_stream
            try:
                print(line, file=self.stream or (info_stream() if info else sys.stderr), flush=True)
            except (OSError, ValueError):  # no console left: nothing to tell
                pass


_QUIET_LOGGERS = ("starvewatch.hooks", "starvewatch.delivery", "starvewatch.sidecar")
_quiet_handler = None


def quiet_console(quiet: bool) -> None:
    """STARVEWATCH_QUIET=1: the training process's own log lines (rate-limited errors of the
    shipper, the spool, the sidecar) stay off the console. Python prints a record to stderr
    only when no handler exists on its way up ("last resort"); a NullHandler on our loggers
    ends that, while the records still propagate to the user's own handlers."""
    import logging
    global _quiet_handler
    if quiet and _quiet_handler is None:
        _quiet_handler = logging.NullHandler()
        for name in _QUIET_LOGGERS:
            logging.getLogger(name).addHandler(_quiet_handler)
    elif not quiet and _quiet_handler is not None:
        for name in _QUIET_LOGGERS:
            logging.getLogger(name).removeHandler(_quiet_handler)
        _quiet_handler = None


def rejected_dir(spool_dir) -> str:
    """`<dir>/rejected/<run>/<stream>` beside `<dir>/spool/<run>/<stream>`: the collector's
    spool sweep never sees it, and a user can attach it to a bug report."""
    spool_dir = os.fspath(spool_dir)
    stream_dir, stream = os.path.split(spool_dir)
    spool_root, run = os.path.split(stream_dir)
    return os.path.join(os.path.dirname(spool_root), "rejected", run, stream)


class SlowWatch:
    """Says once that a send takes long, while it is still in flight: a process that ends
    during a 30 s request must not end without the console having heard why. One lazy daemon
    thread per delivery, asleep unless a send is in flight."""

    def __init__(self, after_s: float, say) -> None:
        self.after_s = after_s
        self.say = say  # say(elapsed_s)
        self._started: float | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.done = False  # said it: no more watching

    def begin(self) -> None:
        if self.done:
            return
        import time
        with self._cond:
            self._started = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="starvewatch-slow-send")
                self._thread.start()
            self._cond.notify()

    def end(self) -> None:
        if self.done:
            return
        with self._cond:
            self._started = None
            self._cond.notify()

    IDLE_EXIT_S = 2.0  # no send for this long: the thread ends (begin() starts another)

    def _run(self) -> None:
        import time
        with self._cond:
            while not self.done:
                if self._started is None:
                    if not self._cond.wait(self.IDLE_EXIT_S) and self._started is None:
                        self._thread = None
                        return
                    continue
                left = self._started + self.after_s - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self.done = True
                elapsed = time.monotonic() - self._started
        self.say(elapsed)
