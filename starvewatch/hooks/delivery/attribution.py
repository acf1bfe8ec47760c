"""Where each wait came from: the loop's blocked intervals joined with the DataLoader workers'
per-batch records (worker_batches.py), by overlap.

For a step's wait [a, b] (a: when next() was called, or iter() for an epoch's first step; b:
when the batch came back), the batch the loop waited for is found in the workers' records
(with in_order=True the one numbered like the step; without, the next one written into the
result queue's pipe: the order the loop receives them, which the hand-over times alone do not
give, worker_batches.py), and
[a, b] is cut along what the batch's worker was doing: starting up, idle on its index queue,
busy with its earlier batches (this one not yet scheduled), fetching the samples, collating;
the part after the worker handed it over is the main process's (the result queue, unpickling,
the pin-memory thread). Each stage gets the length of its intersection with [a, b], never a
summed duration: a fetch that ran while the loop computed costs the loop nothing.

Head-of-line blocking: the part of a wait during which a later batch of the same epoch was
already handed over (in_order=True makes the loop wait for the batches in order).

Runs where the book is kept (records.RecordBook: the sidecar, or the training process without
one), never on the training thread. Exact sums go into the loader's totals (stats.LoaderTotals).
"""
from __future__ import annotations

import heapq
import logging

from ...logonce import RateLimitedLog
from ...stats import WAIT_STAGES, add_per_worker
from ...worker_batches import RING, FIRST, RingReader

_errors = RateLimitedLog(logging.getLogger("starvewatch.hooks"))

(IDX, WAIT_START, GOT, FETCH, C0, C1, DONE, FLAGS, SENT) = range(9)
KEEP = RING  # records kept per worker: a few seconds of the fastest worker
# Records shipped to the collector (for `starvewatch export -f trace`): at most SHIP_MAX per
# loader and run, at most SHIP_PER_BATCH per batch; the rest is counted, not shipped.
SHIP_MAX = 100_000
SHIP_PER_BATCH = 4096
EPOCHS_KEPT = 64  # epoch starts remembered (per loader, epoch, thread)


def split(a: int, b: int, history: list, pos: int, stages: dict) -> int:
    """Add to `stages` the intersection of [a, b] with each stage of the batch
    `history[pos]` (its worker's records in order); returns the part owed to the worker
    (b - a less the hand-over)."""
    r = history[pos]
    handover = max(0, b - max(a, r[DONE]))
    stages["handover"] += handover
    if len(r) > SENT and r[SENT]:  # of the hand-over, the part still in the worker (its feeder)
        send = min(b, r[SENT]) - max(a, r[DONE])
        if send > 0:
            stages["handover_send"] = stages.get("handover_send", 0) + send
    cursor = min(b, r[DONE])  # the worker's part: [a, cursor], walked back in time
    j = pos
    while cursor > a and j >= 0:
        q = history[j]
        own = q is r
        if q[C0]:
            parts = ((q[C0], q[DONE], "collate"), (q[GOT], q[C0], "fetch"))
        else:
            parts = ((q[GOT], q[DONE], "fetch"),)
        for start, end, stage in parts:
            overlap = min(end, cursor) - max(start, a)
            if overlap > 0:
                stages[stage if own else "not_scheduled"] += overlap
        overlap = min(q[GOT], cursor) - max(q[WAIT_START], a)
        if overlap > 0:
            stages["idle"] += overlap
        cursor = min(cursor, q[WAIT_START])
        if cursor <= a:
            break
        if q[FLAGS] & FIRST:  # before its first wait for indices, the worker was starting
            stages["startup"] += cursor - a
            cursor = a
            break
        j -= 1
        if j >= 0 and history[j][DONE] <= cursor:
            # Between handing the previous batch over and waiting again: the put itself.
            overlap = cursor - max(history[j][DONE], a)
            if overlap > 0:
                stages["not_scheduled"] += overlap
            cursor = max(history[j][DONE], a)
        else:
            break
    if cursor > a:  # records missing (a lapped ring, a worker without telemetry)
        stages["unknown"] += cursor - a
    return b - a - handover


class WorkerHistory:
    """One worker's records in order, as a list with a moving start: records are named by
    their position since the first (stable while kept), so a lookup is one subtraction."""

    __slots__ = ("records", "start")

    def __init__(self) -> None:
        self.records: list = []
        self.start = 0  # position of records[0]

    def append(self, record) -> int:
        self.records.append(record)
        if len(self.records) > 2 * KEEP:  # bounded: the oldest KEEP go
            del self.records[:KEEP]
            self.start += KEEP
        return self.start + len(self.records) - 1

    def get(self, position: int):
        i = position - self.start
        return self.records[i] if 0 <= i < len(self.records) else None


class LoaderRecords:
    """One loader's worker records as they are read from its board, for the join."""

    def __init__(self, board: list, config: dict | None, resume: dict | None = None) -> None:
        path, workers, base = board
        # `resume`: where an earlier reader of this board left off (the sidecar's book, after
        # a take-over): its records are joined again, never counted nor shipped again.
        resume = resume if resume and resume.get("board") == str(path) else {}
        self.reader = RingReader(str(path), int(workers), int(base), resume.get("seen"))
        config = config or {}
        self.in_order = config.get("in_order", True) is not False
        # Batches in flight at most: later ones cannot be ready during a wait.
        self.window = max(1, int(workers) * int(config.get("prefetch_factor") or 2))
        self.history = [WorkerHistory() for _ in range(int(workers))]
        self.by_idx: dict[int, list] = {}  # batch number -> [(worker, position)]
        self.arrivals: list = []  # (sent, worker, position) heap: in_order=False's arrival order
        self.epoch_starts: dict = {}
        self.outbox: list = []  # (worker, record) to ship with the next batch
        self.arrived_ns = int(resume.get("arrived_ns") or 0)  # in_order=False: the last batch a step took
        self.shipped = int(resume.get("shipped") or 0)
        self.unshipped = int(resume.get("unshipped") or 0)

    def pull(self, totals) -> None:
        """The records written since the last pull; each worker's batch count and time."""
        records = self.reader.take()
        if not records:
            return
        workers = len(self.history)
        batches, busy = [0] * workers, [0] * workers
        for worker, r, new in records:
            position = self.history[worker].append(r)
            entries = self.by_idx.setdefault(r[IDX], [])
            entries.append((worker, position))
            if len(entries) > 8:  # the same number in many epochs: the recent ones matter
                del entries[:-4]
            arrival = r[SENT] or r[DONE]  # in the order the loop receives them (the put's, if untimed)
            if not self.in_order and (new or arrival > self.arrived_ns):  # never one a step had
                heapq.heappush(self.arrivals, (arrival, worker, position))
            if not new:  # counted and shipped by the reader before a take-over
                continue
            batches[worker] += 1
            busy[worker] += r[DONE] - r[GOT]
            if self.shipped + len(self.outbox) < SHIP_MAX and len(self.outbox) < SHIP_PER_BATCH:
                self.outbox.append((worker, r))
            else:
                self.unshipped += 1
        add_per_worker(totals.worker_batches, batches)
        add_per_worker(totals.worker_batch_ns, busy)
        if len(self.by_idx) > 4 * KEEP * max(1, workers) or len(self.arrivals) > 2 * KEEP * workers:
            self._trim()

    def _trim(self) -> None:
        """Drop the lookups of records no longer kept."""
        history = self.history
        self.by_idx = {idx: kept for idx, entries in self.by_idx.items()
                       if (kept := [(w, p) for w, p in entries if history[w].get(p) is not None])}
        self.arrivals = [item for item in self.arrivals if history[item[1]].get(item[2]) is not None]
        heapq.heapify(self.arrivals)

    def to_dict(self) -> dict:
        """Where this reader stands, for the one that takes its work over (LoaderRecords'
        `resume`)."""
        return {"board": self.reader.path, "seen": list(self.reader.seen), "shipped": self.shipped,
                "unshipped": self.unshipped, "arrived_ns": self.arrived_ns}

    def epoch_start(self, key, start: int | None) -> int | None:
        if start is not None:
            if len(self.epoch_starts) >= EPOCHS_KEPT:
                self.epoch_starts.pop(next(iter(self.epoch_starts)))
            self.epoch_starts[key] = start
            return start
        return self.epoch_starts.get(key)

    def find(self, step: int, b: int, since: int | None) -> tuple | None:
        """(worker, position) of the batch the loop received at `b`."""
        if self.in_order:
            best, best_done = None, None
            for worker, position in self.by_idx.get(step, ()):
                r = self.history[worker].get(position)
                if r is not None and r[DONE] <= b and (since is None or r[GOT] >= since) \
                        and (best_done is None or r[DONE] > best_done):
                    best, best_done = (worker, position), r[DONE]
            return best
        arrivals = self.arrivals
        while arrivals and arrivals[0][0] <= b:
            self.arrived_ns, worker, position = heapq.heappop(arrivals)
            r = self.history[worker].get(position)
            if r is not None and (since is None or r[GOT] >= since):
                return worker, position
        return None

    def ready_before(self, step: int, b: int, since: int | None) -> int | None:
        """When the first batch after `step` (this epoch) was handed over, if before `b`."""
        first = None
        for idx in range(step + 1, step + 1 + self.window):
            for worker, position in self.by_idx.get(idx, ()):
                r = self.history[worker].get(position)
                if r is not None and r[DONE] <= b and (since is None or r[GOT] >= since) \
                        and (first is None or r[DONE] < first):
                    first = r[DONE]
        return first


class Attribution:
    """Per loader index with a worker board: its records, joined with each chunk of steps."""

    def __init__(self, resume: dict | None = None) -> None:
        self.loaders: dict[int, LoaderRecords] = {}
        # Per loader index, where the previous reader left off (to_dict), until its board opens.
        self.resume: dict[int, dict] = {int(k): v for k, v in (resume or {}).items()}

    def to_dict(self) -> dict:
        """What a reader taking over from this one needs (RecordBook carries it): per loader,
        how far each worker's ring was read and counted, and how many records were shipped."""
        return {**{str(i): r for i, r in self.resume.items()},
                **{str(i): loader.to_dict() for i, loader in self.loaders.items()}}

    def use_boards(self, loaders: list[dict]) -> None:
        """From a batch header's loaders: open the rings of those that have a board."""
        for index, loader in enumerate(loaders):
            board = loader.get("board")
            current = self.loaders.get(index)
            if not board or (current is not None and current.reader.path == str(board[0])):
                continue
            if current is not None:  # the loader watched again with other settings: a new board
                current.reader.close()
            try:
                self.loaders[index] = LoaderRecords(board, loader.get("config"), self.resume.pop(index, None))
            except (OSError, ValueError, TypeError) as exc:  # the board is gone: no attribution
                _errors.error("board", "starvewatch: no per-batch worker records for %r: %s", loader.get("name"), exc)

    def add(self, cols: dict, totals_of) -> None:
        """Attribute the waits of a chunk of steps (records.columns) into `totals_of(index)`."""
        if not self.loaders:
            return
        try:
            self._add(cols, totals_of)
        except Exception as exc:  # a shape nobody foresaw: these steps stay unattributed
            _errors.error(type(exc).__name__, "starvewatch: attributing waits: %r", exc)

    def _add(self, cols: dict, totals_of) -> None:
        indexes, steps, waits = cols["index"], cols["step"], cols["wait_ns"]
        keys, _, t_ret, _, nested, _ = cols["lanes"]
        pulled = set()
        for i, index in enumerate(indexes):
            loader = self.loaders.get(index)
            if loader is None:
                continue
            totals = totals_of(index)
            if index not in pulled:
                loader.pull(totals)
                pulled.add(index)
            b = t_ret[i]
            a = b - waits[i]
            extra = nested.get(i)
            since = loader.epoch_start(keys[i][:2], extra[2] if extra and extra[1] > 0 else None)
            found = loader.find(steps[i], b, since)
            if found is None:
                continue
            worker, position = found
            history = loader.history[worker]
            record = history.get(position)
            stages = dict.fromkeys(WAIT_STAGES, 0)
            owed = split(a, b, history.records, position - history.start, stages)
            totals.attributed_steps += 1
            totals.attributed_wait_ns += b - a
            for stage, ns in stages.items():
                if ns:
                    setattr(totals, f"wait_{stage}_ns", getattr(totals, f"wait_{stage}_ns") + ns)
            per_worker = [0] * (worker + 1)
            per_worker[worker] = owed
            add_per_worker(totals.worker_wait_ns, per_worker)
            if loader.in_order and owed > 0:
                ready = loader.ready_before(steps[i], min(b, record[DONE]), since)
                if ready is not None:
                    hol = min(b, record[DONE]) - max(a, ready)
                    if hol > 0:
                        totals.hol_wait_ns += hol
                        per_worker[worker] = hol
                        add_per_worker(totals.worker_hol_ns, per_worker)

    def take_shipped(self, names: list[str], wall_offset_ns: int) -> dict | None:
        """The worker records read since the last batch, as wire columns (wall-clock ns), or
        None when there are none."""
        cols: dict = {"loader": [], "worker": [], "idx": [], "wait_start_ns": [], "got_ns": [],
                      "fetch_start_ns": [], "collate_start_ns": [], "collate_end_ns": [], "done_ns": []}
        unshipped = 0
        for index, loader in self.loaders.items():
            unshipped += loader.unshipped
            if not loader.outbox or index >= len(names):
                continue
            outbox, loader.outbox = loader.outbox, []
            loader.shipped += len(outbox)
            cols["loader"] += [names[index]] * len(outbox)
            cols["worker"] += [w for w, _ in outbox]
            cols["idx"] += [r[IDX] for _, r in outbox]
            for name, i in (("wait_start_ns", WAIT_START), ("got_ns", GOT), ("fetch_start_ns", FETCH),
                            ("collate_start_ns", C0), ("collate_end_ns", C1), ("done_ns", DONE)):
                cols[name] += [r[i] + wall_offset_ns if r[i] else 0 for _, r in outbox]
        if not cols["loader"]:
            return None
        cols["unshipped"] = unshipped
        return cols

    def close(self) -> None:
        for loader in self.loaders.values():
            loader.reader.close()
