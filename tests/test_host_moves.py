"""Where two runs' advice differs, compare and verify-after-change name the host figure that
moved (issue 35 item 5): the same Pillow loop (num_workers=0) diagnosed on a nearly quiet host
and beside other processes, with the model inputs measured in real runs
(tests/data/busy_host_runs.json)."""
from starvewatch.analysis import host_moves
from starvewatch.analysis.compare import comparison
from starvewatch.monitor.outputs import compare_report
from tests.test_busy_host_model import measured_loop
from tests.test_diagnosis import run


def diagnosed(name: str, run_id: str, previous=None) -> dict:
    data, info = measured_loop(name)
    return run(data, system_info=info, previous=previous, meta={"id": run_id})


def test_the_summary_keeps_the_host_figures_its_prediction_rested_on():
    s = diagnosed("pillow_beside_cpu_hog", "hog")
    assert s["host"]["usable_cores"] == 2
    assert abs(s["host"]["host_cpu_pct"] - 95.6) < 0.1
    assert abs(s["host"]["others_cores"] - 1.59) < 0.02
    assert abs(s["host"]["loading_cpu_share"] - 0.544) < 0.01


def test_advice_that_differs_names_the_host_figures_that_moved():
    quiet = diagnosed("pillow_jpeg_workers0_quiet", "quiet")
    busy = diagnosed("pillow_jpeg_workers0_beside_other_session", "busy")
    assert host_moves.top_advice(quiet)["suggested"] == 2 and host_moves.top_advice(busy) is None
    moved = comparison(quiet, busy)["advice_moved"]
    figures = {m["figure"]: m for m in moved["host_moved"]}
    assert set(figures) == {"host_cpu_pct", "others_cores", "loading_cpu_share"}  # 2 usable cores both times
    assert figures["others_cores"]["before"] < 0.2 < 1.3 < figures["others_cores"]["after"]
    assert moved["sentence"].startswith("The advice differs (num_workers=2 (1.55x) before, no change after): "
                                        "the host moved: host CPU busy 56% → 100%; other processes' cores 0.12 → 1.41;")
    assert "the loading's CPU share 1.00 → 0.60" in moved["sentence"]
    # the compare documents carry the sentence
    assert moved["sentence"] in compare_report.to_markdown(comparison(quiet, busy))


def test_the_same_advice_says_nothing_and_unexplained_advice_says_no_figure_moved():
    a, b = diagnosed("pillow_jpeg_workers0_quiet", "a"), diagnosed("pillow_jpeg_workers0_quiet", "b")
    assert comparison(a, b)["advice_moved"] is None
    # the same host, another promise more than 25% apart: the host does not explain it
    b["recommendations"][0]["expected_speedup"] *= 1.5
    moved = comparison(a, b)["advice_moved"]
    assert moved["host_moved"] == [] and "no host figure moved" in moved["sentence"]


def test_verify_after_change_says_the_host_moved_under_the_prediction():
    """The advice made on the quiet host, applied and measured beside another job."""
    quiet = diagnosed("pillow_jpeg_workers0_quiet", "quiet")
    data, info = measured_loop("pillow_jpeg_workers0_beside_other_session")
    data.config = {**data.config, "num_workers": 2, "persistent_workers": True, "prefetch_factor": 2}
    after = run(data, system_info=info, previous=quiet, meta={"id": "after"})
    verification = after["verification"]
    assert [m["figure"] for m in verification["host_moved"]][:2] == ["host_cpu_pct", "others_cores"]
    note = host_moves.verification_note(verification)
    assert note.startswith("The host moved between the two runs (host CPU busy 56% → 100%; other processes' cores")
    assert note in compare_report.to_markdown(comparison(quiet, after))


def test_a_summary_from_before_the_host_figures_falls_back_to_its_system_summary():
    old = diagnosed("pillow_jpeg_workers0_quiet", "old")
    old.pop("host")
    new = diagnosed("pillow_jpeg_workers0_beside_other_session", "new")
    figures = [m["figure"] for m in host_moves.moved(old, new)]
    assert figures == ["host_cpu_pct"]  # what an older summary has: the host's CPU and its cores
