"""Per-batch records of DataLoader workers: the layout of the ring each worker writes into the
worker board's file (hooks/workers.py writes, hooks/delivery/attribution.py reads). A shared
leaf like record_layout.py: the writer runs inside the workers, the reader in the sidecar (or
the training process without one), and neither imports the other.

One ring per worker after the board's other areas: a header (how many records were ever
written: the writer bumps it after the record, so a reader that reads the count first never
reads a record being written, unless the writer laps the ring meanwhile: RING records, ~2 s of
a worker making 2,000 batches a second, against a reader every 0.5 s; a lapped record is
refused by its own order check) and RING records of REC. Times are perf_counter_ns, the same
clock (CLOCK_MONOTONIC) as the training process's step records.

A record, per batch a worker hands over:
  idx            the batch's number as the worker received it (torch's send_idx: the step it
                 is for within the epoch, with in_order=True)
  wait_start_ns  when the worker began waiting on its index queue for it (after handing over
                 its previous batch, or when the worker had started)
  got_ns         when its indices came off the index queue
  fetch_start_ns when the fetcher began (the samples: __getitem__ or the iterator's next)
  collate_start_ns, collate_end_ns   collate_fn's call (0, 0: none seen, e.g. batch_size=None)
  done_ns        when the worker put the batch on the result queue (the hand-over begins)
  flags          FIRST: the worker process's first batch (before wait_start_ns it was starting)
  sent_ns        when the batch's bytes went into the result queue's pipe, timed by the
                 queue's feeder thread under the queue's write lock that every worker takes:
                 the order of sent_ns is the order the loop receives the batches (0: not
                 timed, e.g. a result queue that is not a multiprocessing.Queue). done_ns
                 alone does not give that order: between the put and the write, the feeder
                 thread pickles the batch (its tensors into shared memory) and may be
                 descheduled, and a worker's first put starts its feeder thread.

The record is written by whichever thread times its last field: the feeder thread after the
write (the worker's main thread when the queue cannot be timed). One writer per ring either way.
"""
from __future__ import annotations

import mmap
import struct

REC = struct.Struct("<9q")
HEADER = struct.Struct("<q")
RING = 4096
FIRST = 1
FIELDS = ("idx", "wait_start_ns", "got_ns", "fetch_start_ns", "collate_start_ns", "collate_end_ns",
          "done_ns", "flags", "sent_ns")
RING_BYTES = HEADER.size + RING * REC.size


def ring_offset(base: int, worker_id: int) -> int:
    """Where worker `worker_id`'s ring starts in a board whose rings begin at `base`."""
    return base + worker_id * RING_BYTES


def write(mapping, offset: int, record: tuple) -> None:
    """Append one record to the ring at `offset` (the worker's, one writer)."""
    count, = HEADER.unpack_from(mapping, offset)
    REC.pack_into(mapping, offset + HEADER.size + (count % RING) * REC.size, *record)
    HEADER.pack_into(mapping, offset, count + 1)


def _ordered(record: tuple) -> bool:
    """A whole record (not torn by a lapping writer): its times in the order they happen."""
    _, wait_start, got, fetch, c0, c1, done, _, sent = record
    if sent and sent < done:
        return False
    if c0:
        return 0 < wait_start <= got <= fetch <= c0 <= c1 <= done
    return 0 < wait_start <= got <= fetch <= done


class RingReader:
    """The reading side, for one board file: the records written since the last `take()`.

    `counted`: per worker, how many of its records an earlier reader of the same board has
    read and counted already (a sidecar, before the training process took its work over):
    those are read again (a step still to join may need them) but marked as not new."""

    def __init__(self, path: str, num_workers: int, base: int, counted: list[int] | None = None) -> None:
        self.path = path
        self.num_workers = num_workers
        self.base = base
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.seen = [0] * num_workers
        self.counted = (list(counted or ()) + [0] * num_workers)[:num_workers]
        self.lost = 0  # records a lapping writer overwrote before they were read

    def take(self) -> list[tuple[int, tuple, bool]]:
        """(worker id, record, new) for every record written since the last call, per worker
        in order; `new` is False for a record an earlier reader counted (`counted`)."""
        out = []
        for worker in range(self.num_workers):
            offset = ring_offset(self.base, worker)
            if offset + RING_BYTES > len(self._map):
                break
            count, = HEADER.unpack_from(self._map, offset)
            seen = self.seen[worker]
            if count < seen:  # a board reused from the start (never by the writers): read again
                seen = 0
            first = max(seen, count - RING)
            self.lost += max(0, first - max(seen, self.counted[worker]))
            for n in range(first, count):
                record = REC.unpack_from(self._map, offset + HEADER.size + (n % RING) * REC.size)
                if _ordered(record):
                    out.append((worker, record, n >= self.counted[worker]))
                elif n >= self.counted[worker]:
                    self.lost += 1
            self.seen[worker] = count
        return out

    def close(self) -> None:
        try:
            self._map.close()
        except (BufferError, ValueError):
            pass
