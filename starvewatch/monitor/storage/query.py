"""The read side shared by the API, the CLI and the dashboard: runs, summaries, series."""
from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import time
from collections import OrderedDict

import orjson

from ...analysis.summary import iso, summarize
from ..budget import rollup_bands
from .folded_reads import recent_notes, rolled_spans, samples_rolled
from .project_scope import visible_projects
from ..budget.retention import RAW_WINDOW_STEPS
from .store import Store
from ...analysis.live_tuning import with_live_tuning
from ...analysis.measured_tuning import with_tuning
from ...logonce import RateLimitedLog
from ...schema import BAND_ORDER

# A run whose stored data cannot be read is said once in a while, for that run alone.
_unreadable = RateLimitedLog(logging.getLogger("starvewatch.collector"))

STATUSES = ("live", "stalled", "finished", "lost")


class NotFound(LookupError):
    pass


# Ten browsers polling one live run page must cost about one computation, not ten: answers
# are reused while the run's data has not changed, and for at most this long while it has.
MAX_STALENESS_S = 0.25


# The cache's bounds. By entries: high, so a 256-rank run page (one summary per rank, plus
# each rank's system overview) never evicts its own answers within one pass. By size: an
# estimate of the rows an answer holds (answer_rows), since one `events` answer can hold 50,000
# events; about 200,000 rows is some hundreds of MB at the worst (JSON-decoded event dicts).
MAX_CACHE_ENTRIES = 20_000
MAX_CACHE_ROWS = 200_000


def answer_rows(value, depth: int = 2) -> int:
    """A cheap estimate of an answer's size: the items of its lists, counted to `depth` levels
    of nesting (an events answer: its events and their workers or devices; a series: its
    points), plus one for the answer itself. Linear in the answer's outer items, never a
    recursive sys.getsizeof."""
    if isinstance(value, dict):
        if depth <= 0:
            return 1
        return 1 + sum(answer_rows(v, depth - 1) - 1 for v in value.values() if isinstance(v, (list, tuple, dict)))
    if isinstance(value, (list, tuple)):
        if depth <= 0:
            return 1 + len(value)
        return 1 + len(value) + sum(answer_rows(v, depth - 1) - 1 for v in value
                                    if isinstance(v, (list, tuple, dict)))
    return 1


def cached(per_run: bool = True, max_age_s: float | None = 5.0):
    """max_age_s: how long an answer whose data has not changed is reused (None: until it
    changes). Answers that depend on the clock (live/lost status) keep an age limit; a pure
    function of the data (a series) does not, so a slow one is not computed again on every poll.
    The cache is a least-recently-used one, bounded by entries and by rows (Query.MAX_CACHE_*)."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            version = self.store.versions.get(args[0], 0) if per_run and args else self.store.version
            # The caller's projects are part of the question: a runs list for one project is
            # not the list for everyone (project_scope.py).
            key = (fn.__name__, args, tuple(sorted(kwargs.items())), visible_projects.get())
            now = time.monotonic()
            hit = self._cache.get(key)
            # Time-dependent answers (live/lost status) are refreshed every few seconds anyway.
            deletions = self.store.deletions
            if hit is not None and (max_age_s is None or now - hit[1] < max_age_s) and hit[3] == deletions and (
                    hit[0] == version or now - hit[1] < MAX_STALENESS_S):
                with self._cache_lock:
                    if key in self._cache:
                        self._cache.move_to_end(key)
                return hit[2]
            value = fn(self, *args, **kwargs)
            self._remember(key, (version, now, value, deletions))
            return value
        return wrapper
    return decorate


# How many earlier runs of a name are looked at for one that can be compared with.
PREVIOUS_CANDIDATES = 20


def comparable(status: str | None, verdict: str | None) -> bool:
    """A run to compare a later one with: it ran its course (not lost or interrupted) and has
    enough data for a verdict."""
    return status not in ("lost", "interrupted") and verdict not in (None, "insufficient_data")


def mark_regressions(runs: list[dict]) -> None:
    """Each listed run slower than the previous comparable run of its name beyond noise gets
    `regression` {speedup, interval, sentence} (analysis/regression.py's judgement on the
    training loaders' rates; the run page adds the likely cause)."""
    from ...analysis.regression import regression
    by_name: dict[tuple, list[dict]] = {}
    for r in sorted(runs, key=lambda r: r["started_at"] or ""):
        # Within a project: a run is never judged against (nor names) another project's.
        by_name.setdefault((r.get("project"), r["name"]), []).append(r)
    for members in by_name.values():
        previous = None
        for r in members:
            r["regression"] = None
            if previous is not None:
                r["regression"] = regression(_as_summary(previous), _as_summary(r))
            if comparable(r["status"], r["verdict"]):
                previous = r


def _as_summary(listed: dict) -> dict:
    part = {"name": listed.get("training_loader") or "train", "steps": listed.get("steps"),
            "batches_per_s": listed.get("batches_per_s"), "samples_per_s": listed.get("samples_per_s")}
    return {"run": {"id": listed["id"]}, "verdict": {"training_loader": part["name"]}, "loaders": [part]}


class Query:
    def __init__(self, store: Store, lost_after_s: float = 60.0) -> None:
        self.store = store
        self.lost_after_s = lost_after_s
        # key -> (version, time, answer, deletions, rows), least recently used first.
        self._cache: OrderedDict = OrderedDict()
        self._cache_lock = threading.Lock()
        self.cache_rows = 0  # the answer_rows of every cached answer, added up

    MAX_CACHE_ENTRIES = MAX_CACHE_ENTRIES
    MAX_CACHE_ROWS = MAX_CACHE_ROWS

    def _remember(self, key, entry: tuple) -> None:
        """Cache an answer, evicting the least recently used ones past either bound. An answer
        larger than the whole row bound is not kept (it would evict everything else)."""
        rows = answer_rows(entry[2])
        with self._cache_lock:
            old = self._cache.pop(key, None)
            if old is not None:
                self.cache_rows -= old[4]
            if rows > self.MAX_CACHE_ROWS:
                return
            self._cache[key] = (*entry, rows)
            self.cache_rows += rows
            while len(self._cache) > self.MAX_CACHE_ENTRIES or self.cache_rows > self.MAX_CACHE_ROWS:
                _, evicted = self._cache.popitem(last=False)
                self.cache_rows -= evicted[4]

    # ---- runs ------------------------------------------------------------------------------
    def _row(self, run_id: str):
        row = self.store.run_row(run_id)
        if row is None:
            raise NotFound(f"unknown run id {run_id!r}")
        return row

    def stalls(self, run_id: str) -> list[dict]:
        """One entry per stall (the latest event about it: begun, then ended)."""
        rows = self.store.reader().execute(
            "SELECT data FROM events WHERE run_id = ? AND kind = 'stalls' ORDER BY t_ns", (run_id,)).fetchall()
        return _merge_stalls([orjson.loads(data) for (data,) in rows])

    def live_tuning(self, run_id: str, rank: int | None = None) -> dict | None:
        """Live tuning's records of a run (watch(tune=True), hooks/live_tuner.py): every window
        and decision, and each loader's outcome (start, final, gain, the line to copy), the
        shape of finish()'s `tuning` section; None for a run that was not tuned."""
        rows = self.store.reader().execute(
            "SELECT rank, data FROM events WHERE run_id = ? AND kind = 'tuning' ORDER BY t_ns", (run_id,)).fetchall()
        found = [orjson.loads(data) for r, data in rows if rank is None or r == rank]
        if not found:
            return None
        return with_live_tuning({}, [e for e in found if e.get("decision") != "outcome"],
                                [e for e in found if e.get("decision") == "outcome"])["live_tuning"]

    def active_stalls(self, run_id: str) -> list[dict]:
        return [e for e in self.stalls(run_id) if not e.get("ended_ns")]

    def status(self, run_id: str, streams=None, now: float | None = None) -> str:
        streams = streams if streams is not None else self.store.stream_rows(run_id)
        now = time.time() if now is None else now
        if streams and all(s["finished"] for s in streams):
            return "finished"
        alive = [s for s in streams if not s["finished"] and now - s["last_seen"] <= self.lost_after_s]
        if not alive:
            return "lost" if streams else "finished"
        return "stalled" if self.active_stalls(run_id) else "live"

    def run_meta(self, run_id: str) -> dict:
        row = self._row(run_id)
        meta = orjson.loads(row["meta"])
        streams = self.store.stream_rows(run_id)
        meta.update(id=row["id"], name=row["name"], started_at=row["started_at"] or row["first_seen"],
                    ended_at=row["ended_at"], status=self.status(run_id, streams),
                    world_size=meta.get("world_size", 1), rank=meta.get("rank", 0))
        return meta

    @cached(per_run=True)
    def summary(self, run_id: str, rank: int | None = None) -> dict:
        meta = self.run_meta(run_id)
        loaders = self.store.loader_data(run_id, rank)
        live = self.live_tuning(run_id, rank)
        summary = summarize(meta, loaders, stalls=self.stalls(run_id),
                            system=self.system_overview(run_id, rank), previous=self.previous_summary(meta),
                            worker_events=self.worker_events(run_id, rank),
                            live_tuning=None if live is None else (live["records"], live["loaders"]))
        if rank is None:
            summary["stragglers"] = self.stragglers(run_id)
        streams = [s for s in self.store.stream_rows(run_id) if rank is None or s["rank"] == rank]
        delivery = merge_accounts([stream_account(s) for s in streams])
        if rank is None:
            delivery = with_rejected_files(delivery, self.store.rejected_files(run_id), streams)
        if delivery is not None:
            summary["delivery"] = delivery
        rolled = rolled_spans(self.store.reader(), run_id)
        if rolled:  # which spans only the rollups hold (storage budget, monitor/budget/retention.py)
            summary["rolled_up"] = [r for r in rolled if rank is None or r["rank"] == rank]
        folded = [r for r in samples_rolled(self.store.reader(), run_id) if rank is None or r["rank"] == rank]
        if folded:  # which spans of host, GPU and worker samples are per-bucket aggregates
            summary["samples_rolled_up"] = folded
        return with_tuning(summary, self.store.latest_tuning(run_id))

    def worker_events(self, run_id: str, rank: int | None = None) -> list[dict]:
        """The workers' snapshots of a run (or of one rank), oldest first."""
        sql = "SELECT rank, data FROM events WHERE run_id = ? AND kind = 'workers'"
        args: tuple = (run_id,)
        if rank is not None:
            sql, args = sql + " AND rank = ?", (run_id, rank)
        rows = self.store.reader().execute(sql + " ORDER BY t_ns", args).fetchall()
        return [{"rank": r, **orjson.loads(data)} for r, data in rows]

    @cached(per_run=True)
    def worker_memory(self, run_id: str) -> dict:
        """Per-worker USS/PSS over time (GET /api/v1/runs/{run_id}/workers/memory)."""
        from ...analysis.findings import worker_memory_series
        self._row(run_id)
        return {"series": worker_memory_series(self.worker_events(run_id))}

    @cached(per_run=True)
    def tuning(self, run_id: str) -> dict | None:
        """The latest `starvewatch tune` results stored with the run (None: never tuned)."""
        self._row(run_id)
        return self.store.latest_tuning(run_id)

    STRAGGLER_ROWS = RAW_WINDOW_STEPS  # the storage budget keeps this many raw (retention.py)

    def _recent_step_ranges(self, run_id: str, ranks: int) -> list[tuple[int, int]]:
        """Rowid ranges of each rank's latest step records, about STRAGGLER_ROWS in all: a long
        run is judged on its recent steps, so the answer costs the same at any length. Each
        stored block holds one batch of one rank (its rank read from its first row). A run's
        blocks never overlap, so newest first is the index's order, read backwards: a run of
        millions of blocks is not sorted for it."""
        quota = self.STRAGGLER_ROWS // max(1, ranks)
        taken: dict[int, int] = {}
        picked = []
        for first, last, rank in self.store.reader().execute(
                "SELECT b.first_rowid, b.last_rowid, s.rank FROM step_blocks b JOIN steps s "
                "ON s.rowid = b.first_rowid WHERE b.run_id = ? ORDER BY b.first_rowid DESC", (run_id,)):
            if taken.get(rank, 0) < quota:
                taken[rank] = taken.get(rank, 0) + last - first + 1
                picked.append((first, last))
            elif len(taken) >= ranks and all(n >= quota for n in taken.values()):
                break
        merged: list[list[int]] = []
        for first, last in sorted(picked):
            if merged and first == merged[-1][1] + 1:
                merged[-1][1] = last
            else:
                merged.append([first, last])
        return [(a, b) for a, b in merged]

    @cached(per_run=True, max_age_s=None)
    def stragglers(self, run_id: str) -> dict | None:
        """Ranks that hold a synchronous job back (analysis/stragglers.py); None with one rank."""
        from ...analysis.stragglers import DEFAULT, find_stragglers, likely_cause, windows_from_rows
        streams = self.store.stream_rows(run_id)
        ranks = sorted({s["rank"] for s in streams})
        span = self.store.step_range(run_id)
        if len(ranks) < 2 or span is None:
            return None
        width = DEFAULT.window_steps
        db = self.store.reader()
        sums: dict[tuple, list] = {}
        for lo, hi in self._recent_step_ranges(run_id, len(ranks)):
            for row in db.execute(
                    "SELECT loader, epoch, step / ?, rank, count(*), sum(wait_ns), sum(compute_ns), sum(other_ns), "
                    "sum(other_ns > 0) FROM steps WHERE rowid BETWEEN ? AND ? AND run_id = ? "
                    "GROUP BY loader, epoch, step / ?, rank", (width, lo, hi, run_id, width)):
                total = sums.setdefault(tuple(row[:4]), [0] * 5)
                for i, value in enumerate(row[4:]):
                    total[i] += value
        rows = [(*key, *values) for key, values in sums.items()]
        last_phase = db.execute("SELECT max(rowid) FROM phases WHERE run_id = ?", (run_id,)).fetchone()[0] or 0
        forward = db.execute(
            "SELECT loader, epoch, step / ?, rank, count(*), sum(ns) FROM phases WHERE rowid > ? AND run_id = ? "
            "AND name = 'forward' GROUP BY loader, epoch, step / ?, rank",
            (width, last_phase - 4 * self.STRAGGLER_ROWS, run_id, width)).fetchall()
        result = find_stragglers(windows_from_rows(rows, forward_rows=forward))
        hosts = {s["rank"]: s["stream"].rsplit("-", 2)[0] for s in streams}  # "<host>-<pid>-<hex>"
        systems = {rank: {**(self.system_overview(run_id, rank) or {}), "host": hosts.get(rank)}
                   for rank in ranks}
        for finding in result["stragglers"]:
            rank = finding["rank"]
            finding["cause"] = likely_cause(finding, self.summary(run_id, rank), systems[rank],
                                            [systems[r] for r in ranks if r != rank])
        result["ranks"] = ranks
        return result

    def previous_run_id(self, run_id: str, name: str | None = None) -> str | None:
        """The latest run with the same name that started before this one and can be compared
        with: not lost or interrupted, with enough data for a verdict (issue 34); or None."""
        name = name if name is not None else self._row(run_id)["name"]
        # Of the same project: another project's run is neither compared with nor named.
        rows = self.store.reader().execute(
            "SELECT id FROM runs WHERE name = ? AND id != ? AND coalesce(started_at, first_seen) < "
            "(SELECT coalesce(started_at, first_seen) FROM runs WHERE id = ?) AND coalesce(project, '') = "
            "coalesce((SELECT project FROM runs WHERE id = ?), '') "
            "ORDER BY coalesce(started_at, first_seen) DESC LIMIT ?",
            (name, run_id, run_id, run_id, PREVIOUS_CANDIDATES)).fetchall()
        for (candidate,) in rows:
            if comparable(self.status(candidate), self._listed_figures(candidate)["verdict"]):
                return candidate
        return None

    def previous_summary(self, meta: dict) -> dict | None:
        """The latest earlier run with the same name (for verify-after-change)."""
        previous = self.previous_run_id(meta["id"], meta["name"])
        if previous is None:
            return None
        try:
            prev_meta = self.run_meta(previous)
            live = self.live_tuning(previous)  # a tuned earlier run: compared by its final configuration
            summary = summarize(prev_meta, self.store.loader_data(previous), system=self.system_overview(previous),
                                live_tuning=None if live is None else (live["records"], live["loaders"]))
            return with_tuning(summary, self.store.latest_tuning(previous))
        except Exception as exc:  # an earlier run that cannot be read never breaks this one
            _unreadable.error(f"previous:{type(exc).__name__}", "run %s cannot be compared with: %s: %s",
                              previous[:128], type(exc).__name__, str(exc)[:300])
            return None

    @cached(per_run=True, max_age_s=None)
    def distributions(self, run_id: str, loader: str) -> dict:
        """Wait and compute per batch over every step of one loader (all ranks), from the same
        log-bucketed histograms as the percentiles: {"wait": {"buckets": [[ms, count], ...],
        "count", "max_ms"}, "compute": {...}}. Exact counts, values within 1.6%."""
        from ...stats import bucket_value
        self._row(run_id)
        data = next((d for d in self.store.loader_data(run_id) if d.name == loader), None)
        out = {}
        for part in ("wait", "compute"):
            hist = getattr(data.records, part) if data is not None and data.records else None
            if hist is None or not hist.count:
                out[part] = {"buckets": [], "count": 0, "max_ms": None}
                continue
            buckets = [[min(bucket_value(i), hist.maximum) / 1e6, n] for i, n in sorted(hist.counts.items())]
            out[part] = {"buckets": buckets, "count": hist.count, "max_ms": hist.maximum / 1e6}
        return out

    def system_overview(self, run_id: str, rank: int | None = None) -> dict | None:
        """Averages of the host, GPU and worker samples over the run, or over one rank's own
        samples (None when there are none)."""
        from ...analysis.system import overview
        sql, args = ("SELECT kind, data, rank FROM events WHERE run_id = ? AND kind IN ('samples', 'workers')",
                     [run_id])
        if rank is not None:
            sql += " AND rank = ?"
            args.append(rank)
        # In time order: a bucket of folded samples (stored after newer raw ones) takes its place.
        rows = self.store.reader().execute(sql + " ORDER BY t_ns, rowid", args).fetchall()
        if not rows:
            return None
        # Each event with its rank: the workers' part is one rank's (system.overview).
        return overview([(kind, {**orjson.loads(data), "rank": r}) for kind, data, r in rows])

    @cached(per_run=False)
    def list_runs(self, status: str | None = None, search: str | None = None) -> list[dict]:
        out = []
        for row in self.store.run_rows():
            if search and search.lower() not in (row["name"] + " " + row["id"]).lower():
                continue
            run_status = self.status(row["id"])
            if status and run_status != status:
                continue
            started = row["started_at"] or row["first_seen"]
            ended = row["ended_at"] if run_status == "finished" else None
            try:
                figures = self._listed_figures(row["id"])
            except Exception as exc:  # one run's unreadable totals: listed without figures
                _unreadable.error(f"list:{type(exc).__name__}", "run %s listed without figures: %s: %s",
                                  row["id"][:128], type(exc).__name__, str(exc)[:300])
                figures = {"verdict": BAND_ORDER[0], "input_wait_fraction": None, "batches_per_s": None,
                           "steps": 0, "unreadable": f"{type(exc).__name__}: {str(exc)[:200]}"}
            out.append({
                "id": row["id"], "name": row["name"], "project": row["project"], "status": run_status,
                "started_at": iso(started), "ended_at": iso(ended),
                "duration_s": (ended or row["last_seen"]) - started,
                **figures,
                "ranks": len({s["rank"] for s in self.store.stream_rows(row["id"])}),
            })
        mark_regressions(out)
        return out

    def _listed_figures(self, run_id: str) -> dict:
        """A run's verdict, input wait, batches/s and steps as its summary computes them, from
        the loaders' totals alone (no histograms, no diagnosis): the runs page lists thousands."""
        from ...stats import LoaderTotals
        merged: dict[str, tuple[LoaderTotals, set]] = {}
        for row in self.store.loader_rows(run_id):
            totals = LoaderTotals.from_dict(orjson.loads(row["totals"]))
            if row["name"] not in merged:
                merged[row["name"]] = (totals, {row["rank"]})
                continue
            known, ranks = merged[row["name"]]
            epochs = max(known.epochs, totals.epochs)  # ranks run the same epochs (as Store.loader_data)
            known.merge(totals)
            known.epochs = epochs
            ranks.add(row["rank"])
        from ...analysis.summary import LoaderData, loader_summary, run_verdict
        configs = {row["name"]: orjson.loads(row["config"]) if row["config"] else None
                   for row in self.store.loader_rows(run_id)}
        data = [LoaderData(name, configs.get(name), t, None, sorted(ranks)) for name, (t, ranks) in merged.items()]
        verdict = run_verdict(data, [loader_summary(d) for d in data])
        return {"verdict": verdict["input_bound"], "input_wait_fraction": verdict["input_wait_fraction"],
                "training_loader": verdict["training_loader"],
                # The training loader's: another loader's batches are not the run's throughput.
                "batches_per_s": verdict["batches_per_s"], "samples_per_s": verdict["samples_per_s"],
                "steps": sum(t.steps for t, _ in merged.values())}

    @cached(per_run=False)
    def storage_notes(self) -> list[dict]:
        """The latest runs the storage budget coarsened or deleted (the runs page's banner). A
        caller restricted to some projects reads only its runs' notes (a deleted run's project
        is gone with it: its note is not shown there)."""
        notes = recent_notes(self.store.reader())
        if visible_projects.get() is None:
            return notes
        return [n for n in notes if n["run_id"] is not None and self.store.run_row(n["run_id"]) is not None]

    @cached(per_run=True)
    def detail(self, run_id: str) -> dict:
        meta = self.run_meta(run_id)
        streams = self.store.stream_rows(run_id)
        loaders = {}
        for row in self.store.loader_rows(run_id):
            entry = loaders.setdefault(row["name"], {"name": row["name"], "kind": row["kind"],
                                                      "config": orjson.loads(row["config"]) if row["config"] else None,
                                                      "ranks": []})
            if row["rank"] not in entry["ranks"]:
                entry["ranks"].append(row["rank"])
        return {
            "run": {**meta, "started_at": iso(meta["started_at"]), "ended_at": iso(meta.get("ended_at"))},
            "loaders": list(loaders.values()),
            "ranks": [{"rank": s["rank"], "stream": s["stream"], "last_seq": s["last_seq"],
                       "last_seen": iso(s["last_seen"]), "finished": bool(s["finished"]),
                       "drops": orjson.loads(s["drops"]), "delivery": stream_account(s)} for s in streams],
            # Summed over the processes that reported one (None when none has).
            "delivery": with_rejected_files(merge_accounts([stream_account(s) for s in streams]),
                                            self.store.rejected_files(run_id), streams),
        }

    # ---- raw records and series --------------------------------------------------------------
    def steps_page(self, run_id: str, after: int = 0, limit: int = 10_000, loader: str | None = None) -> dict:
        self._row(run_id)
        span = self.store.step_range(run_id)
        if span is None:
            return {"steps": [], "next_after": None}
        sql = ("SELECT rowid, rank, loader, epoch, step, start_ns, wait_ns, compute_ns, other_ns, "
               "batch_size, gpu_idle_ns FROM steps WHERE rowid > ? AND rowid <= ? AND run_id = ?")
        args: list = [max(after, span[0] - 1), span[1], run_id]
        if loader:
            sql += " AND loader = ?"
            args.append(loader)
        sql += " ORDER BY rowid LIMIT ?"
        args.append(limit)
        rows = self.store.reader().execute(sql, args).fetchall()
        columns = ("rank", "loader", "epoch", "step", "start_ns", "wait_ns", "compute_ns", "other_ns",
                   "batch_size", "gpu_idle_ns")
        # The raw rows only: the spans folded into rollups are listed, so a gap is never silent.
        return {"steps": [dict(zip(columns, tuple(r)[1:])) for r in rows],
                "next_after": rows[-1][0] if len(rows) == limit else None,
                "rolled_up": rolled_spans(self.store.reader(), run_id)}

    @cached(per_run=True, max_age_s=None)
    def rollup_series(self, run_id: str, loader: str | None = None, rank: int | None = None,
                      points: int = 500) -> dict:
        """Per-time-bucket wait fraction and throughput from the per-second rollups."""
        self._row(run_id)
        where, args = "run_id = ?", [run_id]
        if loader:
            where += " AND loader = ?"
            args.append(loader)
        # Run-wide: the rank-summed rollups (run_rollups.py), one row per second or tier bucket
        # instead of one per rank; the same sums, and the ranks each bucket covers.
        table, ranks = "run_rollups", "rank_set_count(ranks)"
        if rank is not None:
            where += " AND rank = ?"
            args.append(rank)
            table, ranks = "rollups", "count(DISTINCT rank)"
        db = self.store.reader()
        lo, hi = db.execute(f"SELECT min(second), max(second) FROM {table} WHERE {where}", args).fetchone()
        if lo is None:
            return {"bucket_s": None, "points": []}
        width = max(1, math.ceil((hi - lo + 1) / max(1, points)))
        rows = db.execute(
            f"SELECT (second - ?) / ? AS b, min(second), sum(steps), sum(wait_ns), sum(compute_ns), "
            f"sum(other_ns), sum(samples), sum(gpu_idle_ns), sum(gpu_steps), max(wait_max_ns), "
            f"{ranks} FROM {table} WHERE {where} GROUP BY b ORDER BY b",
            [lo, width, *args]).fetchall()
        out = []
        for _, second, steps, wait, compute, other, samples, gpu_idle, gpu_steps, wait_max, ranks in rows:
            span = width * max(1, ranks)
            out.append({"t": iso(second), "t_s": second, "steps": steps,
                        "input_wait_fraction": wait / (wait + compute) if wait + compute else None,
                        "batches_per_s": steps / width, "samples_per_s": samples / width if samples else None,
                        "wait_ms_mean": wait / steps / 1e6 if steps else None,
                        "compute_ms_mean": compute / steps / 1e6 if steps else None,
                        "wait_ms_max": wait_max / 1e6, "gpu_idle_fraction":
                        gpu_idle / (wait + compute) if gpu_steps and wait + compute else None,
                        "busy_fraction": (wait + compute + other) / (span * 1e9)})
        return {"bucket_s": width, "points": out}

    RAW_STEP_SERIES_MAX = 100_000

    @cached(per_run=True, max_age_s=None)
    def step_series(self, run_id: str, loader: str, rank: int = 0, points: int = 1000) -> dict:
        """Wait and compute per bucket of time, at most `points` buckets: [min, mean, max] of
        each (the chart draws min-max bands, so one slow or fast step shows at any length).
        Long runs and folded ones are drawn from the per-second rollups, which keep each
        second's extremes (rollup_bands.py), so a 1M-step run never scans its rows. Drawn from
        raw rows, a run longer than `points` seconds gets the rollups' own whole-second buckets:
        the chart is the same before and after its rows are folded; a shorter one gets
        sub-second buckets (the rollups' resolution is one second)."""
        self._row(run_id)
        db = self.store.reader()
        total = db.execute("SELECT sum(steps) FROM rollups WHERE run_id = ? AND loader = ? AND rank = ?",
                           (run_id, loader, rank)).fetchone()[0] or 0
        folded = db.execute("SELECT 1 FROM rolled_spans WHERE run_id = ? AND rank = ?", (run_id, rank)).fetchone()
        if total > self.RAW_STEP_SERIES_MAX or folded:
            return self._step_series_from_rollups(run_id, loader, rank, points)
        return self._step_series_from_steps(run_id, loader, rank, points)

    def _step_series_from_steps(self, run_id: str, loader: str, rank: int, points: int) -> dict:
        db = self.store.reader()
        span = self.store.step_range(run_id)
        where = "rowid BETWEEN ? AND ? AND run_id = ? AND loader = ? AND rank = ?"
        args = (*(span or (0, -1)), run_id, loader, rank)
        lo_ns, hi_ns, n = db.execute(f"SELECT min(start_ns), max(start_ns), count(*) FROM steps WHERE {where}",
                                     args).fetchone()
        if not n:
            return {"bucket_steps": None, "points": [], "epochs": [], "source": "steps"}
        lo_s, hi_s = lo_ns // 1_000_000_000, hi_ns // 1_000_000_000
        if hi_s - lo_s + 1 > points:  # whole seconds, bucketed as _step_series_from_rollups does
            origin, width_ns = lo_s * 1_000_000_000, _bucket_width(lo_s, hi_s, points) * 1_000_000_000
        else:
            origin, width_ns = lo_ns, _bucket_width(lo_ns, hi_ns, points)
        rows = db.execute(
            "SELECT (start_ns - ?) / ? AS b, min(start_ns), count(*), min(epoch), max(epoch), "
            "min(wait_ns), avg(wait_ns), max(wait_ns), min(compute_ns), avg(compute_ns), max(compute_ns) "
            f"FROM steps WHERE {where} GROUP BY b ORDER BY b", (origin, width_ns, *args)).fetchall()
        return _step_points(((start, count, e_min, e_max, (wmin, wavg, wmax), (cmin, cavg, cmax))
                             for _, start, count, e_min, e_max, wmin, wavg, wmax, cmin, cavg, cmax in rows),
                            width_ns / 1e9, "steps")

    def _step_series_from_rollups(self, run_id: str, loader: str, rank: int, points: int) -> dict:
        db = self.store.reader()
        lo, hi = db.execute("SELECT min(second), max(second) FROM rollups WHERE run_id = ? AND loader = ? "
                            "AND rank = ?", (run_id, loader, rank)).fetchone()
        if lo is None:  # a folded rank that never ran this loader
            return {"bucket_steps": None, "points": [], "epochs": [], "source": "rollups"}
        width = _bucket_width(lo, hi, points)
        wait_min_sql, compute_min_sql, compute_max_sql = rollup_bands.VALUES
        rows = db.execute(
            "SELECT (second - ?) / ? AS b, min(second), sum(steps), sum(wait_ns), sum(compute_ns), "
            f"min({wait_min_sql}), max(wait_max_ns), min({compute_min_sql}), max({compute_max_sql}), "
            "min(epoch_min), max(epoch_max) FROM rollups "
            "WHERE run_id = ? AND loader = ? AND rank = ? GROUP BY b ORDER BY b",
            (lo, width, run_id, loader, rank)).fetchall()
        return _step_points(((second * 1_000_000_000, count, e_min, e_max, (wait_min, wait / count, wait_max),
                              (compute_min, compute / count, compute_max))
                             for _, second, count, wait, compute, wait_min, wait_max, compute_min, compute_max,
                             e_min, e_max in rows), width, "rollups")

    @cached(per_run=True, max_age_s=None)
    def events(self, run_id: str, kind: str, since_ns: int = 0, limit: int = 5000,
               newest: bool = False, rank: int | None = None) -> list[dict]:
        """Events after `since_ns`, oldest first: the first `limit` of them, or with `newest` the
        last `limit` (what a page showing "now" needs once a run has more than `limit`); with
        `rank`, only that rank's (the workers panel shows one rank's workers)."""
        self._row(run_id)
        order = "DESC" if newest else "ASC"
        where, args = "run_id = ? AND kind = ? AND t_ns > ?", [run_id, kind, since_ns]
        if rank is not None:
            where += " AND rank = ?"
            args.append(rank)
        rows = self.store.reader().execute(
            f"SELECT rank, data FROM events WHERE {where} ORDER BY t_ns {order} LIMIT ?", (*args, limit)).fetchall()
        if newest:
            rows.reverse()
        return [{"rank": r[0], **orjson.loads(r[1])} for r in rows]


def _bucket_width(lo: int, hi: int, points: int) -> int:
    """The width that cuts [lo, hi] into at most `points` buckets."""
    return max(1, math.ceil((hi - lo + 1) / max(1, points)))


def _step_points(buckets, bucket_s: float, source: str) -> dict:
    """Query.step_series' answer from (start_ns, steps, epoch_min, epoch_max, (wait min, mean,
    max), (compute min, mean, max)) per bucket, in ns: x is the index of a bucket's first step;
    epochs are marked where they start."""
    out, epochs, index, last_epoch = [], [], 0, None
    for start_ns, count, e_min, e_max, wait, compute in buckets:
        if last_epoch is None or e_max != last_epoch:
            if last_epoch is None or e_min != last_epoch:
                epochs.append({"epoch": e_min, "index": index})
            if e_max != e_min:
                epochs.append({"epoch": e_max, "index": index + count // 2})
            last_epoch = e_max
        out.append({"index": index, "start_ns": start_ns, "count": count,
                    "wait_ms": [v / 1e6 for v in wait], "compute_ms": [v / 1e6 for v in compute]})
        index += count
    return {"bucket_steps": max(1, index // max(1, len(out))), "bucket_s": bucket_s, "points": out,
            "epochs": epochs, "source": source}


def stream_account(stream_row) -> dict | None:
    """The latest delivery account a process sent: {acknowledged, spooled, dropped: {reason: n}}."""
    raw = stream_row["delivery"]
    if not raw:
        return None
    account = orjson.loads(raw)
    return {"acknowledged": account["acknowledged"], "spooled": account["spooled"],
            "dropped": account["dropped"], "seq": account["seq"]}


def merge_accounts(accounts: list[dict | None]) -> dict | None:
    """The run's account: the processes' accounts added up; None when no process sent one."""
    known = [a for a in accounts if a is not None]
    if not known:
        return None
    dropped: dict[str, int] = {}
    for a in known:
        for reason, count in a["dropped"].items():
            dropped[reason] = dropped.get(reason, 0) + count
    return {"acknowledged": sum(a["acknowledged"] for a in known), "spooled": sum(a["spooled"] for a in known),
            "dropped": dropped, "processes": len(known)}


def with_rejected_files(account: dict | None, rejected: list[dict], streams=()) -> dict | None:
    """The run's account plus the spool files of the run that the collector could not ingest
    (set aside in rejected/): their step records, where readable, count as dropped
    (`unreadable_spool`), and `rejected_files` lists them. A process that was still running saw
    its own files set aside and counted them already: per stream, the larger count is kept."""
    if not rejected:
        return account
    out = dict(account) if account is not None else {"acknowledged": 0, "spooled": 0, "dropped": {},
                                                     "processes": 0}
    here: dict[str, int] = {}
    for r in rejected:
        here[r["stream"]] = here.get(r["stream"], 0) + (r["records"] or 0)
    reported = {}
    for s in streams:
        own = stream_account(s)
        if own is not None:
            reported[s["stream"]] = own["dropped"].get("unreadable_spool", 0)
    extra = sum(max(0, n - reported.get(stream, 0)) for stream, n in here.items())
    if extra:
        out["dropped"] = {**out["dropped"], "unreadable_spool": out["dropped"].get("unreadable_spool", 0) + extra}
    out["rejected_files"] = rejected
    return out


def _merge_stalls(events: list[dict]) -> list[dict]:
    """One entry per stall: the latest event about it (begun, then ended) wins."""
    merged: dict[tuple, dict] = {}
    for e in events:
        merged[(e.get("rank", 0), e.get("loader"), e.get("started_ns"))] = e
    return list(merged.values())


def _visible_first(fn):
    @functools.wraps(fn)
    def wrapper(self, run_id, *args, **kwargs):
        if visible_projects.get() is not None:
            self._row(run_id)  # NotFound for a run of another project (store.run_row filters)
        return fn(self, run_id, *args, **kwargs)
    return wrapper


def _only_visible_runs(cls):
    """Every public method of `cls` that takes a run id answers NotFound (404) for a run the
    current caller may not see (project_scope.py): one rule for the API, exports, compare and the
    Dash callbacks, which a new method gets without a line of its own. Free for an unrestricted
    caller (the default)."""
    for name, fn in list(vars(cls).items()):
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        params = list(inspect.signature(fn).parameters)
        if len(params) > 1 and params[1] == "run_id":
            setattr(cls, name, _visible_first(fn))
    return cls


_only_visible_runs(Query)
