"""Several loaders on one thread: each step's compute without the other loaders' waits.

A step's compute is measured from its batch's return to its loader's next call. When loaders
are advanced together on one thread (`zip(a, b)`, a main and an auxiliary loader, Lightning's
CombinedLoader), that interval holds the other loaders' waits, and the time a thread spends
waiting for a watched loader is nobody's compute. `Lanes.adjust` takes those waits out, per
thread (the lane in each record's key), where the records become columns (records.columns),
on the clock they were read with, so the hot path pays nothing for it:

- other loaders' wait: the waits of the thread whose batch came back inside the step's
  interval (after this step's batch, by its loader's next call), less those inside the epochs
  nested in the step (validation inside a training step: already out of its compute); taken
  from `other` (time outside step() blocks) first, then from compute.
- shared: compute that another loader of the thread also counts (zip: each loader's step holds
  the loop body), so that the run counts it once: the part of the step before the last call of
  another loader inside it. The run's loop time is every loader's wait and compute less the
  shared part (analysis/summary.py).

The shipper ships every step closed by a cycle's horizon and, as marks, the waits that ended
by then in steps it does not ship yet (in progress, or held back; record_layout.py), so the
waits a step needs are here by the time the step is. They are kept per lane, one block per
chunk, until no step still to come can need them: a step shipped later either was in progress
at the last horizon (then a mark of that cycle or the one before gave its start) or began
after the horizon before. An iterator left unfinished with a step in progress holds nothing
back after RETAIN_NS; its step, if it ever ends, and the first steps after a take-over from a
dead sidecar may keep some other loaders' waits as compute.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate, chain, compress
from operator import itemgetter, sub

RETAIN_NS = 60 * 10**9
MAX_LANE_WAITS = 1 << 18  # the most waits a lane keeps, whatever RETAIN_NS says (memory bound)


def lane_of(key: tuple) -> int:
    return key[2] if len(key) > 2 else 0


class _Lane:
    __slots__ = ("blocks", "horizon", "marked_from", "marked_from_before", "newest", "kept", "view")

    def __init__(self) -> None:
        # (newest time in it, wait ends, wait ns, calls, from marks, keys, oldest time in it),
        # oldest first
        self.blocks: list[tuple] = []
        self.horizon = 0  # the last cycle's horizon: a step that began after it may come
        self.marked_from = INF  # the earliest start of a step in progress, this cycle's marks
        self.marked_from_before = INF  # the same for the cycle before
        self.newest = 0
        self.kept = 0  # waits in the blocks
        self.view = None  # (wait ends sorted, cumulative wait ns, calls sorted), until blocks change


INF = float("inf")


class Lanes:
    """The waits of each thread that steps still to come may hold (see the module's doc)."""

    def __init__(self) -> None:
        self.lanes: dict[int, _Lane] = {}

    def horizon(self, t: int) -> None:
        """A new cycle's records begin: drop what no step still to come can need."""
        for lane in self.lanes.values():
            floor = min(lane.horizon, lane.marked_from, lane.marked_from_before)
            blocks = lane.blocks
            while blocks and (blocks[0][0] < floor or lane.kept > MAX_LANE_WAITS):
                lane.kept -= len(blocks.pop(0)[1])
                lane.view = None
            lane.horizon = max(lane.horizon, t)
            lane.marked_from_before, lane.marked_from = lane.marked_from, INF

    def register(self, lane_input: tuple) -> None:
        """Keep one chunk's waits and calls (from `columns`); every chunk of a batch is
        registered before any is adjusted, since a step's waits may come in a later chunk of
        its cycle (the shipper's order is by loader, not by time)."""
        keys, t_calls, t_rets, t_ends, nested, marks = lane_input
        for mark in marks:
            if len(mark) == 1:
                self.horizon(mark[0])
        mark_lanes: dict[int, list] = {}
        for mark in marks:
            if len(mark) > 1:
                mark_lanes.setdefault(lane_of(mark[0]), []).append(mark)
        by_lane = self._by_lane(keys)
        for lane_id in set(by_lane) | set(mark_lanes):
            lane = self.lanes.get(lane_id)
            if lane is None:
                lane = self.lanes[lane_id] = _Lane()
            if lane_id in mark_lanes:
                self._add_marks(lane, mark_lanes[lane_id])
            if lane_id in by_lane:
                self._add_steps(lane, by_lane[lane_id], keys, t_calls, t_rets, t_ends, nested)

    def adjust(self, lane_input: tuple, computes: list, others: list) -> tuple[list, list, list, list]:
        """Take the other loaders' waits out of one registered chunk's `computes` and `others`
        (changed in place) and return (computes, others, shared ns, other loaders' wait ns)."""
        keys, _, t_rets, t_ends, nested, _ = lane_input
        n = len(keys)
        shared, taken = [0] * n, [0] * n
        for lane_id, positions in self._by_lane(keys).items():
            self._subtract(self.lanes[lane_id], positions, keys, t_rets, t_ends, computes, others, nested,
                           shared, taken)
        return computes, others, shared, taken

    @staticmethod
    def _by_lane(keys: list) -> dict:
        lanes_of = {key: lane_of(key) for key in set(keys)}
        if len(set(lanes_of.values())) <= 1:
            return {lane_id: range(len(keys)) for lane_id in lanes_of.values()}
        lane_col = list(map(lanes_of.__getitem__, keys))
        return {lane_id: [i for i, x in enumerate(lane_col) if x == lane_id] for lane_id in set(lane_col)}

    def _add_marks(self, lane: _Lane, marks: list) -> None:
        by_key: dict = {}
        for mark in marks:
            by_key.setdefault(mark[0], []).append(mark)
        for key, group in by_key.items():  # a block per key: its time span is that key's (_subtract)
            self._add_block(lane, [m[2] for m in group], [m[3] for m in group], [m[1] for m in group], True, {key})
        recent = [m[2] for m in marks if lane.newest - m[2] <= RETAIN_NS]  # not left unfinished
        if recent:
            lane.marked_from = min(lane.marked_from, min(recent))

    def _add_steps(self, lane: _Lane, positions, keys, t_calls, t_rets, t_ends, nested) -> None:
        whole = isinstance(positions, range)
        pick = (lambda col: col) if whole else (lambda col: list(map(col.__getitem__, positions)))  # noqa: E731
        calls, ends = pick(t_calls), pick(t_rets)
        step_ends = pick(t_ends)
        lane_waits = list(map(sub, ends, calls))  # a step's own [call, return]
        extra = []
        for i, (spans, startup, epoch_start) in nested.items():  # iter()'s start-up: a wait too
            if startup > 0 and (i in positions):
                extra.append((epoch_start + startup, startup))
        if extra:
            ends = ends + [e for e, _ in extra]
            lane_waits += [w for _, w in extra]
        self._add_block(lane, ends, lane_waits, calls + step_ends, False,
                        set(keys) if whole else set(pick(keys)))

    def _add_block(self, lane: _Lane, ends: list, lane_waits: list, calls: list, from_marks: bool,
                   keys: set) -> None:
        newest = max(max(ends, default=0), max(calls, default=0))
        oldest = min(min(ends, default=newest), min(calls, default=newest))
        lane.blocks.append((newest, ends, lane_waits, calls, from_marks, keys, oldest))
        lane.kept += len(ends)
        lane.view = None
        if newest > lane.newest:
            lane.newest = newest

    def _subtract(self, lane, positions, keys, t_rets, t_ends, computes, others, nested, shared, taken) -> None:
        if not positions:
            return
        # Only the waits that end, and the calls made, inside a step's (return, next call]
        # change it: a block wholly outside the chunk's steps changes none of them. A step's
        # own loader and epoch never waits or calls inside it, so with one key among the
        # steps and the blocks that overlap them there is nothing to take out. Epochs of one
        # loader that follow each other (a loader iterated again, watched again) land here:
        # building the view for them cost a sort of every kept wait per batch (issue 42).
        if isinstance(positions, range):  # the whole chunk (one lane): C-level over the lists
            lo, hi, step_keys = min(t_rets), max(t_ends), set(keys)
        else:
            lo, hi = min(map(t_rets.__getitem__, positions)), max(map(t_ends.__getitem__, positions))
            step_keys = set(map(keys.__getitem__, positions))
        if len(step_keys.union(*(block[5] for block in lane.blocks if block[6] <= hi and block[0] > lo))) < 2:
            return  # one loader (one epoch) in this stretch of this thread: nothing to take out
        if lane.view is None:
            ends, lane_waits, marked = [], [], {}
            for block in lane.blocks:
                if block[4]:
                    marked.update(zip(block[1], block[2]))  # a wait marked in several cycles
                else:
                    ends += block[1]
                    lane_waits += block[2]
            recorded = set(ends)  # a mark's step came since: its record counts, not the mark
            for end, wait in marked.items():
                if end not in recorded:
                    ends.append(end)
                    lane_waits.append(wait)
            pairs = sorted(zip(ends, lane_waits))
            lane.view = (list(map(itemgetter(0), pairs)), list(accumulate(map(itemgetter(1), pairs))),
                         sorted(set(chain.from_iterable(map(itemgetter(3), lane.blocks)))))
        ends_sorted, cumulative, calls = lane.view

        def waited_by(t: int) -> int:  # the thread's waits that ended by t (of those kept)
            i = bisect_right(ends_sorted, t)
            return cumulative[i - 1] if i else 0

        for i in positions:
            r, e = t_rets[i], t_ends[i]
            if e <= r:
                continue
            w_r = waited_by(r)
            waited = waited_by(e) - w_r
            spans = nested[i][0] if i in nested else None
            if spans:
                for start, end in spans:
                    waited -= waited_by(end) - waited_by(start)
            # The last call of another loader inside the step: until then, that loader's
            # step held this time too.
            j = bisect_left(calls, e) - 1
            last = None
            while j >= 0 and calls[j] > r:
                if spans and any(start <= calls[j] <= end for start, end in spans):
                    j -= 1
                    continue
                last = calls[j]
                break
            if waited > 0:
                other = others[i]
                from_other = other if other < waited else waited
                others[i] = other - from_other
                compute = computes[i]
                rest = waited - from_other
                from_compute = compute if compute < rest else rest
                computes[i] = compute - from_compute
                taken[i] = from_other + from_compute
            if last is not None:
                both = (last - r) - (waited_by(last) - w_r)
                if spans:
                    for start, end in spans:
                        if start >= r and end <= last:
                            both -= (end - start) - (waited_by(end) - waited_by(start))
                shared[i] = max(0, min(both, computes[i]))


def split_marks(records: list[tuple], lengths: list[int], mark_lengths: tuple) -> tuple[list, list]:
    """(records that are steps, marks), keeping order."""
    is_mark = [length in mark_lengths for length in lengths]
    return (list(compress(records, [not m for m in is_mark])), list(compress(records, is_mark)))
