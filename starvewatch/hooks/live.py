"""The run's figures so far, read in the training process itself (no collector needed): what
the framework integrations log through the trainer's own loggers (integrations/).

Read-only. The figures come from the exact totals of the records processed so far (the
record book: one shipping interval behind the loop, and with the sidecar, from when the
sidecar has started and acknowledged them) plus what the hot path counted itself; nothing here touches the hot path or the records' histograms, which the shipper
thread may be filling at the same moment.
"""
from __future__ import annotations

import os

from ..schema import BAND_ORDER, band
from ..stats import LoaderTotals


def _wait_ns(t: LoaderTotals) -> int:
    return t.wait_ns + t.epoch_end_wait_ns  # as the summary counts it (analysis/summary.py)


def _figures(t: LoaderTotals) -> dict:
    # Over the loop's wall step, time outside step() included (analysis/summary.py).
    loop_ns = _wait_ns(t) + t.compute_ns + t.other_ns
    elapsed_s = (loop_ns + t.other_loaders_wait_ns) / 1e9
    fraction = _wait_ns(t) / loop_ns if loop_ns > 0 and t.steps else None
    return {"steps": t.steps, "input_wait_fraction": fraction, "verdict": band(fraction, t.steps, elapsed_s),
            "batches_per_s": t.steps / elapsed_s if elapsed_s > 0 else None, "wall_s": elapsed_s}


def live_figures(session=None) -> dict | None:
    """This process's run so far: `{"input_wait_fraction", "verdict", "steps", "loaders":
    {name: {"input_wait_fraction", "verdict", "steps", "batches_per_s"}}}`, computed as the
    summary computes them (one rank's view). None when no run is active in this process."""
    if session is None:
        from .session import current_session
        session = current_session()
    if session is None or not session.active or session.pid != os.getpid():
        return None
    book = session.shipper.book()
    loaders, wait_ns, loop_ns, steps = {}, 0, 0, 0
    for state in list(session.loader_list):
        totals = book.merged(state.index, state.totals)
        loaders[state.name] = _figures(totals)
        wait_ns += _wait_ns(totals)
        loop_ns += _wait_ns(totals) + totals.compute_ns + totals.other_ns - totals.shared_compute_ns
        steps += totals.steps
    fraction = wait_ns / loop_ns if loop_ns > 0 and steps else None
    # The run's band is its fraction's, judged by the loop that drives it (most wall time).
    train = max(loaders.values(), key=lambda f: f["wall_s"], default=None)
    return {"input_wait_fraction": fraction,
            "verdict": band(fraction, train["steps"], loop_ns / 1e9) if train else "insufficient_data",
            "steps": steps, "loaders": loaders}


def summary_figures(summary: dict) -> dict:
    """The same figures, final, from a run's summary (`finish()`'s)."""
    loaders = {loader["name"]: {key: loader.get(key) for key in ("steps", "input_wait_fraction", "verdict",
                                                                 "batches_per_s", "wall_s")}
               for loader in summary["loaders"]}
    return {"input_wait_fraction": summary["verdict"]["input_wait_fraction"],
            "verdict": summary["verdict"]["input_bound"],
            "steps": sum(loader["steps"] for loader in loaders.values()), "loaders": loaders}


def metrics(figures: dict, prefix: str) -> dict[str, float]:
    """Figures as flat numeric metrics for a logger: `<prefix>input_wait_fraction`,
    `<prefix>verdict_level` (0 insufficient data, 1 not, 2 moderate, 3 high: the collector's
    starvewatch_verdict_level), and per loader `<prefix><loader>/input_wait_fraction` and
    `<prefix><loader>/batches_per_s`. Figures not measured yet are left out."""
    out = {f"{prefix}verdict_level": float(BAND_ORDER.index(figures["verdict"]))}
    if figures["input_wait_fraction"] is not None:
        out[f"{prefix}input_wait_fraction"] = figures["input_wait_fraction"]
    for name, loader in figures["loaders"].items():
        for key in ("input_wait_fraction", "batches_per_s"):
            if loader[key] is not None:
                out[f"{prefix}{name}/{key}"] = loader[key]
    return out


def top_recommendation(summary: dict) -> str | None:
    """The first recommendation of a summary as one line of text, as the console report says it."""
    recommendations = summary.get("recommendations") or []
    if not recommendations:
        return None
    from .report import recommendation_line
    return recommendation_line(recommendations[0])
