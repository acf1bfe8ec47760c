"""The compact end-of-run report, like a test runner's final lines."""
from __future__ import annotations


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def format_report(summary: dict, dashboard_url: str | None = None, spool_dir: str | None = None,
                  compare_url: str | None = None) -> str:
    from ..analysis.sentences import band_words, headline, limiting_phrase
    verdict = summary["verdict"]
    run = summary["run"]
    said = summary.get("answer") or {}
    lines = [f"starvewatch: run {run['name']} ({run['id']}) — {said.get('headline') or headline(summary)}"]
    if verdict.get("limiting_factor") and verdict["input_bound"] != "insufficient_data":
        lines.append(f"  the limit: {limiting_phrase(verdict['limiting_factor'])}")
    if said.get("regression"):  # never a green verdict alone on a slower run
        lines.append(f"  !! {said['regression']}")
    for loader in summary["loaders"]:
        rate = f"{loader['batches_per_s']:.1f} batches/s" if loader.get("batches_per_s") else ""
        lines.append(f"  {loader['name']:<10} {loader['steps']:>8} steps  wait {_pct(loader['input_wait_fraction']):>6}"
                     f"  {band_words(loader['verdict']):<20} {rate}")
    if summary.get("live_tuning"):  # watch(tune=True): what it found, and the line to copy
        from ..analysis.live_tuning import outcome_text
        for outcome in summary["live_tuning"]["loaders"]:
            lines.append(f"  ~> {outcome_text(outcome)}")
            if outcome.get("line"):
                lines.append(f"     {outcome['line']}")
    for rec in summary.get("recommendations", [])[:3]:
        lines.append(f"  -> {recommendation_line(rec)}")
    if summary.get("no_recommendation_reason"):
        lines.append(f"  -- {summary['no_recommendation_reason']}")
    from ..analysis.findings import finding_line
    from ..analysis.findings.stall_text import stall_where
    for stall in summary.get("stalls", [])[:3]:
        where = stall_where(stall)
        lines.append(f"  !! stall on {stall.get('loader')}: waited {stall.get('wait_s', 0):.1f} s for batch "
                     f"{stall.get('step')} of epoch {stall.get('epoch')}"
                     + (f": {where}" if where else ""))
    for finding in summary.get("findings", [])[:3]:
        lines.append(f"  !! {finding.get('loader')}: {finding_line(finding)}")
    if dashboard_url:
        lines.append(f"  full report: {dashboard_url}")
    if compare_url:
        lines.append(f"  compare with the previous run of {run['name']}: {compare_url}")
    elif spool_dir:
        lines.append(f"  full report: starvewatch export {run['id']} --format md  (data in {spool_dir})")
    return "\n".join(lines)


def recommendation_line(rec: dict) -> str:
    """One recommendation as one line: the loader, the change, its expected gain, the reason."""
    from ..quantities import speedup_text
    gain = f" (expected {speedup_text(rec)})" if rec.get("expected_speedup") else ""
    if rec.get("kind") == "protective":
        gain = " (protective: no speed-up" + (f"; {rec['risk']})" if rec.get("risk") else ")")
    # Advice that is not a DataLoader argument (lighter batches, GPU transforms) has no parameter.
    what = (f"{rec['parameter']}={rec['suggested']!r} (now {rec['current']!r})" if rec.get("parameter")
            else str(rec["suggested"]).replace("_", " "))
    return f"{rec['loader']}: {what}{gain}: {rec['reason']}"


def print_report(summary: dict, session, file, previous_run_id: str | None = None) -> None:
    url = session.dashboard_url
    compare = None
    if url and previous_run_id:
        from urllib.parse import quote
        compare = f"{url.rsplit('/runs/', 1)[0]}/compare?a={quote(previous_run_id)}&b={quote(summary['run']['id'])}"
    print(format_report(summary, url, str(session.settings.dir), compare), file=file, flush=True)
