"""Step records into event batches: wire columns, the exact totals and statistics they add up
to (the book), and delivery.

One code path for both places that do this work: the sidecar process (the usual case: the
training process only packs raw records and writes them to a pipe, see sidecar_link.py)
and the training process itself (in-memory transport, no sidecar, or after the sidecar died).
So both produce the same payloads and the same summary.
"""
from __future__ import annotations

import itertools
from itertools import repeat
import logging
import marshal
from operator import itemgetter, sub

from ...logonce import RateLimitedLog
from ...schema import STEP_COLUMNS
from ...stats import LoaderTotals, RecordStats
from ...record_layout import (FULL_RECORD_LEN, HORIZON_RECORD_LEN, OPEN_WAIT_RECORD_LEN, R_COMPUTE, R_END,
                              R_EPOCH_START, R_GPU, R_OTHER, R_PHASES, R_RET, R_SPANS, R_START, R_WAIT,
                              R_BATCH, READS_RECORD_LEN)
from .account import add_accounts, empty_account
from .attribution import Attribution
from .overlap import Lanes, split_marks

_overlap_errors = RateLimitedLog(logging.getLogger("starvewatch.hooks"))
from .transport import BodyAhead, Delivery

LAST_FIELDS = ("drops", "delivery")  # a batch's fields set as it leaves (LocalPipeline.deliver_built)


def with_buffer_drops(account: dict, loaders: list[dict]) -> dict:
    """The account plus the records the hot path's full buffer never recorded."""
    lost = sum(loader["totals"].get("dropped_records", 0) for loader in loaders)
    return add_accounts(account, {"dropped": {"buffer_full": lost}}) if lost else account

# Records taken from the buffer per GIL hold in the training process: under 1 ms when they are
# only packed for the sidecar, ~3 ms when they are converted here. Each hold past the first
# costs the training loop one more GIL hand-off, so not smaller.
CHUNK = 2048


def _positions(values: list, value) -> list[int]:
    """Indexes of `value` in `values`: C-level scans, one Python step per match (few)."""
    out, i = [], -1
    try:
        while True:
            i = values.index(value, i + 1)
            out.append(i)
    except ValueError:
        return out


def _step_columns(records: list[tuple]) -> tuple:
    """(keys, steps, t_call, t_ret, t_next, batch sizes, general) of records of any step
    layout: fields 0-5 of each fast or general-path record (C-level itemgetter maps over each
    run of them), and each reads record's steps straight from slices of its clock reads, never a
    tuple per step (expanding them first was a third of the sidecar's work on a fast loop's
    batch, issue 41). `general`: (position, record) of the general path's records, whose
    fields the caller patches in."""
    lengths = list(map(len, records))
    keys, steps, calls, rets, ends, sizes = [], [], [], [], [], []
    general: list[tuple[int, tuple]] = []
    start = 0
    for i in _positions(lengths, READS_RECORD_LEN) + [len(records)]:
        if i > start:  # a run of fast and general-path records
            run = records[start:i]
            general += [(len(keys) + j, run[j]) for j in _positions(lengths[start:i], FULL_RECORD_LEN)]
            for index, column in enumerate((keys, steps, calls, rets, ends, sizes)):
                column += map(itemgetter(index), run)
        if i < len(records):
            key, first, batch_size, times = records[i]
            closed = (len(times) - 1) // 2
            keys += repeat(key, closed)
            steps += range(first, first + closed)
            calls += times[0:2 * closed:2]
            rets += times[1:2 * closed:2]
            ends += times[2:2 * closed + 1:2]
            sizes += repeat(batch_size, closed)
        start = i + 1
    return keys, steps, calls, rets, ends, sizes, general


def columns(records: list[tuple], names: list[str], wall_offset_ns: int) -> dict:
    """Records to wire columns with C-level itemgetter maps (about 5x a Python loop). Most
    records are raw clock reads from the fast path; the few from the general path (a CPU
    probe, an epoch's first step, `step()` users, GPU measurements) carry durations and
    extras and are patched in by position. The clocks and the shipper's marks (no steps) are
    kept under "lanes" for `settle`, which takes the other loaders' waits on the same thread
    out of each step's compute."""
    lengths = list(map(len, records))
    marks: list[tuple] = []
    if HORIZON_RECORD_LEN in lengths or OPEN_WAIT_RECORD_LEN in lengths:
        records, marks = split_marks(records, lengths, (HORIZON_RECORD_LEN, OPEN_WAIT_RECORD_LEN))
        lengths = None
    if records and list(map(len, records)).count(FULL_RECORD_LEN) == len(records):
        # only the general path's: a loop its shipper fell behind (issue 42)
        return _full_columns(records, names, wall_offset_ns, marks)
    keys, step_column, t_call, t_ret, t_end, sizes, full = _step_columns(records)
    n = len(keys)
    waits, computes = list(map(sub, t_ret, t_call)), list(map(sub, t_end, t_ret))
    others, gpus, phases = [0] * n, [None] * n, []
    nested: dict[int, tuple] = {}  # position -> (nested spans, start-up ns, epoch start)
    for i, r in full:
        waits[i], computes[i], others[i], gpus[i] = r[R_WAIT], r[R_COMPUTE], r[R_OTHER], r[R_GPU]
        t_ret[i], t_end[i] = r[R_RET], r[R_END]
        startup = r[R_WAIT] - (r[R_RET] - r[R_START])  # iter()'s, in a first step's wait
        if r[R_SPANS] or startup > 0:
            nested[i] = (r[R_SPANS], startup, r[R_EPOCH_START])
        if r[R_PHASES]:
            phases += [[names[r[0][0]], r[0][1], r[1], name, ns] for name, ns in r[R_PHASES].items()]
    return _columns_of(keys, step_column, sizes, names, wall_offset_ns, marks, t_call, t_ret, t_end, waits,
                       computes, others, gpus, phases, nested)


def _full_columns(records: list[tuple], names: list[str], wall_offset_ns: int, marks: list) -> dict:
    """`columns` of general-path records only, by C-level maps too: a loop whose shipper
    fell behind runs its steps on the general path, up to a whole buffer of them, and a
    Python step per record made the final cycle of 2 x 10^6 steps take seconds more."""
    col = lambda i: list(map(itemgetter(i), records))  # noqa: E731
    t_call, waits, t_ret = col(R_START), col(R_WAIT), col(R_RET)
    phases: list = []
    nested: dict[int, tuple] = {}
    spans = col(R_SPANS)
    startups = list(map(sub, waits, map(sub, t_ret, t_call)))  # iter()'s, in a first step's wait
    if spans.count(None) != len(spans) or max(startups) > 0:
        for i, (span, startup) in enumerate(zip(spans, startups)):
            if span or startup > 0:
                nested[i] = (span, startup, records[i][R_EPOCH_START])
    step_phases = col(R_PHASES)
    if step_phases.count(None) != len(step_phases):
        for r in records:
            if r[R_PHASES]:
                phases += [[names[r[0][0]], r[0][1], r[1], name, ns] for name, ns in r[R_PHASES].items()]
    return _columns_of(col(0), col(1), col(R_BATCH), names, wall_offset_ns, marks, t_call, t_ret, col(R_END), waits,
                       col(R_COMPUTE), col(R_OTHER), col(R_GPU), phases, nested)


def _columns_of(keys, step_column, sizes, names, wall_offset_ns, marks, t_call, t_ret, t_end, waits, computes,
                others, gpus, phases, nested) -> dict:
    n = len(keys)
    distinct = set(keys)
    if len(distinct) == 1:  # one loader, one epoch: the usual case
        key, = distinct
        index, epoch = key[0], key[1]
        indexes, epochs, loader_names = [index] * n, [epoch] * n, [names[index]] * n
    else:
        indexes, epochs = list(map(itemgetter(0), keys)), list(map(itemgetter(1), keys))
        loader_names = list(map(names.__getitem__, indexes))
    return {"index": indexes, "loader": loader_names, "epoch": epochs, "step": step_column,
            "start_ns": list(map(wall_offset_ns.__add__, t_call)), "wait_ns": waits,
            "compute_ns": computes, "other_ns": others, "batch_size": sizes,
            "gpu_idle_ns": gpus, "phases": phases,
            # not step columns of the wire: they go into the totals (RecordBook.add), once
            # settle() has taken the other loaders' waits out (overlap.py)
            "shared_compute_ns": [0] * n, "other_loaders_wait_ns": [0] * n,
            "lanes": (keys, t_call, t_ret, t_end, nested, marks)}


def settle(chunks: list[dict], lanes: Lanes) -> None:
    """The other loaders' waits out of the compute of a batch's chunks (in place), once every
    chunk's waits are known (overlap.py). Never loses a record: should this fail, the steps
    keep their compute as measured (one console line)."""
    try:
        for cols in chunks:
            lanes.register(cols["lanes"])
        adjusted = [lanes.adjust(cols["lanes"], list(cols["compute_ns"]), list(cols["other_ns"]))
                    for cols in chunks]
    except Exception as exc:  # a record shape nobody foresaw: measured as one loader each
        _overlap_errors.error(type(exc).__name__, "starvewatch: several loaders on one thread: %r", exc)
        lanes.lanes.clear()
        return
    for cols, (computes, others, shared, taken) in zip(chunks, adjusted):
        cols["compute_ns"], cols["other_ns"] = computes, others
        cols["shared_compute_ns"], cols["other_loaders_wait_ns"] = shared, taken


class RecordBook:
    """Per loader (by index): exact totals and statistics of the records processed so far,
    up to and including batch `seq`."""

    def __init__(self, *, vectorized: bool = False) -> None:
        self.totals: dict[int, LoaderTotals] = {}
        self.stats: dict[int, RecordStats] = {}
        self.seq = 0
        self.vectorized = vectorized  # numpy for the histograms: the sidecar, not the trainer
        # Recent waits per thread, for steps still to come (overlap.py). Not in to_dict: after
        # a take-over from a dead sidecar the first steps may keep a few other loaders' waits.
        self.lanes = Lanes()
        # The workers' per-batch records, joined with the steps' waits (attribution.py).
        self.attribution = Attribution()

    def add(self, cols: dict) -> None:
        self.attribution.add(cols, lambda index: self.totals.setdefault(index, LoaderTotals()))
        indexes = cols["index"]
        groups = set(indexes)
        for index in groups:
            if len(groups) == 1:
                pick = lambda col: col  # noqa: E731 - one loader: the columns as they are
            else:
                mask = [i == index for i in indexes]
                pick = lambda col: list(itertools.compress(col, mask))  # noqa: E731
            waits, computes = pick(cols["wait_ns"]), pick(cols["compute_ns"])
            sizes = pick(cols["batch_size"])
            totals = self.totals.setdefault(index, LoaderTotals())
            totals.steps += len(waits)
            totals.wait_ns += sum(waits)
            totals.compute_ns += sum(computes)
            totals.other_ns += sum(pick(cols["other_ns"]))
            totals.shared_compute_ns += sum(pick(cols["shared_compute_ns"]))
            totals.other_loaders_wait_ns += sum(pick(cols["other_loaders_wait_ns"]))
            unknown = sizes.count(None)
            totals.samples += sum(b for b in sizes if b is not None) if unknown else sum(sizes)
            if unknown:
                totals.samples_known = False
            stats = self.stats.setdefault(index, RecordStats())
            stats.add_columns(pick(cols["step"]), waits, computes, pick(cols["gpu_idle_ns"]),
                              vectorized=self.vectorized)

    def merged(self, index: int, counted: LoaderTotals) -> LoaderTotals:
        """Exact totals of a loader: its records in this book plus what the hot path counted
        itself (epochs, epoch-end waits, the records a full buffer dropped)."""
        totals = LoaderTotals.from_dict(counted.to_dict())
        recorded = self.totals.get(index)
        if recorded is not None:
            totals.merge(recorded)
            totals.epochs = counted.epochs
            totals.epoch_end_wait_ns = counted.epoch_end_wait_ns
        return totals

    def to_dict(self) -> dict:
        # "attribution": how far the workers' rings were read, so that a book taken over
        # (a dead sidecar's) neither counts nor ships a worker's record twice.
        return {"seq": self.seq, "loaders": {
            str(i): {"totals": t.to_dict(), "stats": self.stats[i].to_dict()} for i, t in self.totals.items()},
            "attribution": self.attribution.to_dict()}

    @classmethod
    def from_dict(cls, data: dict, *, vectorized: bool = False) -> "RecordBook":
        book = cls(vectorized=vectorized)
        book.attribution = Attribution(data.get("attribution"))
        book.seq = int(data["seq"])
        for key, entry in data["loaders"].items():
            book.totals[int(key)] = LoaderTotals.from_dict(entry["totals"])
            book.stats[int(key)] = RecordStats.from_dict(entry["stats"])
        return book


class LocalPipeline:
    """Records -> columns and the book -> payloads -> Delivery, in the process that runs it.

    `add()` takes one chunk of records; `send(header)` turns what was added into one event
    batch: the header (built by the shipper at that moment) plus the steps, and the hot path's
    totals merged with the book's."""

    chunk = CHUNK
    remote = False  # the work happens here, in the calling thread

    def __init__(self, delivery: Delivery, wall_offset_ns: int, *, vectorized: bool = False) -> None:
        self.delivery = delivery
        self.wall_offset_ns = wall_offset_ns
        self.current_book = RecordBook(vectorized=vectorized)
        self._chunks: list[dict] = []  # columns of the records added since the last send
        self._pending = 0
        # What a sidecar settled before this pipeline took over (acknowledged and dropped; the
        # spool's part is read from the spool itself).
        self.inherited = empty_account()
        self.chunks_added = 0  # (progress that finish() waits for: shipper.progress)

    def pending(self) -> int:
        return self._pending

    def add(self, records: list[tuple], names: list[str]) -> None:
        cols = columns(records, names, self.wall_offset_ns)
        self._chunks.append(cols)
        self._pending += len(cols["step"])
        self.chunks_added += 1

    def _settled_batch(self) -> dict | None:
        """The chunks added since the last send, settled (records.settle), in the book, as
        one batch of columns."""
        chunks, self._chunks, self._pending = self._chunks, [], 0
        if not chunks:
            return None
        settle(chunks, self.current_book.lanes)
        batch = chunks[0]
        self.current_book.add(batch)
        for cols in chunks[1:]:
            self.current_book.add(cols)
            for name, values in cols.items():
                if name != "lanes":
                    batch[name].extend(values)
        return batch

    def send(self, header: dict, deadline: float | None = None) -> int:
        """Deliver one batch; returns its number of step records."""
        return self.deliver_built(self.build(header), header, deadline)

    def build(self, header: dict) -> dict:
        """The batch of what was added since the last send, in the book: its payload but for
        the delivery account and drops, which `deliver_built` adds as they stand when it is
        sent. Apart so that the sidecar builds the next batch while this one is in flight."""
        self.current_book.attribution.use_boards(header["loaders"])
        batch = self._settled_batch()
        book = self.current_book
        loaders = [{**{k: v for k, v in loader.items() if k != "board"},  # a local path: not for the wire
                    "totals": book.merged(index, LoaderTotals.from_dict(loader["totals"])).to_dict()}
                   for index, loader in enumerate(header["loaders"])]
        steps = {name: batch[name] if batch else [] for name in STEP_COLUMNS}
        book.seq = header["seq"]
        payload = {**header, "loaders": loaders, "steps": steps, "phases": batch["phases"] if batch else []}
        shipped = book.attribution.take_shipped([loader["name"] for loader in loaders], self.wall_offset_ns)
        if shipped is not None:  # the workers' batch records, for the trace (attribution.py)
            payload["worker_batches"] = shipped
        return payload

    @staticmethod
    def encode_ahead(payload: dict) -> BodyAhead:
        """A batch's body from `build`, encoded but for the fields `deliver_built` sets."""
        return BodyAhead(payload, LAST_FIELDS)

    def deliver_built(self, payload: dict, header: dict, deadline: float | None = None,
                      ahead: BodyAhead | None = None) -> int:
        """Deliver a batch from `build` (its body from `encode_ahead`, if made), with the
        account as it stands now (every batch before it settled); returns its number of step
        records."""
        payload["drops"] = {**self.delivery.dropped(), **header.get("drops", {})}
        payload["delivery"] = with_buffer_drops(self.account(), header["loaders"])
        self.delivery.deliver(payload, ahead.finish(payload) if ahead is not None else None, deadline=deadline)
        return len(payload["steps"]["step"])

    def add_packed(self, header: dict, parts: list[bytes]) -> None:
        """Add a batch's records as the training process packed them for the sidecar
        (marshalled chunks of records)."""
        names = [loader["name"] for loader in header["loaders"]]
        for part in parts:
            self.add(marshal.loads(part), names)

    def send_packed(self, header: dict, parts: list[bytes], deadline: float | None = None) -> int:
        """Deliver a batch as the training process packed it for the sidecar: in the
        training process after a take-over (the sidecar builds and delivers apart)."""
        self.add_packed(header, parts)
        return self.send(header, deadline)

    def book(self) -> RecordBook:
        return self.current_book

    def replay(self, deadline: float | None = None) -> bool:
        return self.delivery.replay(deadline)

    def flush(self, deadline: float) -> bool:
        return self.delivery.flush(deadline)

    def dropped(self) -> dict:
        return self.delivery.dropped()

    def account(self) -> dict:
        """Where the records this pipeline was given went (account.py)."""
        return add_accounts(self.inherited, self.delivery.account())

    def reset_backoff(self) -> None:
        self.delivery.reset_backoff()

    def spool_only(self) -> None:
        self.delivery.spool_only()
