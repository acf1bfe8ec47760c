"""The training process's end of the sidecar (hooks/sidecar.py).

Per tick the sampler thread does one non-blocking pipe read and the shipper thread one pipe
write; everything else (psutil, NVML, gzip, HTTP, the spool) happens in the sidecar. A sidecar
that never starts or dies leaves `alive` False: sampling and delivery then go on in this
process, and batches the sidecar never acknowledged are delivered again (the collector
deduplicates by sequence number, so nothing is lost or doubled).
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict

from .transport import Delivery, dumps


class SidecarLink:
    WRITE_TIMEOUT_S = 5.0

    def __init__(self, proc) -> None:
        self.proc = proc
        self._fd = proc.stdout.fileno()
        self._in_fd = proc.stdin.fileno()
        os.set_blocking(self._fd, False)
        os.set_blocking(self._in_fd, False)
        self._partial = b""
        self._lock = threading.Lock()   # the sampler and the shipper thread both read
        self._write_lock = threading.Lock()
        self._pids: list[int] | None = None
        self.alive = True
        self.readings: list[dict] = []  # host/gpu/processes messages, taken by the sampler
        self.acked_seq = 0
        self.flushed = 0
        self.dropped = {"spool_payloads": 0, "spool_records": 0}
        self.collector: str | None = None  # what the sidecar found at the collector's URL

    @classmethod
    def start(cls, session) -> "SidecarLink | None":
        settings = session.settings
        delivers = session.transport is None or session.delivers_over_http
        config = {"pid": os.getpid(), "host_interval_s": settings.host_interval_s,
                  "gpu_interval_s": settings.gpu_interval_s,
                  "delivery": None if not delivers else {
                      "url": settings.url, "token": settings.token, "dir": str(settings.dir),
                      "spool_dir": str(session.spool_dir), "spool_max_bytes": settings.spool_max_bytes,
                      "autostart": settings.autostart, "local_rank": session.local_rank}}
        # The package as this process imported it, even when a script put it on sys.path.
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        try:
            proc = subprocess.Popen([sys.executable, "-m", "starvewatch.hooks.sidecar"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                    stderr=subprocess.DEVNULL, close_fds=True)
        except (OSError, ValueError):
            return None
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
                    data = os.read(self._fd, 1 << 20)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:  # EOF: the sidecar exited
                    self.alive = False
                    self.proc.poll()
                    break
                chunks.append(data)
                if len(data) < 1 << 20:
                    break
            if not chunks:
                return
            *lines, self._partial = (self._partial + b"".join(chunks)).split(b"\n")
            for line in lines:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                kind = message.get("kind")
                if kind == "acked":
                    self.acked_seq = max(self.acked_seq, message["seq"])
                    self.dropped = message.get("dropped", self.dropped)
                elif kind == "flushed":
                    self.flushed += 1
                    self.dropped = message.get("dropped", self.dropped)
                elif kind == "collector":
                    self.collector = message.get("found")
                elif kind in ("host", "gpu", "processes", "sampled"):
                    self.readings.append(message)

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
        return self.send_line(json.dumps(message).encode())

    def send_line(self, line: bytes) -> bool:
        """Write one line; a sidecar that takes none of it for WRITE_TIMEOUT_S (stopped, frozen)
        is killed and counted as gone, so a monitor thread never hangs on the pipe."""
        if not self.alive:
            return False
        data = memoryview(line + b"\n")
        deadline = time.monotonic() + self.WRITE_TIMEOUT_S
        try:
            with self._write_lock:
                while data:
                    try:
                        data = data[os.write(self._in_fd, data):]
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


class SidecarDelivery:
    """Delivery through the sidecar, with the in-process Delivery as the fallback."""

    # Batches kept for re-delivery until acknowledged. A sidecar stuck for minutes (a collector
    # that accepts connections and never answers) must not grow this process: past the bound
    # the oldest are left to the sidecar alone.
    MAX_UNACKED_BYTES = 64 * 1024 * 1024

    def __init__(self, link: SidecarLink, fallback: Delivery) -> None:
        self.link = link
        self.fallback = fallback
        self._unacked: OrderedDict[int, tuple[dict, bytes]] = OrderedDict()
        self._unacked_bytes = 0

    def _acknowledged(self) -> None:
        acked = self.link.acked_seq
        while self._unacked and (next(iter(self._unacked)) <= acked
                                 or self._unacked_bytes > self.MAX_UNACKED_BYTES):
            _, (_, body) = self._unacked.popitem(last=False)
            self._unacked_bytes -= len(body)

    def _take_over(self, deadline: float | None = None) -> None:
        """The sidecar is gone: deliver what it never acknowledged from here."""
        self._acknowledged()
        while self._unacked:
            _, (stub, body) = self._unacked.popitem(last=False)
            self._unacked_bytes -= len(body)
            self.fallback.deliver(stub, body, deadline)

    def deliver(self, payload: dict, body: bytes | None = None, deadline: float | None = None) -> None:
        body = body if body is not None else dumps(payload)
        if self.link.alive:
            # What re-delivery needs besides the body: the sequence number and the record count.
            stub = {"seq": payload["seq"], "steps": {"step": range(len(payload["steps"]["step"]))}}
            self._unacked[payload["seq"]] = (stub, body)
            self._unacked_bytes += len(body)
            self._acknowledged()
            if self.link.send_line(body):
                return
        self._take_over(deadline)
        self.fallback.deliver(payload, body, deadline)

    def replay(self, deadline: float | None = None) -> bool:
        if self.link.alive:
            self._acknowledged()
            return True
        self._take_over(deadline)
        return self.fallback.replay(deadline)

    def flush(self, deadline: float) -> bool:
        if self.link.alive and self.link.flush(max(0.0, deadline - time.monotonic())):
            self._acknowledged()
            if not self._unacked:
                return True
        self.link.close(0.5)  # too slow or gone: what it did not acknowledge goes out from here
        self._take_over(deadline)
        return self.fallback.replay(deadline)

    def dropped(self) -> dict:
        mine = self.fallback.dropped()
        return {k: mine[k] + self.link.dropped.get(k, 0) for k in mine}

    def reset_backoff(self) -> None:
        self.fallback.reset_backoff()
