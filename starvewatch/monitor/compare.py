"""Two runs side by side: which loaders pair, how each metric changed, what configuration
changed, and the verify-after-change verdict. Pure functions over two summaries, shared by the
dashboard's compare page and `starvewatch compare` (Markdown, JSON, self-contained HTML).

Loaders pair by name; when both runs have one loader each, those two pair whatever their names
(a loader renamed between runs is still the same loader). Ratios print as a percent change with
the ratio to three significant digits ("-99.7% (0.00255x)"), never rounded to "0.00x".
"""
from __future__ import annotations

import copy
import html
import json
from datetime import datetime

from ..schema import COMPARE_SCHEMA
from .verification import joint_changes_note, verify

# (label, where in a loader summary, kind): kind "fraction" changes in percentage points.
METRICS = (("input wait", ("input_wait_fraction",), "fraction"),
           ("batches/s", ("batches_per_s",), "rate"),
           ("samples/s", ("samples_per_s",), "rate"),
           ("wait p50 (ms)", ("wait_ms", "p50"), "ms"),
           ("wait p95 (ms)", ("wait_ms", "p95"), "ms"),
           ("compute mean (ms)", ("compute_ms", "mean"), "ms"))


def loader_pairs(before: dict, after: dict) -> list[dict]:
    """[{"before": name, "after": name, "by": "name" | "only loader"}], in the after run's order."""
    old = [l["name"] for l in before.get("loaders") or []]
    new = [l["name"] for l in after.get("loaders") or []]
    if len(old) == 1 and len(new) == 1 and old != new:
        return [{"before": old[0], "after": new[0], "by": "only loader"}]
    return [{"before": n, "after": n, "by": "name"} for n in new if n in old]


def pair_label(pair: dict) -> str:
    return pair["after"] if pair["before"] == pair["after"] else f"{pair['before']} → {pair['after']}"


def _loader(summary: dict, name: str) -> dict:
    return next(l for l in summary["loaders"] if l["name"] == name)


def _get(loader: dict, path: tuple):
    value = loader
    for key in path:
        value = (value or {}).get(key)
    return value


def change(a, b, kind: str) -> dict:
    """{"ratio", "change_pct", "change_points"} of after (b) over before (a); None where unknown."""
    out = {"ratio": None, "change_pct": None, "change_points": None}
    if a is None or b is None:
        return out
    if kind == "fraction":
        out["change_points"] = 100 * (b - a)
    if a:
        out["ratio"] = b / a
        out["change_pct"] = 100 * (b / a - 1)
    return out


def change_text(row: dict) -> str:
    """'-99.7% (0.00255x)', '+150.0% (2.5x)', '-71.4 points' for a share; 'n/a' when unknown."""
    if row.get("change_points") is not None:
        return f"{row['change_points']:+.1f} points"
    ratio, pct = row.get("ratio"), row.get("change_pct")
    if ratio is None or pct is None:
        return "n/a"
    shown = f"{pct:+,.0f}%" if abs(pct) >= 1000 else f"{pct:+.1f}%"
    return f"{shown} ({ratio:.3g}x)"


def value_text(x, kind: str) -> str:
    if x is None:
        return "n/a"
    if kind == "fraction":
        return f"{100 * x:.1f}%"
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.3g}" if x else "0"


def metric_rows(before: dict, after: dict, pairs: list[dict]) -> list[dict]:
    rows = []
    for pair in pairs:
        old, new = _loader(before, pair["before"]), _loader(after, pair["after"])
        for label, path, kind in METRICS:
            a, b = _get(old, path), _get(new, path)
            if a is None and b is None:
                continue
            rows.append({"loader": pair_label(pair), "metric": label, "kind": kind, "before": a, "after": b,
                         **change(a, b, kind)})
    return rows


def config_rows(before: dict, after: dict, pairs: list[dict]) -> list[dict]:
    """Every setting of each pair of loaders, with the changed ones marked."""
    rows = []
    for pair in pairs:
        a = _loader(before, pair["before"]).get("config") or {}
        b = _loader(after, pair["after"]).get("config") or {}
        for key in list(a) + [k for k in b if k not in a]:
            rows.append({"loader": pair_label(pair), "setting": key, "before": a.get(key), "after": b.get(key),
                         "before_set": key in a, "after_set": key in b, "changed": a.get(key) != b.get(key)
                         or (key in a) != (key in b)})
    return rows


def aligned_before(before: dict, pairs: list[dict]) -> dict:
    """The before summary with a paired loader renamed to its partner's name, so that
    verify() (which pairs by name) judges the renamed loader too."""
    renames = {p["before"]: p["after"] for p in pairs if p["before"] != p["after"]}
    if not renames:
        return before
    out = copy.deepcopy(before)
    for part in ("loaders", "recommendations", "plans"):
        for item in out.get(part) or []:
            for key in ("name", "loader"):
                if item.get(key) in renames:
                    item[key] = renames[item[key]]
    return out


def comparison(before: dict, after: dict) -> dict:
    """The comparison (schema `starvewatch.compare/1`): both runs, the loader pairs, the metric
    changes, the configuration diff and the verify-after-change verdict (None when the paired
    loaders' configurations are the same)."""
    pairs = loader_pairs(before, after)
    paired_before = {p["before"] for p in pairs}
    paired_after = {p["after"] for p in pairs}
    return {
        "schema": COMPARE_SCHEMA,
        "before": _run(before), "after": _run(after),
        "pairs": pairs,
        "unpaired": {"before": [l["name"] for l in before["loaders"] if l["name"] not in paired_before],
                     "after": [l["name"] for l in after["loaders"] if l["name"] not in paired_after]},
        "metrics": metric_rows(before, after, pairs),
        "config": config_rows(before, after, pairs),
        "verification": verify(aligned_before(before, pairs), after),
    }


def gather(summary_of, distributions_of, series_of, a: str, b: str) -> tuple[dict, dict, dict, dict, dict]:
    """(before, after, comparison, distributions, series) read through three functions, so the
    dashboard (the query layer) and the CLI (a collector or offline data) share one path."""
    before, after = summary_of(a), summary_of(b)
    comp = comparison(before, after)
    distributions, series = {}, {}
    for pair in comp["pairs"]:
        for side, run_id in (("before", a), ("after", b)):
            loader = pair[side]
            distributions[(side, loader)] = distributions_of(run_id, loader)
            series[(side, loader)] = series_of(run_id, loader)
    return before, after, comp, distributions, series


def _run(summary: dict) -> dict:
    run, verdict = summary["run"], summary.get("verdict") or {}
    return {"id": run["id"], "name": run.get("name"), "status": run.get("status"),
            "started_at": run.get("started_at"), "input_bound": verdict.get("input_bound"),
            "input_wait_fraction": verdict.get("input_wait_fraction")}


def start_seconds(summary_run: dict) -> float | None:
    """A run's start as epoch seconds (charts count seconds from each run's start)."""
    started = summary_run.get("started_at")
    if not started:
        return None
    try:
        return datetime.fromisoformat(str(started).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def setting_text(value, is_set: bool = True) -> str:
    """A setting as the dashboard's configuration table shows it (a dict or list spelled out)."""
    if not is_set:
        return "(default)"
    if isinstance(value, (dict, list, tuple)):
        from ..quantities import value as spelled
        return spelled("", value)
    return repr(value)


def expected_of(result: dict):
    return result.get("judged_against") or result.get("expected_speedup")


def speedup_text(x: float) -> str:
    """A speed-up with two decimals in the usual range, three significant digits outside it."""
    return f"{x:.2f}" if 0.1 <= abs(x) < 100 else f"{x:.3g}"


def interval_text(result: dict) -> str:
    """'measured 2.05x [1.90, 2.21] samples/s; predicted 2.40x' -- the prediction against the interval."""
    if result.get("measured_speedup") is None:
        return "not measured"
    low, high = result.get("interval") or (None, None)
    text = f"measured {speedup_text(result['measured_speedup'])}x"
    if low is not None:
        text += f" [{speedup_text(low)}, {speedup_text(high)}]"
    if result.get("basis"):
        text += f" {result['basis']}"
    expected = expected_of(result)
    if expected:
        where = "inside" if low is not None and low <= expected <= high else \
            "above" if low is not None and expected > high else "below" if low is not None else "against"
        text += f"; predicted {speedup_text(expected)}x" + (f" ({where} the interval)" if where != "against" else "")
    return text


# ---- Markdown and JSON -------------------------------------------------------------------------------

def _cell(text) -> str:
    """A Markdown table cell: names are free text; a pipe or a newline would break the table."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("`", "'")


def to_markdown(comp: dict) -> str:
    b, a = comp["before"], comp["after"]
    lines = ["# starvewatch comparison", "",
             f"- before: `{_cell(b['id'])}` ({_cell(b['name'])}, started {b.get('started_at') or 'n/a'}, "
             f"input wait {value_text(b['input_wait_fraction'], 'fraction')})",
             f"- after: `{_cell(a['id'])}` ({_cell(a['name'])}, started {a.get('started_at') or 'n/a'}, "
             f"input wait {value_text(a['input_wait_fraction'], 'fraction')})"]
    for p in comp["pairs"]:
        if p["by"] == "only loader":
            lines.append(f"- loader {_cell(p['before'])} compared with {_cell(p['after'])} (each run's only loader)")
    for side in ("before", "after"):
        if comp["unpaired"][side]:
            lines.append(f"- only in the {side} run: {', '.join(_cell(n) for n in comp['unpaired'][side])}")
    lines += ["", "## Metrics", ""]
    if comp["metrics"]:
        lines += ["| loader | metric | before | after | change |", "|---|---|---:|---:|---:|"]
        lines += [f"| {_cell(r['loader'])} | {r['metric']} | {value_text(r['before'], r['kind'])} | "
                  f"{value_text(r['after'], r['kind'])} | {change_text(r)} |" for r in comp["metrics"]]
    else:
        lines.append("No loader of one run pairs with a loader of the other: nothing to compare.")
    changed = [r for r in comp["config"] if r["changed"]]
    lines += ["", "## Configuration changes", ""]
    if changed:
        lines += ["| loader | setting | before | after |", "|---|---|---|---|"]
        lines += [f"| {_cell(r['loader'])} | **{_cell(r['setting'])}** | "
                  f"`{_cell(setting_text(r['before'], r['before_set']))}` | "
                  f"`{_cell(setting_text(r['after'], r['after_set']))}` |" for r in changed]
    else:
        lines.append("None: the paired loaders have the same configuration.")
    lines += ["", "## Verify after change", ""]
    verification = comp["verification"]
    if verification and verification["results"]:
        lines += ["| loader | change | applied | verdict | measured against predicted |", "|---|---|---|---|---|"]
        for r in verification["results"]:
            lines.append(f"| {_cell(r['loader'])} | `{_cell(r['parameter'])}={_cell(repr(r['suggested']))}` | "
                         f"{'yes' if r['applied'] else 'no'} | {r['status'].replace('_', ' ')} | "
                         f"{interval_text(r)} |")
        notes = joint_changes_note(verification)
        if notes:
            lines += [""] + notes
    elif verification:
        lines.append("The configuration changed, but the before run had no recommendation to verify.")
    else:
        lines.append("The loader configurations are the same: nothing to verify.")
    return "\n".join(lines) + "\n"


def to_json(comp: dict) -> str:
    return json.dumps(comp, indent=2, default=str) + "\n"


# ---- self-contained HTML ------------------------------------------------------------------------------

HTML_STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ddd;padding:4px 8px;font-size:14px;text-align:left}
td.num{text-align:right}code{background:#f5f5f5;padding:1px 4px}tr.changed{background:#fff4d6;font-weight:600}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:12px}.muted{color:#666}
.badge{padding:1px 6px;border-radius:4px;background:#eee}.confirmed{background:#d4edda}.refuted{background:#f8d7da}
.inconclusive{background:#fff3cd}"""


def _e(x) -> str:
    return html.escape(str(x))


def _table(header: list[str], rows: list[list[str]], table_id: str, row_classes: list[str] | None = None,
           numeric: set[int] = frozenset()) -> str:
    """Cells are already-escaped HTML."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f" class='{row_classes[i]}'" if row_classes and row_classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td{' class=num' if j in numeric else ''}>{c}</td>"
                                           for j, c in enumerate(row)) + "</tr>")
    return f"<table id='{table_id}'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def html_tables(comp: dict) -> str:
    """The comparison's tables as HTML (every name escaped)."""
    b, a = comp["before"], comp["after"]
    parts = [f"<p>before: <code>{_e(b['id'])}</code> ({_e(b['name'])}) · after: <code>{_e(a['id'])}</code> "
             f"({_e(a['name'])})</p>"]
    for p in comp["pairs"]:
        if p["by"] == "only loader":
            parts.append(f"<p class='muted'>loader {_e(p['before'])} compared with {_e(p['after'])} "
                         f"(each run's only loader)</p>")
    parts.append("<h2>Metrics</h2>")
    if comp["metrics"]:
        parts.append(_table(["loader", "metric", "before", "after", "change"],
                            [[_e(r["loader"]), _e(r["metric"]), _e(value_text(r["before"], r["kind"])),
                              _e(value_text(r["after"], r["kind"])), _e(change_text(r))] for r in comp["metrics"]],
                            "compare-table", numeric={2, 3, 4}))
    else:
        parts.append("<p>No loader of one run pairs with a loader of the other: nothing to compare.</p>")
    parts.append("<h2>Configuration</h2>")
    parts.append(_table(["loader", "setting", "before", "after"],
                        [[_e(r["loader"]), _e(r["setting"]), f"<code>{_e(setting_text(r['before'], r['before_set']))}</code>",
                          f"<code>{_e(setting_text(r['after'], r['after_set']))}</code>"] for r in comp["config"]],
                        "config-diff", row_classes=["changed" if r["changed"] else "" for r in comp["config"]]))
    parts.append("<h2>Verify after change</h2>")
    verification = comp["verification"]
    if verification and verification["results"]:
        parts.append(_table(["loader", "change", "applied", "verdict", "measured against predicted"],
                            [[_e(r["loader"]), f"<code>{_e(r['parameter'])}={_e(repr(r['suggested']))}</code>",
                              "yes" if r["applied"] else "no",
                              f"<span class='badge {_e(r['status'])}'>{_e(r['status'].replace('_', ' '))}</span>",
                              _e(interval_text(r))] for r in verification["results"]], "verify-table"))
        parts += [f"<p>{_e(n)}</p>" for n in joint_changes_note(verification)]
    elif verification:
        parts.append("<p>The configuration changed, but the before run had no recommendation to verify.</p>")
    else:
        parts.append("<p>The loader configurations are the same: nothing to verify.</p>")
    return "\n".join(parts)


def render_html(comp: dict, figures: list) -> str:
    """One file that opens offline: the tables, then the charts (plotly.js inlined once)."""
    import plotly.io as pio
    charts = "\n".join(pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False,
                                   config={"displaylogo": False}, div_id=f"chart-{i}")
                       for i, fig in enumerate(figures))
    title = _e(f"starvewatch: {comp['before']['id']} vs {comp['after']['id']}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{HTML_STYLE}</style></head><body><h1>starvewatch comparison</h1>{html_tables(comp)}"
            f"<h2>Charts</h2><div class='grid'>{charts}</div></body></html>")

