"""Writes one batch's step records into the store: the raw rows and their rowid block, the
per-second rollups (per rank, and summed over ranks in run_rollups), and each loader's
mergeable statistics.

Its own module because this is the ingest's heaviest work, vectorized with numpy (a
20,000-record batch costs a few milliseconds), and the only writer of fresh rollup rows; the
store (store.py) runs it inside its ingest transaction and keeps the statistics cache.
"""
from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable

# At import (the collector's start), not inside the first batch's ingest: a fresh collector's
# first batch took ~0.1 s longer for it, on the path of a short run's delivery.
import numpy as np

from ...stats import RecordStats
from ..budget import rollup_bands, rollup_merge, run_rollups


STEP_COLUMNS = 11  # of the steps table, in its order
_ONE_ROW = "(" + ", ".join(["?"] * STEP_COLUMNS) + ")"
_ROWS_PER_INSERT = 500


def _rows_per_insert(w) -> int:
    """Rows per multi-row INSERT: 500 (5,500 parameters) where SQLite takes that many (32,766
    since 3.32; Python 3.11+ can ask), else within the old limit of 999 parameters."""
    getlimit = getattr(w, "getlimit", None)
    limit = getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) if getlimit is not None else 999
    return max(1, min(_ROWS_PER_INSERT, limit // STEP_COLUMNS))


@functools.lru_cache(maxsize=8)
def _insert_sql(rows: int) -> str:
    return "INSERT INTO steps VALUES " + ", ".join([_ONE_ROW] * rows)


def _insert_rows(w, columns: list, n: int) -> None:
    """The step rows, from their columns, several hundred rows per statement: a statement per
    row cost ~25% more CPU (SQLite's per-statement work and Python's per-row loop), and the
    rows are most of a batch's ingest (issue 41). The parameters are laid out by slice
    assignment (C-level), never a tuple per row."""
    flat = [None] * (STEP_COLUMNS * n)
    for i, column in enumerate(columns):
        flat[i::STEP_COLUMNS] = column
    per = _rows_per_insert(w)
    full = n - n % per
    width = STEP_COLUMNS * per
    if full:
        w.executemany(_insert_sql(per), (flat[i:i + width] for i in range(0, full * STEP_COLUMNS, width)))
    if full < n:  # the rest a row at a time: one more statement text, not one per remainder size
        w.executemany(_insert_sql(1), (flat[i:i + STEP_COLUMNS] for i in range(full * STEP_COLUMNS, n * STEP_COLUMNS,
                                                                                STEP_COLUMNS)))


def insert_steps(w, batch, stats_for: Callable[..., RecordStats],
                 save_stats: Callable[..., None]) -> None:
    """Store a batch's step records (inside the ingest's transaction): the rows, their block,
    the per-second rollups per rank and summed over ranks, and each loader's statistics
    (`stats_for(w, run_id, stream, loader)` gives the cached ones, `save_stats` writes them)."""
    s = batch.steps
    n = len(s)
    rid, rank = batch.run_id, batch.rank
    first = (w.execute("SELECT max(rowid) FROM steps").fetchone()[0] or 0) + 1
    _insert_rows(w, [[rid] * n, [rank] * n, s.loader, s.epoch, s.step, s.start_ns, s.wait_ns, s.compute_ns,
                     s.other_ns, s.batch_size, s.gpu_idle_ns], n)
    w.execute("INSERT INTO step_blocks VALUES (?, ?, ?)", (rid, first, first + n - 1))
    # Per-second rollups and per-loader statistics, kept as the data arrives (numpy: a
    # 20,000-record batch costs a few milliseconds here).
    names = list(s.loader)
    groups = {names[0]: None} if names.count(names[0]) == n else None
    if groups is None:
        groups = {}
        for i, name in enumerate(names):
            groups.setdefault(name, []).append(i)
    start = np.asarray(s.start_ns, dtype=np.int64)
    wait = np.asarray(s.wait_ns, dtype=np.int64)
    compute = np.asarray(s.compute_ns, dtype=np.int64)
    other = np.asarray(s.other_ns, dtype=np.int64)
    epoch = np.asarray(s.epoch, dtype=np.int64)
    size = np.asarray([b or 0 for b in s.batch_size], dtype=np.int64)
    gpu_known = np.asarray([g is not None for g in s.gpu_idle_ns], dtype=bool)
    gpu = np.asarray([g or 0 for g in s.gpu_idle_ns], dtype=np.int64)
    for name, idx in groups.items():
        pick = (lambda col: col) if idx is None else (lambda col: [col[i] for i in idx])
        sel = slice(None) if idx is None else np.asarray(idx)
        stats = stats_for(w, rid, batch.stream, name)
        stats.add_columns(pick(s.step), pick(s.wait_ns), pick(s.compute_ns), pick(s.gpu_idle_ns),
                          vectorized=True)
        seconds, inverse = np.unique(start[sel] // 1_000_000_000, return_inverse=True)
        k = len(seconds)

        def total(values):
            return np.bincount(inverse, weights=values, minlength=k).astype(np.int64)

        wait_max = np.zeros(k, dtype=np.int64)
        np.maximum.at(wait_max, inverse, wait[sel])
        wait_min = np.full(k, np.iinfo(np.int64).max)
        np.minimum.at(wait_min, inverse, wait[sel])
        compute_min = np.full(k, np.iinfo(np.int64).max)
        np.minimum.at(compute_min, inverse, compute[sel])
        compute_max = np.zeros(k, dtype=np.int64)
        np.maximum.at(compute_max, inverse, compute[sel])
        e_min = np.full(k, np.iinfo(np.int64).max)
        np.minimum.at(e_min, inverse, epoch[sel])
        e_max = np.zeros(k, dtype=np.int64)
        np.maximum.at(e_max, inverse, epoch[sel])
        # bincount's float weights are exact below 2**53 ns (104 days) per second bucket.
        columns = (seconds, np.bincount(inverse, minlength=k), total(wait[sel]), total(compute[sel]),
                   total(other[sel]), total(size[sel]), total(gpu[sel]),
                   np.bincount(inverse, weights=gpu_known[sel], minlength=k).astype(np.int64),
                   wait_max, e_min, e_max)
        bands = rollup_bands.stored(*(c.tolist() for c in (columns[1], wait_min, compute_min, compute_max)))
        w.executemany(
            "INSERT INTO rollups (run_id, rank, loader, second, steps, wait_ns, compute_ns, other_ns, samples, "
            "gpu_idle_ns, gpu_steps, wait_max_ns, epoch_min, epoch_max, wait_min_ns, compute_min_ns, "
            "compute_max_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            + rollup_merge.ON_CONFLICT_ADD + rollup_bands.MERGE,
            [(rid, batch.rank, name, *row, *band)
             for row, band in zip(zip(*(c.tolist() for c in columns)), bands)])
        # The same rows added into the rank-summed rollups (one rank per batch).
        ranks = run_rollups.rank_bit(batch.rank)
        w.executemany(
            f"INSERT INTO run_rollups ({run_rollups.COLUMNS}) "
            "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) " + run_rollups.MERGE,
            [(rid, name, *row, ranks) for row in zip(*(c.tolist() for c in columns))])
        save_stats(w, rid, batch.stream, batch.rank, name, stats)
