"""The run of this process: `init`, `watch`, `finish`, and what happens at fork and at exit."""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
import weakref
from collections import deque
from time import perf_counter_ns

from ..console import info_stream
from ..ids import safe_id, safe_name
from ..limits import MAX_LOADERS_PER_RUN, OVERFLOW_LOADER
from . import cuda
from .core import take_notice as take_core_notice
from .identity import default_run_name, rank_info, run_id_for, run_metadata
from .introspect import dataloader_config, is_torch_dataloader, spawn_facts, wrapped_loader
from .delivery.account import Warnings, add_accounts
from .delivery.records import LocalPipeline, with_buffer_drops
from .delivery.shipper import Shipper
from .delivery.sidecar_link import SidecarLink, SidecarPipeline
from .delivery.transport import Delivery, HttpTransport, Spool, dumps
from .loader import (ACTIVE, WatchedIterable, WatchedIterator, WatchedIteratorProxy, is_watched,
                     set_iterable_epoch_hook, set_loader_lookup, watched_dataloader_class)
from .profiler_marks import track as track_for_profiler
from .settings import HookSettings

log = logging.getLogger("starvewatch.hooks")

_LOCK = threading.RLock()
_SESSION: "Session | None" = None
_LAST_SUMMARY: dict | None = None
_ATEXIT_REGISTERED = False
# A run ended on its own (a notebook's idle end, a loader re-watched with other settings): the
# next run started by watch() keeps its name, settings and transport.
_RESUME: tuple | None = None
FINISH_GRACE_S = 15.0  # how much longer finish() waits for a final cycle slowed by the machine


class LoaderState:
    """Everything the hot path touches for one loader, bound to one session."""

    __slots__ = ("session", "name", "index", "totals", "config", "fixed_batch_size", "buffer",
                 "segments", "capacity", "current", "kind", "board", "loader_ref", "tuner")

    def __init__(self, session: "Session", name: str, index: int, config: dict | None,
                 fixed_batch_size: int | None, kind: str) -> None:
        from ..stats import LoaderTotals
        self.session = session
        self.name = name
        self.index = index
        self.totals = LoaderTotals()
        self.config = config
        self.fixed_batch_size = fixed_batch_size
        self.buffer = session.buffer
        self.segments = session.segments
        self.capacity = session.settings.buffer_capacity
        self.current = None
        self.kind = kind
        self.board = None  # per-worker telemetry of a multi-process DataLoader
        self.loader_ref = None  # the loader object last watched as this loader (weakly)
        self.tuner = None  # watch(tune=True): its LoaderTuner (hooks/live_tuner.py)

    def watched_object(self, loader) -> bool:
        """Note `loader` as this loader's object; True when it is a new one (a re-creation)."""
        import weakref
        seen = self.loader_ref is not None
        previous = self.loader_ref() if seen else None  # None: the earlier object is gone
        try:
            self.loader_ref = weakref.ref(loader)
        except TypeError:  # (a DataLoader takes weak references; a subclass with __slots__ may not)
            self.loader_ref = None
        return seen and previous is not loader

    def attached(self) -> "LoaderState":
        """This loader's state in the current run (a new run after `finish()`)."""
        if self.session.active and self.session.pid == os.getpid():
            return self
        session = ensure_session()
        if session is None:
            return self
        state = session.loaders.get(self.name)
        if state is None:
            state = session.add_loader(self.name, self.config, self.fixed_batch_size, self.kind)
            state.board = self.board
        return state

    def describe(self, totals) -> dict:
        described = {"name": self.name, "kind": self.kind, "config": self.config,
                     "totals": totals.to_dict()}
        if self.board is not None:  # where delivery reads the workers' batch records (not shipped)
            described["board"] = self.board.describe()
        return described


class Session:
    def __init__(self, name: str, settings: HookSettings, transport=None, after_run_id: str | None = None) -> None:
        self.name = safe_name(name)
        self.settings = settings
        self.run_id = run_id_for(name)
        if after_run_id is not None and (self.run_id == after_run_id
                                         or after_run_id.startswith(self.run_id + "-r")):
            # A distributed job's id is derived from the job: every rank starts the next run
            # at the same point, so every rank derives the same new id from the previous one.
            self.run_id = _next_run_id(after_run_id)
        ranks = rank_info()
        self.rank, self.world_size, self.local_rank = ranks["rank"], ranks["world_size"], ranks["local_rank"]
        self.pid = os.getpid()
        self.thread_id = threading.get_ident()  # the training thread, for stall detection
        self.native_tid = threading.get_native_id()  # the profiler's id of it (the trace export)
        self.stream_id = safe_id(f"{socket.gethostname()}-{self.pid}-{secrets.token_hex(4)}")
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.wall_offset_ns = time.time_ns() - perf_counter_ns()
        # A list, not a deque: the shipper takes a chunk with one slice and one `del` (C-level,
        # ~2 ns a record) where popping a deque one record at a time costs ~35 ns a record.
        self.buffer: list = []
        # The fast path's segments (in the buffer, or taken from it) whose reads the shipper has
        # not all taken: with the buffer's length, what bounds the reads the next one may get.
        self.segments: list = []
        self.loaders: dict[str, LoaderState] = {}
        from .loader_identity import SiteBook
        self.sites = SiteBook()  # call site + dataset -> loader name (loader_identity.py)
        self.loader_list: list[LoaderState] = []
        self.live_iterators: weakref.WeakSet = weakref.WeakSet()
        self.events: deque = deque()
        self.dropped_events = 0
        self.stalls: list[dict] = []
        self.tuning_records: list[dict] = []  # live tuning's windows and decisions (live_tuner.py)
        self.tuning_outcomes: list[dict] | None = None  # set by finish() where a loader was tuned
        self.active = True
        self._gpu_timer = None
        self._meta: dict | None = None
        self.dashboard_url: str | None = None
        self.shown_inline = False  # a notebook showed this run's live page (hooks/notebook.py)
        self.idle_ender = None  # a notebook's idle end (hooks/notebook.py)
        self.spool_dir = settings.dir / "spool" / self.run_id / self.stream_id
        # Stack dumps of hung workers (hooks/stacks.py), under the run's directory.
        self.stack_dir = settings.dir / "stacks" / self.run_id / self.stream_id
        if transport is None and settings.url is not None:
            transport = HttpTransport(settings.url, settings.token)
        self.transport = transport
        self.delivers_over_http = isinstance(transport, HttpTransport)
        # First uses import modules; importing on the shipper thread would hand the GIL back
        # and forth with the training loop for a second. Here the loop has not started yet.
        dumps({"warm": [1]})
        pipeline = LocalPipeline(Delivery(transport, Spool(self.spool_dir, settings.spool_max_bytes),
                                          warnings=Warnings(quiet=settings.quiet)),
                                 self.wall_offset_ns)
        # System sampling, record processing and delivery in a separate process: see
        # hooks/delivery/sidecar.py. The in-memory transport (tests) keeps records in this process.
        self.sidecar = SidecarLink.start(self) if settings.sidecar else None
        if self.sidecar is not None and (transport is None or self.delivers_over_http):
            pipeline = SidecarPipeline(self.sidecar, pipeline)
        self.shipper = Shipper(self, pipeline)
        self.samplers: list = []
        self.shipper.start()

    # ---- used by the hot path once per epoch ----------------------------------------------
    def gpu_timer(self):
        timer = self._gpu_timer
        if timer is None and self.active:
            factory = cuda.detect_event_factory()
            if factory is not None:
                timer = self._gpu_timer = cuda.CudaEventTimer(factory, every=self.settings.gpu_event_every)
        return timer if self.active else None

    def gpu_timer_if_any(self):
        return self._gpu_timer

    def stack_dir_made(self):
        from ..private_files import make_private_dirs
        make_private_dirs(self.stack_dir)  # stacks show code and data paths: owner-only
        return self.stack_dir

    # ---- loaders ----------------------------------------------------------------------------
    def default_loader_name(self, hints: tuple[str, ...] = ()) -> str:
        """`train` for the first unnamed loader; a later one is named from its call site
        (hooks/loader_names.py: the variable it is assigned to, else the one passed, else its
        dataset's class), unique within the run, never a counter like `loader2`."""
        if "train" not in self.loaders:
            return "train"
        base = next((h for h in hints if h), None) or "loader"
        if base not in self.loaders:
            return base
        n = 2
        while f"{base}-{n}" in self.loaders:
            n += 1
        return f"{base}-{n}"

    def add_loader(self, name: str, config: dict | None, fixed_batch_size: int | None,
                   kind: str) -> LoaderState:
        state = LoaderState(self, name, len(self.loader_list), config, fixed_batch_size, kind)
        self.loaders[name] = state
        self.loader_list.append(state)
        return state

    # ---- events from the samplers ---------------------------------------------------------
    def emit(self, kind: str, event: dict, limit: int = 100_000) -> None:
        if len(self.events) < limit:
            self.events.append((kind, event))
        else:
            self.dropped_events += 1

    def drain_events(self) -> dict:
        out: dict[str, list] = {}
        events = self.events
        while events:
            try:
                kind, event = events.popleft()
            except IndexError:
                break
            out.setdefault(kind, []).append(event)
        return out

    # ---- metadata and lifecycle -------------------------------------------------------------
    def metadata(self) -> dict:
        if self._meta is None:
            self._meta = run_metadata(self.name, self.run_id)
        meta = dict(self._meta)
        meta.update(started_at=self.started_at, ended_at=self.ended_at,
                    status="live" if self.active else "finished", tid=self.native_tid)
        return meta

    def on_shipper_start(self, shipper) -> None:
        self.metadata()
        if self.delivers_over_http and not isinstance(shipper.pipeline, SidecarPipeline):
            from .delivery.collector_link import connect
            connect(self)

    def announce_collector(self, found: str) -> None:
        """What the sidecar found at the collector's URL (the sampler thread passes it on)."""
        from .delivery.collector_link import announce
        announce(self, found)

    def close_open_steps(self) -> None:
        now = perf_counter_ns()
        for it in list(self.live_iterators):
            if it._segment is not None:
                it._leave_fast()  # the step and clocks back from the fast path's reads
            if it._open:
                it._close_step(now)
            it.__class__ = WatchedIterator  # back to the full path, which sees the closed step
            # Keep a loop that goes on after finish() working, without buffering anything.
            it._capacity = 0
            it._gpu = None

    def settle_open_steps(self, thread_id: int, end_ns: int) -> None:
        """At the end of a notebook cell (on the thread that runs cells): the open step of each
        of that thread's epochs ends at `end_ns` (the cell's end, or when its exception reached
        the shell). An epoch ended by an exception (KeyboardInterrupt) stays alive in the
        traceback, and one iterated with next() goes on in a later cell: the time until then is
        the user reading, not compute. The epoch itself goes on."""
        now = end_ns
        for it in list(self.live_iterators):
            if it._key[2] != thread_id or it._ended:  # the key's lane: the thread taking its batches
                continue
            if it._segment is not None:
                it._leave_fast()
            if it._open:
                it._close_step(now)
            it.__class__ = WatchedIterator  # the next batch starts a step without closing one

    def summary(self) -> dict:
        from ..analysis.summary import LoaderData, summarize
        book = self.shipper.book()
        shipper = self.shipper
        loaders = [LoaderData(name=s.name, config=s.config, totals=book.merged(s.index, shipper.counted(s)),
                              records=book.stats.get(s.index), ranks=[self.rank])
                   for s in self.loader_list]
        run = {k: v for k, v in self.metadata().items()}
        run.update(status="finished" if not self.active else "live", rank=self.rank,
                   world_size=self.world_size)
        from ..analysis.system import overview
        history = [event for sampler in self.samplers for event in sampler.history]
        # Live tuning (windows and decisions, each loader's start, final, gain and line to copy).
        live = None if self.tuning_outcomes is None else (self.tuning_records, self.tuning_outcomes)
        summary = summarize(run, loaders, stalls=self.stalls, system=overview(history, rank=self.rank),
                            worker_events=[e for kind, e in history if kind == "workers"], live_tuning=live)
        # Where every step record went: acknowledged + spooled + dropped = the steps run.
        summary["delivery"] = add_accounts(with_buffer_drops(shipper.pipeline.account(),
                                                             [s.describe(s.totals) for s in self.loader_list]),
                                           shipper.lost_account())
        return summary


def current_session() -> Session | None:
    return _SESSION


def _loader_in_current_run(name: str) -> LoaderState | None:
    """For `step("name")` (the hot path asks; see loader.set_loader_lookup)."""
    session = _SESSION
    return session.loaders.get(name) if session is not None else None


set_loader_lookup(_loader_in_current_run)
set_iterable_epoch_hook(track_for_profiler)  # the profiler sees wrapped iterables (profiler_marks.py)


def _next_run_id(run_id: str) -> str:
    stem, _, seq = run_id.rpartition("-r")
    if stem and seq.isdigit():
        return safe_id(f"{stem}-r{int(seq) + 1}")
    return safe_id(f"{run_id}-r2")


def _register_atexit() -> None:
    global _ATEXIT_REGISTERED
    if not _ATEXIT_REGISTERED:
        atexit.register(_finish_at_exit)
        _ATEXIT_REGISTERED = True


def init(name: str | None = None, *, url: str | None = None, dir=None, transport=None) -> Session | None:
    """Start this process's run, or return the one in progress.

    Optional: the first `watch()` calls it. Call it yourself to name the run or to send it
    somewhere else than the environment says.

    Args:
        name: the run's name, shared by its runs so that they can be compared (default:
            `STARVEWATCH_RUN_NAME`, else the script's file name, or the notebook's). Each run
            also gets a unique id, `NAME-YYYYMMDD-HHMMSS-xxxxxx`.
        url: the collector's address (default: `STARVEWATCH_URL`, else
            `http://127.0.0.1:8412`, where a collector is started for you when none answers);
            `"off"` keeps every record in the spool.
        dir: the data directory for the spool and the database (default: `STARVEWATCH_DIR`,
            else `~/.starvewatch`).
        transport: where batches of records go instead of the collector; for tests (a
            `MemoryTransport` keeps them in a list).

    Returns:
        The run (a `Session`), or None when `STARVEWATCH_DISABLED=1`.

    Example:
        ```python
        import starvewatch

        starvewatch.init("resnet50-baseline")
        loader = starvewatch.watch(DataLoader(dataset, batch_size=64, num_workers=4))
        ```
    """
    global _SESSION, _RESUME
    with _LOCK:
        if _SESSION is not None and _SESSION.active:
            return _SESSION
        resume, after = _RESUME, None
        if resume is not None and name is None and url is None and dir is None and transport is None:
            name, settings, transport, after = resume
            _RESUME = None
        else:
            settings = HookSettings.from_env(url=url, dir=dir)
        if settings.disabled or not _dir_is_ours(settings):
            return None
        if "google.colab" in sys.modules:  # before the sidecar may start a collector
            from .notebook import prepare_environment
            prepare_environment()
        _SESSION = Session(name or default_run_name(), settings, transport, after_run_id=after)
        notice = take_core_notice()  # STARVEWATCH_CORE asked for what cannot run (hooks/core.py)
        if notice and not settings.quiet:
            print(notice, file=sys.stderr, flush=True)
        _register_atexit()
        from .samplers import start_samplers
        start_samplers(_SESSION)
        shell = _kernel_shell()
        if shell is not None:  # also a run restarted by iterating a loader of an ended run
            _in_kernel(shell, _SESSION)
        return _SESSION


def _end_for_next_run(session: Session, quiet: bool = True) -> None:
    """End the run; the next one started by watch() keeps its name, settings and transport."""
    global _RESUME
    finish(quiet=quiet)
    transport = None if session.delivers_over_http else session.transport
    _RESUME = (session.name, session.settings, transport, session.run_id)


def end_idle_run(session: Session, idle_s: float) -> None:
    """A notebook's run with no step and no cell for `idle_s` (hooks/notebook.py): finished."""
    with _LOCK:
        if _SESSION is session and session.active:
            log.info("starvewatch: run %s finished after %.0f s idle", session.run_id, idle_s)
            _end_for_next_run(session)


# What tells one loader configuration from another: the DataLoader's settings. The dataset, its
# length and the sampler are left out: integrations rebuild loaders for another evaluation set,
# Lightning with a DistributedSampler, and those go on in the same run.
_SETTING_KEYS = ("num_workers", "batch_size", "pin_memory", "persistent_workers", "prefetch_factor",
                 "timeout", "drop_last", "multiprocessing_context", "in_order")


def _settings_of(config: dict | None) -> dict:
    return {k: config.get(k) for k in _SETTING_KEYS} if config else {}


def _changed_settings(old: dict, new: dict) -> str:
    old, new = _settings_of(old), _settings_of(new)
    changed = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in _SETTING_KEYS if old.get(k) != new.get(k)]
    return ", ".join(changed[:4]) + (", ..." if len(changed) > 4 else "")


def _loader_name(session: Session, name, shell, loader=None, config: dict | None = None) -> str:
    """The name given, or the one this call site got before (a re-run notebook cell), or the
    next default name; past the collector's bound on loader names per run (limits.py), the
    one name all further loaders share, so a batch is never refused for it."""
    chosen = _given_or_default_name(session, name, shell, loader, config)
    if chosen not in session.loaders and len(session.loaders) >= MAX_LOADERS_PER_RUN - 1:
        if not getattr(session, "overflow_said", False):
            session.overflow_said = True
            log.warning("starvewatch: more than %d loaders in one run: %r and later ones are recorded "
                        "as %r", MAX_LOADERS_PER_RUN - 1, chosen, OVERFLOW_LOADER)
        return OVERFLOW_LOADER
    return chosen


def _given_or_default_name(session: Session, name, shell, loader, config: dict | None) -> str:
    """The name given, or the one this call site got before, or the next default name. The
    frame of watch()'s caller is three up: this function, _loader_name, watch."""
    if name is not None:
        return safe_name(str(name), "loader")
    key = None
    if shell is not None:
        from .notebook import name_for_site, unnamed_watch_key
        key = unnamed_watch_key(sys._getframe(3))
        earlier = name_for_site(key)
        if earlier is not None:
            return earlier
    # The identity rule (loader_identity.py): the same call site and dataset continue a loader.
    from .loader_identity import call_site
    site = call_site(sys._getframe(3))
    # ... with the same settings (two loaders of one line with other batch sizes are two)
    settings = _settings_of(config) if config is not None else None
    for earlier in session.sites.names_for(site, loader):
        state = session.loaders.get(earlier)
        if state is not None and (settings is None or _settings_of(state.config) == settings):
            return earlier
    from .loader_names import name_hints
    chosen = session.default_loader_name(name_hints(sys._getframe(3), loader))
    session.sites.remember(site, loader, chosen)
    if key is not None:
        from .notebook import remember_site
        remember_site(key, chosen)
    return chosen


def ensure_session() -> Session | None:
    session = _SESSION
    if session is not None and session.active:
        return session
    return init()


def watch(loader, name: str | None = None, *, tune: bool | None = None):
    """Wrap a loader so that every batch is timed: how long the loop waited for it, and how
    long it computed before asking for the next.

    The loader iterates exactly as before. A `DataLoader` stays a `DataLoader` (of its own
    class, with every attribute it had); anything else iterable is wrapped. The first call
    starts the run (`init()`); watching the same loader again returns it unchanged.

    Args:
        loader: a `torch.utils.data.DataLoader`, an accelerate-prepared loader, a torchdata,
            webdataset, Hugging Face `datasets` or LitData loader, or any iterable of batches.
        name: the loader's name in the run, when it has several (`"train"`, `"val"`). Default:
            the variable it is assigned to in a notebook cell, else `train`, then `loader2`...
        tune: True: tune a torch DataLoader's settings live, at epoch boundaries, measured on
            the training loop itself (num_workers, prefetch_factor, persistent_workers,
            pin_memory; docs/tuning.md). Default: `STARVEWATCH_TUNE` (off).

    Returns:
        The loader to iterate in place of the one given.

    Raises:
        TypeError: `loader` is not iterable.

    Example:
        ```python
        import starvewatch

        train = starvewatch.watch(DataLoader(train_set, batch_size=64, num_workers=4), "train")
        val = starvewatch.watch(DataLoader(val_set, batch_size=256), "val")
        for epoch in range(10):
            for batch in train:
                train_step(batch)
            for batch in val:
                evaluate(batch)
        ```
    """
    if is_watched(loader):
        return loader
    if loader is None or not hasattr(loader, "__iter__"):
        raise TypeError(f"starvewatch.watch() needs an iterable, got {type(loader).__name__}")
    inner = getattr(loader, "base_dataloader", None)
    if inner is not None and type(loader) is not loader.__class__:
        # accelerate's prepared loaders (DataLoaderShard and kin) only pretend to be DataLoaders
        # (a `__class__` property) and iterate a real one: watch that one in place.
        watch(inner, name, tune=tune)
        return loader
    session = ensure_session()
    if session is None:  # STARVEWATCH_DISABLED=1: a pass-through, no threads
        return loader
    shell = _kernel_shell()
    with _LOCK:
        config = dataloader_config(loader) if is_torch_dataloader(loader) else None
        name = _loader_name(session, name, shell, loader, config)
        tune = session.settings.tune if tune is None else bool(tune)
        if config is not None:
            session, wrapped = _watch_dataloader(session, loader, name, config, tune)
        else:
            if tune:
                _tuning_off_line(session, name, f"{type(loader).__name__} is not a torch DataLoader")
            state = session.loaders.get(name)
            if state is None:  # a WebLoader or a torchdata.nodes pipeline loads in workers too
                config, inner = wrapped_loader(loader)
                state = session.add_loader(name, config, None, type(loader).__name__)
                if inner is not None:
                    from .workers import attach
                    state.board = attach(inner, str(session.stack_dir))
            cls = WatchedIteratorProxy if hasattr(loader, "__next__") else WatchedIterable
            wrapped = cls(loader, state)
    if shell is not None:
        _in_kernel(shell, session)
    return wrapped


def _dir_is_ours(settings) -> bool:
    """An existing STARVEWATCH_DIR of another user, or one others may write to, would hand them
    this run's spool, stacks and secrets: refused with one line, training goes on unmonitored."""
    from ..local_secrets import UnsafeSecret, check_private_dir
    try:
        if settings.dir.exists():
            check_private_dir(settings.dir)
    except (UnsafeSecret, OSError) as exc:
        print(f"starvewatch: monitoring off for this process: {exc}", file=sys.stderr, flush=True)
        return False
    return True


def _tuning_off_line(session: Session, name: str, why: str) -> None:
    if not session.settings.quiet:
        print(f"starvewatch: tuning {name!r}: off ({why})", file=info_stream(), flush=True)


def _watch_dataloader(session: Session, loader, name: str, config: dict, tune: bool = False):
    """(the session, the loader) for a torch DataLoader watched as `name`: a new loader's state,
    or the named one's (a new object with other settings: a new run; with the same settings,
    rebuilt: its epochs count on, `rebuilds` counts it). Under _LOCK."""
    state = session.loaders.get(name)
    if state is not None and name != OVERFLOW_LOADER and _settings_of(state.config) != _settings_of(config):
        session, state = _rewatched(session, state, config)
        if state is not None:  # the same state, with this loader's settings
            state.watched_object(loader)
            from .workers import attach
            state.board = attach(loader, str(session.stack_dir))
    elif state is not None and state.watched_object(loader):
        # A new loader object continuing this one (rebuilt every epoch): its epochs count
        # on, and its workers report on a board of their own.
        state.totals.rebuilds += 1
        from .workers import attach
        state.board = attach(loader, str(session.stack_dir)) or state.board
    if state is None:
        config.update(spawn_facts(loader))
        state = session.add_loader(name, config, loader.batch_size, "DataLoader")
        state.watched_object(loader)
        from .workers import attach
        state.board = attach(loader, str(session.stack_dir))
    tuner = None
    if tune:
        if state.tuner is None:  # kept for a loader rebuilt at the same call site: the found
            from .live_tuner import LoaderTuner  # configuration goes on with the new object
            state.tuner = LoaderTuner(state, type(loader), loader)
        tuner = state.tuner
    loader.__class__ = watched_dataloader_class(type(loader), state, tuner)
    if state.board is not None:  # a StatefulDataLoader's checkpoint interval (snapshots.py)
        from .snapshots import count_checkpoints
        count_checkpoints(type(loader), state.board.checkpoints)
    return session, loader


def _rewatched(session: Session, state: LoaderState, config: dict):
    """A new loader watched under a name already used, with other settings: the same name in a
    new run, so that the two settings compare run with run. Before its first epoch the loader
    just takes the new settings (a cell re-run before training)."""
    if state.totals.epochs == 0 and state.current is None:
        state.config, state.fixed_batch_size = config, config.get("batch_size")
        return session, state
    if session.rank == 0 and not session.settings.quiet:
        print(f"starvewatch: {state.name!r} watched again with other settings "
              f"({_changed_settings(state.config, config)}): run {session.run_id} finished, "
              f"a new run of {session.name!r} starts", file=info_stream(), flush=True)
    _end_for_next_run(session)
    return ensure_session(), None


def _kernel_shell():
    """The Jupyter kernel's shell, or None; a script never imports hooks/notebook.py."""
    if "IPython" not in sys.modules:
        return None
    from .notebook import kernel_shell
    return kernel_shell()


def _in_kernel(shell, session: Session) -> None:
    """In a Jupyter kernel: the cell events, the idle end, the live page inline. Never raises:
    a display that fails must not stop the cell."""
    try:
        from .notebook import install, show_run
        install(shell, session, current_session, end_idle_run)
        show_run(session)
    except Exception as exc:
        log.warning("starvewatch: notebook display failed: %s: %s", type(exc).__name__, exc)


def finish(*, quiet: bool | None = None) -> dict | None:
    """End the run: deliver what is left, stop its threads, and return its summary.

    Optional in a script (the run ends when the process exits); the way to end a run in a
    notebook, where it shows the summary in the cell. Called again, it returns the last
    summary.

    Args:
        quiet: True: print nothing (default: `STARVEWATCH_QUIET`). Otherwise the summary is
            printed to stderr (the verdict, the input wait, the change to make and the
            dashboard's address), or shown in a Jupyter kernel, once, whatever the cell does
            with the value.

    Returns:
        The summary, a dict of the `starvewatch.summary/2` schema (the run, each loader's
        figures, the verdict, the recommendations), or None when no run was started.

    Example:
        ```python
        summary = starvewatch.finish()
        print(summary["verdict"]["input_bound"], summary["verdict"]["input_wait_fraction"])
        for rec in summary["recommendations"]:
            print(rec["loader"], rec["parameter"], rec["current"], "->", rec["suggested"])
        ```
    """
    global _LAST_SUMMARY, _RESUME
    with _LOCK, _child_exits_deferred():
        session = _SESSION
        if session is None or not session.active or session.pid != os.getpid():
            return _LAST_SUMMARY  # (after an idle end too: the next watch() still resumes)
        _RESUME = None  # a run the user ends: the next one is named and set up afresh
        session.close_open_steps()
        _end_tuning(session)  # its last records go with the final batch
        session.active = False
        if session.idle_ender is not None:
            session.idle_ender.stopped.set()
        session.ended_at = time.time()
        # The steps go now, while the samplers take their final readings: with a sidecar that
        # is a round trip to it, answered only once it is up (a short run ends before that),
        # and the records would otherwise wait for it. The final cycle ships the rest with
        # those readings.
        session.shipper.ship_now()
        for sampler in session.samplers:
            sampler.stop()
        done = _drain_shipper(session)
        if done and session.transport is not None:
            session.transport.close()
        if session.sidecar is not None:
            session.sidecar.close()
        summary = session.summary()
        in_kernel = _kernel_shell() is not None
        if in_kernel:  # shown as HTML when it is a cell's value (hooks/notebook.py)
            from .notebook import SummaryReport
            summary = SummaryReport(summary)
        _LAST_SUMMARY = summary
    if not (session.settings.quiet if quiet is None else quiet):
        _report(session, summary, in_kernel)
    return summary


def _end_tuning(session: Session) -> None:
    tuners = [s.tuner for s in session.loader_list if s.tuner is not None]
    if not tuners:
        return
    session.tuning_outcomes = []
    for tuner in tuners:
        try:
            out = tuner.final_outcome()
        except Exception as exc:  # finish() goes on: that loader's outcome is left out
            log.warning("starvewatch: tuning %r: outcome: %s: %s", tuner.state.name, type(exc).__name__, exc)
            continue
        if out is not None:
            session.tuning_outcomes.append(out)


def _drain_shipper(session: Session) -> bool:
    """Stops the shipper after its final cycle; True when that cycle ended (else it is still
    busy past every grace period, and the summary goes without its last records)."""
    shipper = session.shipper
    done = shipper.stop(session.settings.flush_timeout_s + 1.0)
    progress = shipper.progress()
    while not done:
        # Network waits in the final cycle are bounded by the flush deadline; what is left
        # is CPU work on the last records, which the summary and the account need. On an
        # overloaded machine, or with a backlog of millions of steps (a fast loop iterated
        # again, issue 42), it takes longer: wait for it while it gets on, rather than
        # report a summary without the last steps (uncounted: the collector would then
        # hold more than finish() said). The backlog is bounded (the buffer's capacity).
        done = shipper.wait(FINISH_GRACE_S)
        if done or shipper.progress() == progress:
            break
        progress = shipper.progress()
    return done


def _report(session: Session, summary: dict, in_kernel: bool) -> None:
    """The end-of-run report: on stderr, or shown in the notebook cell; with the regression
    against the previous run of this name, as the collector judged it."""
    from .report import print_report
    previous = _previous_run(session, summary)
    if previous is not None:  # slower than that run? the collector judged it (regression.py)
        from .delivery.collector_link import run_regression
        summary["regression"] = run_regression(session.settings.url, session.settings.token,
                                               summary["run"]["id"])
        if summary["regression"] and isinstance(summary.get("answer"), dict):
            summary["answer"]["regression"] = summary["regression"]["sentence"]
    if in_kernel:
        # Shown from here, whatever the cell does with the value (`s = finish()` renders
        # nothing otherwise); the same cell's value then adds nothing (hooks/notebook.py).
        import io
        text = io.StringIO()
        print_report(summary, session, file=text, previous_run_id=previous)
        try:
            summary.show(text.getvalue().rstrip("\n"))
        except Exception as exc:  # a display that fails must not fail finish()
            log.warning("starvewatch: notebook display failed: %s: %s", type(exc).__name__, exc)
    else:
        print_report(summary, session, file=sys.stderr, previous_run_id=previous)


@contextlib.contextmanager
def _child_exits_deferred():
    """While finish() runs, a child's exit (the sidecar ending, a dead DataLoader worker) does
    not run the process's SIGCHLD handler: torch's raises "worker killed" in the main thread
    wherever it is, and finish() would stop half done. Python runs signal handlers on the main
    thread only, so this applies there; the handler is back when finish() returns and runs at
    the next child's exit (torch's iterator also checks its workers on its own)."""
    sigchld = getattr(signal, "SIGCHLD", None)
    if sigchld is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(sigchld)
    if not callable(previous):  # the default or ignored: nothing of Python's runs
        yield
        return
    signal.signal(sigchld, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(sigchld, previous)


def _previous_run(session, summary: dict) -> str | None:
    """Only when this run reached a collector: the report then links the comparison with it."""
    if session.dashboard_url is None:
        return None
    from .delivery.collector_link import previous_run
    return previous_run(session.settings.url, session.settings.token, summary["run"])


def _finish_at_exit() -> None:
    try:
        finish()
    except Exception as exc:  # never turn a clean exit into a traceback: one line instead
        log.warning("starvewatch: finishing the run at exit failed: %s: %s", type(exc).__name__, exc)


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) owns none of the parent's run: no threads were
    copied, and re-sending the parent's buffered records would duplicate them."""
    global _SESSION, _LOCK
    _SESSION = None
    _LOCK = threading.RLock()
    ACTIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
