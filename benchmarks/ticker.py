"""The 1 ms-step loop that is its own high-rate ticker, shared by overhead.py (p99, pause) and
faults.py (the same loop in a training process under each fault). No side effects at import:
faults.py runs it in a subprocess whose environment is the fault's."""
from __future__ import annotations

import time


def timed_steps(source, duration_s: float) -> tuple[list[float], list[float]]:
    """Run 1 ms busy-wait steps over `source` for `duration_s`. Returns each step's wall time (s)
    and each step's longest hold-up (s).

    The busy-wait reads the clock about every 0.1 µs, so the longest gap between two consecutive
    reads (the `next()` call included) is the longest time anything held the thread up: the
    monitor's threads taking the GIL, the sidecar or the OS taking the core."""
    clock = time.perf_counter
    times, holdups = [], []
    end = clock() + duration_s
    last = tick = clock()
    for _ in source:
        worst = 0.0
        step_end = clock() + 0.001
        while True:
            now = clock()
            if now - tick > worst:
                worst = now - tick
            tick = now
            if now >= step_end:
                break
        times.append(now - last)
        holdups.append(worst)
        last = now
        if now > end:
            break
    return times, holdups
