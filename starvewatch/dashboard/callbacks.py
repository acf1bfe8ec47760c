"""Callbacks, registered by a function; each reads through the monitor's query layer."""
from __future__ import annotations

from urllib.parse import parse_qs, unquote

from dash import Input, Output, State, html, no_update
from starlette.concurrency import run_in_threadpool

from ..monitor import figures
from ..monitor.diagnosis import verify
from ..monitor.query import NotFound
from . import layout, views

# Polling pauses while the tab is hidden: the interval still ticks, but nothing is asked of
# the server until the user looks again.
VISIBLE_TICK = """
function(n) {
    if (document.hidden) { return window.dash_clientside.no_update; }
    return n || 0;
}
"""


def route(pathname: str | None, search: str | None):
    path = (pathname or "/").rstrip("/") or "/"
    if path.startswith("/runs/"):
        return layout.run_page(unquote(path[len("/runs/"):]))
    if path == "/compare":
        q = parse_qs((search or "").lstrip("?"))
        return layout.compare_page(q.get("a", [None])[0], q.get("b", [None])[0])
    return layout.runs_page()


def run_view(query, run_id: str, loader: str | None) -> dict:
    """Everything the run page shows, as components and figures (a plain function)."""
    try:
        summary = query.summary(run_id)
    except NotFound:
        return {"missing": True}
    names = [l["name"] for l in summary["loaders"]]
    loader = loader if loader in names else (names[0] if names else None)
    status = summary["run"]["status"]
    steps = query.step_series(run_id, loader=loader, points=1000) if loader else {"points": []}
    series = query.rollup_series(run_id, loader=loader, points=300)
    samples = query.events(run_id, "samples", limit=5000)
    workers = query.events(run_id, "workers", limit=2000)
    ranks = sorted({r["rank"] for r in query.detail(run_id)["ranks"]})
    per_rank = {rank: query.summary(run_id, rank) for rank in ranks} if len(ranks) > 1 else {}
    timeline = figures.step_timeline(steps, title=f"{loader}: wait vs compute per step")
    fraction = figures.wait_fraction_over_time(series)
    for fig in (timeline, fraction):
        fig.update_layout(uirevision=f"{run_id}:{loader}")  # keep the user's zoom across updates
    return {
        "missing": False,
        "title": [html.H2([summary["run"]["name"], " ", views.badge(status)]),
                  html.Div(html.Code(run_id))],
        "banner": [b for b in (views.stall_banner(summary, status), views.delivery_banner(summary)) if b],
        "kpis": views.kpis(summary),
        "loader_options": [{"label": n, "value": n} for n in names],
        "loader": loader,
        "timeline": timeline,
        "fraction": fraction,
        "system": figures.system_over_time(samples),
        "histogram": figures.wait_histogram(steps, title=f"{loader}: wait per batch"),
        "recommendations": views.recommendations(summary),
        "workers": views.workers_panel(workers),
        "ranks": views.ranks_panel(per_rank) or html.P("One rank."),
        "config": views.config_panel(summary),
    }


def register(app, get_query) -> None:
    """Callbacks are async and do their SQL in the thread pool: the collector's event loop keeps
    serving ingest and the API while a page is being built."""
    app.clientside_callback(VISIBLE_TICK, Output("tick", "data"), Input("interval", "n_intervals"))

    @app.callback(Output("page", "children"), Input("url", "pathname"), State("url", "search"))
    def show_page(pathname, search):
        return route(pathname, search)

    @app.callback(Output("runs-container", "children"), Input("tick", "data"), Input("runs-search", "value"),
                  Input("runs-sort", "value"))
    async def refresh_runs(_tick, search, sort):
        runs = await run_in_threadpool(get_query().list_runs)
        if not runs:
            return html.P("No runs yet: wrap a loader with starvewatch.watch(loader) and start training.")
        return views.runs_table(runs, search, sort or "started")

    @app.callback(
        Output("run-title", "children"), Output("stall-banner-container", "children"), Output("kpis", "children"),
        Output("loader-select", "options"), Output("loader-select", "value"),
        Output("timeline-graph", "figure"), Output("fraction-graph", "figure"), Output("system-graph", "figure"),
        Output("histogram-graph", "figure"), Output("recommendations", "children"), Output("workers", "children"),
        Output("ranks", "children"), Output("config", "children"),
        Input("tick", "data"), Input("loader-select", "value"), State("run-id", "data"))
    async def refresh_run(_tick, loader, run_id):
        view = await run_in_threadpool(run_view, get_query(), run_id, loader)
        if view["missing"]:
            return (html.H2(f"Unknown run {run_id}"),) + (no_update,) * 12
        return (view["title"], view["banner"], view["kpis"], view["loader_options"], view["loader"],
                view["timeline"], view["fraction"], view["system"], view["histogram"], view["recommendations"],
                view["workers"], view["ranks"], view["config"])

    @app.callback(Output("compare-a", "options"), Output("compare-b", "options"), Input("tick", "data"))
    async def compare_options(_tick):
        runs = await run_in_threadpool(get_query().list_runs)
        options = [{"label": f"{r['name']} — {r['id']}", "value": r["id"]} for r in runs]
        return options, options

    @app.callback(Output("compare-result", "children"), Input("compare-a", "value"), Input("compare-b", "value"))
    async def compare(a, b):
        if not a or not b:
            return html.P("Pick a run before and a run after a change.")
        query = get_query()
        try:
            before, after = await run_in_threadpool(lambda: (query.summary(a), query.summary(b)))
        except NotFound as exc:
            return html.P(str(exc))
        return views.compare_panel(before, after, verify(before, after))
