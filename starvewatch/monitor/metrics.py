"""Prometheus exposition of live runs (prometheus-client, a registry per app).

Label sets are bounded: live and stalled runs, plus runs finished in the last few minutes,
at most `metrics_max_runs` of them; finished runs age out.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class RunCollector:
    def __init__(self, get_query, settings) -> None:
        self._get_query = get_query
        self._settings = settings

    def _runs(self, query):
        now = time.time()
        rows = []
        for row in query.store.run_rows():
            status = query.status(row["id"])
            if status in ("live", "stalled") or (
                    status == "finished" and now - row["last_seen"] < self._settings.metrics_finished_keep_s):
                rows.append((row, status))
            if len(rows) >= self._settings.metrics_max_runs:
                break
        return rows

    def collect(self):
        labels = ["run", "name", "loader"]
        wait = GaugeMetricFamily("starvewatch_input_wait_fraction",
                                 "Share of the loop spent waiting for data (whole run).", labels=labels)
        rate = GaugeMetricFamily("starvewatch_batches_per_second", "Batches per second.", labels=labels)
        p95 = GaugeMetricFamily("starvewatch_wait_p95_seconds", "95th percentile of the wait per batch.",
                                labels=labels)
        steps = GaugeMetricFamily("starvewatch_steps", "Steps recorded.", labels=labels)
        gpu = GaugeMetricFamily("starvewatch_gpu_utilization_ratio", "Mean GPU utilization (NVML).",
                                labels=["run", "name"])
        live = GaugeMetricFamily("starvewatch_run_live", "1 while the run is live or stalled.",
                                 labels=["run", "name", "status"])
        query = self._get_query()
        if query is not None:
            for row, status in self._runs(query):
                summary = query.summary(row["id"])
                run_id, name = row["id"], row["name"]
                live.add_metric([run_id, name, status], 1.0 if status in ("live", "stalled") else 0.0)
                for loader in summary["loaders"]:
                    lv = [run_id, name, loader["name"]]
                    if loader["input_wait_fraction"] is not None:
                        wait.add_metric(lv, loader["input_wait_fraction"])
                    if loader["batches_per_s"] is not None:
                        rate.add_metric(lv, loader["batches_per_s"])
                    if loader["wait_ms"]["p95"] is not None:
                        p95.add_metric(lv, loader["wait_ms"]["p95"] / 1000)
                    steps.add_metric(lv, loader["steps"])
                util = (summary.get("system") or {}).get("gpu_util_mean")
                if util is not None:
                    gpu.add_metric([run_id, name], util / 100)
        yield from (wait, rate, p95, steps, gpu, live)


def make_registry(get_query, settings) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(get_query, settings))
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    return generate_latest(registry), CONTENT_TYPE_LATEST
