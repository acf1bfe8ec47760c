"""Pure view builders: data in, Dash components out (tested as plain functions)."""
from __future__ import annotations

from dash import dcc, html

from ..ids import url_segment
from ..monitor import figures
from ..monitor.diagnosis import joint_changes_note
from ..monitor.export import compare_rows, measured_with_interval
from .quantities import human_bytes
from ..monitor.findings import stall_where


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
    rows = [[dcc.Link(r["name"], href=f"/runs/{url_segment(r['id'])}"), html.Code(r["id"]), badge(r["status"]),
             (r["started_at"] or "")[:19].replace("T", " "), f"{r['duration_s']:.0f} s", badge(r["verdict"]),
             pct(r["input_wait_fraction"]), num(r["batches_per_s"])] for r in runs]
    return table(["name", "run", "status", "started (UTC)", "duration", "verdict", "input wait", "batches/s"],
                 rows, "runs-table")


def storage_banner(notes: list[dict]) -> html.Div | None:
    """Runs the storage budget (serve --max-db-size) coarsened or deleted, latest first."""
    if not notes:
        return None
    return html.Div([html.Div(f"Storage budget: run {n['name']} ({n['run_id']}) {n['action']} at "
                              f"{(n['t'] or '')[:19].replace('T', ' ')} UTC: {n['detail']}") for n in notes],
                    className="sw-banner", id="storage-banner")


def stall_banner(summary: dict, status: str) -> html.Div | None:
    open_stalls = [s for s in summary.get("stalls") or [] if not s.get("ended_ns")]
    if status != "stalled" or not open_stalls:
        return None
    s = open_stalls[0]
    states = ", ".join(f"worker {w.get('id')}: {w.get('state')}" for w in s.get("workers", [])) or "no worker data"
    where = stall_where(s)
    return html.Div(f"Stalled: {s['loader']} has waited {s['wait_s']:.1f} s for batch {s.get('step')} ({states})"
                    + (f" — {where}" if where else ""), className="sw-banner", id="stall-banner")


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


def workers_panel(events: list[dict], loader: str | None = None) -> html.Div | None:
    """Per worker: load time over time, memory when sampled, and the latest state; None when the
    run has no DataLoader workers (num_workers=0, or not sampled yet)."""
    if not events:
        return None
    latest: dict[str, dict] = {}
    for e in events:
        latest[e["loader"]] = e
    shown = loader if loader in latest else next(iter(latest))
    of_loader = [e for e in events if e["loader"] == shown]
    parts = [html.H3(f"DataLoader workers: {shown}")]
    graphs = [figures.worker_load_over_time(of_loader, title=f"{shown}: load time per batch, per worker")]
    memory = figures.worker_memory_over_time(of_loader, title=f"{shown}: memory per worker")
    if memory is not None:
        graphs.append(memory)
    parts.append(html.Div([dcc.Graph(figure=g, config={"displaylogo": False}, id=f"workers-graph-{i}")
                           for i, g in enumerate(graphs)], className="sw-grid"))
    e = latest[shown]
    rows = [[w["id"], w.get("pid"), w.get("state"), num(w.get("load_ms_mean"), 2, " ms"),
             pct(w.get("cpu_fraction")), num(w.get("cpu_pct"), 0, "%"),
             human_bytes(w["rss_bytes"]) if w.get("rss_bytes") is not None else "n/a", w.get("batches")]
            for w in e["workers"]]
    parts += [html.H4(f"now: {e.get('alive_workers')}/{e.get('configured_workers')} workers alive, "
                      f"queue {e.get('queue_depth') if e.get('queue_depth') is not None else 'n/a'}"
                      f"/{e.get('queue_capacity') or 'n/a'} ready batches"),
              table(["worker", "pid", "state", "load per batch", "CPU while loading", "CPU now", "RSS", "batches"],
                    rows, "workers-table")]
    return html.Div(parts, id="workers-panel", className="sw-card")


def ranks_panel(per_rank: dict[int, dict], stragglers: dict | None = None) -> html.Div | None:
    """One row per rank; a straggler's row is marked, with its kind, severity and likely cause."""
    if len(per_rank) < 2:
        return None
    named: dict[int, list[dict]] = {}
    for s in (stragglers or {}).get("stragglers", []):
        named.setdefault(s["rank"], []).append(s)
    rows = []
    for rank, s in sorted(per_rank.items()):
        marks = [html.Span(f"{f['kind']} straggler", className=f"badge badge-straggler-{f['severity']}",
                           title=(f.get("cause") or {}).get("text", "")) for f in named.get(rank, [])]
        rows.append(html.Tr([html.Td(rank), html.Td(pct(s["verdict"]["input_wait_fraction"])),
                             html.Td(badge(s["verdict"]["input_bound"])),
                             html.Td(num(sum(l["batches_per_s"] or 0 for l in s["loaders"]))),
                             html.Td(marks or "—")],
                            className="sw-straggler" if rank in named else None, id=f"rank-row-{rank}"))
    header = html.Thead(html.Tr([html.Th(h) for h in ("rank", "input wait", "verdict", "batches/s", "straggler")]))
    parts = [html.Table([header, html.Tbody(rows)], className="sw-table", id="ranks-table")]
    for f in (stragglers or {}).get("stragglers", []):
        cause = (f.get("cause") or {}).get("text") or ""
        parts.append(html.P(f"Rank {f['rank']} ({f['loader']}): {f['severity']} {f['kind']} straggler, "
                            f"+{100 * f['excess_fraction']:.0f}% of the {f['step_ms']:.1f} ms step over the "
                            f"median rank. {cause}", className="sw-straggler-note"))
    if stragglers and not stragglers.get("stragglers"):
        parts.append(html.P("No straggler: the ranks wait and compute alike.", className="note"))
    return html.Div(parts, id="ranks-panel")


def compare_panel(before: dict, after: dict, verification: dict | None) -> html.Div:
    rows = [list(r) for r in compare_rows(before, after)]
    parts = [table(["loader", "metric", "before", "after", "after/before"], rows, "compare-table")]
    if verification:
        vrows = [[r["loader"], f"{r['parameter']}={r['suggested']!r}", "yes" if r["applied"] else "no",
                  num(r.get("judged_against") or r["expected_speedup"], 2, "x"), measured_with_interval(r),
                  badge_status(r["status"])]
                 for r in verification["results"]]
        parts += [html.H4("Verify after change"),
                  table(["loader", "change", "applied", "expected", "measured (95% interval)", "verdict"], vrows, "verify-table"),
                  *[html.P(note, className="note") for note in joint_changes_note(verification)]]
    else:
        parts.append(html.P("The loader configurations are the same: nothing to verify."))
    return html.Div(parts)


def badge_status(status: str) -> html.Span:
    color = {"confirmed": "not", "refuted": "high", "inconclusive": "moderate", "not_applied": "insufficient_data"}.get(status, "finished")
    return html.Span(status.replace("_", " "), className=f"badge badge-{color}")
