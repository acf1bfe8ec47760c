"""Stage 1 of the storage budget: delete raw step rows (and phase rows) outside each run's raw
window, keeping their exemplars and saying which spans are rollups only.

Its own module because this is the one fold that deletes rows other tables already summarise
(the per-second rollups hold every step): it owns the straggler window's bounds, the exemplars
kept raw (the slowest steps and those near stalls, `step_exemplars`) and `rolled_spans`. What to
fold and how much per pass is the budget's decision (retention.py), passed in."""
from __future__ import annotations

from collections.abc import Callable

import orjson

from ..storage.write_transaction import immediate_transaction

_EXEMPLAR_COLUMNS = ("run_id, rank, loader, epoch, step, start_ns, wait_ns, compute_ns, other_ns, batch_size, "
                     "gpu_idle_ns")


def window_start(w, run_id: str, raw_window_steps: int) -> int | None:
    """The first rowid of the run's raw window: the blocks the straggler rule reads
    (query.Query._recent_step_ranges takes the same blocks, newest first, per rank)."""
    ranks = len({r for (r,) in w.execute("SELECT rank FROM streams WHERE run_id = ?", (run_id,))}) or 1
    quota = raw_window_steps // ranks
    taken: dict[int, int] = {}
    start = None
    for first, last, rank in w.execute(
            "SELECT b.first_rowid, b.last_rowid, s.rank FROM step_blocks b JOIN steps s "
            "ON s.rowid = b.first_rowid WHERE b.run_id = ? ORDER BY b.first_rowid DESC", (run_id,)):
        if taken.get(rank, 0) < quota:
            taken[rank] = taken.get(rank, 0) + last - first + 1
            start = first
        elif len(taken) >= ranks and all(n >= quota for n in taken.values()):
            return start
    return None  # the whole run is inside its window


def fold_steps(w, runs: list[str], limits: dict[str, int | None], budget_rows: int, exemplar_limit_rows: int,
               phase_window: int, done: dict, changed: Callable[[str], None]) -> bool:
    """One pass: the oldest step blocks of `limits`' runs (before the rowid each maps to; None:
    all), about `budget_rows` rows, deleted in one transaction after their exemplars are copied
    (the table holds at most `exemplar_limit_rows`). With no block to fold, the runs' old phase
    rows go instead. Counts go into `done`; `changed(run_id)` for each run touched. Returns
    whether anything was folded."""
    blocks = []
    for run_id, limit in limits.items():
        sql = "SELECT rowid, first_rowid, last_rowid FROM step_blocks WHERE run_id = ?"
        args: tuple = (run_id,)
        if limit is not None:
            sql, args = sql + " AND last_rowid < ?", (run_id, limit)
        blocks += [(first, last, rowid, run_id) for rowid, first, last in
                   w.execute(sql + " ORDER BY first_rowid LIMIT ?", (*args, budget_rows))]
    blocks.sort()
    picked, rows = [], 0
    for block in blocks:
        if rows >= budget_rows:
            break
        picked.append(block)
        rows += block[1] - block[0] + 1
    if not picked:
        phases = fold_phases(w, runs, phase_window, changed)
        done["phases"] += phases
        return phases > 0
    # Adjacent blocks of one run (one ingest after another) are folded as one rowid range.
    ranges: list[list] = []
    for first, last, block_id, run_id in picked:
        if ranges and ranges[-1][3] == run_id and ranges[-1][0] <= first == ranges[-1][1] + 1:
            ranges[-1][1] = last
        else:
            ranges.append([first, last, None, run_id])
    with immediate_transaction(w):
        thresholds = {}
        room = [exemplar_limit_rows - w.execute("SELECT count(*) FROM step_exemplars").fetchone()[0]]
        for first, last, _, run_id in ranges:
            if run_id not in thresholds:
                thresholds[run_id] = exemplar_rules(w, run_id)
            keep_exemplars(w, run_id, first, last, thresholds[run_id], room)
            for rank, count, last_ns in w.execute(
                    "SELECT rank, count(*), max(start_ns) FROM steps WHERE rowid BETWEEN ? AND ? "
                    "AND run_id = ? GROUP BY rank", (first, last, run_id)).fetchall():
                w.execute("INSERT INTO rolled_spans VALUES (?, ?, ?, ?) ON CONFLICT(run_id, rank) DO "
                          "UPDATE SET until_s = max(until_s, excluded.until_s), steps = steps + excluded.steps",
                          (run_id, rank, last_ns // 1_000_000_000 + 1, count))
            w.execute("DELETE FROM steps WHERE rowid BETWEEN ? AND ? AND run_id = ?", (first, last, run_id))
        w.executemany("DELETE FROM step_blocks WHERE rowid = ?", [(block[2],) for block in picked])
        done["phases"] += fold_phases(w, list(thresholds), phase_window)
    done["steps"] += rows
    for run_id in thresholds:
        changed(run_id)
    return True


def fold_phases(w, runs, keep_rows: int, changed: Callable[[str], None] | None = None) -> int:
    """Delete each run's phase rows but its latest `keep_rows` (0: all); returns how many.
    `changed` is called for each run when rows went (None inside the caller's transaction)."""
    removed = 0
    for run_id in runs:
        last = w.execute("SELECT max(rowid) FROM phases WHERE run_id = ?", (run_id,)).fetchone()[0]
        if last is None:
            continue
        # The straggler rule reads phases with rowid > last - window: keep exactly those.
        removed += w.execute("DELETE FROM phases WHERE run_id = ? AND rowid <= ?",
                             (run_id, last - keep_rows)).rowcount
    if removed and changed is not None:
        for run_id in runs:
            changed(run_id)
    return removed


def exemplar_rules(w, run_id: str) -> dict:
    """Which rows of a run stay raw inside a folded span: the slowest (wait at or above the
    run's 99.9th percentile, per loader) and those within 5 s of a stall."""
    from ...stats import RecordStats, LogHistogram
    waits: dict[str, LogHistogram] = {}
    for name, stats in w.execute("SELECT name, stats FROM loaders WHERE run_id = ? AND stats IS NOT NULL",
                                 (run_id,)):
        hist = RecordStats.from_dict(orjson.loads(stats)).wait
        waits.setdefault(name, LogHistogram()).merge(hist)
    slow = {name: int(h.quantile(0.999) or 0) for name, h in waits.items() if h.count}
    stalls = []
    for (data,) in w.execute("SELECT data FROM events WHERE run_id = ? AND kind = 'stalls'", (run_id,)):
        e = orjson.loads(data)
        began = e.get("started_ns")
        if isinstance(began, int):
            ended = e.get("ended_ns") or e.get("t_ns") or began
            stalls.append((began - 5_000_000_000, int(ended) + 5_000_000_000))
    return {"slow": slow, "stalls": stalls}


def keep_exemplars(w, run_id: str, first: int, last: int, rules: dict, left: list[int]) -> None:
    """Copy a range's exemplars, within the room `left[0]` (rows), which it decreases."""
    room = left[0]
    if room <= 0:
        return
    for lo, hi in rules["stalls"][:100]:
        if room <= 0:
            break
        room -= w.execute(f"INSERT INTO step_exemplars SELECT {_EXEMPLAR_COLUMNS}, 'stall' FROM steps WHERE rowid "
                          "BETWEEN ? AND ? AND run_id = ? AND start_ns BETWEEN ? AND ? LIMIT ?",
                          (first, last, run_id, lo, hi, max(0, room))).rowcount
    for loader, threshold in rules["slow"].items():
        if room <= 0:
            break
        room -= w.execute(f"INSERT INTO step_exemplars SELECT {_EXEMPLAR_COLUMNS}, 'slowest' FROM steps WHERE rowid "
                          "BETWEEN ? AND ? AND run_id = ? AND loader = ? AND wait_ns >= ? AND wait_ns > 0 "
                          "ORDER BY wait_ns DESC LIMIT ?", (first, last, run_id, loader, threshold, room)).rowcount
    left[0] = room
