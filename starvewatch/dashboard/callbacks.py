"""Callbacks, registered by a function; each reads through the monitor's query layer."""
from __future__ import annotations

import hashlib
import json
import logging
from urllib.parse import parse_qs, quote, unquote, urlencode

from dash import Input, Output, State, ctx, dcc, html, no_update
from plotly.utils import PlotlyJSONEncoder
from starlette.concurrency import run_in_threadpool

from ..monitor.outputs import figures
from ..ids import url_segment
from ..logonce import RateLimitedLog
from ..analysis import compare
from ..monitor.outputs.compare_figures import figures_for
from ..monitor.storage.query import NotFound
from . import answer_card, layout, views
from .inert import inert

_unreadable = RateLimitedLog(logging.getLogger("starvewatch.collector"))

# Polling pauses while the tab is hidden: the interval still ticks, but nothing is asked of
# the server until the user looks again.
VISIBLE_TICK = """
function(n) {
    if (document.hidden) { return window.dash_clientside.no_update; }
    return n || 0;
}
"""


def _text(value) -> str | None:
    """A callback's input as the browser sends it, or None: a request can carry any JSON."""
    return value if isinstance(value, str) else None


def run_options(runs: list[dict], *wanted: str | None) -> list[dict]:
    # Run ids start with the run's name; the name is repeated only when they do not.
    options = [{"label": r["id"] if r["id"].startswith(r["name"]) else f"{r['name']} — {r['id']}",
                "value": r["id"]} for r in runs]
    known = {o["value"] for o in options}
    # A run asked for by the URL but not (or no longer) stored stays selected; the comparison
    # then says it is unknown instead of the picker silently emptying.
    return options + [{"label": f"{w} (unknown)", "value": w} for w in dict.fromkeys(wanted) if w and w not in known]


def options_version(options: list[dict]) -> str:
    return hashlib.blake2b(json.dumps(options, sort_keys=True).encode(), digest_size=16).hexdigest()


def compare_search(a: str | None, b: str | None) -> str:
    pairs = {k: v for k, v in (("a", a), ("b", b)) if v}
    return "?" + urlencode(pairs) if pairs else ""


def route(pathname: str | None, search: str | None, runs: list[dict] | None = None):
    pathname, search = _text(pathname), _text(search)
    path = (pathname or "/").rstrip("/") or "/"
    if path.startswith("/runs/"):
        return layout.run_page(unquote(path[len("/runs/"):]))
    if path == "/compare":
        q = parse_qs((search or "").lstrip("?"))
        a, b = q.get("a", [None])[0], q.get("b", [None])[0]
        options = run_options(runs or [], a, b)
        return layout.compare_page(a, b, options, options_version(options))
    if path.startswith("/groups/"):
        return layout.runs_page(unquote(path[len("/groups/"):]))
    return layout.runs_page()


def run_title(summary: dict, previous: str | None) -> list:
    run = summary["run"]
    if previous:
        link = dcc.Link(f"compare with the previous run of {run['name']}", id="compare-previous",
                        href=f"/compare?a={quote(previous)}&b={quote(run['id'])}")
    else:
        link = html.Span(f"no earlier run named {run['name']} to compare with", id="compare-previous-none",
                         className="sw-muted")
    return [html.H2([run["name"], " ", views.badge(run["status"])]),
            html.Div([html.Code(run["id"]), " · ", link], className="sw-subtitle")]


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
    dists = query.distributions(run_id, loader) if loader else {"wait": {}, "compute": {}}
    series = query.rollup_series(run_id, loader=loader, points=300)
    # The latest samples and worker snapshots: the panels say what the workers and host do now.
    samples = query.events(run_id, "samples", limit=5000, newest=True)
    ranks = sorted({r["rank"] for r in query.detail(run_id)["ranks"]})
    per_rank = {rank: query.summary(run_id, rank) for rank in ranks} if len(ranks) > 1 else {}
    stragglers = query.stragglers(run_id) if per_rank else None
    workers_rank, why = shown_workers_rank(summary, loader, stragglers, ranks)
    workers = query.events(run_id, "workers", limit=2000, newest=True, rank=workers_rank)
    timeline = figures.step_timeline(steps, title=f"{loader}: wait vs compute per step")
    fraction = figures.wait_fraction_over_time(series)
    for fig in (timeline, fraction):
        fig.update_layout(uirevision=f"{run_id}:{loader}")  # keep the user's zoom across updates
    advice = [c for c in (answer_card.protective_card(summary), answer_card.findings_card(summary)) if c is not None]
    return {
        "missing": False,
        "title": run_title(summary, query.previous_run_id(run_id)),
        "banner": [b for b in (views.stall_banner(summary, status), views.delivery_banner(summary)) if b],
        "recommendations": answer_card.answer(summary),
        "advice": advice or None,
        "kpis": views.kpis(summary),
        "loader_options": [{"label": n, "value": n} for n in names],
        "loader": loader,
        "timeline": timeline,
        "fraction": fraction,
        "system": figures.system_over_time(samples),
        "histogram": figures.distribution_histogram(dists["wait"], f"{loader}: wait per batch"),
        "compute_histogram": figures.distribution_histogram(dists["compute"], f"{loader}: compute per batch",
                                                            color=figures.COMPUTE_COLOR),
        "workers": views.workers_panel(workers, loader, rank=workers_rank if len(ranks) > 1 else None, why=why,
                                       live=status in ("live", "stalled")),
        "ranks": views.ranks_panel(per_rank, stragglers)
        or html.P("One rank."),
        "config": answer_card.config_table(summary),
        # Who made the loop wait: per stage and per worker (analysis/wait_attribution.py).
        "attribution": figures.wait_attribution(next((l for l in summary["loaders"] if l["name"] == loader), None)),
    }


def shown_workers_rank(summary: dict, loader: str | None, stragglers: dict | None,
                       ranks: list[int]) -> tuple[int | None, str]:
    """Whose DataLoader workers the run page shows (workers are per process, so one rank's at a
    time): a straggler's, when one sent worker snapshots, else the summary's own choice (rank
    0, or the lowest rank with workers: system.overview). Returns (rank, why)."""
    info = ((summary.get("system") or {}).get("loaders") or {}).get(loader) or {}
    with_workers = info.get("ranks") or []
    for finding in (stragglers or {}).get("stragglers") or []:
        if finding["rank"] in with_workers:
            return finding["rank"], "the straggler"
    rank = info.get("rank", ranks[0] if ranks else None)
    return rank, f"{len(with_workers)} of {len(ranks)} ranks sent worker snapshots" if with_workers else ""


def page_after(triggers, page) -> int:
    """The runs page to show after what triggered the list (component ids; a tick and a click
    can arrive in one request): a new filter or sort starts again at the first page, the pager
    moves it, a tick alone keeps it."""
    triggers = set(triggers or ())
    page = page if isinstance(page, int) and not isinstance(page, bool) and page >= 0 else 0
    if triggers & {"runs-search", "runs-sort", "runs-status", "runs-verdict"}:
        return 0
    if "runs-prev" in triggers:
        return max(0, page - 1)
    if "runs-next" in triggers:
        return page + 1
    return page


_last_version: list = [None, None]  # [the list, its fingerprint]: the query layer hands out one list while it is current


def runs_version(runs: list[dict]) -> str:
    """A fingerprint of the runs list: it changes when any run's listed figures do."""
    if _last_version[0] is not runs:
        _last_version[:] = [runs, hashlib.blake2b(json.dumps(runs, sort_keys=True, default=str).encode(),
                                                  digest_size=16).hexdigest()]
    return _last_version[1]


def runs_outputs(runs: list[dict], search, sort, status, verdict, page: int, drawn, group=None) -> tuple:
    """The runs page's outputs: list, page line, prev/next disabled, page, digest (all
    no_update when the page already shows this list)."""
    if not runs:
        empty = html.P("No runs yet: wrap a loader with starvewatch.watch(loader) and start training.")
        return empty, "", True, True, 0, None
    view = views.runs_view(runs, search, sort or "started", status or None, verdict or None, page, group)
    view["table"] = inert(view["table"])
    digest = hashlib.blake2b(json.dumps(view["table"].to_plotly_json(), cls=PlotlyJSONEncoder, sort_keys=True)
                             .encode(), digest_size=16).hexdigest()
    if digest == drawn:
        return (no_update,) * 6
    info = f" page {view['page'] + 1} of {view['pages']} · {view['runs']:,} runs in {view['groups']:,} " \
        f"group{'s' * (view['groups'] != 1)} "
    return (view["table"], info, view["page"] == 0, view["page"] >= view["pages"] - 1, view["page"], digest)


def compare_result(query, a: str, b: str) -> html.Div:
    """The compare page's body for runs a (before) and b (after), or why there is none."""
    try:
        _, _, comp, distributions, series = compare.gather(
            query.summary, query.distributions, lambda run, loader: query.rollup_series(run, loader=loader, points=300),
            a, b)
    except NotFound as exc:
        return html.P(str(exc), id="compare-unknown")
    links = html.P(["before: ", dcc.Link(a, href=f"/runs/{url_segment(a)}"), " · after: ",
                    dcc.Link(b, href=f"/runs/{url_segment(b)}")], className="sw-subtitle")
    return inert(html.Div([links, views.compare_view(comp, figures_for(comp, distributions, series))]))


OUTPUTS = ("title", "banner", "recommendations", "advice", "kpis", "loader_options", "loader", "timeline",
           "fraction", "system", "histogram", "compute_histogram", "workers", "ranks", "config", "attribution")
# The outputs that are components (the rest are figures, options and a value): made inert.
COMPONENT_OUTPUTS = ("title", "banner", "recommendations", "advice", "kpis", "workers", "ranks", "config")


def view_digest(view: dict) -> str:
    """A fingerprint of everything the run page shows. A finished run's page then stops being
    redrawn every second: the user's text selection, scroll and open hover labels stay put."""
    encoded = json.dumps([view[k] for k in OUTPUTS], cls=PlotlyJSONEncoder, sort_keys=True)
    return hashlib.blake2b(encoded.encode(), digest_size=16).hexdigest()


def refresh_run_outputs(query, run_id: str | None, loader: str | None, drawn) -> tuple:
    """The run page's outputs in OUTPUTS order, then the digest; all no_update when the page
    already shows this view."""
    unchanged = (no_update,) * (len(OUTPUTS) + 1)
    if run_id is None:
        return (html.H2("No run selected"),) + unchanged[1:]
    try:
        view = run_view(query, run_id, loader)
    except Exception as exc:  # this run's stored data cannot be drawn: said for this run alone
        return (unreadable_run(run_id, exc),) + unchanged[1:]
    if view["missing"]:
        return (html.H2(f"Unknown run {run_id}"),) + unchanged[1:]
    for key in COMPONENT_OUTPUTS:
        view[key] = inert(view[key])
    digest = view_digest(view)
    if digest == drawn:
        return unchanged
    return tuple(view[k] for k in OUTPUTS) + (digest,)


def unreadable_run(run_id: str, exc: Exception):
    """The run page of a run whose stored data cannot be drawn (a value of the wrong type from
    an older collector, say): the error, for this run alone; the collector's log has the rest."""
    log_unreadable(run_id, exc)
    return html.Div([html.H2(f"Run {run_id} cannot be shown"),
                     html.P(f"Its stored data could not be drawn: {type(exc).__name__}: {str(exc)[:300]}. "
                            f"Other runs are not affected; its exports may still work.",
                            id="run-unreadable")])


def log_unreadable(run_id: str, exc: Exception) -> None:
    _unreadable.error(f"run:{type(exc).__name__}", "run %s cannot be drawn: %s: %s", run_id[:128],
                      type(exc).__name__, str(exc)[:300])


def register(app, get_query) -> None:
    """Callbacks are async and do their SQL in the thread pool: the collector's event loop keeps
    serving ingest and the API while a page is being built."""
    app.clientside_callback(VISIBLE_TICK, Output("tick", "data"), Input("interval", "n_intervals"))

    @app.callback(Output("page", "children"), Input("url", "pathname"), State("url", "search"))
    async def show_page(pathname, search):
        pathname, search = _text(pathname), _text(search)  # a request can carry any JSON value
        runs = await run_in_threadpool(get_query().list_runs) if (pathname or "").rstrip("/") == "/compare" else None
        return route(pathname, search, runs)

    @app.callback(Output("runs-version", "data"), Input("tick", "data"), State("runs-version", "data"))
    async def runs_changed(_tick, known):
        # The list is drawn again when the runs change, never by the tick alone: a tick's answer
        # arriving after a click's could otherwise draw the page the click left.
        version = await run_in_threadpool(lambda: runs_version(get_query().list_runs()))
        return no_update if version == known else version

    @app.callback(Output("runs-container", "children"), Output("runs-page-info", "children"),
                  Output("runs-prev", "disabled"), Output("runs-next", "disabled"), Output("runs-page", "data"),
                  Output("runs-digest", "data"),
                  Input("runs-version", "data"), Input("runs-search", "value"), Input("runs-sort", "value"),
                  Input("runs-status", "value"), Input("runs-verdict", "value"), Input("runs-prev", "n_clicks"),
                  Input("runs-next", "n_clicks"), State("runs-page", "data"), State("runs-group", "data"),
                  State("runs-digest", "data"))
    async def refresh_runs(_version, search, sort, status, verdict, _prev, _next, page, group, drawn):
        page = page_after({p.split(".")[0] for p in ctx.triggered_prop_ids}, page)
        outputs = await run_in_threadpool(lambda: runs_outputs(
            get_query().list_runs(), _text(search), _text(sort), _text(status), _text(verdict), page, drawn,
            _text(group)))
        if outputs[0] is no_update:
            return outputs
        # Runs the storage budget coarsened or deleted (serve --max-db-size) head the list.
        banner = views.storage_banner(await run_in_threadpool(get_query().storage_notes))
        return (outputs[0] if banner is None else [banner, outputs[0]], *outputs[1:])

    @app.callback(
        Output("run-title", "children"), Output("stall-banner-container", "children"),
        Output("recommendations", "children"), Output("advice", "children"), Output("kpis", "children"),
        Output("loader-select", "options"), Output("loader-select", "value"),
        Output("timeline-graph", "figure"), Output("fraction-graph", "figure"), Output("system-graph", "figure"),
        Output("histogram-graph", "figure"), Output("compute-histogram-graph", "figure"),
        Output("workers", "children"), Output("ranks", "children"), Output("config", "children"),
        Output("attribution-graph", "figure"), Output("run-view-digest", "data"),
        Input("tick", "data"), Input("loader-select", "value"), State("run-id", "data"),
        State("run-view-digest", "data"))
    async def refresh_run(_tick, loader, run_id, drawn):
        return await run_in_threadpool(refresh_run_outputs, get_query(), _text(run_id), _text(loader), drawn)

    @app.callback(Output("compare-a", "options"), Output("compare-b", "options"),
                  Output("compare-options-version", "data"), Input("tick", "data"),
                  State("compare-a", "value"), State("compare-b", "value"), State("compare-options-version", "data"))
    async def compare_options(_tick, a, b, known):
        a, b = _text(a), _text(b)
        options = await run_in_threadpool(lambda: run_options(get_query().list_runs(), a, b))
        # A thousand runs are a thousand options: sent again only when they change.
        version = await run_in_threadpool(options_version, options)
        return (no_update,) * 3 if version == known else (options, options, version)

    @app.callback(Output("compare-url", "search"), Input("compare-a", "value"), Input("compare-b", "value"),
                  prevent_initial_call=True)
    def remember_pair(a, b):
        return compare_search(_text(a), _text(b))

    @app.callback(Output("compare-result", "children"), Input("compare-a", "value"), Input("compare-b", "value"))
    async def compare(a, b):
        a, b = _text(a), _text(b)
        if not a or not b:
            return html.P("Pick a run before and a run after a change.")
        return await run_in_threadpool(compare_result, get_query(), a, b)
