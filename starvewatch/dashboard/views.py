"""Pure view builders: data in, Dash components out (tested as plain functions)."""
from __future__ import annotations

import json

from dash import dcc, html

from ..monitor.diagnosis import joint_changes_note
from ..monitor.export import compare_rows, snippet


def pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def num(x, digits=1, unit="") -> str:
    return "n/a" if x is None else f"{x:.{digits}f}{unit}"


def badge(text: str) -> html.Span:
    return html.Span(text.replace("_", " "), className=f"badge badge-{text}")


def kpi(label: str, value, kpi_id: str | None = None) -> html.Div:
    return html.Div([html.Div(label, className="label"), html.Div(value, className="value")],
                    className="sw-kpi", id=kpi_id or f"kpi-{label.lower().replace(' ', '-').replace('/', '')}")


def kpis(summary: dict) -> list:
    v = summary["verdict"]
    loaders = summary["loaders"]
    main = loaders[0] if loaders else {}
    system = summary.get("system") or {}
    return [
        kpi("Input wait", pct(v["input_wait_fraction"]), "kpi-input-wait"),
        kpi("Verdict", badge(v["input_bound"]), "kpi-verdict"),
        kpi("Limiting factor", (v.get("limiting_factor") or "n/a").replace("_", " "), "kpi-factor"),
        kpi("Batches/s", num(main.get("batches_per_s")), "kpi-batches"),
        kpi("Samples/s", num(main.get("samples_per_s")), "kpi-samples"),
        kpi("GPU util", num(system.get("gpu_util_mean"), 0, "%") if system.get("gpu_util_mean") is not None
            else "no GPU", "kpi-gpu"),
        kpi("Speedup at stake", num(v.get("speedup_at_stake"), 2, "x"), "kpi-speedup"),
        kpi("Steps", f"{sum(l['steps'] for l in loaders):,}", "kpi-steps"),
    ]


def table(header: list[str], rows: list[list], table_id: str | None = None) -> html.Table:
    extra = {"id": table_id} if table_id else {}
    return html.Table([html.Thead(html.Tr([html.Th(h) for h in header])),
                       html.Tbody([html.Tr([html.Td(c) for c in row]) for row in rows])],
                      className="sw-table", **extra)


def runs_table(runs: list[dict], search: str | None = None, sort: str = "started") -> html.Table:
    if search:
        runs = [r for r in runs if search.lower() in (r["name"] + " " + r["id"]).lower()]
    keys = {"started": lambda r: r["started_at"] or "", "wait": lambda r: r["input_wait_fraction"] or 0,
            "throughput": lambda r: r["batches_per_s"] or 0, "name": lambda r: r["name"]}
    runs = sorted(runs, key=keys.get(sort, keys["started"]), reverse=sort != "name")
    rows = [[dcc.Link(r["name"], href=f"/runs/{r['id']}"), html.Code(r["id"]), badge(r["status"]),
             (r["started_at"] or "")[:19].replace("T", " "), f"{r['duration_s']:.0f} s", badge(r["verdict"]),
             pct(r["input_wait_fraction"]), num(r["batches_per_s"])] for r in runs]
    return table(["name", "run", "status", "started (UTC)", "duration", "verdict", "input wait", "batches/s"],
                 rows, "runs-table")


def recommendations(summary: dict) -> list:
    recs = summary.get("recommendations") or []
    if not recs:
        return [html.P("No recommendation: the loop is not waiting for data.", id="no-recommendation")]
    out = []
    for r in recs:
        what = f"{r['parameter']}={r['suggested']!r}  (now {r['current']!r})" if r["parameter"] else str(r["suggested"])
        gain = f" — expected {r['expected_speedup']:.2f}x" if r.get("expected_speedup") else ""
        out.append(html.Div([html.H4(f"{r['loader']}: {what}{gain}"), html.P(r["reason"]),
                             html.Div("evidence: " + json.dumps(r["evidence"], default=str), className="sw-evidence")],
                            className="sw-rec"))
    for loader in summary["loaders"]:
        code = snippet(loader.get("config"), recs, loader["name"])
        if code:
            out.append(html.Div([html.Div(f"{loader['name']} loader, with the changes:"),
                                 html.Pre(code, className="sw-code", id=f"snippet-{loader['name']}"),
                                 dcc.Clipboard(target_id=f"snippet-{loader['name']}", title="copy")]))
    return out


def stall_banner(summary: dict, status: str) -> html.Div | None:
    open_stalls = [s for s in summary.get("stalls") or [] if not s.get("ended_ns")]
    if status != "stalled" or not open_stalls:
        return None
    s = open_stalls[0]
    states = ", ".join(f"worker {w.get('id')}: {w.get('state')}" for w in s.get("workers", [])) or "no worker data"
    return html.Div(f"Stalled: {s['loader']} has waited {s['wait_s']:.1f} s for batch {s.get('step')} ({states})",
                    className="sw-banner", id="stall-banner")


def delivery_banner(summary: dict) -> html.Div | None:
    """A banner when the training processes dropped step records before they reached us: the
    figures on the page then miss those steps, and the user must know."""
    account = summary.get("delivery") or {}
    dropped = {reason: n for reason, n in (account.get("dropped") or {}).items() if n}
    if not dropped:
        return None
    total = sum(dropped.values())
    reasons = ", ".join(f"{reason.replace('_', ' ')}: {n:,}" for reason, n in sorted(dropped.items()))
    return html.Div(f"Incomplete: the training processes dropped {total:,} step record{'s' * (total != 1)} "
                    f"that never reached the collector ({reasons}); "
                    f"{account.get('acknowledged', 0):,} acknowledged, {account.get('spooled', 0):,} in the spool.",
                    className="sw-banner", id="delivery-banner")


def workers_panel(events: list[dict]) -> html.Div:
    if not events:
        return html.P("No DataLoader worker data (num_workers=0, or not sampled yet).")
    latest: dict[str, dict] = {}
    for e in events:
        latest[e["loader"]] = e
    parts = []
    for name, e in latest.items():
        rows = [[w["id"], w.get("pid"), w.get("state"), num(w.get("load_ms_mean"), 2, " ms"),
                 pct(w.get("cpu_fraction")), num(w.get("cpu_pct"), 0, "%"), w.get("batches")] for w in e["workers"]]
        parts += [html.H4(f"{name}: {e.get('alive_workers')}/{e.get('configured_workers')} workers alive, "
                          f"queue {e.get('queue_depth') if e.get('queue_depth') is not None else 'n/a'}"
                          f"/{e.get('queue_capacity') or 'n/a'} ready batches"),
                  table(["worker", "pid", "state", "load per batch", "CPU while loading", "CPU now", "batches"], rows)]
    return html.Div(parts, id="workers-panel")


def config_panel(summary: dict) -> html.Div:
    rows = [[l["name"], html.Code(json.dumps(l.get("config"), default=str))] for l in summary["loaders"]]
    return table(["loader", "configuration"], rows, "config-table")


def ranks_panel(per_rank: dict[int, dict]) -> html.Div | None:
    if len(per_rank) < 2:
        return None
    rows = [[rank, pct(s["verdict"]["input_wait_fraction"]), badge(s["verdict"]["input_bound"]),
             num(sum(l["batches_per_s"] or 0 for l in s["loaders"]))] for rank, s in sorted(per_rank.items())]
    return table(["rank", "input wait", "verdict", "batches/s"], rows, "ranks-table")


def compare_panel(before: dict, after: dict, verification: dict | None) -> html.Div:
    rows = [list(r) for r in compare_rows(before, after)]
    parts = [table(["loader", "metric", "before", "after", "after/before"], rows, "compare-table")]
    if verification:
        vrows = [[r["loader"], f"{r['parameter']}={r['suggested']!r}", "yes" if r["applied"] else "no",
                  num(r["expected_speedup"], 2, "x"), num(r["measured_speedup"], 2, "x"), badge_status(r["status"])]
                 for r in verification["results"]]
        parts += [html.H4("Verify after change"),
                  table(["loader", "change", "applied", "expected", "measured", "verdict"], vrows, "verify-table"),
                  *[html.P(note, className="note") for note in joint_changes_note(verification)]]
    else:
        parts.append(html.P("The loader configurations are the same: nothing to verify."))
    return html.Div(parts)


def badge_status(status: str) -> html.Span:
    color = {"confirmed": "not", "refuted": "high", "not_applied": "insufficient_data"}.get(status, "finished")
    return html.Span(status.replace("_", " "), className=f"badge badge-{color}")
