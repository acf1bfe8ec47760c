"""Run summaries as JSON, CSV, Markdown and one self-contained HTML file (opens offline)."""
from __future__ import annotations

import csv
import html
import io
import json

from .findings import finding_line, stall_where
from .diagnosis import joint_changes_note

CSV_COLUMNS = ("run", "rank", "loader", "epoch", "step", "start_ns", "wait_ms", "compute_ms", "other_ms",
               "gpu_idle_ms", "batch_size")


def to_json(summary: dict) -> str:
    return json.dumps(summary, indent=2, sort_keys=False, default=str) + "\n"


def _csv_row(run_id: str, s: dict) -> tuple:
    gpu = s.get("gpu_idle_ns")
    return (run_id, s["rank"], s["loader"], s["epoch"], s["step"], s["start_ns"],
            s["wait_ns"] / 1e6, s["compute_ns"] / 1e6, s["other_ns"] / 1e6,
            "" if gpu is None else gpu / 1e6, "" if s.get("batch_size") is None else s["batch_size"])


def write_csv(run_id: str, steps, out) -> int:
    """One row per recorded step; rows + dropped records = steps. Returns the row count."""
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    rows = 0
    for s in steps:
        writer.writerow(_csv_row(run_id, s))
        rows += 1
    return rows


def csv_chunks(run_id: str, row_batches):
    """The CSV export as UTF-8 chunks, one per batch of step rows (tuples of
    Store.STEP_ROW_COLUMNS), for a streamed response: memory stays flat whatever the run's length."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for rows in row_batches:
        writer.writerows((run_id, rank, loader, epoch, step, start, wait / 1e6, compute / 1e6, other / 1e6,
                          "" if gpu is None else gpu / 1e6, "" if size is None else size)
                         for rank, loader, epoch, step, start, wait, compute, other, size, gpu in rows)
        yield buffer.getvalue().encode()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue().encode()


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _num(x, digits=2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def snippet(config: dict | None, recs: list[dict], loader: str) -> str | None:
    """A copyable DataLoader(...) line with the recommendations applied: exactly the engine's
    applied configuration. A loader's own batching is kept (batch_size=None, a batch_sampler)."""
    from .diagnosis import applied_config, custom_batch_sampler
    changed = {r["parameter"]: r["suggested"] for r in recs if r["loader"] == loader and r["parameter"]
               in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size")}
    if not changed:
        return None
    kwargs = applied_config(config, recs, loader)
    shown = [f"{k}={v!r}" for k, v in kwargs.items()
             if k in changed or k == "batch_size" or (k == "persistent_workers" and v)]
    if custom_batch_sampler(config):
        shown.insert(0, f"batch_sampler=<your {(config or {}).get('batch_sampler')}>")
    wrapper = (config or {}).get("wrapper")  # a loader that is not a DataLoader (introspect.wrapped_loader)
    if wrapper == "torchdata.nodes":
        return f"ParallelMapper(source, map_fn, {', '.join(shown)})"
    return f"{'WebLoader' if wrapper == 'WebLoader' else 'DataLoader'}(dataset, {', '.join(shown)})"


def to_markdown(summary: dict) -> str:
    run, verdict = summary["run"], summary["verdict"]
    lines = [f"# starvewatch report: {run['name']}", "",
             f"- run `{run['id']}` on {run.get('host') or 'unknown host'}, {run.get('status')}, "
             f"started {run.get('started_at')}, ended {run.get('ended_at') or '—'}",
             f"- **input-bound: {verdict['input_bound']}**, input wait {_pct(verdict['input_wait_fraction'])}, "
             f"limiting factor: {verdict.get('limiting_factor') or 'n/a'}",
             f"- speedup at stake if the loop never waited: "
             f"{_num(verdict.get('speedup_at_stake'))}x; GPU idle (CUDA events): {_pct(verdict.get('gpu_idle_fraction'))}",
             "", "## Loaders", "",
             "| loader | steps | epochs | input wait | verdict | wait p50 / p95 / p99 (ms) | compute mean (ms) | batches/s | samples/s | dropped |",
             "|---|---:|---:|---:|---|---|---:|---:|---:|---:|"]
    for l in summary["loaders"]:
        w = l["wait_ms"]
        lines.append(f"| {l['name']} | {l['steps']} | {l['epochs']} | {_pct(l['input_wait_fraction'])} | {l['verdict']} | "
                     f"{_num(w['p50'])} / {_num(w['p95'])} / {_num(w['p99'])} | {_num(l['compute_ms']['mean'])} | "
                     f"{_num(l['batches_per_s'], 1)} | {_num(l['samples_per_s'], 1)} | {l['dropped_records']} |")
    lines += ["", "## Recommendations", ""]
    if not summary["recommendations"]:
        lines.append("None: this run is not starved for data.")
    for i, r in enumerate(summary["recommendations"], 1):
        what = f"`{r['parameter']}={r['suggested']!r}` (now `{r['current']!r}`)" if r["parameter"] else f"{r['suggested']}"
        gain = f", expected {r['expected_speedup']:.2f}x" if r.get("expected_speedup") else ""
        gain += " (measured by starvewatch tune)" if r.get("measured") else ""
        risk = f" Protects against: {r['risk']}." if r.get("kind") == "protective" and r.get("risk") else ""
        label = " (protective)" if r.get("kind") == "protective" else ""
        lines.append(f"{i}. **{r['loader']}**{label}: {what}{gain}. {r['reason']}.{risk}")
        lines.append(f"   Evidence: `{json.dumps(r['evidence'], default=str)}`")
    for l in summary["loaders"]:
        code = snippet(l.get("config"), summary["recommendations"], l["name"])
        if code:
            lines += ["", f"```python\n{l['name']}_loader = {code}\n```"]
    if summary.get("stalls"):
        lines += ["", "## Stalls", ""]
        for s in summary["stalls"]:
            lines.append(f"- {s['loader']}: waited {s['wait_s']:.1f} s for batch {s.get('step')} of epoch "
                         f"{s.get('epoch')} ({'ended' if s.get('ended_ns') else 'still going'})")
            where = stall_where(s)
            if where:
                lines.append(f"  - {where}")
            if s.get("stack"):
                lines += ["", "```text", s["stack"].strip(), "```", ""]
    if summary.get("findings"):
        lines += ["", "## Findings", ""]
        for f in summary["findings"]:
            lines.append(f"- **{f['loader']}** {finding_line(f)}")
            lines.append(f"  - Evidence: `{json.dumps(f.get('detail'), default=str)}`")
            lines.append(f"  - Fix: {f.get('fix')}")
    if summary.get("verification"):
        lines += ["", "## Verify after change", "", compare_table(None, summary, summary["verification"])]
    from .stragglers import markdown_lines
    lines += markdown_lines(summary.get("stragglers"))
    from .tuning import markdown as tuning_markdown
    lines += tuning_markdown(summary.get("tuning"))
    lines += ["", "## Loader configuration", ""]
    for l in summary["loaders"]:
        lines.append(f"- {l['name']}: `{json.dumps(l.get('config'), default=str)}`")
    return "\n".join(lines) + "\n"


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
        lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in compare_rows(before, after)]
    if verification:
        lines += ["", "| loader | change | applied | expected | measured (95% interval) | verdict |",
                  "|---|---|---|---:|---:|---|"]
        for r in verification["results"]:
            lines.append(f"| {r['loader']} | {r['parameter']}={r['suggested']!r} | {'yes' if r['applied'] else 'no'} | "
                         f"{_num(r.get('judged_against') or r['expected_speedup'])}x | {measured_with_interval(r)} | {r['status']} |")
        notes = joint_changes_note(verification)
        if notes:
            lines += [""] + notes
    return "\n".join(lines)


def _md_to_html(text: str) -> str:
    """Just enough Markdown for our own report (headings, lists, tables, code)."""
    out, in_table, in_code = [], False, False
    for line in text.splitlines():
        if line.startswith("```"):
            out.append("</pre>" if in_code else "<pre>")
            in_code = not in_code
            continue
        if in_code:
            out.append(html.escape(line))
            continue
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
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
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.startswith(("- ", "   ")) or line[:3].rstrip(".").isdigit():
            out.append(f"<p class='item'>{_inline(line)}</p>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    if in_table:
        out.append("</table>")
    return "\n".join(out)


def _inline(text: str) -> str:
    import re
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ddd;padding:4px 8px;font-size:14px}
code,pre{background:#f5f5f5;padding:2px 4px}pre{padding:8px}.item{margin:4px 0}"""


def render_html(summary: dict, step_series: dict[str, dict], series: dict, samples: list[dict]) -> str:
    import plotly.io as pio

    from . import figures

    figs = [figures.wait_fraction_over_time(series), figures.throughput_over_time(series)]
    for name, s in step_series.items():
        figs.append(figures.step_timeline(s, title=f"{name}: wait vs compute per step"))
        figs.append(figures.wait_histogram(s, title=f"{name}: wait per batch"))
    figs.append(figures.system_over_time(samples))
    charts = "\n".join(pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False,
                                   config={"displaylogo": False}, div_id=f"chart-{i}")
                       for i, fig in enumerate(figs))
    title = html.escape(f"starvewatch: {summary['run']['name']}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{STYLE}</style></head><body>{_md_to_html(to_markdown(summary))}"
            f"<h2>Charts</h2>{charts}</body></html>")


def export(source, run_id: str, fmt: str, out) -> int | None:
    """Write one run in `fmt` to a text stream; returns the CSV row count for csv."""
    if fmt == "csv":
        return write_csv(run_id, source.steps(run_id), out)
    summary = source.summary(run_id)
    if fmt == "json":
        out.write(to_json(summary))
    elif fmt == "md":
        out.write(to_markdown(summary))
    elif fmt == "html":
        steps = {l["name"]: source.step_series(run_id, l["name"]) for l in summary["loaders"]}
        out.write(render_html(summary, steps, source.series(run_id), source.samples(run_id)))
    else:
        raise ValueError(f"unknown format {fmt!r}: json, csv, md or html")
    return None


def export_text(source, run_id: str, fmt: str) -> str:
    buffer = io.StringIO()
    export(source, run_id, fmt, buffer)
    return buffer.getvalue()
