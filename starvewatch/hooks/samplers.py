"""System samplers on one daemon thread: host (psutil), DataLoader workers, GPU (NVML), and
stall detection. A fixed rate without drift; never inside DataLoader worker processes."""
from __future__ import annotations

import os
import shutil
import threading
import time

from ..limits import MAX_STALL_ROWS_PER_RANK


# /dev/shm as the container sees it can be smaller than the tmpfs says (docker --shm-size).
from ..cpus import CgroupCpuMeter, cpu_limit
from ..envvars import limit_bytes
# Read here in the training process and in the sidecar; HookSettings says the console line.
SHM_LIMIT_BYTES = limit_bytes("STARVEWATCH_SHM_LIMIT_BYTES", quiet=True)


def _psutil():
    try:
        import psutil
        return psutil
    except ImportError:
        return None


from ..shards import compare_readers, trimmed
from .worker_checks import exit_signal, reaped_signal


_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


class HostSampler:
    """Process and machine state, as rates over the last interval."""

    def __init__(self, psutil, pid: int | None = None) -> None:
        self.ps = psutil
        self.pid = pid or os.getpid()  # the training process (the sidecar samples its parent)
        self.proc = psutil.Process(self.pid)
        self.proc.cpu_percent(None)
        self._last = (time.monotonic(), psutil.swap_memory(), self._disk())
        self._cpu_last = self._cpu_times()
        self._children: dict[int, object] = {}
        # The CPUs the training process may use; inside a quota, the cgroup's own counters say
        # whether they are saturated (host percentages do not).
        self.cpu_limit = cpu_limit(self.pid)
        self._quota_meter = CgroupCpuMeter(self.cpu_limit) if self.cpu_limit.quota_cores else None

    def _disk(self):
        try:
            return self.ps.disk_io_counters()
        except (RuntimeError, OSError):
            return None

    def _cpu_times(self) -> list[dict]:
        """One read of /proc/stat: each core's cumulative seconds per field."""
        return [t._asdict() for t in self.ps.cpu_times(percpu=True)]

    def _cpu_shares(self) -> tuple[list[float], float | None]:
        """(busy % per core, iowait % of the host) since the last call, from the raw counters.
        Not psutil.cpu_times_percent(percpu=True): it scales by max(1, a core's total delta),
        so under a 1 s interval every share shrinks (an idle core read 50% busy at 0.5 s). A
        field whose counter ran backwards (a core's iowait can) counts as zero."""
        now, then = self._cpu_times(), self._cpu_last
        self._cpu_last = now
        busy, iowait, cores_with_iowait = [], 0.0, 0
        for t1, t0 in zip(now, then):
            delta = {f: max(0.0, t1[f] - t0.get(f, 0.0)) for f in t1 if f not in ("guest", "guest_nice")}
            total = sum(delta.values())  # (user already includes guest time)
            if total <= 0:
                busy.append(0.0)
                continue
            busy.append(100.0 * sum(delta.get(f, 0.0) for f in _BUSY_FIELDS) / total)
            if "iowait" in delta:
                iowait += 100.0 * delta["iowait"] / total
                cores_with_iowait += 1
        return busy, (iowait / cores_with_iowait if cores_with_iowait else None)

    def sample(self) -> dict:
        ps = self.ps
        now = time.monotonic()
        swap, disk = ps.swap_memory(), self._disk()
        then, swap0, disk0 = self._last
        dt = max(1e-6, now - then)
        self._last = (now, swap, disk)
        per_core, iowait = self._cpu_shares()
        mem = ps.virtual_memory()
        try:
            shm = shutil.disk_usage("/dev/shm")
            shm_used, shm_total = shm.used, shm.total
        except OSError:
            shm_used = shm_total = None
        if SHM_LIMIT_BYTES and shm_total:  # a container's smaller limit, or a simulated one
            shm_total = min(shm_total, SHM_LIMIT_BYTES)
        with self.proc.oneshot():  # one read of /proc/<pid>/stat for both
            process_cpu, rss = self.proc.cpu_percent(None), self.proc.memory_info().rss
        return {
            "kind": "host", "t_ns": time.time_ns(), "interval_s": dt,
            "process_cpu_pct": process_cpu,
            "process_rss_bytes": rss,
            "cpu_pct": sum(per_core) / len(per_core) if per_core else None,
            "cpu_per_core_pct": per_core,
            "iowait_pct": iowait,
            "mem_available_bytes": mem.available, "mem_total_bytes": mem.total,
            "swap_in_bytes_per_s": (swap.sin - swap0.sin) / dt,
            "swap_out_bytes_per_s": (swap.sout - swap0.sout) / dt,
            "disk_read_bytes_per_s": (disk.read_bytes - disk0.read_bytes) / dt if disk and disk0 else None,
            "disk_read_iops": (disk.read_count - disk0.read_count) / dt if disk and disk0 else None,
            "shm_used_bytes": shm_used, "shm_total_bytes": shm_total,
            "cpu_count": os.cpu_count(),
            "usable_cores": self.cpu_limit.usable_cores,
            "cpu_quota_cores": self.cpu_limit.quota_cores,
            **(self._quota_meter.sample() if self._quota_meter is not None else {}),
        }

    def process_state(self, pid: int) -> dict:
        """One child process (a DataLoader worker): running, sleeping, zombie or gone."""
        ps = self.ps
        proc = self._children.get(pid)
        try:
            if proc is None:
                proc = ps.Process(pid)
                if proc.ppid() != self.pid:
                    raise ps.NoSuchProcess(pid)  # the worker is gone and its pid reused
                proc.cpu_percent(None)
                self._children[pid] = proc
            elif not proc.is_running():  # psutil checks the start time: catches pid reuse
                raise ps.NoSuchProcess(pid)
            with proc.oneshot():
                status = proc.status()
                state = {"running": "running", "sleeping": "sleeping", "disk-sleep": "sleeping",
                         "idle": "sleeping", "zombie": "zombie", "dead": "gone"}.get(status, status)
                return {"pid": pid, "state": state, "cpu_pct": proc.cpu_percent(None),
                        "rss_bytes": proc.memory_info().rss if state != "zombie" else None,
                        **(exit_signal(pid) if state == "zombie" else {})}
        except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess) as exc:
            self._children.pop(pid, None)
            zombie = isinstance(exc, ps.ZombieProcess)
            return {"pid": pid, "state": "zombie" if zombie else "gone", "cpu_pct": None,
                    "rss_bytes": None, **(exit_signal(pid) if zombie else {})}



def _ready_batches(inner) -> int | None:
    """Batches the workers finished that the loop has not taken yet: the DataLoader's result
    queue plus results that arrived out of order (torch internals, read defensively)."""
    try:
        ready = inner._data_queue.qsize()
        ready += sum(1 for info in inner._task_info.values() if len(info) == 2)
        return ready
    except Exception:  # another torch version, a platform without qsize: unknown
        return None


class LoaderWatch:
    """Per-loader worker telemetry between two samples."""

    def __init__(self, state) -> None:
        self.state = state
        self.previous: list[dict] | None = None
        self.sent_hashes: list[list[int]] | None = None

    def sample(self, process_state, memory: dict | None = None) -> dict | None:
        """`process_state(pid)`: that worker's state dict, or None when not known (yet);
        `memory`: the sidecar's latest USS/PSS reading per pid (str)."""
        board = self.state.board
        if board is None:
            return None
        rows = board.read()
        previous = self.previous or [dict.fromkeys(r, 0) for r in rows]
        self.previous = rows
        it = self.state.current() if self.state.current is not None else None
        config = self.state.config or {}
        capacity = (config.get("num_workers") or 0) * (config.get("prefetch_factor") or 0)
        depth = _ready_batches(it._it) if it is not None and it._it is not None else None
        workers = []
        for worker_id, (row, old) in enumerate(zip(rows, previous)):
            batches = row["batches"] - old["batches"]
            fetch_ns = row["fetch_ns"] - old["fetch_ns"]
            entry = {
                "id": worker_id, "pid": row["pid"] or None, "batches": row["batches"],
                "batches_interval": batches,
                "load_ms_mean": row["fetch_ns"] / row["batches"] / 1e6 if row["batches"] else None,
                "load_ms_interval": fetch_ns / batches / 1e6 if batches else None,
                "load_ms_max": row["max_fetch_ns"] / 1e6 if row["batches"] else None,
                "cpu_fraction": row["fetch_cpu_ns"] / row["fetch_ns"] if row["fetch_ns"] else None,
                "samples": row["samples"],
            }
            if row["snapshots"]:  # a StatefulDataLoader's worker-state snapshots (snapshots.py)
                entry.update(snapshots=row["snapshots"],
                             snapshot_ms_mean=row["snapshot_ns"] / row["snapshots"] / 1e6,
                             snapshot_load_ms=row["snapshot_load_ns"] / 1e6,
                             snapshot_bytes=row["snapshot_bytes"])
            known = process_state(row["pid"]) if row["pid"] else None
            if known is not None:
                entry.update({k: v for k, v in known.items() if k != "pid"})
            else:
                entry.update(state="unknown" if row["pid"] else "not_started", cpu_pct=None, rss_bytes=None)
            if entry.get("state") in ("gone", "zombie") and "exit_signal" not in entry and it is not None:
                entry.update(reaped_signal(it._it, worker_id, row["pid"]))
            current = board.current(worker_id) if row["batches"] else None
            if current and current["batch_bytes"]:
                entry["batch_bytes"] = current["batch_bytes"]  # sampled in the worker
            if memory and row["pid"] and str(row["pid"]) in memory:
                entry.update(memory[str(row["pid"])])  # uss_bytes, pss_bytes, mem_t_ns
            workers.append(entry)
        # A worker whose state is not known yet makes the count unknown, not smaller.
        alive = (None if any(w["state"] == "unknown" for w in workers)
                 else sum(1 for w in workers if w["state"] in ("running", "sleeping")))
        # An IterableDataset's loader samples with torch's _InfiniteConstantSampler.
        iterable = config.get("sampler") == "_InfiniteConstantSampler"
        hashes = [trimmed(h) for h in board.hashes()] if iterable else []
        shards = compare_readers(hashes) if len(hashes) >= 2 else None
        # The collector compares ranks with these; sent again only when a worker hashed more.
        fresh = hashes if any(hashes) and hashes != self.sent_hashes else None
        if fresh:
            self.sent_hashes = hashes
        return {"t_ns": time.time_ns(), "loader": self.state.name, "workers": workers,
                **({"shard_check": shards} if shards else {}),
                **({"shard_hashes": fresh} if fresh else {}),
                "configured_workers": config.get("num_workers"), "alive_workers": alive,
                "queue_depth": depth, "queue_capacity": capacity or None,
                "persistent_workers": config.get("persistent_workers"),
                **({"state_dict_calls": board.checkpoints.calls,
                    "checkpoint_interval_steps": board.checkpoints.interval_steps()}
                   if board.checkpoints.calls else {})}


class LoopCpu:
    """The training process's CPU time over the sampler intervals each loader's loop ran
    through (its iterator open at both ends of the interval), added to the loader's totals:
    the diagnosis's measured CPU share of the training process (model.py). One clock read
    per tick on this thread; nothing on the training thread."""

    def __init__(self) -> None:
        self.last: tuple[int, int] | None = None
        self.open_at_last: dict[int, bool] = {}

    def tick(self, states) -> None:
        now, cpu = time.perf_counter_ns(), time.process_time_ns()
        last, self.last = self.last, (now, cpu)
        for state in states:
            ref = state.current
            it = ref() if ref is not None else None
            running = it is not None and not it._ended
            if running and last is not None and self.open_at_last.get(id(state)):
                state.totals.loop_process_cpu_ns += max(0, cpu - last[1])
                state.totals.loop_wall_ns += max(0, now - last[0])
            self.open_at_last[id(state)] = running


class StallDetector:
    """A wait for one batch longer than max(min_s, factor x median wait) is a stall: reported
    once when it starts (with the worker states) and once when it ends."""

    def __init__(self, session) -> None:
        self.session = session
        self.open: dict[str, dict] = {}
        self.stack_requests: list[tuple] = []  # (loader, started_ns, pid, signal, path)

    def _waiting(self) -> list[tuple]:
        """(loader state, its iterator or None, when the wait began, "next" or "iter") of every
        wait in progress: per thread, the innermost watched loader whose next() is in
        progress (a loader iterated on another thread waits on its own), and every iter() in
        progress. From the iterators' own state, never the training threads' frames: walking
        another thread's frames (f_back, f_code, f_locals) can crash CPython 3.11
        (python/cpython#111363), and did in this test suite."""
        from .loader import ACTIVE, STARTING
        out, threads = [], set()
        for thread, stack in ACTIVE.by_thread():
            for ref in reversed(list(stack)):  # innermost first
                it = ref()
                since = it.waiting_since() if it is not None else None
                if since is not None:
                    out.append((it._state, it, since, "next"))
                    threads.add(thread)
                    break
        # iter() in progress (worker start-up), on a thread not waiting for a next() already
        out += [(state, None, t0, "iter") for state, t0, thread in list(STARTING) if thread not in threads]
        return out

    def check(self, worker_snapshots: dict[str, dict]) -> None:
        settings = self.session.settings
        now_perf = time.perf_counter_ns()
        stalled: set[str] = set()
        for state, it, t_call, phase in self._waiting():
            if state is None or t_call is None or state.name in stalled:
                continue
            name = state.name
            wait_ns = now_perf - t_call
            median_ns, threshold_ns = None, settings.stall_min_s * 1e9
            # An epoch's first batch holds the start-up (workers spawning, a large job's
            # dataset opening): judged against a start-up allowance, not the steady state's.
            first = phase == "iter" or (it is not None and it.current_step() == 0)
            if first:
                threshold_ns = (settings.stall_startup_s or 6 * settings.stall_min_s) * 1e9
            if wait_ns > threshold_ns:  # only then the book (possibly the sidecar's, parsed)
                stats = self.session.shipper.book().stats.get(state.index)
                if first:  # or twice the slowest first batch of the epochs before
                    earlier = stats.first_wait.maximum if stats is not None and stats.first_wait.count else 0
                    threshold_ns = max(threshold_ns, 2 * earlier)
                else:
                    median_ns = stats.steady_wait().quantile(0.5) if stats is not None and stats.wait.count else None
                    threshold_ns = max(threshold_ns, settings.stall_median_factor * (median_ns or 0))
            if wait_ns > threshold_ns:
                stalled.add(name)
                started_ns = t_call + self.session.wall_offset_ns
                if name in self.open and self.open[name]["started_ns"] != started_ns:
                    self._end(name)  # another wait of the same loader: that stall is over
                if name not in self.open:
                    snapshot = worker_snapshots.get(name)
                    event = {"loader": name, "rank": self.session.rank,
                             "epoch": it._epoch if it is not None else state.totals.epochs,
                             "step": it.current_step() if it is not None else 0,
                             "started_ns": t_call + self.session.wall_offset_ns, "ended_ns": None,
                             "wait_s": wait_ns / 1e9, "threshold_s": threshold_ns / 1e9,
                             "median_wait_ms": median_ns / 1e6 if median_ns else None,
                             "workers": (snapshot or {}).get("workers", []),
                             "t_ns": time.time_ns()}
                    request = self._describe_hang(event, state, it, phase, snapshot)
                    self.open[name] = event
                    self._emit(event)
                    if request is not None:
                        self.stack_requests.append((name, event["started_ns"], *request))
                else:
                    event = self.open[name]
                    event["wait_s"] = wait_ns / 1e9
                    self._refresh_worker_state(event, worker_snapshots.get(name))
        for name in list(self.open):
            if name not in stalled:
                self._end(name)

    def _end(self, name: str) -> None:
        ended = dict(self.open.pop(name), ended_ns=time.time_ns(), t_ns=time.time_ns())
        self._emit(ended)

    def _describe_hang(self, event: dict, state, it, phase: str, snapshot) -> tuple | None:
        """The worker holding the batch, its state, indices and stack (hang.py)."""
        from .hang import describe
        try:
            fields, request = describe(self.session, state, it._it if it is not None else None,
                                       phase, snapshot)
        except Exception as exc:  # a torch version we cannot read: the stall is still reported
            event["phase"] = phase
            self.session.shipper._note_error(f"stall details: {exc!r}")
            return None
        event.update(fields)
        return request

    def _refresh_worker_state(self, event: dict, snapshot: dict | None) -> None:
        """A worker's state is unknown until the sidecar's first reading of its pid: once it
        is known (or changes, say to gone), the stall event says so."""
        worker = event.get("worker")
        workers = (snapshot or {}).get("workers") or []
        if worker is None or worker >= len(workers) or workers[worker].get("pid") != event.get("worker_pid"):
            return
        state = workers[worker].get("state")
        if state != event.get("worker_state"):
            event["worker_state"] = state
            self._emit(dict(event, t_ns=time.time_ns()))

    def got_stack(self, loader: str, started_ns: int, text: str | None) -> None:
        """A worker's stack arrived (from the sidecar or read here): the stall event again."""
        for source in (list(self.open.values()), self.session.stalls):
            for event in source:
                if event["loader"] == loader and event["started_ns"] == started_ns and text:
                    event["stack"] = text
        for event in self.session.stalls:
            if event["loader"] == loader and event["started_ns"] == started_ns and text:
                self._emit(dict(event, t_ns=time.time_ns()))
                return

    def _emit(self, event: dict) -> None:
        stalls = self.session.stalls
        for i, old in enumerate(stalls):
            if old["loader"] == event["loader"] and old["started_ns"] == event["started_ns"]:
                stalls[i] = event
                break
        else:
            stalls.append(event)
        # The collector keeps MAX_STALL_ROWS_PER_RANK stall events per rank (limits.py) and
        # refuses a batch past it: one process sends a quarter (a restarted rank stays in its run).
        sent = getattr(self.session, "stall_events_sent", 0)
        if sent >= MAX_STALL_ROWS_PER_RANK // 4:
            self.session.dropped_events += 1
            return
        self.session.stall_events_sent = sent + 1
        self.session.emit("stalls", event)


class Sampler(threading.Thread):
    """The training process's sampler thread. System readings come from the sidecar process;
    what only this process can see (worker boards, queue depth, the training thread's stack
    for stalls, the CPU probe) is read here, without syscalls. Without a sidecar
    (STARVEWATCH_SIDECAR=0, or it died) the same readings are taken on this thread."""

    def __init__(self, session) -> None:
        super().__init__(name="starvewatch-sampler", daemon=True)
        self.session = session
        self._halt = threading.Event()
        self.loader_watches: dict[str, LoaderWatch] = {}
        self.history: list[tuple[str, dict]] = []  # for the in-process summary's system overview
        self.worker_memory: dict[str, dict] = {}  # pid -> latest USS/PSS reading (the sidecar's)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(3)

    def _record(self, kind: str, event: dict) -> None:
        self.session.emit(kind, event)
        if len(self.history) < 50_000:
            self.history.append((kind, event))

    def run(self) -> None:
        settings = self.session.settings
        link = self.session.sidecar
        host, host_tried = None, False
        process_states: dict[str, dict] = {}
        stalls = StallDetector(self.session)
        loop_cpu = LoopCpu()
        host_every, gpu_every = settings.host_interval_s, settings.gpu_interval_s
        next_host = next_gpu = time.monotonic()
        gpu_enabled = True
        final = False
        while not final:
            final = self._halt.is_set()  # one last reading at stop: short runs get data too
            now = time.monotonic()
            try:
                if now >= next_host or final:
                    if link is not None:
                        if link.collector is not None:  # what the sidecar found at the URL
                            self.session.announce_collector(link.collector)
                            link.collector = None
                        for reading in link.final_readings(1.5) if final else link.take_readings():
                            kind = reading.get("kind")
                            if kind in ("host", "gpu"):
                                self._record("samples", reading)
                            elif kind == "processes":
                                process_states = reading["states"]
                            elif kind == "stack":  # a hung worker's stack, read by the sidecar
                                stalls.got_stack(reading["loader"], reading["started_ns"], reading.get("text"))
                            elif kind == "worker_memory":
                                self.worker_memory.update(reading["workers"])
                            # ("sampled" marks the end of the final reading)
                        if not link.alive and not final:  # it died: sample on this thread from now on
                            self._note("sidecar exited; sampling in the training process")
                            link = None
                    if link is None and host is None and not host_tried:
                        host_tried = True
                        psutil = _psutil()
                        host = HostSampler(psutil) if psutil is not None else None
                    if host is not None:
                        self._record("samples", host.sample())
                    lookup = (host.process_state if host is not None
                              else lambda pid: process_states.get(str(pid)))
                    snapshots, pids = {}, []
                    loop_cpu.tick(list(self.session.loader_list))
                    for state in list(self.session.loader_list):
                        current = state.current() if state.current is not None else None
                        if current is not None:
                            current.probe_cpu()
                        # Held past here, a dropped iterator (zip's partner when the loop ends)
                        # would keep its last step open until this thread lets go.
                        current = None
                        watch = self.loader_watches.setdefault(state.name, LoaderWatch(state))
                        snapshot = watch.sample(lookup, self.worker_memory)
                        if snapshot is not None:
                            snapshots[state.name] = snapshot
                            pids += [w["pid"] for w in snapshot["workers"] if w["pid"]]
                            self._record("workers", snapshot)
                    if link is not None and not final:
                        link.watch_pids(sorted(pids))
                    stalls.check(snapshots)
                    self._request_stacks(stalls, link)
                    if not final:
                        self.session.shipper.drive()
                    # Fixed rate without drift: the next tick is on the grid, skipping missed ones.
                    next_host += host_every * max(1, int((now - next_host) // host_every) + 1)
                if link is None and gpu_enabled and now >= next_gpu:
                    gpu_enabled = self._sample_gpu()
                    next_gpu += gpu_every * max(1, int((now - next_gpu) // gpu_every) + 1)
            except Exception as exc:  # a sampler problem never reaches the training loop
                self._note(f"sampler: {exc!r}")
            if not final:
                wake = next_host if link is not None or not gpu_enabled else min(next_host, next_gpu)
                self._halt.wait(max(0.0, wake - time.monotonic()))

    def _request_stacks(self, stalls: StallDetector, link) -> None:
        """Hung workers' stacks: the sidecar signals and reads (the answer comes with a later
        reading); without one, this thread does, once per stall."""
        while stalls.stack_requests:
            loader, started_ns, pid, signum, path = stalls.stack_requests.pop(0)
            if link is not None and link.alive:
                link.request_stack({"loader": loader, "started_ns": started_ns, "pid": pid,
                                    "signal": signum, "path": path})
            else:
                from .stacks import request
                stalls.got_stack(loader, started_ns, request(pid, signum, path, parent_pid=os.getpid()))

    def _note(self, text: str) -> None:
        self.session.shipper._note_error(text)

    def _sample_gpu(self) -> bool:
        available, reading = gpu_reading()
        if reading is not None:
            self._record("samples", reading)
        return available


def gpu_reading(pid: int | None = None) -> tuple[bool, dict | None]:
    """(NVML usable, a "gpu" sample or None): for the sampler thread and the sidecar alike."""
    from . import nvml
    if not nvml.init():
        return False, None
    devices = nvml.sample(pid)
    return True, ({"kind": "gpu", "t_ns": time.time_ns(), "devices": devices} if devices else None)


def start_samplers(session) -> None:
    sampler = Sampler(session)
    session.samplers.append(sampler)
    sampler.start()
