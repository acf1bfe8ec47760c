"""The hot path: watched loaders and their per-epoch iterators, plus `step()` and `phase()`.

Per batch the training thread reads the clock twice and appends both reads to a list (the
fast path's Segment); the general path appends one tuple per step to the shared buffer. Exact
totals are summed from those records on the shipper thread; only a record that the full
buffer drops is added into the totals here, so totals stay exact even when records are lost.
"""
from __future__ import annotations

import copy
import copyreg
import functools
import threading
import weakref
from threading import get_ident
from time import perf_counter_ns as _now
from time import process_time_ns, thread_time_ns

from .introspect import leading_dim
# The records appended below are laid out as record_layout.py says (FAST_RECORD_LEN from the
# fast path, FULL_RECORD_LEN from the general one): delivery reads them by those positions.
from ..record_layout import ENDED_KEYS, FAST_RECORD_LEN, FULL_RECORD_LEN, Segment  # noqa: F401


class _ActiveStacks:
    """Per thread: weak references to the iterators of the epochs in progress on that thread,
    innermost last (`ACTIVE.stack()`; `ACTIVE.local.stack` is the same list, or missing on a
    thread that never started an epoch). `step()` and `phase()` attribute to the top one of
    their own thread; an epoch that starts while other loaders' steps of the same thread are
    open (validation inside a training step) is taken out of those steps. Weak, so that a loop
    that breaks drops its iterator (and its worker processes) at once. `by_thread()` lists
    every thread's stack, for the stall detector (sampler thread)."""

    def __init__(self) -> None:
        self.local = threading.local()  # a plain one: its attributes are read per step()
        self._all: dict = {}  # thread ident -> that thread's stack (a reused ident replaces a dead thread's)

    def stack(self) -> list:
        try:
            return self.local.stack
        except AttributeError:
            stack = self.local.stack = []
            self._all[get_ident()] = stack
            return stack

    def by_thread(self) -> list:
        """(thread ident, its stack) for every thread that started an epoch."""
        return list(self._all.items())

    def clear(self) -> None:
        """Every thread's stack (a forked child owns none of the parent's epochs)."""
        for _, stack in self.by_thread():
            stack.clear()
        self._all.clear()
        self.local = threading.local()


ACTIVE = _ActiveStacks()

# (loader state, when iter() was called, thread ident) while iter(loader) runs (worker start-up), innermost
# last: the stall detector reads it (and each iterator's waiting_since()) instead of the
# training thread's frames, which another thread cannot walk safely (CPython 3.11 can crash:
# python/cpython#111363).
STARTING: list = []


class WatchedIterator:
    """One epoch of a watched loader: every `iter()` of the loader makes a new one."""

    __slots__ = ("_it", "_state", "_buffer", "_capacity", "_key", "_epoch", "_step",
                 "_t_call", "_t_ret", "_extra_wait", "_open", "_marked", "_excluded", "_step_ns",
                 "_step_used", "_in_step", "_phases", "_bs", "_first", "_probe_bs", "_startup",
                 "_parents", "_t_epoch", "_gpu", "_token", "_ended", "_wref",
                 "_cpu_probe", "_times", "_segment", "_reads_left", "_t_wait",
                 "_spans", "_active", "_sw_profile_name", "__weakref__")

    # What a segment's clock reads are kept in: a list (the Python core) or the compiled core's
    # _ccore.Times (int64 reads, ints made when the shipper reads them); hooks/core.py sets it.
    _new_times = list

    def __init__(self, inner, state, t_iter_call: int, t_iter_ret: int) -> None:
        self._it = inner
        self._state = state
        self._buffer = state.buffer
        self._capacity = state.capacity
        self._epoch = state.totals.epochs
        # The thread (lane) is part of the key: delivery subtracts the waits of the other
        # loaders of the same thread from a step's compute (records.columns, overlap.py).
        self._key = (state.index, self._epoch, get_ident())
        state.totals.epochs += 1
        self._step = 0
        self._open = False
        self._extra_wait = 0  # the epoch's start-up, added to the first step's wait
        self._marked = False  # step(), phase(), a nested loop or a CUDA event touched this step
        self._excluded = 0
        self._spans = None  # (start, end) of the epochs nested in the open step, for delivery
        self._step_ns = 0
        self._step_used = False
        self._in_step = False
        self._phases = None
        self._bs = state.fixed_batch_size
        self._probe_bs = state.fixed_batch_size is None
        self._first = True
        self._startup = t_iter_ret - t_iter_call  # worker spawn: wait of the first step
        self._t_epoch = t_iter_call
        self._gpu = state.session.gpu_timer()
        self._token = None
        self._ended = False
        self._cpu_probe = False  # armed by the sampler: measure this wait's CPU time once
        self._times = None  # the fast path's clock reads (a Segment's list) while it runs
        self._segment = None
        self._reads_left = 0  # how long that list may grow: the buffer's room, in clock reads
        self._t_wait = 0  # when the general path's next() began, while it runs (else 0)
        active = self._active = ACTIVE.stack()  # this thread's: _end may run on another one
        # The innermost steps open on this thread (one loader's, or those of loaders advanced
        # together), down to the ones they are nested in: an epoch that ends inside them is
        # taken out of each (validation inside a training step).
        parents, ancestors = None, set()
        for ref in reversed(active):
            if ref in ancestors:
                break
            parent = ref()
            if parent is not None and parent._open:
                parents = (parents or ()) + ((ref, parent.current_step()),)
                ancestors.update(r for r, _ in parent._parents or ())
        self._parents = parents
        self._wref = weakref.ref(self)
        active.append(self._wref)
        state.current = self._wref
        state.session.live_iterators.add(self)

    def __iter__(self):
        return self

    def __next__(self):
        """The general path: first batch of an epoch, a batch size that changed, CUDA events."""
        t_call = _now()
        if self._segment is not None:
            self._leave_fast()
        # A step that step() or phase() marked is followed by one they mark too, as a rule:
        # the next one stays on this path rather than a round trip through the fast path (a
        # Segment and two class switches per step: ~9,000 instructions of a ~26,000 one,
        # benchmarks/instructions_per_thread.py step).
        user_marked = self._close_step(t_call) if self._open else False
        it = self._it
        if it is None:
            raise StopIteration
        gpu = self._gpu
        token = gpu.begin() if gpu is not None else None
        probe = self._cpu_probe  # read once: the sampler thread may arm it meanwhile
        if probe:  # (one branch whether probed or not: the unprobed step pays nothing more)
            cpu0, process_cpu0 = thread_time_ns(), process_time_ns()
        self._t_wait = t_call
        try:
            batch = next(it)
        except BaseException as exc:
            self._t_wait = 0
            if token is not None:
                gpu.release(token)
            self._failed(exc, t_call)
            raise
        t_ret = _now()
        self._t_wait = 0
        if probe:
            # Is waiting CPU work (loading on this thread) or idle (sleeps, reads, workers)?
            self._cpu_probe = False
            totals = self._state.totals
            totals.wait_probe_cpu_ns += thread_time_ns() - cpu0
            totals.wait_probe_process_cpu_ns += process_time_ns() - process_cpu0
            totals.wait_probe_ns += t_ret - t_call
        self._t_call = t_call
        self._t_ret = t_ret
        self._open = True
        if token is not None:
            gpu.end(token)
            self._token = token
            self._marked = True
        if self._first:
            self._first_batch(batch)
        elif self._probe_bs:
            bs = leading_dim(batch)
            if bs != self._bs:  # a new batch size: the fast path again once it repeats (a loader
                self._bs = bs   # whose sizes vary batch to batch stays here, without a Segment each)
                return batch
        if token is None and not user_marked and not self._marked and not self._extra_wait:
            # (the first step closes here, with its start-up); with CUDA events, the fast path
            # runs the steps between two measured ones
            if gpu is not None:
                self.__class__ = FastGpuWatchedIterator
            else:
                self._enter_fast()
        return batch

    def _enter_fast(self) -> None:
        """From the next batch on, the fast path: clock reads into a new Segment's list, as
        many as the buffer has room for (two per step). A loop whose shipper does not keep up
        stays on the general path, which drops and counts, until the shipper has taken enough
        of the segments: so the memory held stays bounded by twice the buffer's capacity.

        The room is the buffer's less the reads that every segment of this buffer holds and
        the shipper has yet to take (a running one: as many as it may still get): this
        epoch's earlier ones, those of the epochs before (a loader iterated or watched again
        before the shipper took the last one: each new epoch used to get the whole room
        again, issue 42) and the other loaders'. The last segment need not be taken yet:
        waiting for it (ended by the shipper's rotation or the sampler's CPU probe, while the
        shipper was cycling) ran about half of a fast loop's batches on the general path."""
        segments = self._state.segments
        held = 0
        for segment in segments[:]:  # a copy: another thread's loader may change the list
            if segment.done():
                try:
                    segments.remove(segment)
                except ValueError:  # that other thread removed it first
                    pass
            else:  # (final read before the length: a final segment gets no more reads)
                held += (len(segment.times) if segment.final else segment.room) - 2 * segment.taken
        room = 2 * (self._capacity - len(self._buffer)) - held  # in clock reads
        if room < 2:
            return
        times = self._new_times((self._t_call, self._t_ret))  # the open step is the segment's first
        segment = Segment(self._key, self._step, self._bs, times, self._wref, room)
        segments.append(segment)
        self._buffer.append(segment)  # the shipper finds it in order with this loader's records
        self._times, self._segment, self._reads_left = times, segment, room
        self.__class__ = FastWatchedIterator

    def _leave_fast(self) -> None:
        """Back from the fast path (on the training thread, or at the end of the epoch): the
        step and clocks the general path keeps, from the segment's reads; the segment is final."""
        segment, times = self._segment, self._times
        self._segment = self._times = None
        n = len(times)
        self._step = segment.base + (n - 1) // 2
        if n % 2 == 0:  # the last step is open (called and returned): the general path closes it
            self._t_call, self._t_ret = times[-2], times[-1]
        else:  # the last read was a call that did not return (the end, an exception)
            self._open = False
        segment.final = True

    def waiting_since(self) -> int | None:
        """When the batch being waited for was asked for (perf_counter ns), or None when no
        next() of this iterator is in progress. Read by the sampler thread."""
        times = self._times
        if times is not None:  # the fast path: a call without its return is in progress
            n = len(times)
            return times[n - 1] if n % 2 else None
        return self._t_wait or None

    def open_wait(self) -> tuple | None:
        """(key, t_call, t_return, wait ns) of the step in progress when its batch has come
        back but no record holds it yet, else None. Read by the shipper thread: delivery needs
        every wait of a thread that ended before a step it subtracts them from (overlap.py)."""
        key, times = self._key, self._times
        if times is not None:  # the fast path: an even count means called and returned
            n = len(times)
            return (key, times[n - 2], times[n - 1], times[n - 1] - times[n - 2]) if n % 2 == 0 else None
        if not self._open or self._ended:
            return None
        t_call, t_ret = self._t_call, self._t_ret  # two reads: another step may come between
        if not t_call <= t_ret or not self._open:
            return None
        return key, t_call, t_ret, t_ret - t_call + self._extra_wait

    def current_step(self) -> int:
        """The step in progress (or the next one), also while the fast path runs."""
        segment, times = self._segment, self._times
        if segment is not None and times is not None:
            return segment.base + (len(times) - 1) // 2
        return self._step

    def mark(self) -> None:
        """This step needs the full path (step(), phase(), a nested loop, a CPU probe)."""
        self._marked = True
        if type(self) is not WatchedIterator:
            self.__class__ = WatchedIterator

    def _failed(self, exc: BaseException, t_call: int) -> None:
        t = _now()
        # Worker join at the epoch's end (or a failing loader): wait, but not a step. Its
        # interval goes to delivery as a mark: it is no other loader's compute either.
        self._state.totals.epoch_end_wait_ns += t - t_call
        if len(self._buffer) < self._capacity:
            self._buffer.append((self._key, t_call, t, t - t_call, "end"))
        if isinstance(exc, StopIteration):
            self._end(t)

    def _fast_failed(self, exc: BaseException, t_call: int) -> None:
        """The fast path's next() raised (the end of the epoch, a failing loader): shared by
        the Python and the compiled fast path (hooks/core.py), which re-raise after it."""
        self.__class__ = WatchedIterator
        self._leave_fast()  # the step was closed by the call's clock read; none is open
        self._failed(exc, t_call)

    def _fast_new_batch_size(self, t_call: int, t_ret: int, bs) -> None:
        """The fast path's batch (returned at t_ret) has another leading dimension than the
        segment's (both cores): the segment ends with its call, and this step is the general
        path's, which records it with its own batch size."""
        self.__class__ = WatchedIterator
        self._leave_fast()  # the last read is t_call, which closed the step before
        self._t_call, self._t_ret, self._bs = t_call, t_ret, bs
        self._open = True

    def _gpu_fast_drop(self, t_call: int) -> None:
        """The CUDA fast path's step closed by `t_call` finds the buffer full (both cores)."""
        self._drop(self._t_ret - self._t_call, t_call - self._t_ret, 0, None)

    def _gpu_fast_failed(self, exc: BaseException, t_call: int) -> None:
        """The CUDA fast path's next() raised: shared by both cores, which re-raise after it."""
        self._t_wait = 0
        self._open = False  # the step was recorded before the call
        self.__class__ = WatchedIterator
        self._failed(exc, t_call)

    def rotate(self, segment) -> None:
        """Called from the shipper thread: end this fast-path segment at the next batch (the
        general path starts a new one), so that no segment's list grows without bound."""
        if self._segment is segment and type(self) is FastWatchedIterator:
            self.__class__ = WatchedIterator

    def probe_cpu(self) -> None:
        """Called from the sampler thread: measure the CPU time of the next wait (one step,
        on the general path; the iterator returns to the fast class after it)."""
        if not self._ended:
            self._cpu_probe = True
            if type(self) is not WatchedIterator:
                self.__class__ = WatchedIterator  # the probe runs on the full path

    def _first_batch(self, batch) -> None:
        self._first = False
        key = self._key
        if key[2] != get_ident():  # iter() on one thread, the batches taken on another
            self._key = (key[0], key[1], get_ident())
        self._extra_wait = self._startup
        self._startup = 0
        if self._probe_bs:
            self._bs = leading_dim(batch)
            # Nothing batch-shaped in the first batch: stop looking for this epoch.
            self._probe_bs = self._bs is not None

    def _drop(self, wait: int, compute: int, other: int, token) -> None:
        """The buffer is full: the record is lost, its durations are not."""
        totals = self._state.totals
        totals.dropped_records += 1
        totals.steps += 1
        totals.wait_ns += wait
        totals.compute_ns += compute
        totals.other_ns += other
        if self._bs is not None:
            totals.samples += self._bs
        else:
            totals.samples_known = False
        if token is not None:
            self._gpu.release(token)

    def _close_step(self, t_end: int) -> bool:
        """Record the open step; True when step() or phase() marked it."""
        t_ret = self._t_ret
        wait = t_ret - self._t_call + self._extra_wait
        self._extra_wait = 0
        loop_ns = t_end - t_ret - self._excluded
        phases = self._phases
        used = self._step_used
        if used:
            compute = self._step_ns
            other = loop_ns - compute if loop_ns > compute else 0
        else:
            compute, other = (loop_ns if loop_ns > 0 else 0), 0
        buffer = self._buffer
        if len(buffer) < self._capacity:  # (no test here of what delivery needs: each costs more)
            buffer.append((self._key, self._step, self._t_call, wait, compute, self._bs,
                           other, self._token, phases, t_ret, t_end, self._spans,
                           self._t_epoch))
        else:
            self._drop(wait, compute, other, self._token)
        self._step += 1
        self._open = False
        self._marked = False
        self._excluded = 0
        self._spans = None
        self._step_ns = 0
        self._step_used = False
        self._in_step = False
        self._phases = None
        self._token = None
        return used or phases is not None

    def _end(self, t_end: int) -> None:
        """The epoch is over: exhausted, dropped (`break`) or closed by `finish()`."""
        if self._ended:
            return
        self._ended = True
        if self._segment is not None:
            self._leave_fast()
        if self._open:
            self._close_step(t_end)
        self.__class__ = WatchedIterator
        if self._step == 0 and self._startup:
            self._state.totals.epoch_end_wait_ns += self._startup
        for ref, step in self._parents or ():
            parent = ref()
            if parent is not None and parent._open and parent.current_step() == step:
                parent._excluded += t_end - self._t_epoch
                parent._spans = (parent._spans or ()) + ((self._t_epoch, t_end),)
                parent.mark()
        self._parents = None
        ENDED_KEYS.append(self._key)  # the shipper learns which threads had several loaders
        self._it = None  # never pin a finished inner iterator (it may hold worker processes)
        active = self._active
        if active and active[-1] is self._wref:
            active.pop()
        elif self._wref in active:
            active.remove(self._wref)
        self._state.session.live_iterators.discard(self)

    def close(self) -> None:
        self._end(_now())

    def __del__(self):
        try:
            if not self._ended:
                self._end(_now())
        except Exception:  # interpreter shutdown: nothing may raise from here
            pass


class FastWatchedIterator(WatchedIterator):
    """The steady state of an epoch: what almost every batch runs. An iterator is switched to
    this class after a batch with an open, unmarked step, no CUDA events and the batch size of
    the one before, and back to the full path by anything that needs it (`mark()`, a CPU probe,
    the shipper starting a new segment, an exception, the end of the epoch, a batch of another
    size where the size is read from each batch), which reads the step and the clocks back from
    the segment. So the hot path is one length check and two clock reads appended to a list
    (~300 ns on a 2-core VM where each read is ~65 ns), plus `leading_dim()` of the batch for a
    loader whose batch size its settings do not give (a list, a generator, a batch_sampler)."""

    __slots__ = ()

    def __next__(self):
        times = self._times
        if len(times) >= self._reads_left:  # the buffer's room is used up: the general path
            self.__class__ = WatchedIterator
            return WatchedIterator.__next__(self)
        t_call = _now()
        times.append(t_call)  # closes the previous step; an odd count means "waiting since"
        try:
            batch = next(self._it)
        except BaseException as exc:
            self._fast_failed(exc, t_call)
            raise
        if self._probe_bs:  # no batch size from the loader's settings: each batch's is read
            t_ret = _now()
            bs = leading_dim(batch)
            if bs != self._bs:
                self._fast_new_batch_size(t_call, t_ret, bs)
            else:
                times.append(t_ret)
            return batch
        times.append(_now())
        return batch


class FastGpuWatchedIterator(WatchedIterator):
    """The fast path of a run that uses CUDA: the steps between two measured ones (hooks/cuda.py
    measures one in `every`). One countdown more than FastWatchedIterator; when it runs out,
    the step goes to the full path, which records the events."""

    __slots__ = ()

    def __next__(self):
        gpu = self._gpu
        countdown = gpu._countdown - 1
        if countdown <= 0:  # this step is measured: the full path (begin() draws the next gap)
            self.__class__ = WatchedIterator
            return WatchedIterator.__next__(self)
        gpu._countdown = countdown
        t_call = _now()
        buffer = self._buffer
        if len(buffer) < self._capacity:
            buffer.append((self._key, self._step, self._t_call, self._t_ret, t_call, self._bs))
        else:
            self._gpu_fast_drop(t_call)
        self._step += 1
        self._t_wait = t_call
        try:
            batch = next(self._it)
        except BaseException as exc:
            self._gpu_fast_failed(exc, t_call)
            raise
        self._t_wait = 0
        self._t_call = t_call
        self._t_ret = _now()
        if self._probe_bs:  # no batch size from the loader's settings: each batch's is read
            self._bs = leading_dim(batch)
        return batch


def start_epoch(state, make_inner):
    state = state.attached()
    t0 = _now()
    starting = (state, t0, get_ident())
    STARTING.append(starting)
    try:
        inner = make_inner()
    finally:
        STARTING.remove(starting)
    return WatchedIterator(inner, state, t0, _now())


# ---- the wrappers ------------------------------------------------------------------------

def watched_dataloader_class(cls: type, state, tuner=None) -> type:
    """A subclass of the loader's own class that only replaces `__iter__`: the object stays
    an instance of DataLoader (and of the user's subclass) with every attribute it had.

    One subclass per watched loader, holding its state: code that rebuilds a loader from its
    type (Lightning's `type(loader)(**kwargs)` to add a DistributedSampler) gets a loader
    watched under the same name. A copy or deepcopy stays watched (the same loader); pickling
    gives the loader as it was before `watch()`, since the run lives in this process."""
    base_iter = cls.__iter__

    if tuner is None:
        def __iter__(self):
            return start_epoch(type(self)._starvewatch_state, lambda: base_iter(self))
    else:  # watch(tune=True): each epoch's iterator comes from the tuner (live_tuner.py)
        def __iter__(self):
            return start_epoch(type(self)._starvewatch_state, lambda: tuner.epoch(self, base_iter))

    def __reduce_ex__(self, protocol):
        # copyreg's reconstructor (what protocols 0 and 1 use): unpickling needs no starvewatch
        return copyreg._reconstructor, (cls, object, None), _plain_state(self)

    return type(cls.__name__, (cls,), {
        "__iter__": __iter__, "__reduce_ex__": __reduce_ex__, "__copy__": _copy,
        "__deepcopy__": _deepcopy, "__starvewatch_watched__": True, "_starvewatch_state": state,
        "_starvewatch_tuner": tuner,
        "__module__": cls.__module__, "__qualname__": cls.__qualname__})


def _plain_state(obj):
    getstate = getattr(obj, "__getstate__", None)  # object.__getstate__ is Python 3.11+
    return getstate() if getstate is not None else dict(obj.__dict__)


def _copy(self):
    new = object.__new__(type(self))
    new.__dict__.update(self.__dict__)
    return new


def _deepcopy(self, memo):
    new = object.__new__(type(self))
    memo[id(self)] = new
    new.__dict__.update(copy.deepcopy(self.__dict__, memo))
    return new


class WatchedIterable:
    """Wraps any other iterable (a list, a streaming pipeline, a generator...)."""

    __starvewatch_watched__ = True

    def __init__(self, obj, state) -> None:
        self.__dict__["_sw_obj"] = obj
        self.__dict__["_sw_state"] = state

    def __iter__(self):
        obj = self._sw_obj
        epoch = start_epoch(self._sw_state, lambda: iter(obj))
        _iterable_epoch_hook(epoch, obj, self._sw_state.name)  # per epoch: a profiler may see its next()
        return epoch

    def __len__(self):
        return len(self._sw_obj)

    def __getattr__(self, name):
        return getattr(self.__dict__["_sw_obj"], name)

    def __reduce_ex__(self, protocol):
        return _unwrapped, (self._sw_obj,)  # another process: the object as it was

    def __copy__(self):
        return type(self)(self._sw_obj, self._sw_state)

    def __deepcopy__(self, memo):
        return type(self)(copy.deepcopy(self._sw_obj, memo), self._sw_state)

    def __repr__(self) -> str:
        return f"watched({self._sw_obj!r})"


class WatchedIteratorProxy(WatchedIterable):
    """For objects that are iterators themselves, so `next(watched)` works as before."""

    def __next__(self):
        direct = self.__dict__.get("_sw_direct")
        if direct is None or direct._ended:
            direct = self.__dict__["_sw_direct"] = iter(self)
        return next(direct)


def _unwrapped(obj):
    return obj


def is_watched(obj) -> bool:
    return getattr(type(obj), "__starvewatch_watched__", False)


# ---- step() and phase() --------------------------------------------------------------------


def _no_epoch_hook(epoch, obj, name: str) -> None:
    pass


# Called with each new epoch of a wrapped iterable (never per batch): the session installs
# hooks/profiler_marks.track, so the profiler sees those epochs' next(); the hot path imports
# nothing of it.
_iterable_epoch_hook = _no_epoch_hook


def set_iterable_epoch_hook(hook) -> None:
    global _iterable_epoch_hook
    _iterable_epoch_hook = hook


def _no_loaders_by_name(name: str):
    return None


# `step("train")` finds a loader by name in the current run. Runs live in the session, which
# installs its lookup here (set_loader_lookup): the hot path imports nothing of the session.
_loader_by_name = _no_loaders_by_name


def set_loader_lookup(lookup) -> None:
    """`lookup(name)`: the state of the current run's loader of that name, or None."""
    global _loader_by_name
    _loader_by_name = lookup


def _target(loader):
    if loader is None:
        try:
            active = ACTIVE.local.stack
        except AttributeError:  # no epoch ever began on this thread
            return None
        return active[-1]() if active else None
    state = None
    if isinstance(loader, str):
        state = _loader_by_name(loader)
    elif is_watched(loader):
        state = getattr(type(loader), "_starvewatch_state", None) or loader.__dict__.get("_sw_state")
    ref = state.current if state is not None else None
    return ref() if ref is not None else None


class _StepTimer:
    """`with step():` marks the compute of the current step; outermost block counts."""

    __slots__ = ("_loader", "_it", "_t0", "_x0")

    def __init__(self, loader=None) -> None:
        self._loader = loader
        self._it = None

    def __enter__(self):
        it = _target(self._loader)
        if it is not None and it._open and not it._in_step:  # nested: outermost block counts
            it._in_step = True
            it.mark()
            self._it = it
            self._x0 = it._excluded  # epochs nested in the block are theirs, not this step's
            self._t0 = _now()
        else:
            self._it = None
        return self

    def __exit__(self, *exc) -> bool:
        it = self._it
        if it is not None:
            self._it = None
            t = _now()
            if it._open and it._in_step:
                # A loop of another loader run inside the block (validation inside a training
                # step) is that loader's time: taken out of the block as out of the loop.
                nested = it._excluded - self._x0
                block = t - self._t0 - (nested if nested > 0 else 0)
                it._step_ns += block if block > 0 else 0
                it._step_used = True
            it._in_step = False
        return False

    def __call__(self, fn):
        loader = self._loader

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with _StepTimer(loader):
                return fn(*args, **kwargs)
        return wrapper


class _PhaseTimer:
    """`with phase("forward"):` adds its duration to that phase of the current step."""

    __slots__ = ("name", "_it", "_t0")

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def __enter__(self):
        self._it = _target(None)
        self._t0 = _now()
        return self

    def __exit__(self, *exc) -> bool:
        t = _now()
        it = self._it
        if it is not None and it._open:
            phases = it._phases
            if phases is None:
                phases = it._phases = {}
                it.mark()
            phases[self.name] = phases.get(self.name, 0) + t - self._t0
        self._it = None
        return False

    def __call__(self, fn):
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with _PhaseTimer(name):
                return fn(*args, **kwargs)
        return wrapper


# The fast path's __next__: compiled (starvewatch._ccore) where it is available, else the
# Python one above; STARVEWATCH_CORE=python|c forces either (hooks/core.py).
from . import core as _core  # noqa: E402  (needs the classes above)

_core.select(FastWatchedIterator, WatchedIterator, FastGpuWatchedIterator)
