"""The top of the run page: the answer first (verdict in one sentence, the change to make with its
expected speed-up, the DataLoader line to copy, the evidence), then protective advice and findings
in their own labelled places. Pure functions: summary in, components out."""
from __future__ import annotations

import re

from dash import dcc, html

from ..monitor.outputs.export import snippet
from .. import quantities
from ..quantities import speedup_text

# What the answer says (the sentence, the change, which advice is a speed-up) is shared with the
# HTML report's verdict box: analysis/answer_text.py.
from ..analysis.answer_text import (FACTORS, change_text, kind, protective, speedups,  # noqa: F401,E402
                                    verdict_sentence)


def quantity_table(quantities_dict: dict | None, table_id: str | None = None) -> html.Table | None:
    rows = quantities.rows(quantities_dict)
    if not rows:
        return None
    extra = {"id": table_id} if table_id else {}
    return html.Table(html.Tbody([html.Tr([html.Th(k), html.Td(v)]) for k, v in rows]),
                      className="sw-table sw-kv", **extra)


def dom_id(prefix: str, name: str) -> str:
    """An element id from a free-text name: Dash refuses ids with dots and selectors break on
    others, so anything outside [A-Za-z0-9_-] is spelled as _<hex> (still one id per name)."""
    return prefix + re.sub(r"[^A-Za-z0-9_-]", lambda m: f"_{ord(m.group()):x}", str(name))


def copyable(code: str, code_id: str) -> html.Div:
    return html.Div([html.Pre(code, className="sw-code", id=code_id),
                     dcc.Clipboard(target_id=code_id, title="copy", id=f"copy-{code_id}", className="sw-copy")],
                    className="sw-copyable")


def answer(summary: dict) -> html.Div:
    """Verdict, the top change with its speed-up, the line to copy, and why."""
    said = summary.get("answer") or {}
    parts = [html.P(verdict_sentence(summary), className="sw-verdict", id="verdict-sentence")]
    if summary.get("regression"):  # a slower run is never shown as a success alone
        parts.append(html.P(summary["regression"]["sentence"], className="sw-regression", id="regression"))
    if said.get("other_loaders"):
        parts.append(html.Ul([html.Li(line) for line in said["other_loaders"]], id="other-loaders"))
    recs = speedups(summary)
    if not recs:
        band = summary["verdict"]["input_bound"]
        if band == "insufficient_data":
            note = "No change to recommend yet: " + (said.get("needs_more") or "not enough data to judge") + "."
        elif band == "not":
            note = "No change to recommend: the loop is not waiting for data."
        else:
            note = summary.get("no_recommendation_reason") or \
                "No change to recommend: no DataLoader setting is expected to remove the wait that is left."
            if protective(summary) or summary.get("findings") or summary.get("stalls"):
                note += " See the protective advice and findings below."
        parts.append(html.P(note, id="no-recommendation"))
        return html.Div(parts, id="answer", className="sw-card sw-answer")
    top = recs[0]
    gain = top.get("expected_speedup")
    headline = [html.Span("Change ", className="sw-muted"), html.Strong(change_text(top)),
                html.Span(f" on loader {top['loader']}", className="sw-muted")]
    if gain:
        headline.append(html.Span(f"expected {speedup_text(top).replace('x', 'x faster', 1)}"
                                  + (" (measured)" if top.get("measured") else ""),
                                  className="sw-gain", id="top-speedup"))
    parts += [html.H3(headline, id="top-change"), html.P(top.get("reason"), className="sw-reason")]
    config = next((l.get("config") for l in summary["loaders"] if l["name"] == top["loader"]), None)
    code = snippet(config, summary.get("recommendations") or [], top["loader"])
    if code:
        parts.append(copyable(code, dom_id("snippet-", top["loader"])))
    evidence = quantity_table(top.get("evidence"), "evidence-table")
    if evidence is not None:  # behind a toggle: the charts stay near the top of the page
        count = len(quantities.rows(top.get("evidence")))
        parts.append(html.Details([html.Summary(f"Evidence: the {count} quantities this advice rests on"),
                                   evidence], id="evidence", className="sw-details"))
    more = [html.Li([html.Strong(f"{r['loader']}: {change_text(r)}"),
                     f" — expected {speedup_text(r)}" if r.get("expected_speedup") else "",
                     html.Div(r.get("reason"), className="sw-reason")]) for r in recs[1:]]
    if more:
        parts += [html.H4("Also worth changing"), html.Ul(more, id="more-recommendations")]
    for loader in summary["loaders"]:  # the other loaders' lines, each with its changes
        other = snippet(loader.get("config"), summary.get("recommendations") or [], loader["name"]) \
            if loader["name"] != top["loader"] else None
        if other:
            parts += [html.Div(f"{loader['name']} loader:", className="sw-muted"),
                      copyable(other, dom_id("snippet-", loader["name"]))]
    return html.Div(parts, id="answer", className="sw-card sw-answer")


def protective_card(summary: dict) -> html.Div | None:
    recs = protective(summary)
    if not recs:
        return None
    items = []
    for r in recs:
        items.append(html.Div([
            html.H4(f"{r['loader']}: {change_text(r)}"),
            html.P(r.get("risk") or r.get("reason"), className="sw-risk"),
            html.P(r.get("reason"), className="sw-reason") if r.get("risk") else None,
            quantity_table(r.get("evidence"))], className="sw-rec"))
    return html.Div([html.H3("Protective advice (no speed-up: removes a risk)"), *items],
                    id="protective", className="sw-card sw-protective")


def _stall(s: dict, i: int) -> html.Div:
    where = [f"worker {s['worker']}" if s.get("worker") is not None else None,
             f"pid {s['worker_pid']}" if s.get("worker_pid") else None,
             f"state {s['worker_state']}" if s.get("worker_state") else None,
             {"next": "fetching the next batch", "iter": "starting the iterator"}.get(s.get("phase"))]
    where = [w for w in where if w]
    ongoing = not s.get("ended_ns")
    title = (f"{s.get('loader')}: {'waiting' if ongoing else 'waited'} {s.get('wait_s', 0):.1f} s "
             f"for batch {s.get('step')}" + (f" ({', '.join(where)})" if where else ""))
    parts = [html.H4([html.Span("ongoing" if ongoing else "ended", className=f"badge badge-{'stalled' if ongoing else 'finished'}"),
                      " ", title])]
    if s.get("indices"):
        shown = ", ".join(str(x) for x in s["indices"][:32]) + (" …" if len(s["indices"]) > 32 else "")
        parts.append(html.P(f"dataset indices of that batch: {shown}", className="sw-indices"))
    if s.get("workers"):
        parts.append(html.P("workers then: " + ", ".join(f"{w.get('id')}: {w.get('state')}" for w in s["workers"])))
    if s.get("stack"):
        parts.append(html.Details([html.Summary("Python stacks of the stuck process"),
                                   html.Pre(s["stack"], className="sw-code sw-stack")], id=f"stall-stack-{i}"))
    return html.Div(parts, className="sw-stall")


def findings_card(summary: dict) -> html.Div | None:
    stalls = summary.get("stalls") or []
    findings = summary.get("findings") or []
    if not stalls and not findings:
        return None
    parts = [html.H3("Findings")]
    if stalls:
        parts += [html.H4(f"Stalls ({len(stalls)})"),
                  html.Div([_stall(s, i) for i, s in enumerate(stalls)], id="stalls")]
    for i, f in enumerate(findings):
        severity = f.get("severity") or "warning"
        parts.append(html.Div([
            html.H4([html.Span(severity, className=f"badge badge-{'high' if severity == 'critical' else 'moderate'}"),
                     " ", f.get("title") or (f.get("kind") or "finding").replace("_", " ")]),
            html.Div(f"loader {f['loader']}" if f.get("loader") else None, className="sw-muted"),
            quantity_table(f.get("detail")),
            copyable(f["fix"], f"finding-fix-{i}") if f.get("fix") else None],
            className=f"sw-finding sw-finding-{f.get('kind')}", id=f"finding-{i}"))
    return html.Div(parts, id="findings", className="sw-card")


def _config_value(x) -> str:
    if isinstance(x, (dict, list, tuple)):
        return quantities.value("", x)
    return repr(x)


def config_table(summary: dict) -> html.Div:
    """Per loader: the settings a recommendation changes, always shown (now → recommended), and
    the full configuration behind a toggle, those rows highlighted in it too."""
    recs = summary.get("recommendations") or []
    parts = []
    for loader in summary["loaders"]:
        config = loader.get("config") or {}
        changes = {r["parameter"]: r for r in recs if r["loader"] == loader["name"] and r.get("parameter")}
        keys = list(config) + [k for k in changes if k not in config]

        def now(key):
            return html.Code(_config_value(config.get(key)) if key in config else "(default)")

        changed = [html.Tr([html.Th(key), html.Td(now(key)), html.Td(_suggested(changes[key]))],
                           className="sw-changed") for key in keys if key in changes]
        rows = [html.Tr([html.Th(key), html.Td(now(key))], className="sw-changed" if key in changes else None)
                for key in keys]
        parts.append(html.H4(loader["name"]))
        if changed:
            parts.append(html.Table([html.Thead(html.Tr([html.Th("setting"), html.Th("now"), html.Th("recommended")])),
                                     html.Tbody(changed)], className="sw-table sw-kv",
                                    id=dom_id("config-changes-", loader["name"])))
        else:
            parts.append(html.P("no change recommended", className="sw-muted"))
        if not rows:
            parts.append(html.P("no configuration recorded (not a torch DataLoader)", className="sw-muted"))
            continue
        parts.append(html.Details([
            html.Summary(f"Full configuration ({len(rows)} settings)"),
            html.Table([html.Thead(html.Tr([html.Th("setting"), html.Th("now")])), html.Tbody(rows)],
                       className="sw-table sw-kv", id=dom_id("config-", loader["name"]))],
            className="sw-details", id=dom_id("config-details-", loader["name"])))
    return html.Div(parts, id="config-table")


def _suggested(rec: dict) -> list:
    return ["→ ", html.Code(repr(rec["suggested"])),
            html.Span(" protective" if kind(rec) == "protective" else
                      (f" {speedup_text(rec)}" if rec.get("expected_speedup") else ""), className="sw-muted")]
