"""Which projects the current request may see and write (issue 40 item 3: tokens scoped to a
project), and the one check a run's project meets at ingest.

The guard (monitor/web/guard.py) sets `visible_projects` for a request made with a project
token; everything that reads runs reads them through the store's `run_rows` / `run_row`, which
keep only visible runs, and the query layer (query.py) answers "unknown run" for any other. So the
runs page, the API, exports, /metrics, compare, the Dash callbacks and the WebSocket are
filtered in one place. The default (None) is every run: the collector's own token, the per-user
token and the background threads (budget, exporters) see everything, at no cost.

Its own module because storage/ may not import web/: the variable lives with what reads it.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

# None: every run. A frozenset: only runs of those projects (a run without a project, sent with
# the collector's or the per-user token, is nobody's project: only unrestricted callers see it).
visible_projects: ContextVar[frozenset | None] = ContextVar("starvewatch_visible_projects", default=None)


class RunProjectError(PermissionError):
    """A batch for a run of another project than its token's (answered 403, nothing stored)."""


def visible(project: str | None) -> bool:
    projects = visible_projects.get()
    return projects is None or project in projects


def filter_rows(rows):
    """The run rows the current caller may see (all of them when unrestricted)."""
    projects = visible_projects.get()
    if projects is None:
        return rows
    return [r for r in rows if r["project"] in projects]


@contextmanager
def scoped(projects):
    """Run the block as a caller that sees only `projects` (None: every run)."""
    token = visible_projects.set(None if projects is None else frozenset(projects))
    try:
        yield
    finally:
        visible_projects.reset(token)


def check_run_project(w, run_id: str, projects) -> None:
    """A batch sent with a project token: its run must be new (it becomes the token's first
    project's) or already of one of the token's projects. `projects` None: any run."""
    if projects is None:
        return
    row = w.execute("SELECT project FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is not None and row[0] not in projects:
        raise RunProjectError(f"run {run_id!r} belongs to another project than this token's "
                              f"({', '.join(sorted(projects))}); send it with a token of its project")
