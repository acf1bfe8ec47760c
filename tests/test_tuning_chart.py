"""The run page's live-tuning chart (issue 39 item 6): samples/s per window with its interval,
above the configuration over steps, beside the timeline table; through the view, and on a real
run page in headless Chromium."""
import json

from starvewatch.analysis.live_tuning import SCHEMA, tuned_part
from starvewatch.dashboard.tuning_panel import live_panel
from tests.browser import page_with_errors
from tests.test_collector_api import batch

# (configuration, mean step ms, decision): a search from 0 workers that keeps 2, then prefetch 4
WINDOWS = [(tuned_part({"num_workers": 0}), 50.0, "measured"),
           (tuned_part({"num_workers": 2}), 25.0, "kept"),
           (tuned_part({"num_workers": 4}), 40.0, "slower_reverted"),
           (tuned_part({"num_workers": 2, "prefetch_factor": 4}), 20.0, "kept"),
           (tuned_part({"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True}), 19.5, "reverted")]


def tuned_records(steps: int = 32) -> list[dict]:
    records = [{"schema": SCHEMA, "loader": "train", "window": i + 1, "decision": decision, "config": config,
                "figures": {"step_time": {"mean_ms": ms, "sd_ms": ms / 10, "steps": steps, "samples_per_step": 32},
                            "samples_per_s": 32 / (ms / 1e3)},
                "t_ns": (1_700_000_001 + i) * 10**9} for i, (config, ms, decision) in enumerate(WINDOWS)]
    kept_ms = 50.0
    for r, (_, ms, decision) in zip(records[1:], WINDOWS[1:]):  # each trial against the one kept
        ratio = kept_ms / ms
        r["interval"] = {"speedup": ratio, "low": ratio / 1.12, "high": ratio * 1.12, "basis": "samples/s"}
        kept_ms = ms if decision == "kept" else kept_ms
    records.append({"schema": SCHEMA, "loader": "train", "decision": "outcome", "start": WINDOWS[0][0],
                    "final": WINDOWS[3][0], "windows": 5, "gain": {"speedup": 2.5, "low": 2.1, "high": 2.9,
                                                                   "basis": "samples/s"},
                    "line": "DataLoader(dataset, batch_size=32, num_workers=2, prefetch_factor=4)",
                    "t_ns": 1_700_000_009 * 10**9})
    return records


def _live(records):
    return {"schema": SCHEMA, "records": [r for r in records if r["decision"] != "outcome"],
            "loaders": [r for r in records if r["decision"] == "outcome"]}


def _find(component, component_id):
    if getattr(component, "id", None) == component_id:
        return component
    children = component if isinstance(component, list) else getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children] if children is not None else []:
        found = _find(child, component_id)
        if found is not None:
            return found
    return None


def test_the_chart_has_one_point_per_window_with_its_interval():
    graph = _find(live_panel(_live(tuned_records())), "live-tuning-chart")
    assert graph is not None and _find(live_panel(_live(tuned_records())), "live-tuning-table") is not None
    rates, workers, prefetch, *colours = graph.figure.data
    assert [c.name for c in colours] == ["measured", "kept", "reverted", "slower reverted"]
    assert list(rates.y) == [32 / (ms / 1e3) for _, ms, _ in WINDOWS]
    assert list(rates.x) == [16, 48, 80, 112, 144]  # each window's middle step
    up, down = rates.error_y.array, rates.error_y.arrayminus
    assert len(up) == len(down) == 5 and all(u > 0 and d > 0 for u, d in zip(up, down))
    # 10% spread over 32 steps and the 4% run-to-run floor: about +-9% at 95%
    assert 0.07 < up[0] / rates.y[0] < 0.12
    # the configuration as a step line: each window's settings from its first step to its last
    assert list(workers.x) == [0, 32, 32, 64, 64, 96, 96, 128, 128, 160]
    assert list(workers.y) == [0, 0, 2, 2, 4, 4, 2, 2, 2, 2]
    assert list(prefetch.y) == [None, None, 2, 2, 2, 2, 4, 4, 4, 4]
    assert "4 workers" in rates.customdata[2][1] and rates.customdata[2][2] == "slower reverted"


def test_no_chart_without_a_window_that_ran_steps():
    records = [dict(r, figures=None) for r in tuned_records() if r["decision"] != "outcome"]
    assert _find(live_panel(_live(records)), "live-tuning-chart") is None
    assert _find(live_panel(_live(records)), "live-tuning-table") is not None


def post_tuned_run(c, run_id="tuned-run"):
    """A run whose batch carries live tuning's records, as watch(tune=True) ships them."""
    payload = dict(batch(run_id=run_id, n=160, every_ns=20_000_000), tuning=tuned_records())
    status, body = c.request("POST", "/api/v1/ingest", json.dumps(payload).encode(),
                             {"Content-Type": "application/json"})
    assert status == 200, body[:300]
    return run_id


def test_the_run_page_draws_the_tuning_chart(collector, browser):
    c = collector()
    run_id = post_tuned_run(c)
    page, errors = page_with_errors(browser, height=1800)
    page.goto(f"{c.url}/runs/{run_id}")
    page.wait_for_selector("#live-tuning-chart .main-svg", timeout=60_000)
    # plotly drew one marker per window and one error bar each
    assert page.locator("#live-tuning-chart .scatterlayer .trace").first.locator(".point").count() == 5
    assert page.locator("#live-tuning-chart .errorbar").count() == 5
    assert "2 workers, prefetch 4" in page.inner_text("#live-tuning-table")
    assert errors == []
