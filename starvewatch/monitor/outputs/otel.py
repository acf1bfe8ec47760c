"""OpenTelemetry: the collector's metrics (the same list as `/metrics`, monitor/outputs/metrics.py) sent
to any OTLP/HTTP endpoint by the OpenTelemetry SDK. Optional: `pip install 'starvewatch[otel]'`,
started by `starvewatch serve --otlp-endpoint URL`; nothing imports the SDK otherwise."""
from __future__ import annotations

import threading
import time

from .metrics import METRICS, fleet_metrics


def _sdk():
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
    except ImportError as exc:
        raise ImportError("the OpenTelemetry exporter needs opentelemetry-sdk and its OTLP/HTTP exporter, "
                          "which are not installed: pip install 'starvewatch[otel]'") from exc
    return OTLPMetricExporter, Observation, MeterProvider, PeriodicExportingMetricReader, Resource


_sdk()  # importing this module without the SDK says how to install it


class OtelExporter:
    """Observable gauges over `fleet_metrics()`, exported every `interval_s` by the SDK's reader."""

    def __init__(self, get_query, settings, endpoint: str, *, interval_s: float = 15.0,
                 headers: dict | None = None) -> None:
        OTLPMetricExporter, self._Observation, MeterProvider, Reader, Resource = _sdk()
        from ...version import __version__
        self._get_query = get_query
        self._settings = settings
        self._lock = threading.Lock()
        self._cached: tuple[float, list] = (0.0, [])
        # headers=None: the SDK reads OTEL_EXPORTER_OTLP_HEADERS (an auth header, say) itself.
        exporter = OTLPMetricExporter(endpoint=endpoint, headers=headers, timeout=10)
        self._reader = Reader(exporter, export_interval_millis=interval_s * 1000)
        self.provider = MeterProvider(metric_readers=[self._reader], resource=Resource.create(
            {"service.name": "starvewatch-collector", "service.version": __version__}))
        meter = self.provider.get_meter("starvewatch", __version__)
        for name, (help_text, _labels) in METRICS.items():
            meter.create_observable_gauge(name, callbacks=[self._callback(name)], description=help_text)

    def _samples(self) -> list:
        # One computation per export cycle, shared by every gauge's callback.
        with self._lock:
            at, samples = self._cached
            if time.monotonic() - at > 1.0:
                query = self._get_query()
                samples = fleet_metrics(query, self._settings) if query is not None else []
                self._cached = (time.monotonic(), samples)
            return samples

    def _callback(self, name: str):
        def observe(_options):
            return [self._Observation(s.value, s.labels) for s in self._samples() if s.name == name]
        return observe

    def close(self) -> None:
        self.provider.shutdown()  # exports once more, then stops the reader's thread
