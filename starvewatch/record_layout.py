"""The layout of a step record: what the hot path (hooks/loader.py) appends to the buffer and
delivery (hooks/delivery/) reads. A contract beside the other shared ones (spool_format.py,
schema.py) and a leaf: both sides import it and not each other, and delivery reads the
records by it, never by the hooks' internals.

Every record starts with its key, (loader index, epoch, lane): the lane is the thread that
takes the epoch's batches (threading.get_ident()), so that delivery can subtract the waits of
the other loaders of a thread from a step's compute (hooks/delivery/overlap.py). Step layouts,
tuples as short as possible (allocation dominates the hot path):
fast: (key, step, t_call, t_return, t_next_call, batch size): raw clock reads, turned into
      wait and compute on the shipper thread (or in the sidecar); the fast path itself appends
      bare clock reads to a Segment, which the shipper turns into these;
full: (key, step, start, wait, compute, batch size, other, gpu token, phases, t_return, t_end,
      nested spans, epoch start) when step(), phase(), nesting, a CUDA event or the epoch's
      first batch touched the step; t_end is when the step closed, nested spans the (start,
      end) of the epochs nested in it (out of its compute already) or None, epoch start when
      iter() was called (a first step's wait also holds iter()'s start-up: wait - (t_return -
      start), which began then);
reads: (key, first step, batch size, clock reads): consecutive steps of a Segment as the
      shipper takes them, shipped as they are (a slice of ints marshals at a fifth of the cost
      of the fast records it stands for); the columns are built from its slices (records.py).
Two marks the shipper adds to each cycle's records (not steps):
horizon: (t,): every step closed by then is in this cycle's records or an earlier one's;
open wait: (key, t_call, t_return, wait ns, "open"): the wait of a step in progress at the
      horizon, which no record holds yet (the step's record repeats it later).
The general path appends one more mark to the buffer, the wait of a next() that raised (the
epoch's end, joining the workers): (key, t_call, t_end, wait ns, "end"), no step either.
"""
from __future__ import annotations

from bisect import bisect_right

(R_KEY, R_STEP, R_START, R_WAIT, R_COMPUTE, R_BATCH, R_OTHER, R_GPU, R_PHASES, R_RET, R_END, R_SPANS,
 R_EPOCH_START) = range(13)
FAST_RECORD_LEN = 6   # (key, step, t_call, t_ret, t_next, batch size): raw clock reads
FULL_RECORD_LEN = 13  # (key, step, t_start, wait, compute, batch size, other, gpu, phases, t_ret, t_end,
#                        nested spans, epoch start)
READS_RECORD_LEN = 4  # (key, first step, batch size, [t_call, t_ret, ..., t_next_call]): many steps
HORIZON_RECORD_LEN = 1    # (t,)
OPEN_WAIT_RECORD_LEN = 5  # (key, t_call, t_ret, wait ns, "open")
STEP_RECORD_LENS = (FAST_RECORD_LEN, FULL_RECORD_LEN)  # one step each (a reads record holds many)

# Keys of the epochs that ended (appended by the hot path at an epoch's end, taken by the
# shipper each cycle): with the live iterators', the threads where several loaders had steps.
ENDED_KEYS: list = []


class Segment:
    """The steady state of an epoch, as the fast path records it: one flat list of clock reads
    (t_call, t_return, t_call, t_return, ...) that the training thread only appends to, and the
    shipper turns into fast records (FAST_RECORD_LEN tuples). Step `base + i` was called at
    times[2i], returned at times[2i+1] and closed by the next call at times[2i+2], so `n`
    reads hold (n - 1) // 2 closed steps. `final` is set by the training thread after its
    last append; whoever reads it first and the length second has seen every read."""

    __slots__ = ("key", "base", "batch_size", "times", "final", "taken", "owner", "room")

    def __init__(self, key, base: int, batch_size, times: list, owner, room: int = 0) -> None:
        self.key, self.base, self.batch_size, self.times = key, base, batch_size, times
        self.final = False
        self.taken = 0  # closed steps already turned into records
        self.owner = owner  # a weak reference to the iterator, to ask it to start a new segment
        self.room = room  # the most reads it may get (the buffer's room it was given)

    def wait_before(self, t: int) -> tuple | None:
        """(key, t_call, t_return, wait ns) of the step whose batch came back by `t` but
        which was not closed by then (so the shipper does not take it yet), or None."""
        times = self.times
        i = bisect_right(times, t, 0, len(times))  # reads at or before t
        if i < 2 or i % 2:  # nothing returned yet, or waiting at t
            return None
        return self.key, times[i - 2], times[i - 1], times[i - 1] - times[i - 2]

    def done(self) -> bool:
        """Final, and every step of it taken by the shipper."""
        return self.final and self.taken >= (len(self.times) - 1) // 2

    def take(self, limit: int, until: int | None = None) -> list[tuple]:
        """At most `limit` steps closed since the last take (and, with `until`, closed by
        that time), as one reads record (or none)."""
        times = self.times
        n = len(times)
        if until is not None:
            n = bisect_right(times, until, 0, n)  # the reads are in time order
        i = self.taken
        closed = min((n - 1) // 2, i + limit)
        if closed <= i:
            return []
        self.taken = closed
        return [(self.key, self.base + i, self.batch_size, times[2 * i:2 * closed + 1])]


def reads_steps(record: tuple) -> int:
    return (len(record[3]) - 1) // 2


def count_steps(records: list[tuple]) -> int:
    """Steps in a list of records of any layout (marks are not steps)."""
    lengths = list(map(len, records))
    return (lengths.count(FAST_RECORD_LEN) + lengths.count(FULL_RECORD_LEN)
            + sum(reads_steps(r) for r in records if len(r) == READS_RECORD_LEN))


def record_wait(record: tuple) -> tuple:
    """(key, t_call, t_return, wait ns) of a fast or full record or a wait mark."""
    length = len(record)
    if length == FAST_RECORD_LEN:
        return record[0], record[2], record[3], record[3] - record[2]
    if length == OPEN_WAIT_RECORD_LEN:
        return record[:4]
    return record[0], record[R_START], record[R_RET], record[R_WAIT]


def record_end(record: tuple) -> int:
    """When a fast or full record's step closed (its next call), or a wait mark's wait ended."""
    length = len(record)
    if length == FAST_RECORD_LEN:
        return record[4]
    return record[2] if length == OPEN_WAIT_RECORD_LEN else record[R_END]
