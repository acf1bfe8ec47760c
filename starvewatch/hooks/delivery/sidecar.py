"""The sidecar process: for one training process, samples the host, its DataLoader workers and
the GPUs (psutil and NVML work across processes), and delivers its event batches (gzip, HTTP,
the spool, replay, finding or starting the collector), building the batches from the raw step
records first (records.py: the columns, exact totals and statistics).

Why a process: every /proc read, NVML call, socket or file operation releases the GIL, and
each time a monitor thread takes it back the training thread waits (benchmarks/overhead.py
measures the effect on p99 step time). With the sidecar, the training process's threads do one
pipe read and one pipe write per tick. The training side is sidecar_link.py.

Protocol, one JSON object per line both ways (plus the bytes a batch line announces):
  training -> sidecar (stdin): first line the settings; then batches ({"batch": header,
      "parts": [byte sizes]}, followed by that many bytes of marshalled step records per part),
      {"pids": [worker pids]}, {"sample": true} (a reading now), {"flush": timeout_s};
      EOF: spool what is left and exit.
  sidecar -> training (stdout): {"kind": "host" | "gpu" | "processes" | "sampled"} readings,
      per batch delivered or spooled {"kind": "book", "book"} (totals and statistics of every
      record so far) then {"kind": "acked", "seq"}, {"kind": "flushed"},
      {"kind": "collector", "found"}.
Run as `python -m starvewatch.hooks.delivery.sidecar`; nothing here is imported by the hot path.
"""
from __future__ import annotations

import json
import logging
import marshal
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path

from ...logonce import RateLimitedLog
from .account import Warnings
from .collector_link import find_collector
from ...record_layout import count_steps
from .records import LocalPipeline
from ..samplers import HostSampler, _psutil, gpu_reading
from .transport import Delivery, HttpTransport, Spool, TransportError

log = logging.getLogger("starvewatch.sidecar")
_errors = RateLimitedLog(log)


class ToTrainingProcess(logging.Handler):
    """The sidecar has no console (its stderr goes nowhere): its warnings travel up the pipe,
    and the training process prints each as one line. Rate-limited where they are made."""

    def __init__(self, sidecar) -> None:
        super().__init__(logging.WARNING)
        self.sidecar = sidecar

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sidecar.send({"kind": "log", "message": self.format(record)})
        except Exception:  # logging's own convention: a handler never raises
            self.handleError(record)

EOF_FLUSH_S = 5.0  # after EOF, batches still queued are sent for this long, then spooled
BUILD_WAIT_S = 0.25  # at most this long a build waits for the delivery thread's request to go out


class Sidecar:
    def __init__(self, settings: dict, out) -> None:
        self.out = out
        self.parent_pid = int(settings["pid"])
        self.host_every = float(settings.get("host_interval_s", 0.5))
        self.gpu_every = float(settings.get("gpu_interval_s", 1.0))
        # USS/PSS read smaps: a few ms per worker, so at most every 5 s by default.
        self.memory_every = float(settings.get("worker_memory_interval_s", 5.0))
        psutil = _psutil()
        self.host = HostSampler(psutil, pid=self.parent_pid) if psutil is not None else None
        self.pids: list[int] = []
        self.halt = threading.Event()
        self.sample_now = threading.Event()
        self.gpu_enabled = True
        self._write_lock = threading.Lock()
        self.batches: queue.Queue = queue.Queue()
        self.built: queue.Queue = queue.Queue(maxsize=1)  # to the delivery thread (deliver_forever)
        # Clear from the delivery thread's taking a batch until its request is written (or the
        # batch settled otherwise): its turn for the GIL, which a build would hold meanwhile.
        # Each of its socket and pipe calls gave the GIL up and waited up to the switch
        # interval (5 ms) to get it back: from one batch's answer to the next one's request
        # the collector waited 20-50 ms, against 3-5 ms once nothing was left to build
        # (traced on end_to_end.py, issue 41).
        self.may_build = threading.Event()
        self.may_build.set()
        self.flush_deadline: float | None = None
        self.delivery = self.transport = self.pipeline = None
        self.delivery_settings = settings.get("delivery")
        if self.delivery_settings:
            d = self.delivery_settings
            self.transport = HttpTransport(d["url"], d.get("token")) if d.get("url") else None
            # Its console lines reach the training console: the sidecar's stderr is inherited.
            self.delivery = Delivery(self.transport, Spool(Path(d["spool_dir"]), int(d["spool_max_bytes"])),
                                     warnings=Warnings(quiet=bool(settings.get("quiet"))))
            self.pipeline = LocalPipeline(self.delivery, int(settings["wall_offset_ns"]), vectorized=True)
            if self.transport is not None:
                self.transport.request_sent = self.may_build

    def send(self, message: dict) -> None:
        line = json.dumps(message, separators=(",", ":")) + "\n"
        try:
            with self._write_lock:
                self.out.write(line)
                self.out.flush()
        except (OSError, ValueError):  # the training process is gone
            self.halt.set()

    # ---- commands --------------------------------------------------------------------------
    def read_commands(self, stream) -> None:
        for line in stream:
            try:
                command = json.loads(line)
            except ValueError:
                continue
            if "batch" in command:
                sizes = [int(n) for n in command["parts"]]
                parts = [stream.read(n) for n in sizes]
                if list(map(len, parts)) != sizes:
                    break  # cut off by EOF: the training process died mid-write
                self.batches.put(("batch", (command["batch"], parts)))
                continue
            if "stack" in command:  # a hung worker's stack: signal it, read its file
                threading.Thread(target=self.send_stack, args=(command["stack"],), daemon=True).start()
            if "pids" in command:
                self.pids = [int(p) for p in command["pids"]]
            if command.get("sample"):
                self.sample_now.set()
            if "flush" in command:
                # Applies at once to batches already queued: after it, they go to the spool.
                self.flush_deadline = time.monotonic() + float(command["flush"])
                self.batches.put(("flush", None))
        self.flush_deadline = min(self.flush_deadline or float("inf"), time.monotonic() + EOF_FLUSH_S)
        self.batches.put(("eof", None))  # EOF: the training process closed the pipe or died
        self.halt.set()

    # ---- delivery ----------------------------------------------------------------------------
    def deliver_forever(self) -> None:
        if self.delivery is None:
            while self.batches.get()[0] != "eof":
                pass
            return
        # Two stages: this thread builds each batch (columns, the book, its JSON and gzip but
        # for the account: records.encode_ahead) while the delivery thread sends the one
        # before (HTTP, the collector's ingest): a batch the collector takes in ~30 ms is not
        # held up by ~20 ms of building and encoding before it. One batch
        # waits built at most; deliveries, replays and flushes stay in order on their thread,
        # which first finds the collector (the first batch is built meanwhile).
        deliveries = threading.Thread(target=self._deliver_built, daemon=True, name="starvewatch-sidecar-delivery")
        deliveries.start()
        while True:
            try:
                kind, body = self.batches.get(timeout=1.0)
            except queue.Empty:
                if self.built.empty():
                    self.built.put(("replay", None))  # idle: catch up on the spool
                continue
            if kind == "batch":
                header, parts = body
                # Built while the delivery thread waits on the collector, not while it sends.
                self.may_build.wait(BUILD_WAIT_S)
                failed = None
                try:
                    self.pipeline.add_packed(header, parts)
                    payload = self.pipeline.build(header)
                    ahead = self.pipeline.encode_ahead(payload)
                except Exception as exc:  # never fatal, never silent: counted by the delivery thread
                    payload, ahead, failed = None, None, (sum(count_steps(marshal.loads(part)) for part in parts), exc)
                # The book as of this batch: the training process takes it over with the
                # acknowledgement, and re-sends only the batches after it.
                self.built.put(("batch", (header, payload, ahead, failed, self.pipeline.book().to_dict())))
            elif kind == "flush":
                self.built.put(("flush", None))
            else:
                self.built.put(("eof", None))
                deliveries.join()
                return

    def _find_collector(self) -> None:
        d = self.delivery_settings
        try:
            found = find_collector(d["url"], Path(d["dir"]), self.transport, autostart=d["autostart"],
                                   local_rank=int(d.get("local_rank") or 0))
        except Exception as exc:  # this thread must go on: the builder waits on it
            _errors.error(f"find:{type(exc).__name__}", "starvewatch: finding the collector failed: %r", exc)
            found = "none"
        if found == "starvewatch":
            self.delivery.reset_backoff()
        elif found == "other":
            self.delivery.spool_only()
        self.send({"kind": "collector", "found": found})

    def _deliver_built(self) -> None:
        """The delivery thread: finds the collector, then delivers built batches, spool replays
        and flushes, in order."""
        if self.transport is not None:
            self._find_collector()
        while True:
            kind, body = self.built.get()
            if kind == "batch":
                self.may_build.clear()
            try:
                if kind == "batch":
                    header, payload, ahead, failed, book = body
                    if failed is not None:
                        self._lost(*failed)
                    if payload is not None:
                        try:
                            self.pipeline.deliver_built(payload, header, self.flush_deadline, ahead)
                        except Exception as exc:  # never fatal, never silent: the records are counted
                            self._lost(len(payload["steps"]["step"]), exc)
                    # The book and the account first: the training process takes them over
                    # with the acknowledgement (both include this batch).
                    self.send({"kind": "book", "book": book})
                    self.send({"kind": "acked", "seq": header["seq"], "dropped": self.delivery.dropped(),
                               "account": self.pipeline.account()})
                elif kind == "replay":
                    self._replay(None)
                elif kind == "flush":
                    self._replay(self.flush_deadline, final=True)
                    self.send({"kind": "flushed", "dropped": self.delivery.dropped(),
                               "account": self.pipeline.account()})
                    self.flush_deadline = None
                else:
                    return
            except Exception as exc:  # the thread goes on: the builder waits on it
                _errors.error(f"delivery:{type(exc).__name__}", "starvewatch: sidecar delivery failed: %r", exc)
            finally:
                self.may_build.set()

    def _lost(self, records: int, exc: Exception) -> None:
        """Records the sidecar could not deliver, counted (on the delivery thread: the only
        one that changes the account)."""
        self.delivery._drop("sidecar_error", records)
        self.delivery.warnings.once("sidecar_error", f"the sidecar could not deliver {records} step "
                                                     f"records ({exc!r}); counted as dropped")

    def _replay(self, deadline: float | None, final: bool = False) -> None:
        before = self.delivery.acknowledged
        try:
            if final:
                self.delivery.flush(deadline)
            else:
                self.delivery.replay(deadline)
        except (OSError, TransportError) as exc:
            _errors.error(f"replay:{type(exc).__name__}", "starvewatch: replaying the spool failed: %s", exc)
        if self.delivery.acknowledged != before:  # spooled records reached the collector
            self.send({"kind": "account", "account": self.pipeline.account()})

    # ---- sampling ----------------------------------------------------------------------------
    def tick_host(self) -> None:
        if self.host is None:
            return
        self.send(self.host.sample())
        states = {str(pid): self.host.process_state(pid) for pid in self.pids}
        self.send({"kind": "processes", "t_ns": time.time_ns(), "states": states})

    def send_stack(self, request: dict) -> None:
        from ..stacks import request as request_stack
        text = request_stack(int(request["pid"]), int(request["signal"]), str(request["path"]),
                             parent_pid=self.parent_pid)
        self.send({"kind": "stack", "loader": request.get("loader"),
                   "started_ns": request.get("started_ns"), "text": text})

    def tick_memory(self) -> None:
        """USS (memory only this worker holds) and PSS per DataLoader worker: RSS counts the
        pages shared with the parent after fork, and so hides copy-on-read growth."""
        if self.host is None or not self.pids:
            return
        ps = self.host.ps
        out = {}
        for pid in self.pids:
            try:
                proc = ps.Process(pid)
                if proc.ppid() != self.parent_pid:
                    continue
                info = proc.memory_full_info()
            except (ps.Error, OSError):
                continue
            if not info.uss:  # exiting (its memory already given back): not a reading
                continue
            out[str(pid)] = {"uss_bytes": info.uss, "pss_bytes": getattr(info, "pss", None),
                             "mem_t_ns": time.time_ns()}
        if out:
            self.send({"kind": "worker_memory", "t_ns": time.time_ns(), "workers": out})

    def tick_gpu(self) -> None:
        self.gpu_enabled, reading = gpu_reading(self.parent_pid)
        if reading is not None:
            self.send(reading)

    def sample_forever(self) -> None:
        next_host = next_gpu = next_memory = time.monotonic()
        while not self.halt.is_set():
            if os.getppid() != self.parent_pid:  # the training process died (we were re-parented)
                break
            now = time.monotonic()
            if now >= next_host:
                self.tick_host()
                next_host += self.host_every * max(1, int((now - next_host) // self.host_every) + 1)
            if self.gpu_enabled and now >= next_gpu:
                self.tick_gpu()
                next_gpu += self.gpu_every * max(1, int((now - next_gpu) // self.gpu_every) + 1)
            if now >= next_memory:
                self.tick_memory()
                next_memory = time.monotonic() + self.memory_every
            if self.sample_now.is_set():  # the last reading at finish(): short runs get data too
                self.sample_now.clear()
                self.tick_host()
                if self.gpu_enabled:
                    self.tick_gpu()
                self.send({"kind": "sampled"})
            wake = min(next_host, next_gpu) if self.gpu_enabled else next_host
            self.sample_now.wait(max(0.0, wake - time.monotonic()))


def main() -> int:
    # Ctrl-C in the terminal reaches the whole process group: the sidecar ends when the
    # training process closes the pipe (or dies), after spooling what it holds.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Below the training process in CPU priority: when the cores are busy, the kernel runs the
    # training process's threads first (a monitor thread that waits for a core holds up the
    # training thread at the next GIL hand-off). nice 10 still leaves it ~10% of a busy core,
    # ample for its ~1%.
    # The training process lowered this one at spawn (sidecar_link.lower_priority); if that
    # failed, do it now.
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) < min(19, os.getpriority(os.PRIO_PROCESS, os.getppid()) + 10):
            os.nice(10)
    except OSError:
        pass
    stdin = sys.stdin.buffer
    sidecar = Sidecar(json.loads(stdin.readline()), sys.stdout)
    root = logging.getLogger("starvewatch")
    root.addHandler(ToTrainingProcess(sidecar))
    root.propagate = False
    threading.Thread(target=sidecar.read_commands, args=(stdin,), daemon=True).start()
    sampler = threading.Thread(target=sidecar.sample_forever, daemon=True)
    sampler.start()
    sidecar.deliver_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
