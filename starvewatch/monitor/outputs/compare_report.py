"""Two runs compared, as documents: Markdown, JSON and one self-contained HTML file (plotly.js
inlined once), for `starvewatch compare`. The comparison itself is analysis/compare.py."""
from __future__ import annotations

import html
import json

from ...analysis.compare import change_text, interval_text, setting_text, value_text
from ...analysis.host_moves import verification_note
from ...analysis.verification import change_label, joint_changes_note
from .markdown_text import readable_time


# ---- Markdown and JSON -------------------------------------------------------------------------------

def _cell(text) -> str:
    """A Markdown table cell: names are free text; a pipe or a newline would break the table."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("`", "'")


def to_markdown(comp: dict) -> str:
    b, a = comp["before"], comp["after"]
    lines = ["# starvewatch comparison", "",
             f"- before: `{_cell(b['id'])}` ({_cell(b['name'])}, started {readable_time(b.get('started_at'))}, "
             f"input wait {value_text(b['input_wait_fraction'], 'fraction')})",
             f"- after: `{_cell(a['id'])}` ({_cell(a['name'])}, started {readable_time(a.get('started_at'))}, "
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
            lines.append(f"| {_cell(r['loader'])} | `{_cell(change_label(r))}` | "
                         f"{'yes' if r['applied'] else 'no'} | {r['status'].replace('_', ' ')} | "
                         f"{interval_text(r)} |")
        notes = joint_changes_note(verification) + [n for n in [verification_note(verification)] if n]
        if notes:
            lines += [""] + notes
    elif verification:
        lines.append("The configuration changed, but the before run had no recommendation to verify.")
    else:
        lines.append("The loader configurations are the same: nothing to verify.")
    if comp.get("advice_moved"):
        lines += ["", "## Advice", "", comp["advice_moved"]["sentence"]]
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
                            [[_e(r["loader"]), f"<code>{_e(change_label(r))}</code>",
                              "yes" if r["applied"] else "no",
                              f"<span class='badge {_e(r['status'])}'>{_e(r['status'].replace('_', ' '))}</span>",
                              _e(interval_text(r))] for r in verification["results"]], "verify-table"))
        parts += [f"<p>{_e(n)}</p>" for n in joint_changes_note(verification)
                  + [n for n in [verification_note(verification)] if n]]
    elif verification:
        parts.append("<p>The configuration changed, but the before run had no recommendation to verify.</p>")
    else:
        parts.append("<p>The loader configurations are the same: nothing to verify.</p>")
    if comp.get("advice_moved"):
        parts += ["<h2>Advice</h2>", f"<p class='advice-moved'>{_e(comp['advice_moved']['sentence'])}</p>"]
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

