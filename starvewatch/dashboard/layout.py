"""Page layouts (static structure; the callbacks fill them)."""
from __future__ import annotations

from dash import dcc, html

from ..ids import url_segment
from .tuning_panel import card as tuning_card

POLL_MS = 1000


def root_layout() -> html.Div:
    header = html.Div([dcc.Link("starvewatch", href="/", className="brand"),
                       dcc.Link("Runs", href="/"), dcc.Link("Compare", href="/compare")], className="sw-header")
    return html.Div([dcc.Location(id="url"), header,
                     dcc.Interval(id="interval", interval=POLL_MS), dcc.Store(id="tick"),
                     html.Div(id="page", className="sw-page")])


def _filter(filter_id: str, label: str, options: list[tuple[str, str]]) -> html.Div:
    return html.Div([html.Span(label, className="sw-muted"),
                     dcc.RadioItems(id=filter_id, value="", inline=True, className="sw-filter",
                                    options=[{"label": "any", "value": ""}] +
                                    [{"label": text, "value": value} for value, text in options])],
                    className="sw-filter-row")


def runs_page(group: str | None = None) -> html.Div:
    """Runs grouped by name, filtered by status and verdict, a page of runs at a time; with
    `group`, the runs of that name only (all of them)."""
    from ..monitor.storage.query import STATUSES
    from .views import VERDICTS
    title = html.H2("Runs") if group is None else \
        html.H2(["Runs named ", html.Code(group), " ", dcc.Link("(all runs)", href="/", className="sw-muted")])
    return html.Div([
        title,
        dcc.Store(id="runs-group", data=group),
        html.Div([dcc.Input(id="runs-search", type="search", placeholder="search by name or id",
                            className="sw-search", debounce=False),
                  dcc.Dropdown(id="runs-sort", value="started", clearable=False, style={"width": "220px"},
                               options=[{"label": "newest first", "value": "started"},
                                        {"label": "most input wait", "value": "wait"},
                                        {"label": "highest throughput", "value": "throughput"},
                                        {"label": "name", "value": "name"}])],
                 style={"display": "flex", "gap": "12px", "alignItems": "center"}),
        _filter("runs-status", "status:", [(s, s) for s in STATUSES]),
        _filter("runs-verdict", "verdict:", list(VERDICTS.items())),
        dcc.Store(id="runs-page", data=0),
        dcc.Store(id="runs-version"),  # the runs list's fingerprint: the list is drawn again when it changes
        dcc.Store(id="runs-digest"),  # what the list last drew: an unchanged list is not redrawn
        html.Div(id="runs-container", className="sw-card"),
        html.Div([html.Button("← newer", id="runs-prev", n_clicks=0, disabled=True),
                  html.Span(id="runs-page-info", className="sw-muted"),
                  html.Button("older →", id="runs-next", n_clicks=0, disabled=True)], className="sw-pager"),
    ])


def run_page(run_id: str) -> html.Div:
    """The answer first (verdict, change, line to copy, evidence), then protective advice and
    findings, the numbers, the configuration, and the charts last."""
    def graph(graph_id):
        return html.Div(dcc.Graph(id=graph_id, config={"displaylogo": False}), className="sw-card")

    exports = html.Div([html.Span("Export: ")] + [
        html.A(label, href=f"/api/v1/runs/{url_segment(run_id)}/export?format={fmt}", download="", id=f"export-{fmt}")
        for label, fmt in (("JSON", "json"), ("CSV", "csv"), ("Markdown", "md"), ("HTML report", "html"),
                           ("Trace (Perfetto)", "trace"))],
        className="sw-exports")
    return html.Div([
        dcc.Store(id="run-id", data=run_id),
        dcc.Store(id="run-view-digest"),  # what the page last drew: an unchanged tick redraws nothing
        html.Div(id="run-title"),
        html.Div(id="stall-banner-container"),
        html.Div(id="recommendations"),
        html.Div(id="advice"),
        html.Div(id="kpis", className="sw-kpis"),
        html.Div([html.H3("Loader configuration"), html.Div(id="config")], className="sw-card"),
        tuning_card(),
        html.Div([html.Span("Charts for loader: "),
                  dcc.Dropdown(id="loader-select", clearable=False, style={"width": "240px", "display": "inline-block"})],
                 className="sw-card"),
        html.Div([graph("timeline-graph"), graph("fraction-graph"), graph("histogram-graph"),
                  graph("compute-histogram-graph"), graph("attribution-graph"), graph("system-graph")],
                 className="sw-grid"),
        html.Div(id="workers"),
        html.Div([html.H3("Ranks"), html.Div(id="ranks")], className="sw-card", id="ranks-card"),
        html.Div(exports, className="sw-card"),
    ])


def compare_page(a: str | None, b: str | None, options: list[dict] | None = None,
                 options_version: str | None = None) -> html.Div:
    """The pickers get their options with the page, so `/compare?a=&b=` opens preselected."""
    options = options or []
    return html.Div([
        # Picking runs writes them into the address bar (no reload), so the page can be shared.
        dcc.Location(id="compare-url", refresh=False),
        html.H2("Compare runs"),
        html.Div([dcc.Dropdown(id="compare-a", options=options, value=a, placeholder="before", style={"width": "480px"}),
                  dcc.Dropdown(id="compare-b", options=options, value=b, placeholder="after", style={"width": "480px"})],
                 style={"display": "flex", "gap": "12px"}),
        html.Div(id="compare-result", className="sw-card"),
        dcc.Store(id="compare-options-version", data=options_version),  # the options sent: again only when changed
    ])
