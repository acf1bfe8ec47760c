"""The shipper thread: drains the step buffer, resolves CUDA events, builds exact aggregates
for `finish()`, and delivers sequence-numbered batches. Never touches the training thread."""
from __future__ import annotations

import itertools
import threading
import time
from operator import itemgetter, sub

from ..schema import EVENTS_SCHEMA, STEP_COLUMNS
from ..stats import LoaderTotals, RecordStats
from .cuda import PENDING
from .loader import FULL_RECORD_LEN, R_COMPUTE, R_GPU, R_OTHER, R_PHASES, R_WAIT
from .transport import Delivery, TransportError

CHUNK = 2048                # records processed per GIL hold (a few ms at most)
HEARTBEAT_S = 2.0           # an idle process still says it is alive this often
GPU_PENDING_LIMIT_S = 30.0  # an event pair never completed by then yields no measurement
GPU_FINAL_WAIT_S = 1.5      # at finish(), how long queued GPU work may take to drain


def _concat(batch: dict, more: dict) -> dict:
    for name, values in more.items():
        batch[name].extend(values)
    return batch


def _positions(values: list, value) -> list[int]:
    """Indexes of `value` in `values`: C-level scans, one Python step per match (few)."""
    out, i = [], -1
    try:
        while True:
            i = values.index(value, i + 1)
            out.append(i)
    except ValueError:
        return out


class Shipper(threading.Thread):
    def __init__(self, session, delivery: Delivery) -> None:
        super().__init__(name="starvewatch-shipper", daemon=True)
        self.session = session
        self.delivery = delivery
        self.record_stats: dict[int, RecordStats] = {}
        self.record_totals: dict[int, LoaderTotals] = {}
        self._wake = threading.Event()
        self._stop_requested = threading.Event()
        self._done = threading.Event()
        self._seq = 0
        self._last_sent = 0.0
        self._meta_sent = False
        self._pending_gpu: list[tuple[float, tuple]] = []
        self.shipped_records = 0
        self.errors: list[str] = []

    # ---- thread ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.session.on_shipper_start(self)
        except Exception as exc:  # set-up problems (collector start) never stop the monitor
            self._note_error(f"start-up: {exc}")
        interval = self.session.settings.ship_interval_s
        while not self._stop_requested.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop_requested.is_set():
                break
            try:
                self.cycle()
            except Exception as exc:
                self._note_error(f"cycle: {exc!r}")
        try:
            self.cycle(final=True)
        except Exception as exc:
            self._note_error(f"final flush: {exc!r}")
        finally:
            self._done.set()

    def stop(self, timeout_s: float) -> bool:
        """Ask for the final flush and wait at most `timeout_s`; True when it completed."""
        self._stop_requested.set()
        self._wake.set()
        if not self.is_alive() and not self._done.is_set():
            # Never started (or died): flush on the caller's thread.
            self.cycle(final=True)
            self._done.set()
        return self._done.wait(timeout_s)

    def _note_error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)

    # ---- one cycle ------------------------------------------------------------------------
    def _take(self, n: int) -> list[tuple]:
        popleft = self.session.buffer.popleft
        try:
            return [popleft() for _ in range(n)]
        except IndexError:  # pragma: no cover - only this thread pops
            return []

    def _resolve_gpu(self, records: list[tuple], final: bool) -> list[tuple]:
        """Replace event tokens by GPU idle ns; hold back records whose events are pending."""
        timer = self.session.gpu_timer_if_any()
        now = time.monotonic()
        pending = self._pending_gpu
        self._pending_gpu = []
        ready: list[tuple] = []
        plain: list[tuple] = []
        for r in records:
            (plain if len(r) <= R_GPU or r[R_GPU] is None else pending).append(
                r if len(r) <= R_GPU or r[R_GPU] is None else (now, r))
        give_up_at = now + GPU_FINAL_WAIT_S if final else None
        for first_seen, rec in pending:
            while True:
                result = timer.resolve(rec[R_GPU]) if timer is not None else None
                if result is not PENDING:
                    ready.append(rec[:R_GPU] + (result,) + rec[R_GPU + 1:])
                    break
                if final and time.monotonic() < give_up_at:
                    time.sleep(0.001)
                    continue
                if final or now - first_seen > GPU_PENDING_LIMIT_S:
                    ready.append(rec[:R_GPU] + (None,) + rec[R_GPU + 1:])
                else:
                    self._pending_gpu.append((first_seen, rec))
                break
        return plain + ready

    def _columns(self, records: list[tuple]) -> dict:
        """Records to wire columns with C-level itemgetter maps (about 5x a Python loop). Most
        records are raw clock reads from the fast path; the few from the general path (a CPU
        probe, an epoch's first step, `step()` users, GPU events) carry durations and extras
        and are patched in by position."""
        names = [state.name for state in self.session.loader_list]
        n = len(records)
        col = lambda i: list(map(itemgetter(i), records))  # noqa: E731
        t_call, t3, t4 = col(2), col(3), col(4)
        waits, computes = list(map(sub, t3, t_call)), list(map(sub, t4, t3))
        others, gpus, phases = [0] * n, [None] * n, []
        for i in _positions(list(map(len, records)), FULL_RECORD_LEN):
            r = records[i]
            waits[i], computes[i], others[i], gpus[i] = r[R_WAIT], r[R_COMPUTE], r[R_OTHER], r[R_GPU]
            if r[R_PHASES]:
                phases += [[names[r[0][0]], r[0][1], r[1], name, ns] for name, ns in r[R_PHASES].items()]
        keys = col(0)
        distinct = set(keys)
        if len(distinct) == 1:  # one loader, one epoch: the usual case
            (index, epoch), = distinct
            indexes, epochs = [index] * n, [epoch] * n
        else:
            indexes, epochs = list(map(itemgetter(0), keys)), list(map(itemgetter(1), keys))
        return {
            "index": indexes,
            "loader": list(map(names.__getitem__, indexes)) if len(distinct) > 1 else [names[indexes[0]]] * n,
            "epoch": epochs,
            "step": col(1),
            "start_ns": list(map(self.session.wall_offset_ns.__add__, t_call)),
            "wait_ns": waits,
            "compute_ns": computes,
            "other_ns": others,
            "batch_size": col(5),
            "gpu_idle_ns": gpus,
            "phases": phases,
        }

    def cycle(self, final: bool = False) -> None:
        """Ship what the buffer held when the cycle began, in chunks of CHUNK records with the
        GIL handed back between them: C-level maps over a big backlog would otherwise hold it
        for tens of milliseconds. Only that much: a loop that appends faster than chunks are
        taken must not keep one cycle from ever ending."""
        session = self.session
        limit = session.settings.max_batch_records
        deadline = time.monotonic() + session.settings.flush_timeout_s if final else None
        extra = session.drain_events()
        left = len(session.buffer)
        batch, sent = None, False
        while True:
            n = min(CHUNK, left)
            left -= n
            records = self._take(n)
            if self._pending_gpu or (records and session.gpu_timer_if_any() is not None):
                records = self._resolve_gpu(records, final and left <= 0)
            if records:
                columns = self._columns(records)
                self._update_stats(columns)
                batch = columns if batch is None else _concat(batch, columns)
            if batch is not None and (len(batch["step"]) >= limit or left <= 0):
                self._send(batch, extra, final and left <= 0, deadline)
                batch, extra, sent = None, {}, True
            if left <= 0:
                break
            time.sleep(0)  # the training thread runs between chunks
        heartbeat_due = time.monotonic() - self._last_sent >= HEARTBEAT_S
        if not sent and (extra or final or not self._meta_sent or heartbeat_due):
            self._send({name: [] for name in (*STEP_COLUMNS, "phases")}, extra, final, deadline)
        try:
            if final:
                self.delivery.flush(deadline)
            else:
                self.delivery.replay()
        except TransportError as exc:
            self._note_error(str(exc))

    def _send(self, columns: dict, extra: dict, final: bool, deadline: float | None) -> None:
        steps = {name: columns[name] for name in STEP_COLUMNS}
        self.delivery.deliver(self._payload(steps, columns["phases"], extra, final), deadline=deadline)
        self.shipped_records += len(steps["step"])
        self._last_sent = time.monotonic()

    def _update_stats(self, columns: dict) -> None:
        indexes = columns["index"]
        groups = set(indexes)
        for index in groups:
            if len(groups) == 1:
                pick = lambda col: col  # noqa: E731 - one loader: the columns as they are
            else:
                mask = [i == index for i in indexes]
                pick = lambda col: list(itertools.compress(col, mask))  # noqa: E731
            waits, computes = pick(columns["wait_ns"]), pick(columns["compute_ns"])
            sizes = pick(columns["batch_size"])
            totals = self.record_totals.setdefault(index, LoaderTotals())
            totals.steps += len(waits)
            totals.wait_ns += sum(waits)
            totals.compute_ns += sum(computes)
            totals.other_ns += sum(pick(columns["other_ns"]))
            unknown = sizes.count(None)
            totals.samples += sum(b for b in sizes if b is not None) if unknown else sum(sizes)
            if unknown:
                totals.samples_known = False
            stats = self.record_stats.setdefault(index, RecordStats())
            stats.add_columns(pick(columns["step"]), waits, computes, pick(columns["gpu_idle_ns"]))

    def loader_totals(self, state) -> LoaderTotals:
        """Exact totals: the records drained so far plus what the hot path counted itself
        (epochs, epoch-end waits, dropped records)."""
        totals = LoaderTotals.from_dict(state.totals.to_dict())
        recorded = self.record_totals.get(state.index)
        if recorded is not None:
            totals.merge(recorded)
            totals.epochs = state.totals.epochs
            totals.epoch_end_wait_ns = state.totals.epoch_end_wait_ns
        return totals

    def _payload(self, steps: dict, phases: list, extra: dict, final: bool) -> dict:
        session = self.session
        self._seq += 1
        payload = {
            "schema": EVENTS_SCHEMA,
            "run_id": session.run_id,
            "rank": session.rank,
            "stream": session.stream_id,
            "seq": self._seq,
            "sent_at_ns": time.time_ns(),
            "status": "finished" if final and not session.active else "live",
            "loaders": [state.describe(self.loader_totals(state)) for state in session.loader_list],
            "steps": steps,
            "phases": phases,
            "drops": {**self.delivery.dropped(), "events": session.dropped_events},
            **extra,
        }
        if not self._meta_sent or final:
            payload["run"] = session.metadata()
            self._meta_sent = True
        return payload
