"""Live tuning of one watched DataLoader (issue 39), applied at epoch boundaries.

`watch(loader, tune=True)` gives the loader a watched class whose `__iter__` asks its
`LoaderTuner` for each epoch's inner iterator (the untuned class is untouched: tune=False costs
the hot path nothing). Per epoch (the training thread, at iter()):

1. the epoch before ends the current window once it holds enough steps; the pure decision
   (analysis/live_tuning.py) says keep, revert, or the next candidate; no decision while a
   stall of this loader is open;
2. the configuration to run is put on the twin (hooks/torch_loader_internals.py: the private
   torch internals), the old workers are shut down and checked gone;
3. the user's RNG is drawn exactly as the untuned loader would (one base seed per iterator it
   would build), and that seed seeds the twin's private generator;
4. the epoch's batches go through `_TimedEpoch`: one clock read per batch, the loop's own step
   time (wait and compute), what the window is measured on.

A change that fails at iter() or at its first batch is reverted and the epoch starts again with
the last good configuration (no batch was delivered: none lost or doubled), tuning is off for
that loader, one console line says why. Nothing here raises into training."""
from __future__ import annotations

import logging
import sys
import threading
import warnings
import weakref
from collections import deque
from time import perf_counter_ns as _now

from ..analysis import live_tuning
from . import torch_loader_internals as internals

log = logging.getLogger("starvewatch.hooks")


class _BatchFeed:
    """One epoch's index batches, drawn from the user's batch_sampler once, shared by the
    iterators that take turns in that epoch: each `iter()` (torch calls it as it starts or resets
    an iterator) gives a reader; a stopped reader takes no more (the old iterator then delivers
    what its workers hold, in order, and ends), and the next one goes on where it stopped: every
    index batch exactly once, in the sampler's order."""

    def __init__(self, loader) -> None:
        self.source = loader.batch_sampler
        self._batches = iter(())
        self._readers: list = []
        self.taken = 0  # index batches handed out this epoch
        self.returned: deque = deque()  # handed to an iterator that failed before delivering: again first

    def start_epoch(self) -> None:
        self._batches = iter(self.source)  # lazy: a RandomSampler draws at its first batch, as untuned
        self._readers = []
        self.taken = 0
        self.returned.clear()

    def stop_readers(self) -> None:
        for reader in self._readers:
            reader.stopped = True

    def settle(self) -> None:
        """An iterator delivered its first batch: what its readers took is its to deliver."""
        for reader in self._readers:
            reader.kept = None

    def give_back(self) -> None:
        """The iterator that has delivered nothing yet failed: the index batches its readers took
        go first to the next one, in their order (none lost, none doubled)."""
        batches = []
        for reader in self._readers:
            if reader.kept:
                batches += reader.kept
            reader.kept, reader.stopped = None, True
        self.returned.extendleft(reversed(batches))
        self.taken -= len(batches)

    def __iter__(self):
        reader = _FeedReader(self)
        self._readers.append(reader)
        return reader

    def __len__(self):
        return len(self.source)


class _FeedReader:
    __slots__ = ("feed", "stopped", "kept")

    def __init__(self, feed: _BatchFeed) -> None:
        self.feed, self.stopped, self.kept = feed, False, []  # kept: until its iterator delivers

    def __iter__(self):
        return self

    def __next__(self):
        if self.stopped:
            raise StopIteration
        feed = self.feed
        batch = feed.returned.popleft() if feed.returned else next(feed._batches)
        feed.taken += 1
        if self.kept is not None:
            self.kept.append(batch)
        return batch


class _Switch:
    """The rest of an epoch switched in its middle: the old iterator's batches until it ends
    (its feed stopped), then the new one's."""

    __slots__ = ("it", "make_next", "tuner", "__weakref__")

    def __init__(self, old, make_next, tuner: "LoaderTuner") -> None:
        self.it, self.make_next, self.tuner = old, make_next, tuner

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.it)
        except StopIteration:
            if self.make_next is None:
                raise
        make, self.make_next = self.make_next, None
        it = None
        try:
            it = self.it = make()
            batch = next(it)
        except StopIteration:
            raise
        except Exception as exc:  # the new configuration fails at its start: back, none lost
            self.it = self.tuner.failed(exc, it)
            batch = next(self.it)
        self.tuner.settled()
        return batch

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "it"), name)


class _TimedEpoch:
    """The twin's epoch iterator, with the loop's clock read at every next()."""

    __slots__ = ("_it", "_times", "_tuner", "_switch_at", "__weakref__")

    def __init__(self, it, times: list, tuner: "LoaderTuner", switch_at: int = 1 << 62) -> None:
        self._it, self._times, self._tuner, self._switch_at = it, times, tuner, switch_at

    def __iter__(self):
        return self

    def __next__(self):  # the first batch; from the second on, _SteadyTimedEpoch's
        self._times.append(_now())
        self.__class__ = _SteadyTimedEpoch
        try:
            batch = next(self._it)
        except StopIteration:
            raise
        except Exception as exc:  # a change that breaks the first batch: back and again
            self._it = self._tuner.failed(exc, self._it)
            batch = next(self._it)
        self._tuner.settled()
        return batch

    def __getattr__(self, name):  # hang.py and the stall detector read the torch iterator's fields
        return getattr(object.__getattribute__(self, "_it"), name)


class _SteadyTimedEpoch(_TimedEpoch):
    """After the first batch: one clock read and one append per batch (~0.3 us in all)."""

    __slots__ = ()

    def __next__(self):
        times = self._times
        times.append(_now())
        if len(times) >= self._switch_at:  # a window's worth of steps in this epoch: decide now
            self._tuner.mid_epoch(self)
        try:
            return next(self._it)
        except StopIteration:
            raise
        except Exception as exc:  # batches were delivered: it raises as untuned, tuning goes off
            self._tuner.crashed(exc)
            raise


class LoaderTuner:
    """Tuning state of one watched loader (kept across the loader objects a call site rebuilds:
    the found configuration is applied to each new one)."""

    def __init__(self, state, base_class: type, loader) -> None:
        self.state = state
        self.base_class = base_class
        self.lock = threading.Lock()
        self.plan: live_tuning.TuningPlan | None = None
        self.disabled: str | None = None
        self.twin = None
        self.twin_owner = None  # weak reference to the user object the twin copies
        self.twin_config: dict | None = None
        self.generator = internals.private_generator(0)
        self.drawn_for: weakref.WeakSet = weakref.WeakSet()  # persistent user loaders that drew once
        self.times: list | None = None  # the running epoch's clock reads
        self.window: list[int] = []  # step durations of the open window (ns)
        self.window_epochs = 0  # epochs begun in the open window (their first steps: start-up)
        self.epoch_iter = None  # a weak reference to the last epoch's torch iterator
        self.records: list[dict] = []
        self.loading_waits = False
        self.feed: _BatchFeed | None = None  # the twin's batch_sampler (map-style loaders)
        self.loader_ref = None  # the user's loader of the running epoch
        self.samples_per_step = getattr(loader, "batch_size", None)
        self.advice = _AdviceThread(self)
        self.step = 0  # steps of every closed window: the same decision points on every rank
        self.board = None  # under torchrun with the agent's store: rank 0 decides for every rank
        self.running: dict | None = None  # with a board: the configuration every rank runs now
        self.last_point = -1  # with a board: the step of the last decision point passed
        self.user_config = live_tuning.tuned_part(state.config or {})
        self.user_persistent = bool(self.user_config["persistent_workers"] and self.user_config["num_workers"])
        if not internals.supported():
            self._off(f"torch {internals.torch_version()} is not one live tuning was checked on")
        elif not internals.is_plain_dataloader(loader):
            self._off(f"{type(loader).__name__} keeps state in its own iterator")
        elif state.session.world_size > 1:
            self.board = _board_for(state)
            ranks = f"rank {state.session.rank} of {state.session.world_size}"
            self._say(f"{ranks} tunes on its own measurements" if self.board is None else
                      f"{ranks}: rank 0 decides for every rank, at epoch boundaries")

    # ---- per epoch (training thread) ----------------------------------------------------------
    def epoch(self, loader, base_iter):
        """The inner iterator of one epoch of `loader`. Never raises what tuning caused."""
        if self.disabled and self.twin is None:
            return base_iter(loader)
        try:
            with self.lock:
                self._close_window()
                self.window_epochs += 1
                config = self._config()
                self._draw_seed(loader)
                twin = self._twin_for(loader, config)
                if self.feed is not None:
                    self.feed.start_epoch()
                times = self.times = [_now()]
            return self._start(twin, times, loader)
        except Exception as exc:
            return self._recover(exc, loader)

    def _start(self, twin, times, loader):
        try:
            it = _quiet_iter(twin)
        except Exception as exc:
            it = self.failed(exc, None)
        self.epoch_iter = weakref.ref(it) if _weakrefable(it) else None
        self.loader_ref = weakref.ref(loader)
        return _TimedEpoch(it, times, self, self._switch_at(len(self.window)))

    def _switch_at(self, held: int) -> int:
        """After how many clock reads of this epoch's list the window is decided mid-epoch:
        never without a feed (an IterableDataset, a loader without batch_sampler), once the
        search is over, or with too few batches left for a window."""
        if self.feed is None or self.disabled or self.plan is None or self.plan.done or self.board is not None:
            return 1 << 62
        return max(2, live_tuning.MID_EPOCH_WINDOW_STEPS - held) + 2

    def mid_epoch(self, epoch: "_TimedEpoch") -> None:
        """In the middle of an epoch (training thread, inside next()): decide on the window;
        a new configuration takes over after the old iterator's in-flight batches."""
        epoch._switch_at = 1 << 62
        try:
            with self.lock:
                if self.times is not epoch._times:
                    return  # not the running epoch's (another epoch began meanwhile)
                left = len(self.feed) - self.feed.taken if _has_len(self.feed) else 0
                if left < live_tuning.MIN_WINDOW_STEPS:
                    return  # the epoch's end is near: decided there
                before = dict(self.twin_config)
                times = epoch._times
                now = times[-1]
                self.times = list(times)  # the window so far (its last read: this call's)
                self._close_window(mid_epoch=True)
                del times[:]
                times.append(now)  # the next window's first step starts here
                self.times = times
                config = self._config()
                if config != before:
                    self.feed.stop_readers()
                    loader = self.loader_ref()
                    epoch._it = _Switch(epoch._it, lambda: self._continue(loader, config), self)
                epoch._switch_at = self._switch_at(0)
        except Exception as exc:  # the epoch goes on as it was; tuning off
            self._disable(_short(exc))

    def _continue(self, loader, config: dict):
        """The new iterator of a switched epoch: the old one has ended (its workers shut down
        by torch, or by _twin_for); it goes on with the feed's remaining index batches."""
        with self.lock:
            twin = self._twin_for(loader, config)
        it = _quiet_iter(twin)
        self.epoch_iter = weakref.ref(it) if _weakrefable(it) else None
        return it

    def _config(self) -> dict:
        if self.plan is None:
            self.plan = live_tuning.TuningPlan(self.state.config or {}, self._bounds())
            self.advice.request()  # ready, at the latest, for the second decision
        if self.board is not None:
            return self._config_on_board()
        if self.disabled or self.plan.done:
            return self.plan.current
        return self.plan.config()

    def _config_on_board(self) -> dict:
        """At an epoch boundary under torchrun: what every rank runs from here (read from what
        the board's thread swapped in: no store access). Rank 0 publishes its plan's next
        configuration for the next boundary (the windows between are not judged)."""
        board, rank = self.board, self.state.session.rank
        if self.running is None:
            self.running = dict(self.plan.current)
        if board.revert is not None:  # a rank could not apply one: every rank goes back, off
            self._disable(f"rank {board.revert.get('rank')} could not apply a change: {board.revert.get('reason')}")
            return live_tuning.tuned_part(board.revert["config"])
        if self.disabled:
            return self.running
        late = [d for d in board.due(self.step) if d["at_step"] <= self.last_point]
        applied = board.decisions[:board.applied]
        self.last_point = self.step
        if late:  # read after the decision point it was due at: this rank would differ
            board.publish_revert(self.running, f"rank {rank} read a decision late")
            self._disable("this rank read a decision after its step")
            return self.running
        if applied and applied[-1]["config"] != self.running:
            self.running = dict(applied[-1]["config"])
            self._record({"schema": live_tuning.SCHEMA, "decision": "applied", "step": self.step,
                          "config": dict(self.running), "rank": rank})
        wanted = self.plan.config() if not self.plan.done else self.plan.current
        pending = board.decisions[board.applied:]
        if rank == 0 and not pending and wanted != self.running:
            board.publish(wanted, at_step=self.step + 1)  # the next decision point, on every rank
        return self.running

    def close_at_end(self) -> None:
        """The run ends (finish()): the open window is decided on what it holds, so that the
        last configuration tried is judged (and the summary's final one is a measured one)."""
        try:
            self.advice.stop()
            if self.board is not None:
                self.board.stop_polling()
            with self.lock:
                self._close_window(final=True)
        except Exception as exc:  # the summary goes on without the last decision
            log.warning("starvewatch: tuning %r: last window: %s", self.state.name, _short(exc))

    def _close_window(self, final: bool = False, mid_epoch: bool = False) -> None:
        times, self.times = self.times, None
        if times and len(times) > 2:
            steps = [b - a for a, b in zip(times[1:], times[2:])]
            if steps:
                steps[0] += times[1] - times[0]  # the epoch's start-up is its first step's wait
            self.window.extend(steps)
            self.step += len(steps)
        if self.plan is None or self.disabled or self.plan.done:
            self.window, self.window_epochs = [], 0
            return
        if len(self.window) < (2 if final else live_tuning.MIN_WINDOW_STEPS):
            return
        steps, self.window = self.window, []
        epochs, self.window_epochs = self.window_epochs, 0
        if self.board is not None and (self.state.session.rank != 0 or self.running != self.plan.config()):
            return  # with a board: rank 0 judges windows that ran the plan's configuration only
        where = {"mid_epoch": True} if mid_epoch else {}
        if self._stall_open():  # no decision on a window a stall ran through: measured again
            self._record({"schema": live_tuning.SCHEMA, "decision": "stall_open",
                          "config": self.plan.config(), **where})
            return
        self.plan.bounds = self._bounds()
        if not final:
            self.plan.advice = self.advice.ready  # the last list computed; never waited for
        figures = live_tuning.window_figures(steps, self.samples_per_step, epochs)
        self._record(dict(self.plan.window_done(figures), **where))
        if not (final or self.plan.done):
            self.advice.request()  # for the next decision, on the run as it is now

    def _draw_seed(self, loader) -> None:
        """One draw of the user's RNG where the untuned loader would draw its base seed: every
        iter(), or a persistent loader's first only (the same count as without tuning)."""
        if self.user_persistent:
            if loader in self.drawn_for:
                return
            self.drawn_for.add(loader)
        seed = internals.draw_base_seed(loader.__dict__.get("generator"))
        self.generator.manual_seed(seed)

    def _twin_for(self, loader, config: dict):
        owner = self.twin_owner() if self.twin_owner is not None else None
        twin = self.twin
        rebuild = (twin is None or owner is not loader
                   or bool(config["persistent_workers"]) != bool(self.twin_config["persistent_workers"]))
        self._end_workers(twin if rebuild else (twin if config != self.twin_config else None))
        if rebuild:
            if owner is not loader:
                self.feed = _BatchFeed(loader) if internals.feeds_batches(loader) else None
            twin = self.twin = internals.make_twin(loader, self.base_class, config, self.generator, self.feed)
            self.twin_owner = weakref.ref(loader)
        elif config != self.twin_config:
            internals.apply_live(twin, config)
        self.twin_config = dict(config)
        return twin

    def _end_workers(self, changing) -> None:
        """Shut down the last epoch's workers (a loop that broke leaves them running) and those
        `changing` (a twin about to change) holds; the twin's persistent ones that go on are
        kept. A worker that stays alive raises (tuning then turns off)."""
        keep = internals.held_iterator(self.twin) if self.twin is not None and changing is None else None
        last = self.epoch_iter() if self.epoch_iter is not None else None
        held = internals.held_iterator(changing) if changing is not None else None
        ending = {id(it): it for it in (last, held) if it is not None and it is not keep}
        for it in ending.values():
            if not internals.shut_down(it):
                raise RuntimeError("a DataLoader worker did not exit")
        if held is not None:
            changing.__dict__["_iterator"] = None

    # ---- failures -------------------------------------------------------------------------
    def failed(self, exc: BaseException, it):
        """A configuration failed at iter() or its first batch: the last good one again (or,
        failing at the start, the user's own), tuning off for this loader. Returns the new
        epoch iterator; re-raises when the user's own configuration fails (not tuning's doing)."""
        config = self.twin_config or self.user_config
        good = self.plan.current if self.plan is not None else self.user_config
        if config == self.user_config and (self.plan is None or good == self.user_config):
            raise exc
        with self.lock:
            self._disable(f"{_short(exc)} with {_changes(good, config)}")
            if self.board is not None:  # every rank goes back to `good` at its next boundary
                self.running = dict(good)
                try:
                    self.board.publish_revert(good, self.disabled)
                except Exception as store_exc:  # the store gone: this rank alone reverts
                    log.warning("starvewatch: tuning: revert not published: %s", _short(store_exc))
            if it is not None:
                internals.shut_down(it)
            if self.feed is not None:
                self.feed.give_back()
            twin = self.twin
            if twin is not None:
                self._end_workers(twin)
            twin = self.twin = internals.make_twin(self.twin_owner(), self.base_class, good, self.generator,
                                                   self.feed)
            self.twin_config = dict(good)
        new = iter(twin)
        self.epoch_iter = weakref.ref(new) if _weakrefable(new) else None
        return new

    def settled(self) -> None:
        if self.feed is not None:
            self.feed.settle()

    def crashed(self, exc: BaseException) -> None:
        """A tried configuration failed after its first batch (a worker killed mid-epoch): the
        epoch cannot go on without losing or doubling samples, so the exception stands; the
        next epochs run the last good configuration, tuning off. Under the user's own
        configuration nothing changes (not tuning's doing)."""
        try:
            if self.plan is not None and (self.twin_config or self.user_config) != self.plan.current:
                with self.lock:
                    self._disable(f"{_short(exc)} with {_changes(self.plan.current, self.twin_config)}")
                    # torch's own shutdown now: the dead worker's pid leaves its SIGCHLD watch,
                    # which would otherwise raise again at the next child's exit
                    it = self.epoch_iter() if self.epoch_iter is not None else None
                    if it is not None:
                        internals.shut_down(it)
        except Exception:  # the user's exception is the one that matters
            pass

    def _recover(self, exc: Exception, loader):
        """Tuning's own bookkeeping failed before the epoch started: off, and the user's loader
        iterates as it would untuned (its workers)."""
        self._disable(_short(exc))
        self.twin = None
        return _TimedEpoch(iter(_Plain(loader, self.base_class)), [_now()], self)

    def _disable(self, reason: str) -> None:
        if self.disabled:
            return
        self.disabled = reason
        if self.plan is not None:
            self._record(self.plan.abandon(reason))
        self._off(f"reverted and off for this loader: {reason}")

    def _off(self, why: str) -> None:
        self.disabled = self.disabled or why
        self._say(why)

    def _say(self, what: str) -> None:
        if not self.state.session.settings.quiet:
            from ..console import info_stream
            print(f"starvewatch: tuning {self.state.name!r}: {what}", file=info_stream(), flush=True)

    # ---- what is known -------------------------------------------------------------------
    def _bounds(self) -> dict:
        from ..cpus import usable_cores
        dataset = getattr(self.twin, "dataset", None) if self.twin is not None else None
        iterable = _is_iterable(dataset) if dataset is not None else \
            (self.state.config or {}).get("sampler") == "_InfiniteConstantSampler"
        totals = self.state.totals
        # Loading that waits (sleeps, reads) rather than computes, seen by the CPU probe while
        # the main process loaded (0 workers); kept once seen (workers hide it from the probe).
        self.loading_waits = self.loading_waits or (
            totals.wait_probe_ns > 10_000_000 and not (self.twin_config or self.user_config)["num_workers"]
            and totals.wait_probe_cpu_ns < 0.5 * totals.wait_probe_ns)
        waits = self.loading_waits
        config = dict(self.state.config or {}, **(self.twin_config or {}))
        memory_most = live_tuning.memory_workers(self.state.name, config, self._worker_bytes(),
                                                 _memory_readings())
        return live_tuning.bounds_for(usable_cores(), memory_most=memory_most, loading_waits=waits,
                                      iterable=iterable, shards_by_worker=self._shards_by_worker(),
                                      cuda=_cuda(), input_bound=_input_bound(totals))

    def _advice(self) -> list[dict]:
        """The ranked advice for this loader on the run so far (the summary's recommendations,
        with its configuration as tuned now), the plan's first candidates. On _AdviceThread's
        thread, once per window; [] when the run has too little to say or the analysis fails
        (the session's lists may change under it: then [] too, and the next window's try)."""
        session = self.state.session
        try:
            from ..analysis.summary import LoaderData, summarize
            book, shipper = session.shipper.book(), session.shipper
            loaders = []
            for s in list(session.loader_list):
                config = dict(s.config or {}, **(self.twin_config or {})) if s is self.state else s.config
                loaders.append(LoaderData(name=s.name, config=config, totals=book.merged(s.index, shipper.counted(s)),
                                          records=book.stats.get(s.index), ranks=[session.rank]))
            run = dict(session.metadata(), rank=session.rank, world_size=session.world_size)
            summary = summarize(run, loaders, stalls=list(session.stalls))
            return [r for r in summary.get("recommendations") or [] if r.get("loader") == self.state.name]
        except Exception as exc:  # the plan's own candidates instead
            log.debug("starvewatch: tuning %r: no advice: %s", self.state.name, _short(exc))
            return []

    def _worker_bytes(self) -> int | None:
        """The largest USS of this loader's live workers (the sampler's latest readings)."""
        it = self.epoch_iter() if self.epoch_iter is not None else None
        pids = {str(w.pid) for w in internals.worker_processes(it)} if it is not None else set()
        readings = [r for s in self.state.session.samplers for pid, r in s.worker_memory.items() if pid in pids]
        sizes = [r.get("uss_bytes") for r in readings if r.get("uss_bytes")]
        return max(sizes) if sizes else None

    def _shards_by_worker(self) -> bool:
        from ..shards import duplicated
        for sampler in self.state.session.samplers:
            for kind, event in reversed(sampler.history):
                if kind == "workers" and event.get("loader") == self.state.name and event.get("shard_check"):
                    return not duplicated(event["shard_check"])
        return False

    def _stall_open(self) -> bool:
        return any(e.get("loader") == self.state.name and "ended_ns" not in e
                   for e in list(self.state.session.stalls))

    def _record(self, record: dict) -> None:
        record = dict(record, loader=self.state.name, t_ns=_wall_ns())
        self.records.append(record)
        session = self.state.session
        session.tuning_records.append(record)
        session.emit("tuning", record)  # shipped with the next batch (the collector's events)

    def final_outcome(self) -> dict | None:
        """At finish(), before the last batch leaves: the open window decided, and the outcome
        with its line to copy, shipped as a record of its own (`decision` "outcome")."""
        self.close_at_end()
        out = self.outcome()
        if out is None:
            return None
        out["line"] = live_tuning.found_line(self.state.config, out, self.state.name)
        self.state.session.emit("tuning", dict(out, decision="outcome", t_ns=_wall_ns()))
        return out

    def outcome(self) -> dict | None:
        if self.plan is None:
            return None
        out = dict(self.plan.outcome(), loader=self.state.name)
        if self.disabled:
            out["disabled"] = self.disabled
        return out


class _AdviceThread:
    """The ranked advice computed off the training thread. A summarize() of the run took 36 ms
    at the first decision (its imports) and 5 ms at the second on a 20,000-step run: too much
    for a decision point inside next(). A window's close asks for a fresh list (`request`, an
    Event set) and decides on `ready`, the last list computed, swapped whole by this thread:
    a decision point never waits for it (the advice lags one window)."""

    IDLE_CHECK_S = 30.0  # how often an idle thread checks that its tuner still searches

    def __init__(self, tuner: LoaderTuner) -> None:
        self.ready: list[dict] = []
        self.computed = 0  # lists computed (tests read it)
        self._tuner = weakref.ref(tuner)  # the thread keeps no loader alive
        self._wanted = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        if self._stopped:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="starvewatch-tuning-advice", daemon=True)
            self._thread.start()
        self._wanted.set()

    def stop(self) -> None:
        self._stopped = True
        self._wanted.set()

    def _run(self) -> None:
        while True:
            asked = self._wanted.wait(self.IDLE_CHECK_S)
            tuner = self._tuner()
            if self._stopped or tuner is None or tuner.disabled or (tuner.plan is not None and tuner.plan.done):
                return
            if asked:
                self._wanted.clear()
                ready = tuner._advice()
                self.ready = ready  # one attribute swap: the training thread reads a whole list
                self.computed += 1
            del tuner


def _board_for(state):
    """Rank 0's decisions for every rank, through the torchrun agent's store (the one the run
    id is agreed in); None without it. Every rank polls it on a thread of its own."""
    from .tuning_board import TuningBoard, agent_store
    store = agent_store()
    if store is None:
        return None
    board = TuningBoard(store, state.session.run_id, state.name, state.session.rank)
    board.start_polling()
    return board


class _Plain:
    """The user's loader iterated with its own class's __iter__ (tuning off before a twin)."""

    def __init__(self, loader, base_class: type) -> None:
        self.loader, self.base_class = loader, base_class

    def __iter__(self):
        return self.base_class.__iter__(self.loader)


def _quiet_iter(twin):
    with warnings.catch_warnings():
        # torch's "suggested max number of worker" warning: loading that waits was given more
        # workers than cores on purpose (the bounds), the user did not ask for them
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        return iter(twin)


def _has_len(obj) -> bool:
    try:
        len(obj)
        return True
    except Exception:
        return False


def _weakrefable(obj) -> bool:
    try:
        weakref.ref(obj)
        return True
    except TypeError:
        return False


def _is_iterable(dataset) -> bool:
    try:
        from torch.utils.data import IterableDataset
        return isinstance(dataset, IterableDataset)
    except Exception:
        return False


def _input_bound(totals) -> bool | None:
    """Whether the loop waits for this loader (10% of its loop time or more, run-wide, as
    hooks/live.py counts it); None before a step."""
    wait = totals.wait_ns + totals.epoch_end_wait_ns
    loop = wait + totals.compute_ns + totals.other_ns
    if not totals.steps or loop <= 0:
        return None
    return wait >= 0.1 * loop


def _cuda() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:
        return False


def _memory_readings() -> dict:
    """Free RAM and /dev/shm, in the system fields rules.memory_budget reads."""
    import os
    out: dict = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    out["mem_available_min_bytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        st = os.statvfs("/dev/shm")
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        out.update(shm_total_bytes=total, shm_used_min_bytes=total - free, shm_used_max_bytes=total - free)
    except OSError:
        pass
    return out


def _wall_ns() -> int:
    import time
    return time.time_ns()


def _short(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]  # one console line (torch's carry a traceback)
    return f"{type(exc).__name__}: {first[:160]}"


def _changes(good: dict, tried: dict) -> str:
    return ", ".join(f"{k} {good.get(k)!r} -> {tried.get(k)!r}" for k in live_tuning.TUNED_KEYS
                     if good.get(k) != tried.get(k)) or "the same settings"
