"""The run page's "Measured tuning" panel: `starvewatch tune` results stored with the run, and
live tuning's timeline (watch(tune=True): one row per window beside a chart of samples/s per
window with its interval and the configuration over steps, then the outcome and its line).

A component of its own (view builder + callback), so the run page only holds its container.
"""
from __future__ import annotations

from dash import Input, Output, State, dcc, html
from starlette.concurrency import run_in_threadpool

from ..monitor.outputs.tuning_figure import tuning_timeline
from ..monitor.storage.query import NotFound

CONTAINER_ID = "tuning-panel"


def _num(x, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def card() -> html.Div:
    """The container placed on the run page; the callback fills it."""
    return html.Div([html.H3("Measured tuning"), html.Div(id=CONTAINER_ID)], className="sw-card")


def panel(tuning: dict | None) -> list:
    if not tuning:
        return [html.P(["Not tuned yet. ", html.Code("starvewatch tune module:make_loader --run NAME"),
                        " measures DataLoader settings on this machine and stores them here."],
                       id="tuning-none")]
    answer = tuning.get("answer") or {}
    rows = []
    for t in tuning.get("trials") or []:
        is_answer = bool(answer) and t["config"] == answer.get("config")
        mem = f"{t['worker_uss_bytes'] / 2**20:.0f} MiB" if t.get("worker_uss_bytes") else "n/a"
        status = t["status"].replace("_", " ") + (f": {t['reason']}" if t.get("reason") else "")
        rows.append(html.Tr([html.Td(("* " if is_answer else "") + (t.get("label") or str(t["config"]))),
                             html.Td(_num(t.get("batches_per_s"))), html.Td(_num(t.get("samples_per_s"))),
                             html.Td(mem), html.Td(_num(t.get("cpu_pct"), 0)), html.Td(status)],
                            className="sw-tuned" if is_answer else None))
    header = html.Thead(html.Tr([html.Th(h) for h in ("configuration", "batches/s", "samples/s",
                                                      "worker memory", "CPU %", "status")]))
    consumption = tuning.get("consumption_batches_per_s")
    facts = (f"{len(tuning.get('trials') or [])} trials in {tuning.get('elapsed_s') or 0:.1f} s "
             f"(budget {tuning.get('budget_s')} s) on {tuning.get('host') or 'unknown host'}, "
             f"{tuning.get('cores')} cores, {tuning.get('created_at')}"
             + (f"; consumption {consumption:.1f} batches/s" if consumption else ""))
    parts = [html.P(facts, className="sw-evidence"),
             html.Table([header, html.Tbody(rows)], className="sw-table", id="tuning-table")]
    if answer:
        parts += [html.P(f"Answer: {answer.get('rule')}."),
                  html.Pre(answer.get("snippet") or "", className="sw-code", id="tuning-snippet"),
                  dcc.Clipboard(target_id="tuning-snippet", title="copy")]
    else:
        parts.append(html.P("No configuration could be measured within the budget."))
    return parts


_SETTING_SHORT = {"num_workers": "workers", "prefetch_factor": "prefetch", "persistent_workers": "persistent",
                  "pin_memory": "pinned", "in_order": "in order"}


def config_text(config: dict | None) -> str:
    """A tuned configuration in a few words: `2 workers, prefetch 4, persistent`."""
    if not config:
        return "n/a"
    workers = config.get("num_workers") or 0
    words = [f"{workers} workers" if workers != 1 else "1 worker"]
    if workers and config.get("prefetch_factor") not in (None, 2):
        words.append(f"prefetch {config['prefetch_factor']}")
    for key in ("persistent_workers", "pin_memory"):
        if config.get(key):
            words.append(_SETTING_SHORT[key])
    if config.get("in_order") is False:
        words.append("out of order")
    return ", ".join(words)


def live_panel(live: dict | None) -> list:
    """Live tuning (watch(tune=True)): the timeline of windows, one row each (the configuration
    run, the loop's samples/s, the interval against the configuration kept, the decision),
    beside its chart (samples/s per window with its interval, the configuration over steps),
    then each loader's outcome and the line to copy."""
    if not live:
        return []
    rows = []
    for r in live.get("records") or []:
        figures = r.get("figures") or {}
        rate = figures.get("samples_per_s") or figures.get("batches_per_s")
        interval = r.get("interval")
        rows.append(html.Tr([html.Td(r.get("loader")), html.Td(str(r.get("window") or "")),
                             html.Td(config_text(r.get("config"))), html.Td(_num(rate)),
                             html.Td(f"{interval['speedup']:.2f}x [{interval['low']:.2f}, {interval['high']:.2f}]"
                                     if interval else ""),
                             html.Td(str(r.get("decision") or "").replace("_", " "))]))
    header = html.Thead(html.Tr([html.Th(h) for h in ("loader", "window", "configuration", "samples/s",
                                                      "against the kept one", "decision")]))
    table = html.Table([header, html.Tbody(rows)], className="sw-table", id="live-tuning-table")
    chart = tuning_timeline(live, config_text)
    parts = [html.H4("Live tuning"),
             html.Div([html.Div(table), dcc.Graph(figure=chart, id="live-tuning-chart",
                                                  config={"displaylogo": False})], className="sw-grid")
             if chart is not None else table]
    for i, out in enumerate(live.get("loaders") or []):
        gain = out.get("gain")
        parts.append(html.P(f"{out.get('loader')}: {config_text(out.get('start'))} -> {config_text(out.get('final'))}"
                            + (f", measured {gain['speedup']:.2f}x [{gain['low']:.2f}, {gain['high']:.2f}]"
                               if gain else ", no gain kept")
                            + (f" (tuning off: {out['disabled']})" if out.get("disabled") else "")))
        if out.get("line"):
            parts += [html.Pre(out["line"], className="sw-code", id=f"live-tuning-line-{i}"),
                      dcc.Clipboard(target_id=f"live-tuning-line-{i}", title="copy")]
    return parts


def register(app, get_query) -> None:
    @app.callback(Output(CONTAINER_ID, "children"), Input("tick", "data"), State("run-id", "data"))
    async def refresh_tuning(_tick, run_id):
        if not isinstance(run_id, str):  # a request can carry any JSON value
            return []
        try:
            tuning = await run_in_threadpool(get_query().tuning, run_id)
            live = await run_in_threadpool(get_query().live_tuning, run_id)
        except NotFound:
            return []
        return (panel(tuning) if tuning or not live else []) + live_panel(live)
