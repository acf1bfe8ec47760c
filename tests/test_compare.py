"""Comparing two runs (analysis/compare.py, compare_figures.py, the dashboard's compare page) on
a real store: loader pairing, readable changes, the configuration diff, the verdict and its
interval, and the charts."""
import html
import json
import re

import pytest

from starvewatch.dashboard import callbacks
from starvewatch.analysis import compare
from starvewatch.monitor.outputs import compare_figures, compare_report
from starvewatch.monitor.outputs.markdown_text import md_text
from starvewatch.monitor.web.wire_models import EventBatch
from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.store import Store

SECOND = 1_000_000_000
HOSTILE = "img<b>|x</b>`"


def _batch(run_id, loader, config, wait_ms, compute_ms=10.0, n=300, start_s=1_700_000_000, name="cmp"):
    """n steps, one every (wait + compute) ms; waits alternate +-10% so a distribution has width."""
    every_ns = int((wait_ms + compute_ms) * 1e6)
    waits = [int(wait_ms * 1e6 * (0.9 if i % 2 else 1.1)) for i in range(n)]
    return EventBatch.model_validate({
        "schema": "starvewatch.events/1", "run_id": run_id, "stream": f"s-{run_id}", "seq": 1, "status": "finished",
        "run": {"id": run_id, "name": name, "started_at": start_s},
        "loaders": [{"name": loader, "config": config, "totals": {
            "steps": n, "epochs": 1, "wait_ns": sum(waits), "compute_ns": n * int(compute_ms * 1e6),
            "samples": n * 32}}],
        "steps": {"loader": [loader] * n, "epoch": [0] * n, "step": list(range(n)),
                  "start_ns": [start_s * SECOND + i * every_ns for i in range(n)], "wait_ns": waits,
                  "compute_ns": [int(compute_ms * 1e6)] * n, "other_ns": [0] * n, "batch_size": [32] * n,
                  "gpu_idle_ns": [None] * n}})


@pytest.fixture
def two_runs(tmp_path):
    """A starved run whose only loader is named `first`, then the fix, its only loader named
    HOSTILE, with the recommended num_workers."""
    store = Store(tmp_path / "db.sqlite")
    store.ingest(_batch("before", "first", {"num_workers": 0, "batch_size": 32}, wait_ms=30))
    query = Query(store)
    rec = next(r for r in query.summary("before")["recommendations"] if r["parameter"] == "num_workers")
    store.ingest(_batch("after", HOSTILE, {"num_workers": rec["suggested"], "batch_size": 32}, wait_ms=0.5,
                        start_s=1_700_000_100))
    yield query, rec
    store.close()


def test_ratios_print_as_percent_change_with_significant_digits():
    row = {**compare.change(1526.63, 3.90, "ms")}
    assert compare.change_text(row) == "-99.7% (0.00255x)"  # not "0.00x"
    assert compare.change_text(compare.change(10.0, 25.0, "rate")) == "+150.0% (2.5x)"
    assert compare.change_text(compare.change(1.0, 40.0, "rate")) == "+3,900% (40x)"
    assert compare.change_text(compare.change(0.717, 0.02, "fraction")) == "-69.7 points"
    assert compare.change_text(compare.change(None, 3.0, "ms")) == "n/a"
    assert compare.change_text(compare.change(0.0, 3.0, "ms")) == "n/a"  # no ratio to zero
    assert compare.setting_text({"a_ms": 2.5}) == "a 2.50 ms" and compare.setting_text(4) == "4"
    assert compare.setting_text(None, is_set=False) == "(default)" and compare.setting_text("fork") == "'fork'"


def test_loaders_pair_by_name_or_as_each_runs_only_loader():
    def run(*names):
        return {"run": {"id": "r"}, "loaders": [{"name": n} for n in names]}
    assert compare.loader_pairs(run("a"), run("b")) == [{"before": "a", "after": "b", "by": "only loader"}]
    assert compare.loader_pairs(run("train", "val"), run("val", "train")) == [
        {"before": "val", "after": "val", "by": "name"}, {"before": "train", "after": "train", "by": "name"}]
    assert compare.loader_pairs(run("a"), run("b", "c")) == []  # no name in common, not one each
    assert compare.loader_pairs(run(), run("b")) == []


def test_renamed_only_loader_is_compared_and_its_recommendation_verified(two_runs):
    query, rec = two_runs
    comp = compare.comparison(query.summary("before"), query.summary("after"))
    assert comp["schema"] == "starvewatch.compare/1"
    assert comp["pairs"] == [{"before": "first", "after": HOSTILE, "by": "only loader"}]
    metrics = {r["metric"]: r for r in comp["metrics"]}
    assert metrics["batches/s"]["ratio"] > 2 and metrics["wait p95 (ms)"]["change_pct"] < -90
    changed = [r["setting"] for r in comp["config"] if r["changed"]]
    assert changed == ["num_workers"] and [r["setting"] for r in comp["config"]] == ["num_workers", "batch_size"]
    result = next(r for r in comp["verification"]["results"] if r["parameter"] == "num_workers")
    assert result["loader"] == HOSTILE and result["applied"] and result["status"] == "confirmed"
    low, high = result["interval"]
    assert low <= result["measured_speedup"] <= high
    text = compare.interval_text(result)
    assert text.startswith(f"measured {result['measured_speedup']:.2f}x [") and "predicted" in text
    json.loads(compare_report.to_json(comp))  # plain JSON


def test_markdown_keeps_hostile_names_inside_their_cells(two_runs):
    query, _ = two_runs
    md = compare_report.to_markdown(compare.comparison(query.summary("before"), query.summary("after")))
    metrics = md[md.index("## Metrics"):md.index("## Configuration")]
    rows = [line for line in metrics.splitlines() if line.startswith("| first → ")]
    assert len(rows) == 6 and all(r.count("|") - r.count("\\|") == 6 for r in rows), rows  # 5 cells each
    assert "| first → img<b>\\|x</b>' | wait p95 (ms) |" in md and "-9" in md


def test_html_is_self_contained_and_escapes_names(two_runs):
    query, _ = two_runs
    before, after, comp, dists, series = compare.gather(
        query.summary, query.distributions, lambda r, l: query.rollup_series(r, loader=l, points=300), "before", "after")
    charts = compare_figures.figures_for(comp, dists, series)
    figs = [charts["pairs"][0][k] for k in ("wait", "compute", "throughput", "input_wait")] + [charts["verify"]]
    page = compare_report.render_html(comp, figs)
    assert HOSTILE not in page and html.escape(HOSTILE) in page
    assert "<script src=" not in page and page.count("chart-") >= 5
    assert "<tr class='changed'><td>first → " in page


def test_figures_overlay_distributions_and_draw_the_interval_with_the_prediction(two_runs):
    query, rec = two_runs
    _, _, comp, dists, series = compare.gather(
        query.summary, query.distributions, lambda r, l: query.rollup_series(r, loader=l, points=300), "before", "after")
    charts = compare_figures.figures_for(comp, dists, series)
    pair = charts["pairs"][0]
    wait = pair["wait"]
    assert [t.name for t in wait.data] == ["before: before (300 batches)", "after: after (300 batches)"]
    assert wait.layout.xaxis.type == "log"
    for trace in wait.data:  # each run's shares add up to its batches
        assert sum(trace.y[:-1]) == pytest.approx(100)
    # The before run waits ~30 ms, the after ~0.5 ms: their mass sits at opposite ends of one axis.
    peak = [trace.x[max(range(len(trace.y) - 1), key=lambda i: trace.y[i])] for trace in wait.data]
    assert 20 < peak[0] < 40 and 0.3 < peak[1] < 0.7
    assert HOSTILE not in wait.layout.title.text and html.escape(HOSTILE, quote=False) in wait.layout.title.text
    throughput = pair["throughput"]
    assert len(throughput.data) == 2 and min(throughput.data[0].x) >= 0 and max(throughput.data[0].x) < 15
    assert min(throughput.data[1].x) >= 0  # the after run starts 100 s later, drawn from its own start
    verify = charts["verify"]
    meta = verify.layout.meta
    assert meta["predicted"] == [rec["expected_speedup"]] and meta["intervals"][0][0] <= meta["measured"][0]
    assert verify.data[1].marker.symbol == "diamond" and verify.data[0].error_x.array[0] > 0
    assert HOSTILE not in verify.data[0].y[0]


def test_dashboard_compare_page_shows_tables_and_charts(two_runs):
    query, _ = two_runs
    body = callbacks.compare_result(query, "before", "after")
    ids = set()

    def walk(c):
        if isinstance(c, (list, tuple)):
            for x in c:
                walk(x)
        elif c is not None and not isinstance(c, (str, int, float)):
            if getattr(c, "id", None):
                ids.add(c.id)
            walk(getattr(c, "children", None))
    walk(body)
    assert {"compare-table", "config-diff", "verify-table", "verify-graph", "compare-wait-0", "compare-compute-0",
            "compare-throughput-0", "compare-input-wait-0"} <= ids
    assert callbacks.compare_result(query, "before", "nope").id == "compare-unknown"


RAW_JSON = re.compile(r"""[{\[]\s*(&quot;|&#x27;|["'])|(&quot;|["'])\s*:\s""")


def test_run_report_reads_evidence_and_configuration_as_the_dashboard_does(two_runs):
    from starvewatch.monitor.outputs.export import export_text, to_markdown
    from starvewatch.monitor.storage.sources import LocalSource
    query, rec = two_runs
    source = LocalSource(query.store, "test store")
    page = export_text(source, "before", "html")
    body = page[page.index("<body>"):page.index("<h2>Charts</h2>")]
    assert not RAW_JSON.search(body), RAW_JSON.search(body)
    assert re.search(r"Evidence: load per batch [\d.]+ ms; compute per batch [\d.]+ ms", body)
    # The configuration table: the setting to change in bold with its new value, the others plain.
    assert f"<td><b>num_workers</b></td><td><code>0</code></td><td><b>→ <code>{rec['suggested']}</code></b>" in body
    assert "<td>batch_size</td><td><code>32</code></td><td></td>" in body
    md = to_markdown(query.summary("after"))
    assert f"### {md_text(HOSTILE)}" in md  # the loader's own table, its name as Markdown text


def test_only_settings_whose_effect_changed_are_changes():
    """num_workers 0 -> 2 as torch records it (issue 34 item 6): prefetch_factor None -> 2 and the
    multiprocessing context None -> 'fork' are torch's implied defaults, not changes the user
    made; compare and verify-after-change list num_workers alone."""
    from starvewatch.analysis.compare import config_rows
    from starvewatch.analysis.verification import verify
    before_config = {"num_workers": 0, "batch_size": 16, "prefetch_factor": None, "multiprocessing_context": None,
                     "persistent_workers": False, "timeout": 0}
    after_config = {**before_config, "num_workers": 2, "prefetch_factor": 2, "multiprocessing_context": "fork"}
    part = {"name": "train", "steps": 100, "input_wait_fraction": 0.3,
            "step_time": {"mean_ms": 10.0, "sd_ms": 1.0, "steps": 100, "samples_per_step": 16}}
    before = {"run": {"id": "a"}, "loaders": [{**part, "config": before_config}],
              "recommendations": [{"loader": "train", "parameter": "num_workers", "current": 0, "suggested": 2,
                                   "kind": "speedup", "expected_speedup": 1.5}]}
    after = {"run": {"id": "b"}, "loaders": [{**part, "config": after_config}]}
    pairs = [{"before": "train", "after": "train", "by": "name"}]
    assert [r["setting"] for r in config_rows(before, after, pairs) if r["changed"]] == ["num_workers"]
    assert verify(before, after)["changed"] == {"train": {"num_workers": [0, 2]}}
    # A prefetch_factor the user set is a change.
    after["loaders"][0]["config"] = {**after_config, "prefetch_factor": 4}
    assert [r["setting"] for r in config_rows(before, after, pairs) if r["changed"]] == ["num_workers", "prefetch_factor"]
