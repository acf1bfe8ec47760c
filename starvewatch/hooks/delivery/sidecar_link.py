"""The training process's end of the sidecar (sidecar.py).

Per tick the sampler thread does one non-blocking pipe read and the shipper thread one pipe
write; everything else (psutil, NVML, gzip, HTTP, the spool) happens in the sidecar. A sidecar
that never starts or dies leaves `alive` False: sampling and delivery then go on in this
process, and batches the sidecar never acknowledged are delivered again (the collector
deduplicates by sequence number, so nothing is lost or doubled).
"""
from __future__ import annotations

import errno
import json
import logging
import marshal
import os
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict

from .account import add_accounts, empty_account, quiet_console
from ...record_layout import count_steps
from .records import CHUNK, LocalPipeline, RecordBook
from .transport import dumps

log = logging.getLogger("starvewatch.hooks")

SIDECAR_MODULE = "starvewatch.hooks.delivery.sidecar"  # run with -m: sidecar.py


class PipeIO:
    """Non-blocking pipe reads and writes that keep the GIL (libc through ctypes.PyDLL; os.read
    and os.write as the fallback). Releasing the GIL for a call that returns at once only
    hands it to the training thread, and taking it back costs a forced switch: the training
    loop would be interrupted twice per tick instead of once."""

    READ_SIZE = 1 << 20

    def __init__(self) -> None:
        self._libc = None
        try:
            import ctypes
            libc = ctypes.PyDLL(None, use_errno=True)
            for call in (libc.read, libc.write):
                call.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
                call.restype = ctypes.c_ssize_t
            self._ctypes, self._libc = ctypes, libc
            self._buffer = ctypes.create_string_buffer(self.READ_SIZE)
        except (ImportError, OSError, AttributeError):  # pragma: no cover - no libc symbols
            pass

    def _check(self, result: int) -> int:
        if result < 0:
            code = self._ctypes.get_errno()
            raise BlockingIOError(code, "would block") if code in (errno.EAGAIN, errno.EWOULDBLOCK) \
                else OSError(code, os.strerror(code))
        return result

    def read(self, fd: int) -> bytes:
        if self._libc is None:
            return os.read(fd, self.READ_SIZE)
        n = self._check(self._libc.read(fd, self._buffer, self.READ_SIZE))
        return self._ctypes.string_at(self._buffer, n)

    def write(self, fd: int, data: bytes, offset: int) -> int:
        if self._libc is None:
            return os.write(fd, memoryview(data)[offset:])
        address = self._ctypes.cast(self._ctypes.c_char_p(data), self._ctypes.c_void_p).value
        return self._check(self._libc.write(fd, address + offset, len(data) - offset))


SIDECAR_NICE = 10  # below the training process: see lower_priority()


def lower_priority(pid: int) -> None:
    """The sidecar runs SIDECAR_NICE below this process from its first instruction on (Popen
    returns after the exec): its start-up (the interpreter, its imports, psutil) then takes
    CPU the training leaves idle, never a core the training is waiting for. nice 10 still
    leaves it ~10% of a busy core, ample for its ~1%. Set from here because a `preexec_fn`
    is unsafe in a process with threads; the sidecar checks and lowers itself if this failed."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + SIDECAR_NICE))
    except (OSError, AttributeError):  # not permitted, or no setpriority on this platform
        pass


class SidecarLink:
    WRITE_TIMEOUT_S = 5.0

    def __init__(self, proc) -> None:
        self.proc = proc
        self._fd = proc.stdout.fileno()
        self._in_fd = proc.stdin.fileno()
        os.set_blocking(self._fd, False)
        os.set_blocking(self._in_fd, False)
        self._partial = b""
        self._io = PipeIO()
        self._lock = threading.Lock()   # the sampler and the shipper thread both read
        self._write_lock = threading.Lock()
        self._pids: list[int] | None = None
        self.alive = True
        self.readings: list[dict] = []  # host/gpu/processes messages, taken by the sampler
        self.acked_seq = 0  # batches up to this one are delivered (or spooled) and in ...
        self.book_line: bytes | None = None  # ... the sidecar's book: this line, unparsed
        self._next_book: bytes | None = None
        self.flushed = 0
        self.dropped = {"spool_payloads": 0, "spool_records": 0}
        self.account: dict | None = None  # the sidecar's delivery account, as of `acked_seq`
        self.collector: str | None = None  # what the sidecar found at the collector's URL

    @classmethod
    def start(cls, session) -> "SidecarLink | None":
        settings = session.settings
        quiet_console(settings.quiet)  # before anything here may log
        delivers = session.transport is None or session.delivers_over_http
        config = {"pid": os.getpid(), "wall_offset_ns": session.wall_offset_ns,
                  "host_interval_s": settings.host_interval_s,
                  "gpu_interval_s": settings.gpu_interval_s,
                  "worker_memory_interval_s": settings.worker_memory_interval_s,
                  "delivery": None if not delivers else {
                      "url": settings.url, "token": settings.token, "dir": str(settings.dir),
                      "spool_dir": str(session.spool_dir), "spool_max_bytes": settings.spool_max_bytes,
                      "autostart": settings.autostart, "local_rank": session.local_rank},
                  "quiet": settings.quiet}
        # The package as this process imported it, even when a script put it on sys.path: the
        # directory above `starvewatch`, one level up per dot in this module's name.
        package_root = os.path.dirname(os.path.abspath(__file__))
        for _ in range(__name__.count(".")):
            package_root = os.path.dirname(package_root)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        try:
            proc = subprocess.Popen([sys.executable, "-m", SIDECAR_MODULE],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                    close_fds=True)  # stderr inherited: its warnings reach the console
        except (OSError, ValueError) as exc:  # no process to spare: the training process does it all
            log.warning("starvewatch: the sidecar process could not start (%s); sampling and delivery "
                        "run in the training process", exc)
            return None
        lower_priority(proc.pid)
        link = cls(proc)
        link._send(config)
        return link if link.alive else None

    # ---- reading ---------------------------------------------------------------------------
    def poll(self) -> None:
        """Read whatever the sidecar wrote (usually one read) and sort it."""
        with self._lock:
            chunks = []
            while self.alive:
                try:
                    data = self._io.read(self._fd)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:  # EOF: the sidecar exited
                    self.alive = False
                    self.proc.poll()
                    break
                chunks.append(data)
                if len(data) < PipeIO.READ_SIZE:
                    break
            if not chunks:
                return
            *lines, self._partial = (self._partial + b"".join(chunks)).split(b"\n")
            for line in lines:
                if line.startswith(b'{"kind":"book"'):  # parsed only when needed
                    self._next_book = line
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                kind = message.get("kind")
                if kind == "acked":  # follows the book that includes the batch
                    self.acked_seq = max(self.acked_seq, message["seq"])
                    self.dropped = message.get("dropped", self.dropped)
                    self.account = message.get("account", self.account)
                    if self._next_book is not None:
                        self.book_line, self._next_book = self._next_book, None
                elif kind == "flushed":
                    self.flushed += 1
                    self.dropped = message.get("dropped", self.dropped)
                    self.account = message.get("account", self.account)
                elif kind == "account":
                    self.account = message["account"]
                elif kind == "collector":
                    self.collector = message.get("found")
                elif kind in ("host", "gpu", "processes", "sampled", "stack", "worker_memory"):
                    self.readings.append(message)
                elif kind == "log":  # a warning of the sidecar's, rate-limited there: one console line
                    log.warning("%s", message.get("message"))

    def take_readings(self) -> list[dict]:
        self.poll()
        with self._lock:
            out, self.readings = self.readings, []
        return out

    def wait_for(self, condition, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            if condition():
                return True
            left = deadline - time.monotonic()
            if not self.alive or left <= 0:
                return False
            select.select([self._fd], [], [], min(left, 0.1))

    # ---- writing ---------------------------------------------------------------------------
    def _send(self, message: dict) -> bool:
        return self.write(json.dumps(message).encode() + b"\n")

    def send_batch(self, header: dict, parts: list[bytes]) -> bool:
        """One batch: its header as a JSON line, then its marshalled record chunks."""
        line = dumps({"batch": header, "parts": [len(p) for p in parts]})
        return self.write(b"".join([line, b"\n", *parts]))

    def write(self, data: bytes) -> bool:
        """A sidecar that takes none of `data` for WRITE_TIMEOUT_S (stopped, frozen) is killed
        and counted as gone, so a monitor thread never hangs on the pipe."""
        if not self.alive:
            return False
        offset = 0
        deadline = time.monotonic() + self.WRITE_TIMEOUT_S
        try:
            with self._write_lock:
                while offset < len(data):
                    try:
                        offset += self._io.write(self._in_fd, data, offset)
                    except BlockingIOError:
                        left = deadline - time.monotonic()
                        if left <= 0 or not select.select([], [self._in_fd], [], left)[1]:
                            raise TimeoutError("the sidecar stopped reading") from None
            return True
        except (OSError, ValueError):
            self.alive = False
            self.proc.kill()
            return False

    def watch_pids(self, pids: list[int]) -> None:
        if pids != self._pids:
            self._pids = pids
            self._send({"pids": pids})

    def request_stack(self, request: dict) -> None:
        """A hung worker's stack (hooks/stacks.py): answered by a "stack" reading."""
        self._send({"stack": request})

    def final_readings(self, timeout_s: float) -> list[dict]:
        """Ask for one more reading now (short runs get data too) and wait for it."""
        if self._send({"sample": True}):
            self.wait_for(lambda: any(r.get("kind") == "sampled" for r in self.readings), timeout_s)
        return self.take_readings()

    def flush(self, timeout_s: float) -> bool:
        """Every batch sent so far delivered or spooled by the sidecar, within `timeout_s`."""
        count = self.flushed
        return self._send({"flush": timeout_s}) and self.wait_for(lambda: self.flushed > count, timeout_s + 0.5)

    def close(self, timeout_s: float = 2.0) -> None:
        """EOF on its stdin: the sidecar spools what it still holds and exits."""
        self.alive = False
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class SidecarPipeline:
    """The shipper's pipeline when a sidecar runs: records are packed with marshal (about 0.2 us
    each, a fifth of converting them here) and written to the sidecar, which builds the
    columns, the book and the payloads with the same code (records.LocalPipeline) and
    delivers them. Its book comes back with every acknowledgement, kept as raw bytes and parsed
    only when needed (a stall check, `finish()`, a take-over).

    If the sidecar dies or freezes, `local` takes over: it starts from the sidecar's last book
    and processes every batch the book does not include again (same sequence numbers: the
    collector keeps one copy), so neither the summary nor the collector loses or doubles a step.
    """

    chunk = CHUNK  # taking and packing this many records holds the GIL for under 1 ms

    # Batches kept until the sidecar's book includes them. A sidecar stuck for minutes (a
    # collector that accepts connections and never answers) must not grow this process: past
    # the bound the oldest are left to the sidecar alone.
    MAX_UNACKED_BYTES = 64 * 1024 * 1024

    def __init__(self, link: SidecarLink, local: LocalPipeline) -> None:
        self.link = link
        self.local = local
        self.remote = True  # False once `local` took over
        self._parts: list[bytes] = []
        self._count = 0
        self._unacked: OrderedDict[int, tuple[dict, list[bytes], int]] = OrderedDict()
        self._unacked_bytes = 0
        self._let_go: dict[int, int] = {}  # seq -> records, past the bound and not yet acked
        self._book: tuple[bytes, RecordBook] | None = None
        self.lost_records = 0  # let go past MAX_UNACKED_BYTES, then the sidecar died: not in the summary

    def pending(self) -> int:
        return self._count if self.remote else self.local.pending()

    def add(self, records: list[tuple], names: list[str]) -> None:
        if self.remote:
            self._parts.append(marshal.dumps(records))
            self._count += count_steps(records)
        else:
            self.local.add(records, names)

    def send(self, header: dict, deadline: float | None = None) -> int:
        if not self.remote:
            return self.local.send(header, deadline)
        parts, count = self._parts, self._count
        self._parts, self._count = [], 0
        self._unacked[header["seq"]] = (header, parts, count)
        self._unacked_bytes += sum(map(len, parts))
        self._trim()
        if not self.link.send_batch(header, parts):
            self._take_over(deadline)
        return count

    def _trim(self) -> None:
        included = self.link.acked_seq
        while self._unacked and (next(iter(self._unacked)) <= included
                                 or self._unacked_bytes > self.MAX_UNACKED_BYTES):
            seq, (_, parts, count) = self._unacked.popitem(last=False)
            self._unacked_bytes -= sum(map(len, parts))
            if seq > included:
                self._let_go[seq] = count
        for seq in [seq for seq in self._let_go if seq <= included]:
            del self._let_go[seq]

    def _take_over(self, deadline: float | None = None) -> None:
        """The sidecar is gone: from its last book on, everything is done in this process."""
        if not self.remote:
            return
        self.link.close(0.5)
        self.remote = False
        book = self._sidecar_book()
        if book is not None:
            book.vectorized = self.local.current_book.vectorized
            self.local.current_book = book
        self._trim()
        self.lost_records += sum(self._let_go.values())  # neither in the book nor here
        self._let_go.clear()
        # What the sidecar settled stays settled; the spool's part is read from the spool. The
        # batches re-delivered from memory below leave the spool first (the sidecar may have
        # spooled them after its last report), so no record is in two places.
        spool = self.local.delivery.spool
        for seq in self._unacked:
            spool.remove_batch(seq)
        settled = self.link.account or empty_account()
        # Spooled records the sidecar reported that are gone now were delivered meanwhile (its
        # replay, or the collector's sweep of the spool directory).
        taken = max(0, settled["spooled"] - spool.records)
        self.local.inherited = add_accounts(
            {"acknowledged": settled["acknowledged"] + taken, "dropped": settled["dropped"]},
            {"dropped": {"sidecar_died": self.lost_records}})
        for header, parts, _ in self._unacked.values():
            self.local.send_packed(header, parts, deadline)
        self._unacked.clear()
        self._unacked_bytes = 0

    def _sidecar_book(self) -> RecordBook | None:
        raw = self.link.book_line
        if raw is None:
            return None
        if self._book is None or self._book[0] is not raw:
            self._book = (raw, RecordBook.from_dict(json.loads(raw)["book"]))
        return self._book[1]

    def book(self) -> RecordBook:
        if not self.remote:
            return self.local.book()
        self.link.poll()
        return self._sidecar_book() or RecordBook()

    def replay(self, deadline: float | None = None) -> bool:
        if self.remote and self.link.alive:
            self._trim()
            return True
        self._take_over(deadline)
        return self.local.replay(deadline)

    def flush(self, deadline: float) -> bool:
        if self.remote and self.link.alive and self.link.flush(max(0.0, deadline - time.monotonic())):
            self._trim()
            if not self._unacked:
                return True
        self._take_over(deadline)  # too slow or gone: what its book lacks is done here
        return self.local.replay(deadline)

    def dropped(self) -> dict:
        mine = self.local.dropped()
        out = {k: mine[k] + self.link.dropped.get(k, 0) for k in mine}
        if self.lost_records:
            out["sidecar_records"] = self.lost_records
        return out

    def account(self) -> dict:
        """Where the records went: the sidecar's account while it delivers (batches it has
        not acknowledged yet are in flight), this process's after a take-over."""
        if not self.remote:
            return self.local.account()
        self.link.poll()
        return self.link.account or empty_account()

    def reset_backoff(self) -> None:
        self.local.reset_backoff()
