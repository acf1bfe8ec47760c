"""Pure analysis of a run: from exact totals and record statistics to `starvewatch.summary/1`.

Used alike by `finish()` in the training process, the collector's API, export and the
dashboard, so every surface reports the same numbers. No web framework in here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..schema import SUMMARY_SCHEMA, band, worst_band
from ..stats import LoaderTotals, RecordStats
from .findings import findings_from


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
    them included (loaders advanced together on one thread, hooks/delivery/overlap.py)."""
    return loop_ns(t) + t.other_ns + t.other_loaders_wait_ns


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
    """Per-step loop time with its spread, for verify-after-change: the mean is exact, the
    spread comes from the wait and compute histograms (treated as independent)."""
    spreads = [h.variance() for h in (rec.wait, rec.compute)] if rec else [None]
    sd = math.sqrt(sum(spreads)) / 1e6 if None not in spreads else None
    return {"mean_ms": (loop_ns(t) + t.other_loaders_wait_ns) / t.steps / 1e6 if t.steps else None,
            "sd_ms": sd, "steps": t.steps,
            "samples_per_step": t.samples / t.steps if t.steps and t.samples_known and t.samples else None}


def loader_summary(data: LoaderData) -> dict:
    t, rec = data.totals, data.records
    f = fraction(wait_total_ns(t), loop_ns(t))
    # Wall time one rank spent in this loader's loop; ranks run in parallel.
    elapsed_s = wall_ns(t) / max(1, len(data.ranks)) / 1e9
    gpu_idle = fraction(rec.gpu_idle_ns, rec.gpu_loop_ns) if rec and rec.gpu_measured_steps else None
    return {
        "name": data.name,
        "config": data.config,
        "steps": t.steps,
        "epochs": t.epochs,
        "input_wait_fraction": f,
        "verdict": band(f, t.steps),
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
    }


def summarize(run: dict, loaders: list[LoaderData], *, stalls=(), system: dict | None = None,
              previous: dict | None = None, worker_events: list[dict] | None = None) -> dict:
    """The run summary (schema `starvewatch.summary/1`) with verdict and recommendations."""
    from .diagnosis import diagnose

    loader_parts = [loader_summary(d) for d in loaders]
    total_wait = sum(wait_total_ns(d.totals) for d in loaders)
    # Loaders advanced together on one thread each count the loop body as compute: once here.
    total_loop = sum(loop_ns(d.totals) - d.totals.shared_compute_ns for d in loaders)
    f = fraction(total_wait, total_loop)
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
            "input_bound": worst_band([p["verdict"] for p in loader_parts]),
            "input_wait_fraction": f,
            "gpu_idle_fraction": fraction(gpu_idle, gpu_loop) if gpu_measured else None,
            "limiting_factor": None,
            "speedup_at_stake": 1.0 / (1.0 - f) if f is not None and f < 1.0 else None,
        },
        "stalls": list(stalls),
        # Hung workers are in the stalls; memory growth and the like here (analysis/findings/__init__.py).
        "findings": findings_from(worker_events or [], {d.name: d.config for d in loaders}, system,
                                  waits={p["name"]: p["input_wait_fraction"] for p in loader_parts},
                                  world_size=run.get("world_size") or 1,
                                  batches_per_s={p["name"]: p["batches_per_s"] for p in loader_parts}),
        "recommendations": [],
        "system": system,
    }
    diagnose(summary, loaders, system=system, previous=previous, run=run)
    return summary
