"""Verify-after-change on a live-tuned run (issue 39 item 6), on stored records: the change
verified is the tuning's start -> final, judged by the final windows against the start windows;
a later untuned run with the found configuration is judged against the tuned run's final windows."""
from starvewatch.analysis.compare import comparison, interval_text
from starvewatch.analysis.live_tuning import SCHEMA, tuned_part
from starvewatch.analysis.verification import change_label, pooled_windows, verify
from starvewatch.monitor.outputs.compare_report import to_markdown

START, FINAL = tuned_part({"num_workers": 0}), tuned_part({"num_workers": 2})


def _step_time(mean_ms: float, steps: int = 64, sd_ms: float = 1.0) -> dict:
    return {"mean_ms": mean_ms, "sd_ms": sd_ms, "steps": steps, "samples_per_step": 8}


def _window(n: int, config: dict, mean_ms: float, decision: str) -> dict:
    return {"schema": SCHEMA, "loader": "train", "window": n, "config": config, "decision": decision,
            "figures": {"step_time": _step_time(mean_ms, steps=32)}}


def _tuned_run(run_id: str, final_ms: float) -> dict:
    """A run tuned 0 -> 2 workers: two windows at the start (40 ms), a tried 4 workers reverted,
    then final windows; its run-wide step time mixes every trial (the middle value)."""
    records = [_window(1, START, 40, "measured"), _window(2, FINAL, final_ms, "kept"),
               _window(3, tuned_part({"num_workers": 4}), 90, "slower_reverted"),
               _window(4, FINAL, final_ms, "measured"), _window(5, START, 40, "reverted")]
    outcome = {"schema": SCHEMA, "loader": "train", "start": START, "final": FINAL, "windows": 5,
               "done": True, "stopped": "no candidate left", "gain": None, "decision": "outcome"}
    return {"run": {"id": run_id}, "loaders": [{"name": "train", "config": {"num_workers": 0},
                                                "step_time": _step_time(50), "input_wait_fraction": 0.4}],
            "recommendations": [], "live_tuning": {"schema": SCHEMA, "records": records, "loaders": [outcome]}}


def _plain_run(run_id: str, config: dict, mean_ms: float, recommend: bool = False) -> dict:
    run = {"run": {"id": run_id}, "loaders": [{"name": "train", "config": config, "step_time": _step_time(mean_ms),
                                               "input_wait_fraction": 0.4}], "recommendations": []}
    if recommend:
        run["recommendations"] = [{"loader": "train", "parameter": "num_workers", "suggested": 2,
                                   "kind": "speedup", "expected_speedup": 1.8}]
    return run


def test_pooled_windows_take_only_the_windows_of_that_configuration():
    run = _tuned_run("b", final_ms=20)
    start = pooled_windows(run, "train", START)
    assert start["step_time"]["steps"] == 64 and start["windows"] == 2 and start["step_time"]["mean_ms"] == 40
    assert pooled_windows(run, "train", FINAL)["step_time"]["mean_ms"] == 20
    assert pooled_windows(run, "train", tuned_part({"num_workers": 8})) is None


def test_a_tuned_run_verifies_its_start_to_final_not_the_run_to_run_diff():
    # The earlier run had 1 worker; the tuned run started at 0 (the user's loader) and ended at 2.
    before = _plain_run("a", {"num_workers": 1}, 45)
    after = _tuned_run("b", final_ms=20)
    v = verify(before, after)
    assert v["changed"] == {"train": {"num_workers": [0, 2], "prefetch_factor": [None, 2]}}
    tuning = v["results"][0]
    assert tuning["kind"] == "tuning" and tuning["measured_against"] == "start windows"
    # final windows (20 ms) against start windows (40 ms), not the run-wide 50 ms
    assert tuning["measured_speedup"] == 2.0 and tuning["interval"][0] > 1 and tuning["status"] == "confirmed"
    assert change_label(tuning) == "tuned: num_workers 0 -> 2, prefetch_factor None -> 2"


def test_a_tuned_run_that_ended_slower_is_refuted():
    v = verify(_plain_run("a", {"num_workers": 0}, 40), _tuned_run("b", final_ms=60))
    assert v["results"][0]["status"] == "refuted" and v["results"][0]["interval"][1] < 1


def test_an_earlier_recommendation_taken_by_tuning_is_judged_inside_the_tuned_run():
    # The earlier run (0 workers, 80 ms on a busier day) advised 2 workers; the tuned run
    # started where it ran, so the same-run start windows are the baseline, not the other day.
    before = _plain_run("a", {"num_workers": 0}, 80, recommend=True)
    rec = verify(before, _tuned_run("b", final_ms=30))["results"][1]
    assert rec["applied"] and rec["measured_against"] == "start windows"
    assert abs(rec["measured_speedup"] - 40 / 30) < 0.01 and rec["status"] == "confirmed"
    # A tuned run that started elsewhere (the user set 1 worker): against the earlier run.
    after = _tuned_run("b", final_ms=30)
    after["live_tuning"]["loaders"][0]["start"] = tuned_part({"num_workers": 1})
    after["loaders"][0]["config"] = {"num_workers": 1}
    rec = verify(before, after)["results"][1]
    assert rec["measured_against"] == "earlier run" and abs(rec["measured_speedup"] - 80 / 30) < 0.01
    assert rec["status"] == "confirmed"


def test_an_untuned_run_with_the_found_configuration_is_judged_against_the_final_windows():
    before = _tuned_run("a", final_ms=20)
    same = verify(before, _plain_run("b", {"num_workers": 2, "prefetch_factor": 2}, 21))
    assert same["changed"] == {}
    (r,) = same["results"]
    assert r["kind"] == "reproduces" and r["status"] == "confirmed" and abs(r["measured_speedup"] - 20 / 21) < 0.01
    assert "final windows" in interval_text(r)
    lost = verify(before, _plain_run("b", {"num_workers": 2}, 40))["results"][0]
    assert lost["status"] == "refuted"
    # Another configuration: the diff is taken from the tuned run's final configuration.
    moved = verify(before, _plain_run("b", {"num_workers": 4}, 20))
    assert moved["changed"] == {"train": {"num_workers": [2, 4]}}


def test_the_compare_report_names_the_tuning_change():
    comp = comparison(_plain_run("a", {"num_workers": 0}, 40), _tuned_run("b", final_ms=20))
    text = to_markdown(comp)
    assert "tuned: num_workers 0 -> 2" in text and "against the start windows" in text


def test_the_collector_verifies_a_tuned_run_and_the_run_after_it(tmp_path):
    """Stored records: the run page's summary of a tuned run verifies start -> final, and the
    next run of the same name (untuned, the found configuration) is judged against its final
    windows."""
    import orjson
    from starvewatch.monitor.storage.open_store import open_store
    from starvewatch.monitor.storage.query import Query
    from starvewatch.monitor.web.wire_models import EventBatch
    from tests.test_collector_api import batch
    from tests.test_tuning_chart import tuned_records

    store = open_store(str(tmp_path / "db.sqlite"))
    plain = batch(run_id="run-a", stream="sa", n=64, start_s=1_700_000_000, status="finished")
    tuned = dict(batch(run_id="run-b", stream="sb", n=160, start_s=1_700_001_000, status="finished"), tuning=tuned_records())
    found = batch(run_id="run-c", stream="sc", n=64, start_s=1_700_002_000, status="finished")
    found["loaders"][0]["config"] = {"num_workers": 2, "prefetch_factor": 4}
    for payload in (plain, tuned, found):
        store.ingest(EventBatch.model_validate_json(orjson.dumps(payload)))
    query = Query(store)
    v = query.summary("run-b")["verification"]
    assert v["previous_run"] == "run-a"
    assert v["results"][0]["kind"] == "tuning" and v["results"][0]["measured_against"] == "start windows"
    assert v["changed"]["train"]["num_workers"] == [0, 2] and v["results"][0]["status"] == "confirmed"
    after = query.summary("run-c")["verification"]
    assert after["previous_run"] == "run-b" and after["results"][0]["kind"] == "reproduces"
