"""The extremes each per-rank rollup row keeps besides `wait_max_ns`: the least wait and the
least and greatest compute of its steps. The per-step chart (Query.step_series) draws them as a
min-max band per bucket, so a spike or a dip stays visible after raw rows are folded
(retention.py). Mergeable like the rest of the row: a minimum of minima, a maximum of maxima.

NULL stands for the row's mean (sum / steps): exact for a row of one step, which is stored so
(a slow loop's per-second rows cost a header byte per column, not four), and the best known
for rows written before these columns existed. Every reader goes through VALUES.
"""
from __future__ import annotations

COLUMNS = ("wait_min_ns", "compute_min_ns", "compute_max_ns")
_KINDS = (("wait_min_ns", "min", "wait_ns"), ("compute_min_ns", "min", "compute_ns"),
          ("compute_max_ns", "max", "compute_ns"))


def _value(column: str, total: str, prefix: str = "") -> str:
    return f"coalesce({prefix}{column}, {prefix}{total} / {prefix}steps)"


# Each column's value in a rollup row (in COLUMNS' order), and merged over a GROUP BY.
VALUES = tuple(_value(column, total) for column, _, total in _KINDS)
AGGREGATES = ", ".join(f"{kind}({_value(column, total)})" for column, kind, total in _KINDS)

# An upsert's SET clauses (SQLite evaluates them on the row as it was before the update).
MERGE = ", ".join(f"{column} = {kind}({_value(column, total)}, {_value(column, total, 'excluded.')})"
                  for column, kind, total in _KINDS)


def stored(steps: list[int], *columns: list[int]) -> list[tuple]:
    """Per row, the band columns as stored: NULL (None) where the row holds one step."""
    return [(None,) * len(columns) if n == 1 else values for n, *values in zip(steps, *columns)]


def migrate(w) -> None:
    """Add the columns to `rollups`. Run after database_file.migrate (its span_s): a new and a
    migrated database then have one column order, which the tiers' coarsening relies on."""
    present = {row[1] for row in w.execute("PRAGMA table_info(rollups)")}
    for column in COLUMNS:
        if column not in present:
            w.execute(f"ALTER TABLE rollups ADD COLUMN {column} INTEGER")
