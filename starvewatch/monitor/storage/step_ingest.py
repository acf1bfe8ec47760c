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


# The steps table's columns, in its order.
ROW_COLUMNS = ("run_id", "rank", "loader", "epoch", "step", "start_ns", "wait_ns", "compute_ns", "other_ns",
               "batch_size", "gpu_idle_ns")
# Columns that often hold one value for a whole batch: one loader and epoch, no `step()` marks
# (other_ns 0), a fixed batch size or none, no GPU measurements. (The run and rank always do.)
_OFTEN_CONSTANT = ("loader", "epoch", "other_ns", "batch_size", "gpu_idle_ns")
_NULLABLE = ("batch_size", "gpu_idle_ns")
_ROWS_PER_INSERT = 500


def _rows_per_insert(w, constants: int, per_row: int) -> int:
    """Rows per multi-row INSERT: 500 where SQLite takes that many parameters (32,766 since
    3.32; Python 3.11+ can ask), else within the old limit of 999."""
    getlimit = getattr(w, "getlimit", None)
    limit = getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) if getlimit is not None else 999
    return max(1, min(_ROWS_PER_INSERT, (limit - constants) // per_row))


@functools.lru_cache(maxsize=64)
def _insert_sql(constant: tuple[str, ...], varying: tuple[str, ...], rows: int) -> str:
    """`rows` rows a statement; the constant columns are the parameters ?1..?k of every row."""
    row = "(" + ", ".join([f"?{i}" for i in range(1, len(constant) + 1)] + ["?"] * len(varying)) + ")"
    return f"INSERT INTO steps ({', '.join(constant + varying)}) VALUES " + ", ".join([row] * rows)


def _insert_rows(w, constants: dict, varying: dict, n: int) -> None:
    """The step rows, several hundred a statement: a statement per row cost ~25% more CPU
    (SQLite's per-statement work and Python's per-row loop). A column with one value for the
    whole batch (`constants`) is bound once a statement, as a numbered parameter each row
    repeats: binding every row's copy of it was half the rows' CPU (for a fast loop's
    20,480 rows, 7 of the 11 columns: ~26 -> ~11 ms, issue 41). The other parameters are laid
    out by slice assignment (C-level), never a tuple per row."""
    constant, names = tuple(constants), tuple(varying)
    values, width_row = list(constants.values()), len(names)
    flat = [None] * (width_row * n)
    for i, column in enumerate(varying.values()):
        flat[i::width_row] = column
    per = _rows_per_insert(w, len(constant), width_row)
    full = n - n % per
    width = width_row * per
    if full:
        w.executemany(_insert_sql(constant, names, per),
                      (values + flat[i:i + width] for i in range(0, full * width_row, width)))
    if full < n:  # the rest a row at a time: one more statement text, not one per remainder size
        w.executemany(_insert_sql(constant, names, 1),
                      (values + flat[i:i + width_row] for i in range(full * width_row, n * width_row, width_row)))


def _split_constant(batch) -> tuple[dict, dict]:
    """The batch's step columns as (constant: name -> its one value, varying: name -> column),
    both in the table's column order."""
    s = batch.steps
    n = len(s)
    constants = {"run_id": batch.run_id, "rank": batch.rank}
    varying = {}
    for name in ROW_COLUMNS[2:]:
        column = getattr(s, name)
        if name in _OFTEN_CONSTANT and column.count(column[0]) == n:
            constants[name] = column[0]
        else:
            varying[name] = column
    return constants, varying


def _ints(name: str, constants: dict, varying: dict, n: int) -> np.ndarray:
    """A step column as int64, None as 0; a constant one filled in, not read value by value."""
    if name in constants:
        return np.full(n, constants[name] or 0, dtype=np.int64)
    values = varying[name]
    return np.asarray([v or 0 for v in values] if name in _NULLABLE else values, dtype=np.int64)


def insert_steps(w, batch, stats_for: Callable[..., RecordStats],
                 save_stats: Callable[..., None]) -> None:
    """Store a batch's step records (inside the ingest's transaction): the rows, their block,
    the per-second rollups per rank and summed over ranks, and each loader's statistics
    (`stats_for(w, run_id, stream, loader)` gives the cached ones, `save_stats` writes them)."""
    s = batch.steps
    n = len(s)
    rid = batch.run_id
    first = (w.execute("SELECT max(rowid) FROM steps").fetchone()[0] or 0) + 1
    constants, varying = _split_constant(batch)
    # A writer with its own way with step rows (PostgreSQL's COPY: pg_store.py) has insert_step_rows.
    write_rows = getattr(w, "insert_step_rows", None)
    if write_rows is not None:
        write_rows(constants, varying, n)
    else:
        _insert_rows(w, constants, varying, n)
    w.execute("INSERT INTO step_blocks VALUES (?, ?, ?)", (rid, first, first + n - 1))
    # Per-second rollups and per-loader statistics, kept as the data arrives (numpy: a
    # 20,000-record batch costs a few milliseconds here).
    if "loader" in constants:
        groups = {constants["loader"]: None}
    else:
        groups = {}
        for i, name in enumerate(s.loader):
            groups.setdefault(name, []).append(i)
    start, wait, compute, other, epoch, size, gpu = (
        _ints(name, constants, varying, n)
        for name in ("start_ns", "wait_ns", "compute_ns", "other_ns", "epoch", "batch_size", "gpu_idle_ns"))
    gpu_known = np.full(n, constants["gpu_idle_ns"] is not None) if "gpu_idle_ns" in constants else \
        np.asarray([g is not None for g in s.gpu_idle_ns], dtype=bool)
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
