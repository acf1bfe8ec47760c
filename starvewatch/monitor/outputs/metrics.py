"""The collector's metrics of live runs, one list for every exporter: Prometheus `/metrics`
(prometheus-client, a registry per app), OpenTelemetry (monitor/outputs/otel.py) and TensorBoard
(monitor/outputs/tensorboard.py) all read `fleet_metrics()`, so they export the same numbers.

Label sets are bounded: live and stalled runs, plus runs finished in the last few minutes,
at most `metrics_max_runs` of them; finished runs age out.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ...logonce import RateLimitedLog
from ...schema import BAND_ORDER

_unreadable = RateLimitedLog(logging.getLogger("starvewatch.collector"))

# name -> (help, label names). Documented in docs/fleets.md; never rename one (dashboards use them).
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "starvewatch_input_wait_fraction": ("Share of the loop spent waiting for data (whole run).",
                                        ("run", "name", "loader")),
    "starvewatch_batches_per_second": ("Batches per second.", ("run", "name", "loader")),
    "starvewatch_wait_p95_seconds": ("95th percentile of the wait per batch.", ("run", "name", "loader")),
    "starvewatch_steps": ("Steps recorded.", ("run", "name", "loader")),
    "starvewatch_gpu_utilization_ratio": ("Mean GPU utilization (NVML).", ("run", "name")),
    "starvewatch_run_live": ("1 while the run is live or stalled.", ("run", "name", "status")),
    "starvewatch_verdict_level": ("Input-bound band of the run: 0 insufficient data, 1 not, 2 moderate, 3 high.",
                                  ("run", "name")),
    "starvewatch_verdict": ("1 for the run's input-bound band (the band is a label).", ("run", "name", "verdict")),
    "starvewatch_stalls": ("Stalls detected in the run (a wait over max(10 s, 20x the median)).", ("run", "name")),
    "starvewatch_stalled": ("1 while the run is stalled.", ("run", "name")),
    "starvewatch_rank_input_wait_fraction": ("Share of one rank's loop spent waiting for data.",
                                             ("run", "name", "loader", "rank")),
    "starvewatch_rank_batches_per_second": ("Batches per second of one rank.", ("run", "name", "loader", "rank")),
    "starvewatch_straggler_excess_ratio": ("A straggling rank's excess wait or compute over the median rank, "
                                           "as a share of the step time.",
                                           ("run", "name", "loader", "rank", "kind", "severity")),
    "starvewatch_run_unreadable": ("1 for a run whose stored data could not be read (its other metrics are "
                                   "missing; the collector's log says why). Other runs are not affected.",
                                   ("run", "name")),
}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict
    value: float


def _runs(query, settings):
    now = time.time()
    rows = []
    for row in query.store.run_rows():
        status = query.status(row["id"])
        if status in ("live", "stalled") or (
                status == "finished" and now - row["last_seen"] < settings.metrics_finished_keep_s):
            rows.append((row, status))
        if len(rows) >= settings.metrics_max_runs:
            break
    return rows


def fleet_metrics(query, settings) -> list[Sample]:
    """Every metric sample of the runs worth exporting now."""
    out: list[Sample] = []
    for row, status in _runs(query, settings):
        # One run at a time: a run whose stored data cannot be read is one line of its own (and
        # a log line), never the end of /metrics for every run.
        try:
            out += _run_metrics(query, row, status)
        except Exception as exc:
            _unreadable.error(f"metrics:{type(exc).__name__}", "run %s left out of the metrics: %s: %s",
                              row["id"][:128], type(exc).__name__, str(exc)[:300])
            out.append(Sample("starvewatch_run_unreadable", {"run": str(row["id"]), "name": str(row["name"])}, 1.0))
    return out


def _run_metrics(query, row, status) -> list[Sample]:
    out: list[Sample] = []

    def add(metric, value, **labels):
        if value is not None:
            out.append(Sample(metric, {k: str(v) for k, v in labels.items()}, float(value)))

    run_id, name = row["id"], row["name"]
    summary = query.summary(run_id)
    add("starvewatch_run_live", 1.0 if status in ("live", "stalled") else 0.0, run=run_id, name=name,
        status=status)
    for loader in summary["loaders"]:
        lv = dict(run=run_id, name=name, loader=loader["name"])
        add("starvewatch_input_wait_fraction", loader["input_wait_fraction"], **lv)
        add("starvewatch_batches_per_second", loader["batches_per_s"], **lv)
        p95 = loader["wait_ms"]["p95"]
        add("starvewatch_wait_p95_seconds", p95 / 1000 if p95 is not None else None, **lv)
        add("starvewatch_steps", loader["steps"], **lv)
    util = (summary.get("system") or {}).get("gpu_util_mean")
    add("starvewatch_gpu_utilization_ratio", util / 100 if util is not None else None, run=run_id, name=name)
    verdict = summary["verdict"]["input_bound"]
    add("starvewatch_verdict_level", BAND_ORDER.index(verdict), run=run_id, name=name)
    add("starvewatch_verdict", 1.0, run=run_id, name=name, verdict=verdict)
    add("starvewatch_stalls", len(summary.get("stalls") or []), run=run_id, name=name)
    add("starvewatch_stalled", 1.0 if status == "stalled" else 0.0, run=run_id, name=name)
    ranks = sorted({s["rank"] for s in query.store.stream_rows(run_id)})
    for rank in ranks:
        for loader in query.summary(run_id, rank)["loaders"]:
            lv = dict(run=run_id, name=name, loader=loader["name"], rank=rank)
            add("starvewatch_rank_input_wait_fraction", loader["input_wait_fraction"], **lv)
            add("starvewatch_rank_batches_per_second", loader["batches_per_s"], **lv)
    for s in (summary.get("stragglers") or {}).get("stragglers", []):
        add("starvewatch_straggler_excess_ratio", s["excess_fraction"], run=run_id, name=name,
            loader=s["loader"], rank=s["rank"], kind=s["kind"], severity=s["severity"])
    return out


class RunCollector:
    def __init__(self, get_query, settings) -> None:
        self._get_query = get_query
        self._settings = settings

    def collect(self):
        families = {name: GaugeMetricFamily(name, help_text, labels=list(labels))
                    for name, (help_text, labels) in METRICS.items()}
        query = self._get_query()
        if query is not None:
            for sample in fleet_metrics(query, self._settings):
                family = families[sample.name]
                family.add_metric([sample.labels[k] for k in METRICS[sample.name][1]], sample.value)
        yield from families.values()


def make_registry(get_query, settings) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(get_query, settings))
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    return generate_latest(registry), CONTENT_TYPE_LATEST
