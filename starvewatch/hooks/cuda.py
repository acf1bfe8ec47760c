"""What the GPU really saw while the loop waited for data, from CUDA events.

An event pair is recorded on the current stream when the loop asks for a batch (A) and when
it gets it (B). A completes when the GPU has drained the work queued before the wait; B right
after, if nothing else was queued. So `A.elapsed_time(B)` is the time the GPU sat idle for
want of data: about the wait when the queue was empty, about zero when a backlog hid the wait.
Events are resolved on the shipper thread with `query()`, never `synchronize()`.
"""
from __future__ import annotations

import random
import sys
from collections import deque

PENDING = object()


def detect_event_factory():
    """A factory of timing events when this process already uses CUDA, else None.

    Never initialises CUDA by itself: a CPU job stays a CPU job.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
    except Exception:
        return None
    return lambda: torch.cuda.Event(enable_timing=True)


class CudaEventTimer:
    """A small reusable pool of event pairs; an exhausted pool skips a step, never blocks.

    Each `Event.record()` costs the training thread a few µs (Python-level stream lookup plus
    the driver call), so only one step in `every` (on average) is measured: the gaps are
    random (1 to 2*every-1 steps), so a loop with a period of its own (gradient accumulation,
    logging every n steps) cannot line up with them. The GPU-idle fraction is the measured
    steps' idle over their loop time (stats.RecordStats), so it stays unbiased; its sampling
    error grows by about sqrt(every) (docs/performance.md)."""

    def __init__(self, event_factory, pool_size: int = 128, every: int = 1, seed: int | None = None) -> None:
        self._free = deque((event_factory(), event_factory()) for _ in range(pool_size))
        self.pool_size = pool_size
        self.skipped = 0
        self.every = max(1, int(every))
        self._random = random.Random(seed)
        self._countdown = 1  # the first step of a run is measured

    def begin(self):
        countdown = self._countdown - 1
        if countdown > 0:
            self._countdown = countdown
            return None
        every = self.every
        self._countdown = self._random.randint(1, 2 * every - 1) if every > 1 else 1
        try:
            pair = self._free.pop()
        except IndexError:
            self.skipped += 1
            return None
        pair[0].record()
        return pair

    def end(self, pair) -> None:
        pair[1].record()

    def release(self, pair) -> None:
        self._free.append(pair)

    def resolve(self, pair):
        """GPU idle ns of a finished pair (and the pair back in the pool), or PENDING."""
        try:
            if not pair[1].query():
                return PENDING
            idle_ns = max(0, int(pair[0].elapsed_time(pair[1]) * 1_000_000))
        except Exception:  # a failed event: no measurement for this step
            idle_ns = None
        self.release(pair)
        return idle_ns
