"""Run summaries as JSON, CSV, Markdown and one self-contained HTML file (opens offline)."""
from __future__ import annotations

import codecs
import csv
import html
import io
import json
import re

from ...analysis.findings import finding_line
from ...analysis.findings.stall_text import stall_where
from .markdown_sections import attribution_lines, live_tuning_lines, straggler_lines, tuning_lines
from .markdown_text import md_block, md_code, md_text, readable_time
from ...quantities import speedup_text
from ...analysis.diagnosis import joint_changes_note
from ...analysis.verification import change_label
from ...analysis.snippet import is_call, snippet  # noqa: F401  (the dashboard and reports import it from here)
from .verdict_box import VERDICT_BOX_STYLE, verdict_box

CSV_COLUMNS = ("run", "rank", "loader", "epoch", "step", "start_ns", "wait_ms", "compute_ms", "other_ms",
               "gpu_idle_ms", "batch_size", "kind", "bucket_s", "bucket_steps")
# kind: "step" (one recorded step), "bucket" (a rolled-up span's bucket of bucket_steps steps over
# bucket_s seconds: times are its totals, batch_size its samples) or "exemplar" (a slow step or
# one near a stall kept raw inside a rolled-up span, also counted in its bucket). See
# monitor/budget/retention.py.


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A text cell a spreadsheet will not run: one starting with = + - @ tab or CR gets a
    leading ' (OWASP's advice for CSV injection). Numbers are left as they are."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def to_json(summary: dict) -> str:
    return json.dumps(summary, indent=2, sort_keys=False, default=str) + "\n"


def csv_chunks(run_id: str, row_batches):
    """The CSV export as UTF-8 chunks, one per batch of step rows (tuples of
    Store.STEP_ROW_COLUMNS, optionally followed by kind, bucket_s, bucket_steps: see
    retention.export_rows), for a streamed response: memory stays flat whatever the run's length."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for rows in row_batches:
        shown_run = csv_cell(run_id)
        writer.writerows((shown_run, rank, csv_cell(loader), epoch, "" if step is None else step, start, wait / 1e6,
                          compute / 1e6, other / 1e6, "" if gpu is None else gpu / 1e6,
                          "" if size is None else size, *(_marks(extra)))
                         for rank, loader, epoch, step, start, wait, compute, other, size, gpu, *extra in rows)
        yield buffer.getvalue().encode()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue().encode()


def _marks(extra) -> tuple:
    kind, bucket_s, bucket_steps = extra if extra else ("step", None, None)
    return kind, "" if bucket_s is None else bucket_s, "" if bucket_steps is None else bucket_steps


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _num(x, digits=2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def to_markdown(summary: dict) -> str:
    from ...analysis.sentences import band_words, headline, limiting_phrase
    run, verdict = summary["run"], summary["verdict"]
    said = summary.get("answer") or {}
    lines = [f"# starvewatch report: {md_text(run['name'])}", "",
             f"- run {md_code(run['id'])} on {md_text(run.get('host') or 'unknown host')}, {run.get('status')}, "
             f"started {readable_time(run.get('started_at'))}, ended {readable_time(run.get('ended_at'))}",
             f"- **{md_text(said.get('headline') or headline(summary))}**"
             + (f"; the limit: {limiting_phrase(verdict['limiting_factor'])}"
                if verdict.get("limiting_factor") and verdict["input_bound"] != "insufficient_data" else ""),
             f"- GPU idle (CUDA events): {_pct(verdict.get('gpu_idle_fraction'))}"]
    if said.get("regression"):
        lines.append(f"- **{md_text(said['regression'])}**")
    lines += [f"- {md_text(line)}" for line in said.get("other_loaders") or []]
    lines += ["", "## Loaders", "",
             "| loader | steps | epochs | input wait | verdict | wait p50 / p95 / p99 (ms) | compute mean (ms) | batches/s | samples/s | dropped |",
             "|---|---:|---:|---:|---|---|---:|---:|---:|---:|"]
    for l in summary["loaders"]:
        w = l["wait_ms"]
        lines.append(f"| {md_text(l['name'])} | {l['steps']} | {l['epochs']} | {_pct(l['input_wait_fraction'])} | {band_words(l['verdict'])} | "
                     f"{_num(w['p50'])} / {_num(w['p95'])} / {_num(w['p99'])} | {_num(l['compute_ms']['mean'])} | "
                     f"{_num(l['batches_per_s'], 1)} | {_num(l['samples_per_s'], 1)} | {l['dropped_records']} |")
    lines += _recommendation_lines(summary, verdict, said)
    lines += attribution_lines(summary)
    lines += _stall_and_finding_lines(summary)
    if summary.get("verification"):
        lines += ["", "## Verify after change", "", compare_table(None, summary, summary["verification"])]
    lines += straggler_lines(summary.get("stragglers"))
    lines += tuning_lines(summary.get("tuning"))
    lines += live_tuning_lines(summary.get("live_tuning"))
    if summary.get("rolled_up") or summary.get("samples_rolled_up"):
        lines += ["", "## Rolled-up spans", "",
                  "Past the storage budget, the oldest step records were folded into rollups: totals, "
                  "percentiles and the verdict are unchanged; before these times each rank's steps are "
                  "kept as buckets, not rows.", ""]
        lines += [f"- rank {r['rank']}: {r['steps']} steps before {r['until']}" for r in summary.get("rolled_up") or ()]
    if summary.get("samples_rolled_up"):
        lines += ["", "Host, GPU and worker samples folded into per-bucket minima, means and maxima (the "
                  "system figures and findings are unchanged):", ""]
        lines += [f"- rank {r['rank']}: {r['events']} samples before {r['until']}"
                  for r in summary["samples_rolled_up"]]
    lines += ["", "## Loader configuration", ""]
    lines += config_table_lines(summary)
    return "\n".join(lines) + "\n"


def _recommendation_lines(summary: dict, verdict: dict, said: dict) -> list[str]:
    """The report's recommendations with their evidence and each loader's line to copy, or why
    none is made."""
    lines: list[str] = []
    lines += ["", "## Recommendations", ""]
    if not summary["recommendations"]:
        # "Not starved" only where the band says so; a waiting run says why nothing is advised.
        band = verdict["input_bound"]
        lines.append(md_text(summary.get("no_recommendation_reason")) if summary.get("no_recommendation_reason") else
                     "None: this run is not starved for data." if band == "not" else
                     "None yet: " + md_text(said.get("needs_more") or "not enough data to judge") + "."
                     if band == "insufficient_data" else "None: no DataLoader setting is predicted to help.")
    elif summary.get("no_recommendation_reason"):
        lines += [md_text(summary["no_recommendation_reason"]), ""]
    for i, r in enumerate(summary["recommendations"], 1):
        what = f"`{change_label(r)}` (now `{r['current']!r}`)" if r["parameter"] else f"{r['suggested']}"
        gain = f", expected {speedup_text(r)}" if r.get("expected_speedup") else ""
        gain += " (measured by starvewatch tune)" if r.get("measured") else ""
        risk = f" Protects against: {r['risk']}." if r.get("kind") == "protective" and r.get("risk") else ""
        label = " (protective)" if r.get("kind") == "protective" else ""
        lines.append(f"{i}. **{md_text(r['loader'])}**{label}: {what}{gain}. {r['reason']}.{risk}")
        lines.append(f"   Evidence: {quantities_text(r.get('evidence'))}")
    for l in summary["loaders"]:
        code = snippet(l.get("config"), summary["recommendations"], l["name"])
        if code:
            lines += ["", *md_block(f"{l['name']}_loader = {code}" if is_call(code) else
                                    f"# {l['name']}: set in your own {(l.get('config') or {}).get('wrapper') or 'DataLoader'}(...) call\n{code}",
                                    "python")]
    return lines


def _stall_and_finding_lines(summary: dict) -> list[str]:
    """The stalls (with where the stalled batch is) and the findings no step timing shows."""
    lines: list[str] = []
    if summary.get("stalls"):
        lines += ["", "## Stalls", ""]
        for s in summary["stalls"]:
            lines.append(f"- {md_text(s['loader'])}: waited {s['wait_s']:.1f} s for batch {s.get('step')} of epoch "
                         f"{s.get('epoch')} ({'ended' if s.get('ended_ns') else 'still going'})")
            where = stall_where(s)
            if where:
                lines.append(f"  - {md_text(where)}")
            if s.get("stack"):
                lines += ["", *md_block(s["stack"].strip()), ""]
    if summary.get("findings"):
        lines += ["", "## Findings", ""]
        for f in summary["findings"]:
            lines.append(f"- **{md_text(f['loader'])}** {finding_line(f)}")
            lines.append(f"  - Evidence: {quantities_text(f.get('detail'))}")
            lines.append(f"  - Fix: {f.get('fix')}")
    return lines


def quantities_text(named: dict | None) -> str:
    """Named quantities as the dashboard reads them: 'load per batch 26.7 ms; cores 2'."""
    from ...quantities import rows
    return "; ".join(f"{label} {value}" for label, value in rows(named)) or "none recorded"


def _config_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").replace("`", "'")


def config_table_lines(summary: dict) -> list[str]:
    """Per loader, its settings as a table; a setting a recommendation changes is in bold with
    the value to set (the dashboard's configuration table, in Markdown)."""
    from ...quantities import value
    recs = summary.get("recommendations") or []
    lines = []
    for l in summary["loaders"]:
        config = l.get("config") or {}
        changes = {r["parameter"]: r for r in recs if r["loader"] == l["name"] and r.get("parameter")}
        lines.append(f"### {md_text(l['name'])}")
        if not config and not changes:
            lines += ["", "No configuration recorded (not a torch DataLoader).", ""]
            continue
        lines += ["", "| setting | now | recommended |", "|---|---|---|"]
        for key in list(config) + [k for k in changes if k not in config]:
            x = config.get(key)
            now = "(default)" if key not in config else value("", x) if isinstance(x, (dict, list, tuple)) else repr(x)
            rec = changes.get(key)
            if rec is None:
                lines.append(f"| {md_text(key)} | `{_config_cell(now)}` | |")
                continue
            gain = " (protective)" if rec.get("kind") == "protective" else \
                f" (expected {speedup_text(rec)})" if rec.get("expected_speedup") else ""
            lines.append(f"| **{md_text(key)}** | `{_config_cell(now)}` | **→ `{_config_cell(repr(rec['suggested']))}`**{gain} |")
        lines.append("")
    return lines


def compare_rows(before: dict, after: dict) -> list[tuple]:
    rows = []
    old = {l["name"]: l for l in before["loaders"]}
    for l in after["loaders"]:
        o = old.get(l["name"])
        if o is None:
            continue
        for label, key, fmt in (("input wait", "input_wait_fraction", _pct),
                                ("batches/s", "batches_per_s", lambda v: _num(v, 1)),
                                ("wait p95 ms", None, None)):
            if key is None:
                a, b = o["wait_ms"]["p95"], l["wait_ms"]["p95"]
                fmt = _num
            else:
                a, b = o[key], l[key]
            ratio = f"{b / a:.2f}x" if a and b is not None else "n/a"
            rows.append((l["name"], label, fmt(a), fmt(b), ratio))
    return rows


def _expected_text(r: dict) -> str:
    """The prediction a verify result is judged against; none for a live tuning's own change."""
    expected = r.get("judged_against") or r.get("expected_speedup")
    return f"{_num(expected)}x" if expected else "none"


def measured_with_interval(r: dict) -> str:
    """'2.05x [1.90, 2.21] samples/s' -- the verdict's interval and basis, where known."""
    if r.get("measured_speedup") is None:
        return "n/a"
    interval = r.get("interval")
    shown = f"{r['measured_speedup']:.2f}x"
    if interval:
        shown += f" [{interval[0]:.2f}, {interval[1]:.2f}]"
    return shown + (f" {r['basis']}" if r.get("basis") else "")


def compare_table(before: dict | None, after: dict, verification: dict | None) -> str:
    lines = []
    if before is not None:
        lines += ["| loader | metric | before | after | after/before |", "|---|---|---:|---:|---:|"]
        lines += [f"| {md_text(a)} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in compare_rows(before, after)]
    if verification:
        lines += ["", "| loader | change | applied | expected | measured (95% interval) | verdict |",
                  "|---|---|---|---:|---:|---|"]
        for r in verification["results"]:
            lines.append(f"| {md_text(r['loader'])} | {change_label(r)} | {'yes' if r['applied'] else 'no'} | "
                         f"{_expected_text(r)} | {measured_with_interval(r)} | {r['status']} |")
        notes = joint_changes_note(verification)
        if notes:
            lines += [""] + notes
    return "\n".join(lines)


def _md_to_html(text: str) -> str:
    """Just enough Markdown for our own report (headings, lists, tables, code). Lists become
    real lists ("- " and "1. " items, "  - " sub-items, an indented line continues its item):
    no literal "- " in the page."""
    out, in_table, fence, lists = [], False, "", []  # lists: the open list tags, outermost first

    def close_lists(depth: int = 0) -> None:
        while len(lists) > depth:
            out.append(f"</li></{lists.pop()}>")

    for line in text.splitlines():
        opening = re.match(r"^`{3,}", line)
        if (not fence and opening) or (fence and line == fence):
            if not fence:
                close_lists()
            out.append("</pre>" if fence else "<pre>")
            fence = "" if fence else opening.group(0)
            continue
        if fence:
            out.append(html.escape(line))
            continue
        if line.startswith("|"):
            close_lists()
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().removeprefix("|").removesuffix("|"))]
            if all(set(c) <= set("-:") for c in cells):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        item = re.match(r"^( *)(- |\d+\. )(.*)$", line)
        if item:
            depth = 1 + len(item.group(1)) // 2
            kind = "ul" if item.group(2) == "- " else "ol"
            close_lists(depth)
            if len(lists) == depth:  # the next item of the open list
                out.append("</li><li>")
            else:
                while len(lists) < depth:
                    lists.append(kind)
                    out.append(f"<{kind}><li>")
            out.append(_inline(item.group(3)))
        elif lists and line.startswith("  ") and line.strip():  # continues the item above
            out.append(f"<div class='more'>{_inline(line.strip())}</div>")
        elif line.startswith("#"):
            close_lists()
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.strip():
            close_lists()
            out.append(f"<p>{_inline(line)}</p>")
    close_lists()
    if in_table:
        out.append("</table>")
    return "\n".join(out)


def _inline(text: str) -> str:
    """Code spans (any backtick fence), backslash escapes and **bold**; everything else as text."""
    held: list[str] = []

    def hold(markup: str) -> str:
        held.append(markup)
        return f"\0{len(held) - 1}\0"

    text = re.sub(r"(`+) ?(.+?) ?\1(?!`)", lambda m: hold(f"<code>{html.escape(m.group(2))}</code>"), text)
    text = re.sub(r"\\([!-/:-@\[-`{-~])", lambda m: hold(html.escape(m.group(1))), text)
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub("\0(\\d+)\0", lambda m: held[int(m.group(1))], text)


STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ddd;padding:4px 8px;font-size:14px}
code,pre{background:#f5f5f5;padding:2px 4px}pre{padding:8px}li{margin:4px 0}.more{color:#444}
""" + VERDICT_BOX_STYLE


def report_figures(step_series: dict[str, dict], series: dict, samples: list[dict],
                   distributions: dict[str, dict] | None = None, attributed: list[dict] | None = None) -> list:
    """The HTML report's charts. Each loader's wait histogram is drawn from its mergeable
    histograms (Query.distributions, the ones the summary's percentiles use, kept when a run's
    rows are folded): every step's wait, the same before and after a fold. Never from bucket
    means, which hide a 500 ms spike among 10 ms steps."""
    from . import figures

    figs = [figures.wait_fraction_over_time(series), figures.throughput_over_time(series)]
    for name, s in step_series.items():
        figs.append(figures.step_timeline(s, title=f"{name}: wait vs compute per step"))
        dist = (distributions or {}).get(name) or {}
        figs.append(figures.distribution_histogram(dist.get("wait") or {}, f"{name}: wait per batch"))
    figs += [figures.wait_attribution(l) for l in attributed or ()]
    figs.append(figures.system_over_time(samples))
    return figs


def render_html(summary: dict, step_series: dict[str, dict], series: dict, samples: list[dict],
                distributions: dict[str, dict] | None = None) -> str:
    """`distributions`: per loader, its Query.distributions answer (the wait histograms)."""
    import plotly.io as pio

    figs = report_figures(step_series, series, samples, distributions,
                          [l for l in summary["loaders"] if l.get("attribution")])
    charts = "\n".join(pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False,
                                   config={"displaylogo": False}, div_id=f"chart-{i}")
                       for i, fig in enumerate(figs))
    title = html.escape(f"starvewatch: {summary['run']['name']}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{STYLE}</style></head><body>{_with_verdict_box(_md_to_html(to_markdown(summary)), summary)}"
            f"<h2>Charts</h2>{charts}</body></html>")


def _with_verdict_box(body: str, summary: dict) -> str:
    """The report's title, then the verdict box (as the dashboard's run page opens), then the rest."""
    title, sep, rest = body.partition("</h1>")
    return f"{title}{sep}{verdict_box(summary)}{rest}" if sep else verdict_box(summary) + body


def write_csv_chunks(chunks, out) -> int:
    """Write the CSV export's UTF-8 chunks (csv_chunks, from this process or a collector) to a
    text stream; returns the data rows written, counted by a CSV reader (a quoted cell may hold
    a line break)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = [""]  # the text after the last line break, until its line is complete

    def lines():
        for chunk in chunks:
            text = decoder.decode(chunk)
            out.write(text)
            parts = (pending[0] + text).split("\n")
            pending[0] = parts.pop()
            yield from (part + "\n" for part in parts)
        rest = decoder.decode(b"", final=True)
        out.write(rest)
        if pending[0] + rest:
            yield pending[0] + rest

    return max(0, sum(1 for _ in csv.reader(lines())) - 1)  # less the header


def export(source, run_id: str, fmt: str, out) -> int | None:
    """Write one run in `fmt` to a text stream; returns the CSV row count for csv. The CSV is
    the collector's own (`source.csv_chunks`: its API's bytes, or the same function here
    offline), rolled-up spans as marked buckets."""
    if fmt == "csv":
        return write_csv_chunks(source.csv_chunks(run_id), out)
    summary = source.summary(run_id)
    if fmt == "json":
        out.write(to_json(summary))
    elif fmt == "md":
        out.write(to_markdown(summary))
    elif fmt == "html":
        steps = {l["name"]: source.step_series(run_id, l["name"]) for l in summary["loaders"]}
        dists = {l["name"]: source.distributions(run_id, l["name"]) for l in summary["loaders"]}
        out.write(render_html(summary, steps, source.series(run_id), source.samples(run_id), dists))
    else:
        raise ValueError(f"unknown format {fmt!r}: json, csv, md or html")
    return None


def export_text(source, run_id: str, fmt: str) -> str:
    buffer = io.StringIO()
    export(source, run_id, fmt, buffer)
    return buffer.getvalue()
