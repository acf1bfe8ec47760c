"""Fleets: `/metrics` against the documented Grafana dashboard, OpenTelemetry export to a real
OTLP/HTTP receiver on loopback, and TensorBoard scalars written by the collector."""
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import yaml

from .conftest import free_port, wait_until
from .test_collector_api import batch

DOCS = Path(__file__).parent.parent / "docs"
SECOND = 1_000_000_000


def _two_ranks_and_a_stall(c, run_id="fleet-run"):
    """Rank 1 waits 20 ms per step where rank 0 waits 2 ms (same 28 ms step): a straggler; and an
    open stall on rank 0."""
    for rank, (wait, compute) in enumerate(((2_000_000, 26_000_000), (20_000_000, 8_000_000))):
        payload = batch(run_id=run_id, stream=f"s{rank}", rank=rank, n=100, wait_ns=wait, compute_ns=compute)
        if rank == 0:
            payload["stalls"] = [{"loader": "train", "rank": 0, "step": 100, "started_ns": 1_700_000_002 * SECOND,
                                  "wait_s": 12.0, "t_ns": 1_700_000_003 * SECOND, "workers": []}]
            payload["samples"] = [{"kind": "gpu", "t_ns": 1_700_000_001 * SECOND,  # as NVML reports it
                                   "devices": [{"index": 0, "name": "stand-in", "gpu_util_pct": 35.0}]}]
        status, body = c.request("POST", "/api/v1/ingest", orjson.dumps(payload),
                                 {"Content-Type": "application/json"})
        assert status == 200, body


def _metric_names_in_dashboard() -> set[str]:
    dashboard = json.loads((DOCS / "grafana" / "starvewatch-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return {name for e in exprs for name in re.findall(r"\bstarvewatch_[a-z_]+\b", e)}


def test_every_metric_of_the_grafana_dashboard_is_exported_with_samples(collector):
    c = collector(token="fleet-secret")
    _two_ranks_and_a_stall(c)
    text = c.request("GET", "/metrics")[1].decode()
    sampled = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    used = _metric_names_in_dashboard()
    assert len(used) >= 10, used
    assert used - sampled == set(), f"used by the dashboard but not exported: {used - sampled}"
    # Per rank, verdicts, stalls and the straggler, with the values the data implies.
    assert re.search(r'starvewatch_rank_input_wait_fraction\{loader="train",name="api-test",rank="1",'
                     r'run="fleet-run"\} 0\.714', text), text
    assert 'starvewatch_verdict{name="api-test",run="fleet-run",verdict="high"} 1.0' in text
    assert 'starvewatch_stalled{name="api-test",run="fleet-run"} 1.0' in text
    assert 'starvewatch_gpu_utilization_ratio{name="api-test",run="fleet-run"} 0.35' in text
    assert re.search(r'starvewatch_straggler_excess_ratio\{kind="input",loader="train",name="api-test",'
                     r'rank="1",run="fleet-run",severity="critical"\} 0\.64', text), text
    # The documented scrape config sends the token as a bearer token; without it: 401.
    scrape = yaml.safe_load((DOCS / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["authorization"]["type"] == "Bearer" and scrape["metrics_path"] == "/metrics"
    import urllib.error
    import urllib.request
    try:
        urllib.request.urlopen(c.url + "/metrics", timeout=10)
        raise AssertionError("/metrics answered without the token")
    except urllib.error.HTTPError as err:
        assert err.code == 401


class _OtlpReceiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            import gzip
            body = gzip.decompress(body)
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)  # a real decode: malformed protobuf raises here
        for resource in request.resource_metrics:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}.get("service.name")
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.gauge.data_points:
                        attrs = {a.key: a.value.string_value for a in point.attributes}
                        type(self).received.append((service, self.path, metric.name, attrs, point.as_double))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_opentelemetry_exports_the_metrics_to_an_otlp_http_receiver(collector):
    _OtlpReceiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _OtlpReceiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/metrics"
        c = collector(extra=["--otlp-endpoint", endpoint, "--otlp-interval", "0.5"])
        _two_ranks_and_a_stall(c)

        def rank1_wait():
            return [r for r in _OtlpReceiver.received if r[2] == "starvewatch_rank_input_wait_fraction"
                    and r[3].get("rank") == "1"]
        got = wait_until(rank1_wait, timeout_s=30, what="an OTLP export with rank 1's input wait")
        service, path, _name, attrs, value = got[-1]
        assert (service, path) == ("starvewatch-collector", "/v1/metrics")
        assert attrs == {"run": "fleet-run", "name": "api-test", "loader": "train", "rank": "1"}
        assert abs(value - 20 / 28) < 1e-6
        names = {r[2] for r in _OtlpReceiver.received}
        assert {"starvewatch_input_wait_fraction", "starvewatch_straggler_excess_ratio",
                "starvewatch_stalled", "starvewatch_verdict_level"} <= names
    finally:
        server.shutdown()
        server.server_close()


def test_serve_tensorboard_writes_per_run_scalars(collector, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tb = tmp_path / "tb"
    c = collector(extra=["--tensorboard", str(tb), "--tensorboard-interval", "0.3"])
    _two_ranks_and_a_stall(c)

    def scalars():
        run_dir = tb / "fleet-run"
        if not run_dir.is_dir():
            return None
        acc = EventAccumulator(str(run_dir))
        acc.Reload()
        tags = acc.Tags()["scalars"]
        return acc if {"input_wait_fraction/train", "rank1/input_wait_fraction/train"} <= set(tags) else None
    acc = wait_until(scalars, timeout_s=30, what="TensorBoard scalars for the run")
    whole = acc.Scalars("input_wait_fraction/train")[-1]
    assert whole.step == 200 and abs(whole.value - 22 / 56) < 1e-6  # both ranks: 100 steps each
    rank1 = acc.Scalars("rank1/input_wait_fraction/train")[-1]
    assert rank1.step == 200 and abs(rank1.value - 20 / 28) < 1e-6  # one x axis: the run's steps


def test_the_run_page_marks_the_straggling_rank_in_a_browser(collector, browser):
    c = collector()
    _two_ranks_and_a_stall(c)
    page = browser.new_page(viewport={"width": 1300, "height": 1600})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(c.url + "/runs/fleet-run")
    row = page.locator("#rank-row-1")
    row.wait_for(timeout=30_000)
    assert row.get_attribute("class") == "sw-straggler"
    assert "input straggler" in row.inner_text()
    assert page.locator("#rank-row-0").get_attribute("class") is None
    assert "input straggler" not in page.locator("#rank-row-0").inner_text()
    assert "Rank 1 (train): critical input straggler" in page.locator("#ranks-panel").inner_text()
    assert errors == []
