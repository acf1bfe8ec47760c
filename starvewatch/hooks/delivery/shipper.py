"""The shipper: drains the step buffer, resolves CUDA events, and hands the records to the
pipeline (records.py, or the sidecar's through sidecar_link.py) in
sequence-numbered batches. Its cycle runs on the sampler thread while the sidecar delivers
(see `drive`), else on its own thread; never on the training thread."""
from __future__ import annotations

import logging
import sys
import threading
import time

from ...limits import MAX_STEP_RECORDS
from ...logonce import RateLimitedLog
from ...schema import EVENTS_SCHEMA
from ..cuda import PENDING
from ...record_layout import (ENDED_KEYS, READS_RECORD_LEN, R_GPU, STEP_RECORD_LENS, Segment, count_steps,
                              reads_steps, record_end, record_wait)
from ...stats import LoaderTotals
from .account import quiet_console
from .overlap import lane_of
from .records import RecordBook
from .transport import TransportError

HEARTBEAT_S = 2.0           # an idle process still says it is alive this often
GPU_PENDING_LIMIT_S = 30.0  # an event pair never completed by then yields no measurement
GPU_FINAL_WAIT_S = 1.5      # at finish(), how long queued GPU work may take to drain
DRIVEN_WAKE_S = 5.0         # while the sampler runs the cycles, this thread checks this often
# A fast-path segment longer than this (clock reads) is ended at its next batch and a new one
# started, so no list holds more than about one cycle of a loop's clock reads.
SEGMENT_ROTATE_READS = 8192
SEGMENT_TAKE_STEPS = 4096  # steps per reads record: the sidecar's batches stay small
CHUNK_TRIES = 3  # a chunk the pipeline refuses is retried in the next cycles, then counted lost
FINAL_TRIES = CHUNK_TRIES + 1  # final cycles before giving up: enough to count such a chunk

_errors = RateLimitedLog(logging.getLogger("starvewatch.hooks"))


def _records_within(records: list[tuple], steps: int) -> int:
    """How many records from the front hold at most `steps` steps (at least one record)."""
    total = 0
    for i, record in enumerate(records):
        total += reads_steps(record) if len(record) == READS_RECORD_LEN else 1
        if total > steps:
            return max(1, i)
    return len(records)


class Shipper(threading.Thread):
    def __init__(self, session, pipeline) -> None:
        super().__init__(name="starvewatch-shipper", daemon=True)
        self.session = session
        self.pipeline = pipeline  # records.LocalPipeline, or sidecar_link.SidecarPipeline
        self._wake = threading.Event()
        self._cycle_lock = threading.Lock()
        self._stop_requested = threading.Event()
        self._done = threading.Event()
        self._seq = 0
        self._last_sent = 0.0
        self.last_cycle_at = time.monotonic()
        self.driven_at = 0.0  # the last cycle the sampler thread ran
        self._meta_sent = False
        self._pending_gpu: list[tuple[float, tuple]] = []
        # Fast-path segments still running or not all taken, and records closed after a
        # cycle's horizon, in buffer order: the next cycle takes them first.
        self._carried: list = []
        self._multi_lanes: set = set()  # threads with steps of several loaders (or epochs) last cycle
        self.shipped_records = 0
        self.lost_steps: dict[int, int] = {}  # loader index -> steps of chunks dropped here (see _add)
        self._add_failures = 0  # the chunk at the front failed this many times in a row
        self._chunks_done = 0  # (progress(): finish() waits for a final cycle that gets on)
        self.errors: list[str] = []
        quiet_console(session.settings.quiet)

    # ---- thread ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.session.on_shipper_start(self)
        except Exception as exc:  # set-up problems (collector start) never stop the monitor
            self._note_error(f"start-up: {exc}")
        interval = self.session.settings.ship_interval_s
        while not self._stop_requested.is_set():
            # Usually the sampler thread runs the cycles (see drive()); this thread then wakes
            # only rarely, to take over if the sampler stopped driving, and for the final flush.
            driven = time.monotonic() - self.driven_at < 2 * interval
            woken = self._wake.wait(DRIVEN_WAKE_S if driven else interval)  # set: cycle now
            self._wake.clear()
            if self._stop_requested.is_set():
                break
            if woken or time.monotonic() - self.last_cycle_at >= 0.9 * interval:
                self._locked_cycle(blocking=True)
        try:
            self._final_cycles(lambda: self._locked_cycle(blocking=True, final=True))
        finally:
            self._done.set()

    def _final_cycles(self, cycle) -> None:
        """The final cycle, again while one that failed left records to ship (a chunk the
        pipeline refused goes back to the front; the third refusal counts it lost): a
        failure must not lose what the flush had not handed on yet."""
        for _ in range(FINAL_TRIES):
            try:
                cycle()
                return
            except Exception as exc:
                self._note_error(f"final flush: {exc!r}")
                if not (self._carried or self.session.buffer or self._pending_gpu):
                    return

    def drive(self) -> None:
        """From the sampler thread, right after its tick: run the cycle there when one is
        (nearly) due. One thread taking the GIL from the training loop twice a second costs
        it half the hand-offs of two threads doing so. Only while the sidecar delivers: an
        in-process delivery may block on the network, and sampling must not wait for it."""
        if not self.pipeline.remote:
            return
        if time.monotonic() - self.last_cycle_at >= 0.9 * self.session.settings.ship_interval_s:
            self.driven_at = time.monotonic()
            self._locked_cycle(blocking=False)

    def _locked_cycle(self, blocking: bool, final: bool = False) -> None:
        if not self._cycle_lock.acquire(blocking=blocking):
            return  # the other thread is cycling
        try:
            self.last_cycle_at = time.monotonic()
            self.cycle(final=final)
        except Exception as exc:
            if final:
                raise
            self._note_error(f"cycle: {exc!r}")
        finally:
            self._cycle_lock.release()

    def ship_now(self) -> None:
        """A cycle now, on this thread, without waiting for it: finish() starts the records on
        their way while the samplers take their final readings."""
        self._wake.set()

    def stop(self, timeout_s: float) -> bool:
        """Ask for the final flush and wait at most `timeout_s`; True when it completed."""
        self._stop_requested.set()
        self._wake.set()
        if not self.is_alive() and not self._done.is_set():
            # Never started (or died): flush on the caller's thread.
            try:
                self._final_cycles(lambda: self.cycle(final=True))
            finally:
                self._done.set()
        return self._done.wait(timeout_s)

    def wait(self, timeout_s: float) -> bool:
        """Wait for the final flush requested by `stop`; True when it completed."""
        return self._done.wait(timeout_s)

    def _note_error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)
        # One console line per kind of failure ("cycle: OSError(...)" and "final flush: OSError(...)"
        # are one kind), then at most one per 5 minutes.
        _errors.error(text.split(": ", 1)[-1].split("(")[0], "starvewatch: shipping records failed: %s", text)

    # ---- one cycle ------------------------------------------------------------------------
    def _take(self, n: int, final: bool = False) -> tuple[list[tuple], list[tuple]]:
        """The oldest `n` items of the buffer, all at once: two C-level calls (~2 ns an item
        against ~35 for popping one by one), each atomic under the GIL; the training thread
        only appends at the end meanwhile, so the front stays what was sliced. Then the
        records: fast-path segments as reads records (record_layout.py), in order with each
        loader's other records. Returns (marks, records).

        Only the steps closed by the cycle's horizon (a clock read before anything else) are
        taken; the rest waits for the next cycle, in order. The marks give the horizon and the
        waits that ended by then in steps not taken (in progress, or closed after it), so
        every wait of a thread that ended before a shipped step closed is shipped with it or
        before: delivery subtracts them from the compute of the other loaders of that thread
        (overlap.py). The final cycle takes everything."""
        buffer = self.session.buffer
        before_horizon = len(buffer)  # appended before the horizon: closed before it
        horizon = None if final else time.perf_counter_ns()
        multi = self._multi_lanes = self._lanes_of_several(horizon is not None)  # read after it
        marks = [(horizon,)] if horizon is not None else []
        marks += [wait + ("open",) for wait in self._open_waits(multi)]
        items = buffer[:n]
        del buffer[:len(items)]
        carried, self._carried = self._carried, []
        if not carried and not any(type(item) is Segment for item in items):
            if horizon is None or all(record_end(item) <= horizon for item in items[before_horizon:]):
                return marks, items
        records: list[tuple] = []
        checked = len(carried) + (before_horizon if horizon is not None else len(items))
        for position, item in enumerate(carried + items):  # carried ones first: older than anything taken now
            if type(item) is not Segment:
                if position >= checked and horizon is not None and record_end(item) > horizon:
                    self._carried.append(item)  # closed after the horizon: next cycle
                    if lane_of(item[0]) in multi:
                        marks.append(record_wait(item) + ("open",))
                else:
                    records.append(item)
                continue
            final_segment = item.final  # read before the length: a final segment gets no more reads
            while True:
                chunk = item.take(SEGMENT_TAKE_STEPS, horizon)  # one slice of its reads (C-level)
                records += chunk
                if not chunk or reads_steps(chunk[0]) < SEGMENT_TAKE_STEPS:
                    break
            if multi and lane_of(item.key) in multi:
                wait = item.wait_before(horizon)
                if wait is not None:
                    marks.append(wait + ("open",))
            if not final_segment or not item.done():
                self._carried.append(item)
                if not final_segment and len(item.times) > SEGMENT_ROTATE_READS:
                    owner = item.owner()
                    if owner is not None:
                        owner.rotate(item)
            else:
                self._forget(item)
        return marks, records

    def _forget(self, segment) -> None:
        """A segment taken whole no longer counts against the fast path's room, nor keeps its
        reads in memory (the training thread drops taken ones too, at a segment's start)."""
        try:
            self.session.segments.remove(segment)
        except (ValueError, AttributeError):  # removed there first (or a session without the list)
            pass

    def _lanes_of_several(self, cycle: bool) -> set:
        """The threads where several loaders (or epochs) have steps: those of the live
        iterators and of the epochs ended since the last cycle. Waits are marked only there:
        elsewhere no other loader's step can hold them."""
        ended = ENDED_KEYS[:]
        del ENDED_KEYS[:len(ended)]
        if not cycle:
            return set()
        lanes: dict = {}
        for key in ended + [it._key for it in self._live()]:
            lanes.setdefault(lane_of(key), set()).add(key)
        return {lane for lane, keys in lanes.items() if len(keys) > 1}

    def _live(self) -> list:
        return [it for it in map(lambda ref: ref(), list(self.session.live_iterators.data)) if it is not None]

    def _open_waits(self, multi: set) -> list[tuple]:
        """The waits of the steps in progress on those threads whose batch has come back. The
        iterators are held only in here: one held past its loop's end would keep its last step
        open longer."""
        if not multi:
            return []
        waits = [it.open_wait() for it in self._live() if lane_of(it._key) in multi]
        return [wait for wait in waits if wait is not None]

    def _resolve_gpu(self, records: list[tuple], final: bool) -> list[tuple]:
        """Replace event tokens by GPU idle ns. A record whose events are still pending is held
        back, and so is every later record of the same loader, even one without events: the
        collector and the summary see each loader's steps in order."""
        timer = self.session.gpu_timer_if_any()
        now = time.monotonic()
        queue = self._pending_gpu + [(now, r) for r in records]  # held ones are the older
        self._pending_gpu = []
        ready: list[tuple] = []
        blocked: set[int] = set()  # loaders with an earlier record still pending
        give_up_at = now + GPU_FINAL_WAIT_S if final else None
        for first_seen, rec in queue:
            loader = rec[0][0]
            if loader in blocked:
                self._pending_gpu.append((first_seen, rec))
                continue
            token = rec[R_GPU] if len(rec) > R_GPU else None
            if token is None or isinstance(token, int):  # no events, or resolved while held
                ready.append(rec)
                continue
            while True:
                try:
                    result = timer.resolve(token) if timer is not None else None
                except Exception:  # no measurement for this step, as for a failed event (cuda.py)
                    result = None
                if result is not PENDING:
                    ready.append(rec[:R_GPU] + (result,) + rec[R_GPU + 1:])
                    break
                if final and time.monotonic() < give_up_at:
                    time.sleep(0.001)
                    continue
                if final or now - first_seen > GPU_PENDING_LIMIT_S:
                    ready.append(rec[:R_GPU] + (None,) + rec[R_GPU + 1:])
                else:
                    blocked.add(loader)
                    self._pending_gpu.append((first_seen, rec))
                break
        return ready

    def cycle(self, final: bool = False) -> None:
        """Ship what the buffer held when the cycle began, in chunks with the GIL handed back
        between them: C-level work over a big backlog would otherwise hold it for tens of
        milliseconds. Only that much: a loop that appends faster than chunks are taken must
        not keep one cycle from ever ending."""
        session = self.session
        pipeline = self.pipeline
        limit = min(session.settings.max_batch_records, MAX_STEP_RECORDS)  # limits.py: the collector's
        deadline = time.monotonic() + session.settings.flush_timeout_s if final else None
        extra = session.drain_events()
        marks, backlog = self._take(len(session.buffer), final)
        left, start = len(backlog), 0
        sent = False
        chunk: list[tuple] = []  # taken from the backlog, not yet handed to the pipeline
        try:
            while True:
                n = min(pipeline.chunk, left)
                records = backlog[start:start + n]
                # A batch holds at most `limit` steps: a chunk of reads records can hold
                # millions (SEGMENT_TAKE_STEPS each), so it is cut by steps, not by records.
                n = len(records) if pipeline.pending() + len(records) <= limit and \
                    count_steps(records) <= limit - pipeline.pending() else \
                    _records_within(records, limit - pipeline.pending())
                records = chunk = records[:n]
                left -= n
                start += n
                if self._pending_gpu or (records and session.gpu_timer_if_any() is not None):
                    records = chunk = self._resolve_gpu(records, final and left <= 0)
                    # held back for their GPU events: their waits go now (overlap.py)
                    marks += [record_wait(held) + ("open",) for _, held in self._pending_gpu
                              if lane_of(held[0]) in self._multi_lanes]
                if marks:  # with the cycle's first chunk (not re-queued with it: the cycle's own)
                    records, marks = marks + records, []
                if records:
                    self._add(records, [state.name for state in session.loader_list])
                chunk = []
                self._chunks_done += 1
                if pipeline.pending() and (pipeline.pending() >= limit or left <= 0):
                    self._send(extra, final and left <= 0, deadline)
                    extra, sent = {}, True
                if left <= 0:
                    break
                time.sleep(0)  # the training thread runs between chunks
        except BaseException:
            # The chunk that failed and those after it go first into the next cycle, before
            # the carried segments' later reads (each loader's steps stay in order). Its
            # position had advanced already: it used to be neither delivered, spooled nor
            # counted (issue 33).
            self._carried[0:0] = chunk + backlog[start:]
            raise
        heartbeat_due = time.monotonic() - self._last_sent >= HEARTBEAT_S
        if not sent and (extra or final or not self._meta_sent or heartbeat_due):
            self._send(extra, final, deadline)
        try:
            if final:
                pipeline.flush(deadline)
                if not session.active:
                    # One more batch without records: the run's final delivery account (the
                    # last batch carried the account as it stood before its own delivery), so
                    # the collector shows what was dropped up to the end.
                    self._send({}, True, deadline)
            else:
                pipeline.replay()
        except TransportError as exc:
            self._note_error(str(exc))

    def _add(self, records: list[tuple], names: list[str]) -> None:
        """pipeline.add(); a chunk it refused CHUNK_TRIES times (never seen; a record shape
        nobody foresaw) is dropped and counted under `shipper_error`, with its steps in the
        loader's totals, rather than retried forever or lost without a count."""
        try:
            self.pipeline.add(records, names)
        except Exception:
            self._add_failures += 1
            if self._add_failures < CHUNK_TRIES:
                raise
            self._add_failures = 0
            for record in records:
                steps = reads_steps(record) if len(record) == READS_RECORD_LEN else \
                    1 if len(record) in STEP_RECORD_LENS else 0
                if steps:
                    self.lost_steps[record[0][0]] = self.lost_steps.get(record[0][0], 0) + steps
            self._note_error(f"cycle: a chunk refused {CHUNK_TRIES} times was dropped: {sys.exc_info()[1]!r}")
            return
        self._add_failures = 0

    def counted(self, state) -> "LoaderTotals":
        """A loader's totals as the hot path counted them, plus its steps dropped here."""
        lost = self.lost_steps.get(state.index, 0)
        if not lost:
            return state.totals
        totals = LoaderTotals.from_dict(state.totals.to_dict())
        totals.steps += lost
        return totals

    def lost_account(self) -> dict:
        """The steps dropped here, as a delivery account (account.py)."""
        lost = sum(self.lost_steps.values())
        return {"dropped": {"shipper_error": lost}} if lost else {}

    def progress(self) -> tuple:
        """Changes while the shipper gets on with its work (records handed on, batches built),
        here or in the pipeline's own process-local work (a take-over from the sidecar)."""
        local = getattr(self.pipeline, "local", self.pipeline)
        return self._chunks_done, self._seq, getattr(local, "chunks_added", 0)

    def _send(self, extra: dict, final: bool, deadline: float | None) -> None:
        self.shipped_records += self.pipeline.send(self._header(extra, final), deadline)
        self._last_sent = time.monotonic()

    def book(self) -> RecordBook:
        """Totals and statistics of every record shipped so far."""
        return self.pipeline.book()

    def _header(self, extra: dict, final: bool) -> dict:
        """Everything in a batch but the steps; the pipeline adds those and the book's totals."""
        session = self.session
        self._seq += 1
        header = {
            "schema": EVENTS_SCHEMA,
            "run_id": session.run_id,
            "rank": session.rank,
            "stream": session.stream_id,
            "seq": self._seq,
            "sent_at_ns": time.time_ns(),
            "status": "finished" if final and not session.active else "live",
            "loaders": [state.describe(self.counted(state)) for state in session.loader_list],
            "drops": {**self.pipeline.dropped(), "events": session.dropped_events},
            **extra,
        }
        if not self._meta_sent or final:
            header["run"] = session.metadata()
            self._meta_sent = True
        return header
