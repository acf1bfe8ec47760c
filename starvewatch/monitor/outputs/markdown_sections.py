"""Report sections of the Markdown export (and the HTML report drawn from it) for parts of a
summary that have their own shape: the stragglers across ranks, and stored `starvewatch tune`
results. Every stored name goes through markdown_text, never into the document as markup."""
from __future__ import annotations

from .markdown_text import md_block, md_text


def straggler_lines(result: dict | None) -> list[str]:
    """The report's "Stragglers" section (none for a single-rank run)."""
    if not result:
        return []
    lines = ["", "## Stragglers", "",
             f"Ranks compared per window of {result['rule']['window_steps']} aligned steps ({result['windows']} "
             f"windows): excess over the median rank of {100 * result['rule']['warning_fraction']:.0f}% of the step "
             f"time is a warning, {100 * result['rule']['critical_fraction']:.0f}% critical.", ""]
    if not result["stragglers"]:
        lines.append("No straggler: the ranks wait and compute alike.")
    for s in result["stragglers"]:
        cause = (s.get("cause") or {}).get("text") or ""
        lines.append(f"- **rank {s['rank']}**, {md_text(s['loader'])}: {s['severity']} {s['kind']} straggler, "
                     f"+{s['excess_ms']:.1f} ms of a {s['step_ms']:.1f} ms step "
                     f"({100 * s['excess_fraction']:.0f}%). {cause}")
    return lines


def attribution_lines(summary: dict) -> list[str]:
    """'Where the waits came from': per loader with an attribution, its shares per stage and
    per worker (analysis/wait_attribution.py; docs/what-it-measures.md defines the stages)."""
    from ...analysis.wait_attribution import STAGE_TEXT
    from .markdown_text import md_text
    loaders = [l for l in summary.get("loaders") or () if l.get("attribution")]
    if not loaders:
        return []
    lines = ["", "## Where the waits came from", ""]
    for l in loaders:
        a = l["attribution"]
        coverage = f", {a['coverage'] * 100:.0f}% of its wait" if a.get("coverage") is not None else ""
        lines += [f"**{md_text(l['name'])}** ({a['steps']} steps attributed{coverage}):", "",
                  "| stage | share of the wait | ms |", "|---|---:|---:|"]
        lines += [f"| {stage} ({STAGE_TEXT.get(stage, stage)}) | {v['share'] * 100:.1f}% | {v['ms']:.1f} |"
                  for stage, v in a["stages"].items() if v["ms"] > 0]
        lines += ["", "| worker | share of the wait | head-of-line ms | batches | ms per batch |",
                  "|---|---:|---:|---:|---:|"]
        for w in a["workers"]:
            n = w["worker"]
            batches = a["worker_batches"][n] if n < len(a["worker_batches"]) else 0
            per = a["worker_batch_ms"][n] if n < len(a["worker_batch_ms"]) else None
            lines.append(f"| {n} | {w['share'] * 100:.1f}% | {w['head_of_line_ms']:.1f} | {batches} | "
                         f"{_fmt(per)} |")
        lines.append(f"| main process (hand-over) | {a['main_process_share'] * 100:.1f}% | | | |")
        if a.get("handover_send_share"):
            lines.append(f"| of it, still in the worker (pickling, sending) | {a['handover_send_share'] * 100:.1f}% | | | |")
        lines.append("")
    return lines


def tuning_lines(tuning: dict | None) -> list[str]:
    """The report section for stored tuning results (Markdown lines; empty when none)."""
    if not tuning:
        return []
    lines = ["", "## Measured tuning (`starvewatch tune`)", "",
             f"{len(tuning.get('trials') or [])} trials in {tuning.get('elapsed_s') or 0:.1f} s of a "
             f"{md_text(tuning.get('budget_s'))} s budget on {md_text(tuning.get('host') or 'unknown host')} "
             f"({md_text(tuning.get('cores'))} cores), {md_text(tuning.get('created_at'))}.", "",
             "| configuration | batches/s | samples/s | worker memory | CPU % | status |",
             "|---|---:|---:|---:|---:|---|"]
    answer = tuning.get("answer") or {}
    for t in tuning.get("trials") or []:
        label = t.get("label") or ", ".join(f"{k}={v!r}" for k, v in t["config"].items())
        mark = " (answer)" if answer and t["config"] == answer.get("config") else ""
        mem = f"{t['worker_uss_bytes'] / 2**20:.0f} MiB" if t.get("worker_uss_bytes") else "n/a"
        status = t["status"] + (f": {t['reason']}" if t.get("reason") else "")
        lines.append(f"| {md_text(label)}{mark} | {_fmt(t.get('batches_per_s'))} | {_fmt(t.get('samples_per_s'))} | "
                     f"{mem} | {_fmt(t.get('cpu_pct'), 0)} | {md_text(status)} |")
    if answer:
        lines += ["", f"Answer: {md_text(answer.get('rule'))}.", "", *md_block(str(answer.get('snippet')), "python")]
    return lines


def live_tuning_lines(live: dict | None) -> list[str]:
    """The report section for live tuning (watch(tune=True)): one row per window, then each
    loader's start -> final, its measured gain and the line to copy (empty when not tuned)."""
    if not live:
        return []
    from ...analysis.live_tuning import outcome_text
    lines = ["", "## Live tuning (`watch(loader, tune=True)`)", "",
             "| loader | window | num_workers | prefetch_factor | persistent | samples/s | speed-up [interval] | decision |",
             "|---|---:|---:|---:|---|---:|---|---|"]
    for r in live.get("records") or []:
        c, fig, iv = r.get("config") or {}, r.get("figures") or {}, r.get("interval")
        rate = fig.get("samples_per_s", fig.get("batches_per_s"))
        shown = f"{iv['speedup']:.2f}x [{iv['low']:.2f}, {iv['high']:.2f}]" if iv else ""
        lines.append(f"| {md_text(r.get('loader'))} | {md_text(r.get('window'))} | {md_text(c.get('num_workers'))} | "
                     f"{md_text(c.get('prefetch_factor'))} | {md_text(c.get('persistent_workers'))} | {_fmt(rate)} | "
                     f"{shown} | {md_text(r.get('decision'))} |")
    for out in live.get("loaders") or []:
        lines += ["", md_text(outcome_text(out)) + "."]
        if out.get("line"):
            lines += ["", *md_block(str(out["line"]), "python")]
    return lines


def _fmt(x, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"
