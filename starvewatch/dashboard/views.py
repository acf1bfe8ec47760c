"""Pure view builders: data in, Dash components out (tested as plain functions)."""
from __future__ import annotations

from dash import dcc, html

from ..ids import url_segment
from ..monitor.outputs import figures
from ..analysis.diagnosis import joint_changes_note
from ..analysis.verification import change_label
from ..analysis import compare
from ..analysis.sentences import BAND_WORDS as VERDICTS  # one vocabulary: the badge's, the filter's
from ..quantities import human_bytes
from ..analysis.findings.stall_text import stall_where


def pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def num(x, digits=1, unit="") -> str:
    return "n/a" if x is None else f"{x:.{digits}f}{unit}"


def badge(text: str) -> html.Span:
    """A band in the one vocabulary (analysis/answer.py), any other state as its words."""
    return html.Span(VERDICTS.get(text, text.replace("_", " ")), className=f"badge badge-{text}")


def kpi(label: str, value, kpi_id: str | None = None) -> html.Div:
    return html.Div([html.Div(label, className="label"), html.Div(value, className="value")],
                    className="sw-kpi", id=kpi_id or f"kpi-{label.lower().replace(' ', '-').replace('/', '')}")


def kpis(summary: dict) -> list:
    from ..analysis.sentences import limiting_phrase
    v = summary["verdict"]
    loaders = summary["loaders"]
    # The training loader's throughput (analysis/summary.run_verdict), not the first watched.
    main = next((l for l in loaders if l["name"] == v.get("training_loader")), loaders[0] if loaders else {})
    system = summary.get("system") or {}
    return [
        kpi("Input wait", pct(v["input_wait_fraction"]), "kpi-input-wait"),
        kpi("Verdict", badge(v["input_bound"]), "kpi-verdict"),
        kpi("Limiting factor", limiting_phrase(v.get("limiting_factor")) or "n/a", "kpi-factor"),
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


PAGE_SIZE = 50  # runs per page: the page stays light with thousands of runs in the store
PER_GROUP = 3  # a group shows its newest runs; its own page (/groups/NAME) shows them all

SORT_KEYS = {"started": lambda r: r["started_at"] or "", "wait": lambda r: r["input_wait_fraction"] or 0,
             "throughput": lambda r: r["batches_per_s"] or 0, "name": lambda r: r["name"]}


def group_runs(runs: list[dict], search: str | None = None, sort: str = "started", status: str | None = None,
               verdict: str | None = None, only: str | None = None) -> list[dict]:
    """Runs grouped by name: [{"name", "runs" (those the filters keep, newest first), "total",
    "last_two" ([before, after] ids of the group's two newest runs, or None)}]. A group sorts by
    its newest shown run under `sort`; groups the filters empty are left out."""
    groups: dict[str, list[dict]] = {}
    for r in sorted(runs, key=SORT_KEYS["started"], reverse=True):
        groups.setdefault(r["name"], []).append(r)
    needle = search.lower() if search else None
    out = []
    for name, members in groups.items():
        if only is not None and name != only:
            continue
        shown = [r for r in members if (needle is None or needle in (r["name"] + " " + r["id"]).lower())
                 and (not status or r["status"] == status) and (not verdict or r["verdict"] == verdict)]
        if shown:
            out.append({"name": name, "runs": shown, "total": len(members),
                        "last_two": [members[1]["id"], members[0]["id"]] if len(members) > 1 else None})
    key = SORT_KEYS.get(sort, SORT_KEYS["started"])
    out.sort(key=lambda g: key(g["runs"][0]), reverse=sort != "name")
    return out


def _group_row(group: dict, shown: int, continued: bool) -> html.Tr:
    from urllib.parse import quote
    matching, total = len(group["runs"]), group["total"]
    count = f"{total} run{'s' * (total != 1)}" if matching == total else f"{matching} of {total} runs match"
    more = [" · ", dcc.Link(f"all {matching}", href=f"/groups/{url_segment(group['name'])}",
                            className="sw-group-all")] if shown < matching else []
    cells = [html.Td([dcc.Link(group["name"], href=f"/runs/{url_segment(group['runs'][0]['id'])}",
                               className="sw-group-name"),
                      html.Span(f" · {count}" + (" (continued)" if continued else ""), className="sw-muted"), *more],
                     colSpan=5)]
    if group["last_two"]:
        a, b = group["last_two"]
        cells.append(html.Td(dcc.Link("compare the last two", href=f"/compare?a={quote(a, safe='')}&b={quote(b, safe='')}",
                                      className="sw-compare-last-two"), colSpan=2))
    else:
        cells.append(html.Td("one run", className="sw-muted", colSpan=2))
    return html.Tr(cells, className="sw-group")


def runs_view(runs: list[dict], search: str | None = None, sort: str = "started", status: str | None = None,
              verdict: str | None = None, page: int = 0, group: str | None = None) -> dict:
    """One page of the runs page: {"table", "page", "pages", "runs", "groups"}. Each group shows
    its PER_GROUP newest runs (all of them on its own page, `group`), PAGE_SIZE runs a page; a
    group cut by a page boundary is headed again on the next page, marked continued."""
    groups = group_runs(runs, search, sort, status, verdict, only=group)
    per_group = None if group is not None else PER_GROUP
    flat = [(g, i, r) for g in groups for i, r in enumerate(g["runs"][:per_group])]
    pages = max(1, -(-len(flat) // PAGE_SIZE))
    page = min(max(0, page), pages - 1)
    rows, current = [], None
    for g, i, r in flat[page * PAGE_SIZE:(page + 1) * PAGE_SIZE]:
        if g is not current:
            rows.append(_group_row(g, len(g["runs"][:per_group]), continued=i > 0))
            current = g
        rows.append(html.Tr([html.Td(dcc.Link(r["id"], href=f"/runs/{url_segment(r['id'])}"), className="sw-run-id"),
                             html.Td(badge(r["status"])), html.Td((r["started_at"] or "")[:19].replace("T", " ")),
                             html.Td(f"{r['duration_s']:.0f} s"),
                             html.Td([badge(r["verdict"])] + ([html.Span(" " + r["regression"]["sentence"],
                                                                         className="sw-regression")]
                                                              if r.get("regression") else [])),
                             html.Td(pct(r["input_wait_fraction"])), html.Td(num(r["batches_per_s"]))],
                            className="sw-run"))
    view = f"{status or 'any'}|{verdict or 'any'}|{sort}|{page}|{len(flat)}"
    if not rows:
        body = html.P("No run matches these filters.", id="runs-none", **{"data-view": view})
    else:
        header = html.Thead(html.Tr([html.Th(h) for h in ("run", "status", "started (UTC)", "duration", "verdict",
                                                           "input wait", "batches/s")]))
        body = html.Table([header, html.Tbody(rows)], className="sw-table sw-runs", id="runs-table",
                          **{"data-view": view})
    return {"table": body, "page": page, "pages": pages, "runs": sum(len(g["runs"]) for g in groups),
            "shown": len(flat), "groups": len(groups)}


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
    files = account.get("rejected_files") or []
    if files and not dropped:
        return html.Div(f"Incomplete: {len(files):,} spool file{'s' * (len(files) != 1)} of this run could not be "
                        f"read and {'were' if len(files) != 1 else 'was'} set aside ({files[0]['file']}: "
                        f"{files[0]['reason']}).", className="sw-banner", id="delivery-banner")
    if not dropped:
        return None
    total = sum(dropped.values())
    reasons = ", ".join(f"{reason.replace('_', ' ')}: {n:,}" for reason, n in sorted(dropped.items()))
    return html.Div(f"Incomplete: the training processes dropped {total:,} step record{'s' * (total != 1)} "
                    f"that never reached the collector ({reasons}); "
                    f"{account.get('acknowledged', 0):,} acknowledged, {account.get('spooled', 0):,} in the spool."
                    + (f" {len(files):,} spool file{'s' * (len(files) != 1)} set aside as unreadable." if files else ""),
                    className="sw-banner", id="delivery-banner")


def workers_panel(events: list[dict], loader: str | None = None, rank: int | None = None,
                  why: str = "", live: bool = True) -> html.Div | None:
    """Per worker: load time over time, memory when sampled, and the latest state; None when the
    run has no DataLoader workers (num_workers=0, or not sampled yet). `events`: one rank's
    snapshots; with several ranks, `rank` names it in the heading (and `why` that one). A run
    that is no longer `live` shows no "now" (workers alive, queue, state, CPU now): its workers
    are gone, and "0/1 workers alive" would read as a fault."""
    if not events:
        return None
    latest: dict[str, dict] = {}
    for e in events:
        latest[e["loader"]] = e
    shown = loader if loader in latest else next(iter(latest))
    of_loader = [e for e in events if e["loader"] == shown]
    whose = f", rank {rank}" + (f" ({why})" if why else "") if rank is not None else ""
    parts = [html.H3(f"DataLoader workers: {shown}{whose}", id="workers-heading")]
    graphs = [figures.worker_load_over_time(of_loader, title=f"{shown}: load time per batch, per worker")]
    memory = figures.worker_memory_over_time(of_loader, title=f"{shown}: memory per worker")
    if memory is not None:
        graphs.append(memory)
    parts.append(html.Div([dcc.Graph(figure=g, config={"displaylogo": False}, id=f"workers-graph-{i}")
                           for i, g in enumerate(graphs)], className="sw-grid"))
    e = latest[shown]
    if live:
        rows = [[w["id"], w.get("pid"), w.get("state"), num(w.get("load_ms_mean"), 2, " ms"),
                 pct(w.get("cpu_fraction")), num(w.get("cpu_pct"), 0, "%"),
                 human_bytes(w["rss_bytes"]) if w.get("rss_bytes") is not None else "n/a", w.get("batches")]
                for w in e["workers"]]
        parts += [html.H4(f"now: {e.get('alive_workers')}/{e.get('configured_workers')} workers alive, "
                          f"queue {e.get('queue_depth') if e.get('queue_depth') is not None else 'n/a'}"
                          f"/{e.get('queue_capacity') or 'n/a'} ready batches"),
                  table(["worker", "pid", "state", "load per batch", "CPU while loading", "CPU now", "RSS",
                         "batches"], rows, "workers-table")]
    else:
        rows = [[w["id"], w.get("pid"), num(w.get("load_ms_mean"), 2, " ms"), pct(w.get("cpu_fraction")),
                 human_bytes(w["rss_bytes"]) if w.get("rss_bytes") is not None else "n/a", w.get("batches")]
                for w in e["workers"]]
        parts += [html.H4(f"{e.get('configured_workers')} workers, as last seen"),
                  table(["worker", "pid", "load per batch", "CPU while loading", "RSS", "batches"], rows,
                        "workers-table")]
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


def compare_view(comp: dict, charts: dict | None = None) -> html.Div:
    """Two runs side by side (analysis/compare.py): the metric changes, the configuration with
    what changed highlighted, the verify-after-change verdict with its intervals drawn, then the
    distributions overlaid and the series on one time axis, per pair of loaders."""
    def graph(fig, graph_id):
        return html.Div(dcc.Graph(figure=fig, id=graph_id, config={"displaylogo": False}), className="sw-card")

    # First: is the later run slower, beyond noise (analysis/regression.py); then the
    # one-sentence answer ("after is 1.41x faster; predicted 1.69x; confirmed") when the
    # comparison carries one (its wording belongs to the analysis).
    parts = [html.P(comp["regression"]["sentence"], className="sw-regression", id="compare-regression")] \
        if comp.get("regression") else []
    if comp.get("headline"):
        parts.append(html.P(comp["headline"], className="sw-headline", id="compare-headline"))
    if comp.get("advice_moved"):  # the runs' advice differs: which host figure moved (issue 35 item 5)
        parts.append(html.P(comp["advice_moved"]["sentence"], className="note", id="compare-advice-moved"))
    parts += [html.P(f"loader {p['before']} compared with {p['after']} (each run's only loader)", className="note")
              for p in comp["pairs"] if p["by"] == "only loader"]
    for side in ("before", "after"):
        if comp["unpaired"][side]:
            parts.append(html.P(f"only in the {side} run: {', '.join(comp['unpaired'][side])}", className="note"))
    if comp["metrics"]:
        rows = [html.Tr([html.Td(r["loader"]), html.Td(r["metric"]), html.Td(compare.value_text(r["before"], r["kind"])),
                         html.Td(compare.value_text(r["after"], r["kind"])),
                         html.Td(compare.change_text(r), className=f"sw-{direction(r)}" if direction(r) else None)])
                for r in comp["metrics"]]
        parts.append(html.Table([html.Thead(html.Tr([html.Th(h) for h in ("loader", "metric", "before", "after",
                                                                             "change")])),
                                 html.Tbody(rows)], className="sw-table", id="compare-table"))
    else:
        parts.append(html.P("No loader of one run pairs with a loader of the other: nothing to compare.",
                            id="compare-nothing"))
    if comp["config"]:
        def config_rows(changed: bool) -> list:
            return [html.Tr([html.Td(r["loader"]), html.Th(r["setting"]),
                             html.Td(html.Code(compare.setting_text(r["before"], r["before_set"]))),
                             html.Td(html.Code(compare.setting_text(r["after"], r["after_set"])))],
                            className="sw-changed" if changed else None)
                    for r in comp["config"] if bool(r["changed"]) is changed]

        def config_table(rows: list, table_id: str) -> html.Table:
            return html.Table([html.Thead(html.Tr([html.Th(h) for h in ("loader", "setting", "before", "after")])),
                               html.Tbody(rows)], className="sw-table sw-kv", id=table_id)

        changed, same = config_rows(True), config_rows(False)
        parts.append(html.H4("Configuration: what changed"))
        parts.append(config_table(changed, "config-diff") if changed else
                     html.P("No setting changed.", className="sw-muted", id="config-diff"))
        if same:  # the unchanged settings, behind a toggle: they are most of the table
            parts.append(html.Details([html.Summary(f"Unchanged settings ({len(same)})"),
                                       config_table(same, "config-unchanged")],
                                      className="sw-details", id="config-unchanged-details"))
    verification = comp["verification"]
    if verification and verification["results"]:
        vrows = [[r["loader"], change_label(r), "yes" if r["applied"] else "no",
                  badge_status(r["status"]), compare.interval_text(r)] for r in verification["results"]]
        parts += [html.H4("Verify after change"),
                  table(["loader", "change", "applied", "verdict", "measured against predicted"], vrows, "verify-table"),
                  *[html.P(note, className="note") for note in joint_changes_note(verification)]]
        if charts is not None:
            parts.append(graph(charts["verify"], "verify-graph"))
    elif verification:
        parts.append(html.P("The configuration changed, but the before run had no recommendation to verify.",
                            id="verify-none"))
    else:
        parts.append(html.P("The loader configurations are the same: nothing to verify.", id="verify-none"))
    for i, pair in enumerate((charts or {}).get("pairs") or []):
        parts += [html.H4(f"Loader {pair['label']}"),
                  html.Div([graph(pair["wait"], f"compare-wait-{i}"), graph(pair["compute"], f"compare-compute-{i}"),
                            graph(pair["throughput"], f"compare-throughput-{i}"),
                            graph(pair["input_wait"], f"compare-input-wait-{i}")], className="sw-grid")]
    return html.Div(parts)


# A change smaller than this is no change (noise between two runs of the same job).
SAME_PCT, SAME_POINTS = 2.0, 1.0


def direction(row: dict) -> str | None:
    """"better", "worse" or None (no direction, or too small to say) for a compare metric row:
    throughput up is better; the input wait and the waits down are better; compute is neither
    (it changes with the work, not with the loader)."""
    if row["kind"] == "rate":
        higher_is_better = True
    elif row["kind"] == "fraction" or row["metric"].startswith("wait"):
        higher_is_better = False
    else:
        return None
    if row.get("change_points") is not None:
        delta, same = row["change_points"], SAME_POINTS
    elif row.get("change_pct") is not None:
        delta, same = row["change_pct"], SAME_PCT
    else:
        return None
    if abs(delta) < same:
        return None
    return "better" if (delta > 0) is higher_is_better else "worse"


def badge_status(status: str) -> html.Span:
    color = {"confirmed": "not", "refuted": "high", "inconclusive": "moderate", "not_applied": "insufficient_data"}.get(status, "finished")
    return html.Span(status.replace("_", " "), className=f"badge badge-{color}")
