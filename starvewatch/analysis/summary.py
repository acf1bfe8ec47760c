"""Pure analysis of a run: from exact totals and record statistics to `starvewatch.summary/2`.

Used alike by `finish()` in the training process, the collector's API, export and the
dashboard, so every surface reports the same numbers. No web framework in here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..schema import OLD_SUMMARY_SCHEMAS, SUMMARY_SCHEMA, band
from ..stats import LoaderTotals, RecordStats
from .findings import findings_from
from .findings.head_of_line import head_of_line_findings
from .wait_attribution import attribution_of


@dataclass
class LoaderData:
    name: str
    config: dict | None
    totals: LoaderTotals
    records: RecordStats | None = None
    ranks: list[int] = field(default_factory=lambda: [0])


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    try:
        return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):  # a time past year 9999, as a hand-made batch may send
        return None


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def wait_total_ns(t: LoaderTotals) -> int:
    """Waits of the steps plus the worker joins at epoch ends."""
    return t.wait_ns + t.epoch_end_wait_ns


def loop_ns(t: LoaderTotals) -> int:
    return wait_total_ns(t) + t.compute_ns


def wall_ns(t: LoaderTotals) -> int:
    """The wall time of this loader's loop: its steps' time, the other loaders' waits inside
    them included (loaders advanced together on one thread, hooks/delivery/overlap.py). This
    is the step every fraction and prediction is relative to (summary/2): wait + compute +
    the time outside `step()` blocks, marked or not."""
    return loop_ns(t) + t.other_ns + t.other_loaders_wait_ns


def run_wall_ns(loaders) -> int:
    """The run's loop wall time over all its loaders: each loader's wait, compute and time
    outside step() once. Loaders advanced together on one thread (zip) each count the loop
    body: its compute once (`shared_compute_ns`), and the time outside step() blocks of the one
    that saw the most of it (the others' lies in the same loop body)."""
    totals = [d.totals for d in loaders]
    shared = [t.other_ns for t in totals if t.shared_compute_ns]
    return sum(loop_ns(t) - t.shared_compute_ns for t in totals) \
        + sum(t.other_ns for t in totals if not t.shared_compute_ns) + max(shared, default=0)


def fraction(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def _distribution(hist, steps: int, total_ns: int) -> dict:
    """Mean is exact (from totals); percentiles and max come from the recorded steps."""
    have = hist is not None and hist.count > 0
    return {
        "mean": _ms(total_ns / steps) if steps else None,
        "p50": _ms(hist.quantile(0.50)) if have else None,
        "p95": _ms(hist.quantile(0.95)) if have else None,
        "p99": _ms(hist.quantile(0.99)) if have else None,
        "max": _ms(hist.maximum) if have else None,
    }


def _step_time(t: LoaderTotals, rec: RecordStats | None) -> dict:
    """Per-step wall time (wait + compute + other: the same step as the fraction's) with its
    spread, for verify-after-change and compare: the mean is exact, the spread comes from the
    wait and compute histograms (treated as independent)."""
    spreads = [h.variance() for h in (rec.wait, rec.compute)] if rec else [None]
    sd = math.sqrt(sum(spreads)) / 1e6 if None not in spreads else None
    return {"mean_ms": wall_ns(t) / t.steps / 1e6 if t.steps else None,
            "sd_ms": sd, "steps": t.steps,
            "samples_per_step": t.samples / t.steps if t.steps and t.samples_known and t.samples else None}


def loader_summary(data: LoaderData) -> dict:
    t, rec = data.totals, data.records
    # Of the loop's wall time, time outside step() blocks included (summary/2; summary/1
    # divided by wait + compute only, which a step() mark inflated).
    # Other loaders' waits in its steps (zip) are theirs: out of this loader's own step.
    f = fraction(wait_total_ns(t), loop_ns(t) + t.other_ns) if t.steps else None
    # Wall time one rank spent in this loader's loop; ranks run in parallel.
    elapsed_s = wall_ns(t) / max(1, len(data.ranks)) / 1e9
    gpu_idle = fraction(rec.gpu_idle_ns, rec.gpu_loop_ns) if rec and rec.gpu_measured_steps else None
    return {
        "name": data.name,
        "config": data.config,
        "steps": t.steps,
        "epochs": t.epochs,
        "input_wait_fraction": f,
        "verdict": band(f, t.steps, elapsed_s),
        "wall_s": elapsed_s,
        "wait_ms": _distribution(rec.wait if rec else None, t.steps, t.wait_ns),
        "compute_ms": _distribution(rec.compute if rec else None, t.steps, t.compute_ns),
        "other_ms_total": _ms(t.other_ns),
        "epoch_end_wait_ms_total": _ms(t.epoch_end_wait_ns),
        "batches_per_s": t.steps / elapsed_s if elapsed_s > 0 else None,
        "samples_per_s": t.samples / elapsed_s if elapsed_s > 0 and t.samples_known and t.steps else None,
        "gpu_idle_fraction": gpu_idle,
        "step_time": _step_time(t, rec),
        "dropped_records": t.dropped_records,
        "ranks": sorted(data.ranks),
        "attribution": attribution_of(t),  # who made the loop wait (wait_attribution.py)
    }


def run_verdict(loaders: list[LoaderData], parts: list[dict]) -> dict:
    """The run's headline figures (the summary's and the runs list's alike): the band of the
    run's fraction, judged by the loop that drives the run (the training loader's steps); the
    throughput is the training loader's (other loaders are named beside it: answer.py)."""
    total_wait = sum(wait_total_ns(d.totals) for d in loaders)
    # Loaders advanced together on one thread each count the loop body: once here.
    run_wall = run_wall_ns(loaders)
    f = fraction(total_wait, run_wall) if any(d.totals.steps for d in loaders) else None
    train = training_part(parts)
    ranks = max((len(d.ranks) for d in loaders), default=1)
    run_wall_s = run_wall / max(1, ranks) / 1e9
    judged = band(f, train["steps"], run_wall_s) if train else "insufficient_data"
    return {
        "input_bound": judged,
        "input_wait_fraction": f,
        # No ceiling claimed from a loop too short to judge.
        "speedup_at_stake": 1.0 / (1.0 - f) if f is not None and f < 1.0 and judged != "insufficient_data" else None,
        "training_loader": train["name"] if train else None,
        "batches_per_s": train["batches_per_s"] if train else None,
        "samples_per_s": train["samples_per_s"] if train else None,
        "wall_s": run_wall_s,
    }


def training_part(parts: list[dict]) -> dict | None:
    """The loader that drives the loop: the one with the most wall time (a validation loop
    nested in its steps is out of it); None when none has steps."""
    measured = [p for p in parts if p["steps"]]
    if not measured:
        return None
    return max(measured, key=lambda p: (p["wall_s"] or 0) * max(1, len(p.get("ranks") or [0])))


def summarize(run: dict, loaders: list[LoaderData], *, stalls=(), system: dict | None = None,
              previous: dict | None = None, worker_events: list[dict] | None = None,
              live_tuning: tuple[list[dict], list[dict]] | None = None) -> dict:
    """The run summary (schema `starvewatch.summary/2`) with verdict and recommendations.
    `live_tuning`: (records, outcomes) of a run tuned live, attached before verify-after-change
    (which reads a tuned run as start -> final) and replacing the advice it measured."""
    from .diagnosis import diagnose

    loader_parts = [loader_summary(d) for d in loaders]
    headline = run_verdict(loaders, loader_parts)
    gpu_idle = sum(d.records.gpu_idle_ns for d in loaders if d.records)
    gpu_loop = sum(d.records.gpu_loop_ns for d in loaders if d.records)
    gpu_measured = sum(d.records.gpu_measured_steps for d in loaders if d.records)
    summary = {
        "schema": SUMMARY_SCHEMA,
        "run": {
            "id": run.get("id"), "name": run.get("name"),
            "started_at": iso(run.get("started_at")), "ended_at": iso(run.get("ended_at")),
            "status": run.get("status"), "host": run.get("host"),
            "rank": run.get("rank", 0), "world_size": run.get("world_size", 1),
        },
        "loaders": loader_parts,
        "verdict": {
            **headline,
            "gpu_idle_fraction": fraction(gpu_idle, gpu_loop) if gpu_measured else None,
            "limiting_factor": None,
        },
        "stalls": list(stalls),
        # Hung workers are in the stalls; memory growth and the like here (analysis/findings/__init__.py).
        "findings": findings_from(worker_events or [], {d.name: d.config for d in loaders}, system,
                                  waits={p["name"]: p["input_wait_fraction"] for p in loader_parts},
                                  world_size=run.get("world_size") or 1,
                                  batches_per_s={p["name"]: p["batches_per_s"] for p in loader_parts})
        + head_of_line_findings(loader_parts),
        "recommendations": [],
        "system": system,
    }
    if live_tuning is not None:
        from .live_tuning import with_live_tuning
        with_live_tuning(summary, *live_tuning)  # read by the verification diagnose() writes
    diagnose(summary, loaders, system=system, previous=previous, run=run)
    if live_tuning is not None:
        with_live_tuning(summary, *live_tuning)  # the advice tuning measured goes
    return summary


def upgrade(summary: dict) -> dict:
    """A summary as summary/2 reads it: a /1 summary (an older collector's) gets each loader's
    fraction and step time over its wall step (wait + compute + other, from its exact means and
    `other_ms_total`) and the run's fraction and speed-up at stake from its loaders'. Anything
    else is returned as it is."""
    if not isinstance(summary, dict) or summary.get("schema") not in OLD_SUMMARY_SCHEMAS:
        return summary
    out = dict(summary, schema=SUMMARY_SCHEMA)
    parts, waits, walls = [], 0.0, 0.0
    for part in summary.get("loaders") or []:
        part = dict(part)
        steps = part.get("steps") or 0
        wait = (part.get("wait_ms") or {}).get("mean")
        compute = (part.get("compute_ms") or {}).get("mean")
        # Unmarked loops had no time outside step(): their /1 fraction is already the wall's.
        if steps and wait is not None and compute is not None and part.get("other_ms_total"):
            wait_total = wait * steps + (part.get("epoch_end_wait_ms_total") or 0)
            wall = wait_total + compute * steps + (part.get("other_ms_total") or 0)
            part["input_wait_fraction"] = fraction(wait_total, wall)
            part["verdict"] = band(part["input_wait_fraction"], steps)
            if isinstance(part.get("step_time"), dict):
                part["step_time"] = dict(part["step_time"], mean_ms=wall / steps)
            waits, walls = waits + wait_total, walls + wall
        elif steps and wait is not None and compute is not None:
            waits += wait * steps + (part.get("epoch_end_wait_ms_total") or 0)
            walls += (wait + compute) * steps + (part.get("epoch_end_wait_ms_total") or 0)
        parts.append(part)
    out["loaders"] = parts
    verdict = dict(summary.get("verdict") or {})
    if walls > 0 and any(p.get("other_ms_total") for p in parts):
        f = waits / walls
        verdict["input_wait_fraction"] = f
        verdict["speedup_at_stake"] = 1.0 / (1.0 - f) if f < 1.0 else None
    out["verdict"] = verdict
    return out
