"""The layout of a step record: what the hot path (hooks/loader.py) appends to the buffer and
delivery (hooks/delivery/) reads. A contract beside the other shared ones (spool_format.py,
schema.py) and a leaf: both sides import it and not each other, and delivery reads the
records by it, never by the hooks' internals.

Two layouts, tuples as short as possible (allocation dominates the hot path):
fast: ((loader index, epoch), step, t_call, t_return, t_next_call, batch size): raw clock
      reads, turned into wait and compute on the shipper thread (or in the sidecar); the fast
      path itself appends bare clock reads to a Segment, which the shipper turns into these;
full: ((loader index, epoch), step, start, wait, compute, batch size, other, gpu token, phases)
      when step(), phase(), nesting, a CUDA event or the epoch's first batch touched the step;
reads: ((loader index, epoch), first step, batch size, clock reads): consecutive steps of a
      Segment as the shipper takes them, shipped as they are (a slice of ints marshals at a
      fifth of the cost of the fast records it stands for) and expanded where the columns are
      built (expand_reads).
"""
from __future__ import annotations

from itertools import repeat

R_KEY, R_STEP, R_START, R_WAIT, R_COMPUTE, R_BATCH, R_OTHER, R_GPU, R_PHASES = range(9)
FAST_RECORD_LEN = 6   # (key, step, t_call, t_ret, t_next, batch size): raw clock reads
FULL_RECORD_LEN = 9   # (key, step, t_start, wait, compute, batch size, other, gpu, phases)
READS_RECORD_LEN = 4  # (key, first step, batch size, [t_call, t_ret, ..., t_next_call]): many steps


class Segment:
    """The steady state of an epoch, as the fast path records it: one flat list of clock reads
    (t_call, t_return, t_call, t_return, ...) that the training thread only appends to, and the
    shipper turns into fast records (FAST_RECORD_LEN tuples). Step `base + i` was called at
    times[2i], returned at times[2i+1] and closed by the next call at times[2i+2], so `n`
    reads hold (n - 1) // 2 closed steps. `final` is set by the training thread after its
    last append; whoever reads it first and the length second has seen every read."""

    __slots__ = ("key", "base", "batch_size", "times", "final", "taken", "owner")

    def __init__(self, key, base: int, batch_size, times: list, owner) -> None:
        self.key, self.base, self.batch_size, self.times = key, base, batch_size, times
        self.final = False
        self.taken = 0  # closed steps already turned into records
        self.owner = owner  # a weak reference to the iterator, to ask it to start a new segment

    def done(self) -> bool:
        """Final, and every step of it taken by the shipper."""
        return self.final and self.taken >= (len(self.times) - 1) // 2

    def take(self, limit: int) -> list[tuple]:
        """At most `limit` steps closed since the last take, as one reads record (or none)."""
        times = self.times
        n = len(times)
        i = self.taken
        closed = min((n - 1) // 2, i + limit)
        if closed <= i:
            return []
        self.taken = closed
        return [(self.key, self.base + i, self.batch_size, times[2 * i:2 * closed + 1])]


def reads_steps(record: tuple) -> int:
    return (len(record[3]) - 1) // 2


def expand_reads(records: list[tuple]) -> list[tuple]:
    """Records with every reads record replaced by the fast records it holds (C-level zips)."""
    positions = [i for i, length in enumerate(map(len, records)) if length == READS_RECORD_LEN]
    if not positions:
        return records
    out: list[tuple] = []
    start = 0
    for i in positions:
        out += records[start:i]
        key, first, batch_size, times = records[i]
        closed = (len(times) - 1) // 2
        out += zip(repeat(key), range(first, first + closed), times[0:2 * closed:2], times[1:2 * closed:2],
                   times[2:2 * closed + 1:2], repeat(batch_size))
        start = i + 1
    out += records[start:]
    return out


def count_steps(records: list[tuple]) -> int:
    """Steps in a list of records of any layout."""
    return len(records) + sum(reads_steps(r) - 1 for r in records if len(r) == READS_RECORD_LEN)
