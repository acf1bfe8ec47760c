"""One write transaction on the writer connection: BEGIN IMMEDIATE, COMMIT, or ROLLBACK on any
exception (a full disk, an interrupt) and re-raise.

Its own module because each fold of the storage budget (raw steps, rollup tiers, samples) runs
in one such transaction on an autocommit connection (isolation_level=None), and the three wrote
the same begin/commit/rollback block by hand."""
from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def immediate_transaction(w):
    """The block runs inside BEGIN IMMEDIATE ... COMMIT on `w`; an exception rolls it back."""
    w.execute("BEGIN IMMEDIATE")
    try:
        yield
        w.execute("COMMIT")
    except BaseException:
        w.execute("ROLLBACK")
        raise
