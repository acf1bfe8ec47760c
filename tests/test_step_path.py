"""A loop that marks its steps with step() or phase() stays on the general path while it marks
(no round trip through the fast path per step), records every step once with the block's time
as compute, and returns to the fast path once it stops marking."""
import time
from time import perf_counter_ns

import starvewatch
from tests.conftest import shipped_column, shipped_steps


def test_marked_steps_stay_on_the_general_path_and_keep_their_measured_blocks(memory_run):
    session, transport = memory_run
    iterator = iter(starvewatch.watch(list(range(36)), "marked"))
    classes, inner_ns, outer_ns = [], {}, {}
    for i, _ in enumerate(iterator):
        classes.append(type(iterator).__name__)
        if i < 12:  # step() on every batch
            t_outer = perf_counter_ns()
            with starvewatch.step():
                t_inner = perf_counter_ns()
                time.sleep(0.002)
                inner_ns[i] = perf_counter_ns() - t_inner
            outer_ns[i] = perf_counter_ns() - t_outer
            time.sleep(0.001)  # outside the block: other, not compute
        elif i < 24:  # phase() only
            t_outer = perf_counter_ns()
            with starvewatch.phase("forward"):
                t_inner = perf_counter_ns()
                time.sleep(0.001)
                inner_ns[i] = perf_counter_ns() - t_inner
            outer_ns[i] = perf_counter_ns() - t_outer
        else:  # no marks: the fast path again
            time.sleep(0.001)
    starvewatch.finish()
    # Every step after the first marked one, while the loop marks, was on the general path
    # (the first marked step began on the fast path: its mark switched it back).
    assert classes[1:25] == ["WatchedIterator"] * 24, classes
    # Once the marks stop, at most one step on the general path, then the fast path.
    assert classes[26:] == ["FastWatchedIterator"] * 10, classes
    assert shipped_steps(transport) == [("marked", 0, i) for i in range(36)]
    computes = shipped_column(transport, "compute_ns", "marked")
    others = shipped_column(transport, "other_ns", "marked")
    for i in range(12):  # the step() block: at least what the test timed inside, at most around it
        assert inner_ns[i] <= computes[i] <= outer_ns[i], (i, inner_ns[i], computes[i], outer_ns[i])
        assert others[i] >= 1_000_000, (i, others[i])
    for i in range(12, 36):  # no step() block: the whole loop body is compute
        assert computes[i] >= 1_000_000 and others[i] == 0, (i, computes[i], others[i])
    phases = [p for payload in transport.payloads for p in payload["phases"]]
    forward = {p[2]: p[4] for p in phases if p[3] == "forward"}
    assert sorted(forward) == list(range(12, 24))
    assert all(inner_ns[i] <= forward[i] <= outer_ns[i] for i in range(12, 24)), forward
