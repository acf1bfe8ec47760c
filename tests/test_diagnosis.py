"""The diagnosis engine as pure functions over constructed measurements."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from starvewatch.monitor.analysis import LoaderData, summarize
from starvewatch.monitor.diagnosis import DEFAULT, applied_config, joint_changes_note, verify
from starvewatch.stats import LoaderTotals, RecordStats

MS = 1_000_000


def loader(name="train", steps=200, wait_ms=20.0, compute_ms=10.0, workers=0, epochs=2, first_wait_ms=None,
           persistent=False, prefetch=None, waits=None):
    totals = LoaderTotals(steps=steps, epochs=epochs, wait_ns=int(steps * wait_ms * MS),
                          compute_ns=int(steps * compute_ms * MS), samples=steps * 32)
    rec = RecordStats()
    per_epoch = steps // epochs
    step_idx = [i % per_epoch for i in range(steps)]
    wait_col = waits or [int(wait_ms * MS)] * steps
    if first_wait_ms is not None:
        wait_col = [int(first_wait_ms * MS) if s == 0 else w for s, w in zip(step_idx, wait_col)]
    totals.wait_ns = sum(wait_col)
    rec.add_columns(step_idx, wait_col, [int(compute_ms * MS)] * steps, [None] * steps)
    config = {"num_workers": workers, "batch_size": 32, "pin_memory": False, "persistent_workers": persistent,
              "prefetch_factor": prefetch if workers else None}
    return LoaderData(name=name, config=config, totals=totals, records=rec)


def system(cpu_fraction=None, load_ms=None, name="train", cpu_count=2, **extra):
    out = {"cpu_count": cpu_count, "cpu_pct_mean": 50.0, "gpu_samples": 0,
           "loaders": {name: {"worker_load_ms_mean": load_ms, "worker_cpu_fraction": cpu_fraction}}}
    out.update(extra)
    return out


def run(*loaders, system_info=None, previous=None):
    return summarize({"id": "r", "name": "n"}, list(loaders), system=system_info, previous=previous)


def test_healthy_run_gets_no_recommendation():
    s = run(loader(wait_ms=0.1, compute_ms=10))
    assert s["verdict"]["input_bound"] == "not" and s["verdict"]["limiting_factor"] == "compute_bound"
    assert s["recommendations"] == []


def test_too_few_steps_is_insufficient_data():
    s = run(loader(steps=10, wait_ms=50))
    assert s["loaders"][0]["verdict"] == "insufficient_data" and s["verdict"]["input_bound"] == "insufficient_data"


def test_workers_at_zero_while_starved_gets_a_concrete_count_and_a_valid_dataloader():
    s = run(loader(wait_ms=20, compute_ms=10, workers=0), system_info=system())
    top = s["recommendations"][0]
    assert top["parameter"] == "num_workers" and top["current"] == 0
    assert top["suggested"] == 3  # ceil(20 / 10 x 1.2)
    assert isinstance(top["suggested"], int) and top["expected_speedup"] > 2
    assert top["evidence"]["load_ms_per_batch"] == pytest.approx(20, rel=0.02)
    kwargs = applied_config(s["loaders"][0]["config"], s["recommendations"], "train")
    DataLoader(TensorDataset(torch.zeros(4)), **kwargs)  # torch accepts the combination
    assert kwargs["num_workers"] == 3 and kwargs["persistent_workers"] is True


def test_cpu_bound_workers_are_capped_by_cores_but_latency_bound_ones_are_not():
    cpu = run(loader(wait_ms=30, compute_ms=5, workers=1), system_info=system(cpu_fraction=0.95, load_ms=35))
    latency = run(loader(wait_ms=30, compute_ms=5, workers=1), system_info=system(cpu_fraction=0.05, load_ms=35))
    assert cpu["verdict"]["limiting_factor"] == "input_bound_cpu"
    assert latency["verdict"]["limiting_factor"] == "input_bound_io"
    cpu_rec = next(r for r in cpu["recommendations"] if r["parameter"] == "num_workers")
    lat_rec = next(r for r in latency["recommendations"] if r["parameter"] == "num_workers")
    assert lat_rec["suggested"] == 9  # ceil(35 / 5 x 1.2), past the 2 cores: they sleep
    assert cpu_rec["suggested"] == 2 and "capped" in cpu_rec["reason"]
    assert lat_rec["expected_speedup"] > cpu_rec["expected_speedup"]


def test_cpu_bound_workers_at_the_core_count_get_lighter_transforms():
    s = run(loader(wait_ms=10, compute_ms=5, workers=2, persistent=True),
            system_info=system(cpu_fraction=0.9, load_ms=30))
    assert [r["suggested"] for r in s["recommendations"]][:1] == ["gpu_transforms"]


def test_epoch_startup_stalls_recommend_persistent_workers():
    s = run(loader(wait_ms=1, compute_ms=5, workers=2, epochs=10, steps=200, first_wait_ms=400),
            system_info=system(cpu_fraction=0.2, load_ms=2))
    assert s["verdict"]["limiting_factor"] == "epoch_startup"
    top = s["recommendations"][0]
    assert (top["parameter"], top["current"], top["suggested"]) == ("persistent_workers", False, True)
    assert top["evidence"]["first_batch_wait_ms"] == pytest.approx(400, rel=0.02)


def test_bursty_waits_recommend_a_deeper_prefetch_queue():
    waits = [int(0.1 * MS)] * 200
    for i in range(0, 200, 25):
        waits[i + 1] = int(60 * MS)
    s = run(loader(workers=2, wait_ms=0, compute_ms=20, waits=waits, epochs=1, prefetch=2, persistent=True),
            system_info=system(cpu_fraction=0.1, load_ms=5))
    top = s["recommendations"][0]
    assert top["parameter"] == "prefetch_factor" and top["current"] == 2 and top["suggested"] > 2


def test_shm_pressure_recommends_a_shallower_queue():
    s = run(loader(wait_ms=0.1, compute_ms=20, workers=4, prefetch=8, persistent=True),
            system_info=system(load_ms=2, shm_used_max_bytes=900, shm_total_bytes=1000))
    assert [(r["parameter"], r["suggested"]) for r in s["recommendations"]] == [("prefetch_factor", 2)]


def test_slow_validation_loader_gets_its_own_settings_and_ranking_by_gain():
    s = run(loader("train", wait_ms=0.1, compute_ms=10), loader("val", wait_ms=30, compute_ms=5),
            system_info=system(name="val"))
    assert s["verdict"]["input_bound"] == "high"
    top = s["recommendations"][0]
    assert top["loader"] == "val" and top["parameter"] == "num_workers" and "validation" in top["reason"]
    gains = [r["expected_speedup"] or 0 for r in s["recommendations"]]
    assert gains == sorted(gains, reverse=True)


def test_gpu_underused_without_input_wait_is_host_bound():
    s = run(loader(wait_ms=0.1, compute_ms=10), system_info={"gpu_util_mean": 35.0, "gpu_samples": 5})
    assert s["verdict"]["limiting_factor"] == "host_bound"
    assert s["recommendations"][0]["parameter"] == "batch_size" and s["recommendations"][0]["suggested"] == 64


def test_verify_after_change_confirms_or_refutes_with_measurements():
    before = run(loader(wait_ms=20, compute_ms=10, workers=0), system_info=system())
    good = run(loader(wait_ms=0.5, compute_ms=10, workers=3, persistent=True), previous=before)
    verdicts = {r["parameter"]: r for r in good["verification"]["results"]}
    assert verdicts["num_workers"]["status"] == "confirmed" and verdicts["num_workers"]["measured_speedup"] > 2
    assert good["verification"]["changed"]["train"]["num_workers"] == [0, 3]
    # applied in one run: the measured speed-up is theirs jointly, and the verdict says so
    assert verdicts["num_workers"]["applied_together"] == ["persistent_workers=True"]
    assert joint_changes_note(good["verification"]) == [
        "train: num_workers=3, persistent_workers=True were applied together; the measured speed-up "
        "is theirs jointly, each judged against its own expectation."]
    bad = run(loader(wait_ms=19, compute_ms=10, workers=3, persistent=True), previous=before)
    assert {r["parameter"]: r["status"] for r in bad["verification"]["results"]}["num_workers"] == "refuted"
    assert verify(before, before) is None  # nothing changed: nothing to verify


def test_thresholds_live_in_one_documented_dataclass():
    assert DEFAULT.worker_headroom == 1.2 and DEFAULT.min_gain > 1
    assert "Every number" in type(DEFAULT).__doc__
