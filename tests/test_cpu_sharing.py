"""CPU-bound loading on few cores (issue 25 item 5): the model's prediction shares the cores
between the workers, the training process's measured CPU and the host's other processes;
where what one run cannot pin down moves the prediction a lot, it gives a range. Pure
functions over constructed measurements (tests/test_diagnosis.py's builders), plus one real
Pillow pipeline."""
import os
import random
import time

import pytest
from PIL import Image
from torch.utils.data import DataLoader

import starvewatch
from benchmarks.scenarios.cases import Photos, spin
from starvewatch.dashboard.answer_card import answer
from starvewatch.hooks.report import recommendation_line
from starvewatch.analysis.diagnosis import DEFAULT
from starvewatch.monitor.outputs.export import to_markdown
from starvewatch.analysis.throughput_model import LoaderFacts, shared_cores_step, speedup, speedup_range
from starvewatch.analysis.summary import loader_summary
from tests.test_dashboard_views import _text
from tests.test_diagnosis import loader, run, system

# One loader, num_workers=0, 2 cores: 16 ms of CPU-bound loading on the training thread, then
# 4 ms of compute.
LOAD_MS, COMPUTE_MS = 16.0, 4.0


def measured(compute_cpu_ms: float, others_cores: float = 0.0, others_cores_max: float | None = None,
             workers: int = 0, loop_wall_s: float = 2.0, steps: int = 200):
    """(loader data, system) of that loop: the training process used `compute_cpu_ms` of CPU
    per step beside the loading's, and other processes `others_cores` of the host's 2."""
    data = loader(wait_ms=LOAD_MS, compute_ms=COMPUTE_MS, workers=workers, wait_cpu_fraction=1.0, steps=steps)
    totals = data.totals
    totals.wait_probe_process_cpu_ns = totals.wait_probe_cpu_ns  # loading: the training thread only
    step_ms = LOAD_MS + COMPUTE_MS
    process_cores = (LOAD_MS + compute_cpu_ms) / step_ms
    totals.loop_wall_ns = int(loop_wall_s * 1e9)
    totals.loop_process_cpu_ns = int(process_cores * totals.loop_wall_ns)
    peak = others_cores if others_cores_max is None else others_cores_max
    info = system(cpu_count=2, cpu_pct_mean=100 * (process_cores + others_cores) / 2,
                  cpu_pct_max=100 * (process_cores + peak) / 2, process_cpu_pct_mean=100 * process_cores)
    return data, info


def diagnosed(data, info) -> dict:
    return run(data, system_info=info)


def facts(data, info) -> LoaderFacts:
    return LoaderFacts(loader_summary(data), data, info, None, DEFAULT)


def two_workers(f: LoaderFacts) -> dict:
    return {**f.config, "num_workers": 2}


def naive_speedup(f: LoaderFacts) -> float:
    """The former model: cores fully parallel and free, max(compute, load / workers, load / cores)
    plus the hand-over and the modelled start-up per epoch (2 forked workers, the first batch)."""
    step = max(f.compute, f.load / 2, f.load / f.cores) + DEFAULT.worker_transfer_ms \
        + (DEFAULT.worker_spawn_ms_fork + f.load) * f.epochs / f.steps
    return f.step / step


def test_the_training_process_cpu_is_measured_apart_from_loading():
    f = facts(*measured(compute_cpu_ms=3.0))
    assert f.process_cpu_source == "loop"
    assert f.main_cpu_ms == pytest.approx(3.0, rel=0.01)
    assert f.thread_share == pytest.approx(1.0)
    assert f.others_cores == pytest.approx(0.0, abs=1e-9)


def test_the_training_processs_cpu_lowers_the_prediction():
    """Compute that is CPU work takes cores from the workers; compute that waits (on a GPU)
    leaves them: the same loop, the same waits, a lower speed-up."""
    waiting = facts(*measured(compute_cpu_ms=0.0))
    working = facts(*measured(compute_cpu_ms=4.0))
    assert speedup(working, two_workers(working)) < speedup(waiting, two_workers(waiting)) - 0.1
    # 16 ms of loading and 4 ms of the training process's CPU (plus its hand-over) on 2 cores:
    # at best 20.5 / 2 per batch, not the cores-parallel max(4, 16 / 2).
    assert speedup(working, two_workers(working)) < 20 / (20.5 / 2)
    assert speedup(working, two_workers(working)) < naive_speedup(working) - 0.2


def test_other_processes_cores_lower_the_prediction():
    quiet = facts(*measured(compute_cpu_ms=4.0))
    busy = facts(*measured(compute_cpu_ms=4.0, others_cores=0.8))
    assert busy.others_cores == pytest.approx(0.8)
    assert speedup(busy, two_workers(busy)) < speedup(quiet, two_workers(quiet)) - 0.2
    # The host's cores all taken but this process's own one: workers cannot add any.
    full = facts(*measured(compute_cpu_ms=4.0, others_cores=1.0))
    assert speedup(full, two_workers(full)) < 1.0


def test_one_worker_beside_the_training_thread_on_two_cores_does_not_share():
    """Two runnable threads on two free cores each get a whole one: the step is the longer
    of loading and compute."""
    f = facts(*measured(compute_cpu_ms=4.0))
    step, share = shared_cores_step(f, 1, f.load, f.compute, 0.5, 0.0)
    assert share == pytest.approx(1.0)
    assert step == pytest.approx(f.load, rel=0.01)


def test_more_workers_than_cores_share_them():
    f = facts(*measured(compute_cpu_ms=4.0))
    _, share = shared_cores_step(f, 4, f.load, f.compute, 0.5, 0.0)
    assert share < 0.5  # 4 busy workers and the training thread on 2 cores
    four = speedup(f, {**f.config, "num_workers": 4})
    assert four < 20 / (20.5 / 2)  # never past what the 2 cores can do


def test_a_range_when_the_hosts_load_swings():
    """Other processes took 0.2 cores on average but 1.2 at their peak: the prediction is a
    range around its point."""
    f = facts(*measured(compute_cpu_ms=4.0, others_cores=0.2, others_cores_max=1.2))
    config = two_workers(f)
    low, high = speedup_range(f, config)
    assert low < speedup(f, config) < high
    assert high > low * (1 + DEFAULT.range_min_spread)
    summary = diagnosed(*measured(compute_cpu_ms=4.0, others_cores=0.2, others_cores_max=1.2))
    rec = next(r for r in summary["recommendations"] if r["parameter"] == "num_workers")
    assert rec["suggested"] == 2
    assert rec["expected_speedup_range"][0] < rec["expected_speedup"] < rec["expected_speedup_range"][1]
    plan = summary["plans"][0]
    assert plan["expected_speedup_range"] == rec["expected_speedup_range"]
    # Shown wherever the point is: the console line, the Markdown (and HTML) report, the dashboard.
    likely = f"(likely {rec['expected_speedup_range'][0]:.2f}-{rec['expected_speedup_range'][1]:.2f}x)"
    assert likely in recommendation_line(rec)
    assert likely in to_markdown(summary)
    assert likely in _text(answer(summary))


def test_no_range_on_a_quiet_host_with_long_epochs():
    """Nothing else ran and the unmeasured start-up weighs little over 1,000 steps an epoch:
    the point says it all."""
    summary = diagnosed(*measured(compute_cpu_ms=4.0, steps=2000))
    rec = next(r for r in summary["recommendations"] if r["parameter"] == "num_workers")
    assert "expected_speedup_range" not in rec
    assert "likely" not in recommendation_line(rec)


def test_short_epochs_widen_the_range_by_the_unmeasured_start_up():
    """From num_workers=0 no run measured the workers' spawn: over short epochs it moves the
    prediction, and the range says so even on a quiet host."""
    short = facts(*measured(compute_cpu_ms=4.0, steps=40))
    long = facts(*measured(compute_cpu_ms=4.0, steps=2000))
    assert speedup_range(short, two_workers(short)) is not None
    assert speedup_range(long, two_workers(long)) is None


def test_without_the_process_cpu_the_former_model_holds():
    """Hooks that predate the measurement (no process CPU at all): the cores-parallel model, no range."""
    data, info = measured(compute_cpu_ms=4.0)
    data.totals.loop_wall_ns = data.totals.loop_process_cpu_ns = 0
    del info["process_cpu_pct_mean"]
    f = facts(data, info)
    assert f.main_cpu_ms is None
    assert speedup(f, two_workers(f)) == pytest.approx(naive_speedup(f))
    assert speedup_range(f, two_workers(f)) is None


def test_the_runs_mean_process_cpu_stands_in_for_a_short_loop():
    f = facts(*measured(compute_cpu_ms=4.0, loop_wall_s=0.1))
    assert f.process_cpu_source == "run"
    assert f.main_cpu_ms == pytest.approx(4.0, rel=0.01)


# ---- a real Pillow pipeline (the harness's, on smaller images) --------------------------------
def test_a_real_pillow_pipeline_is_cpu_bound_and_its_prediction_shares_the_cores(tmp_path, monkeypatch):
    from starvewatch.analysis import diagnosis
    monkeypatch.setenv("STARVEWATCH_HOST_INTERVAL_S", "0.1")
    seen = {}
    original = diagnosis.diagnose

    def keep_inputs(summary, loaders, **kwargs):  # the facts the diagnosis saw
        seen.update(summary=summary, loaders=list(loaders), system=kwargs.get("system"))
        return original(summary, loaders, **kwargs)
    monkeypatch.setattr(diagnosis, "diagnose", keep_inputs)
    rng = random.Random(0)
    paths = []
    for i in range(48):
        noise = Image.frombytes("RGB", (160, 160), rng.randbytes(160 * 160 * 3))
        path = os.path.join(tmp_path, f"{i}.jpg")
        noise.save(path, quality=90)
        paths.append(path)
    starvewatch.init("pillow")
    watched = starvewatch.watch(DataLoader(Photos(crop=96, out=64, paths=paths), batch_size=8, num_workers=0), name="train")
    deadline = time.monotonic() + 1.5  # epochs until the sampler measured the loop's CPU a few times
    while time.monotonic() < deadline:
        for _ in watched:
            spin(0.002)  # the training step: CPU work on the training thread
    summary = starvewatch.finish()
    data = seen["loaders"][0]
    assert data.totals.loop_wall_ns > 0.5e9  # the sampler thread measured the loop's CPU
    f = LoaderFacts(summary["loaders"][0], data, seen["system"], None, DEFAULT)
    assert f.process_cpu_source == "loop"
    # The training step's 2 ms of CPU, loading taken out (the sampler's and shipper's threads,
    # the collate's torch threads add a little).
    assert 1.0 < f.main_cpu_ms < 8.0
    # The verdict (the sampled CPU fraction of the waits) is the engine's; on a host other
    # processes fill it can fall under its threshold, so the model is asked as for CPU work.
    f.cpu_busy, f.cpu_weight = True, 1.0
    # Never more than the cores-parallel bound: every CPU part at a whole core, the loading's
    # CPU per batch (its wall time at the share of a core it got) over 2 cores, the step's CPU
    # work beside the part of the step that waits. (On a host other processes fill, the wall
    # times hold waits for a core, which more threads can win back: the bound is the CPU's.)
    share = f.thread_share or 1.0
    cpu_load = f.load * share
    compute_floor = f.compute - min(f.compute, f.main_cpu_ms / share) + f.main_cpu_ms
    parallel = f.step / (max(compute_floor, cpu_load / 2, cpu_load / f.cores) + DEFAULT.worker_transfer_ms)
    assert speedup(f, {**f.config, "num_workers": 2}) < parallel
    rec = next((r for r in summary["recommendations"] if r["parameter"] == "num_workers"), None)
    if summary["verdict"]["limiting_factor"] == "input_bound_cpu" and rec is not None:
        assert rec["suggested"] <= f.cores and rec["evidence"]["main_cpu_ms"] > 0


def test_with_workers_already_loading_the_configuration_as_it_ran_predicts_no_change():
    """Workers already loading CPU-bound, the training process's CPU measured: the shared-cores
    model's prediction of the present configuration is its baseline, so keeping it is 1.0x and a
    change is judged relative to it (the process's CPU already holds part of each hand-over)."""
    f = facts(*measured(compute_cpu_ms=4.0, workers=2))
    f.cpu_busy, f.cpu_weight = True, 1.0  # what the workers' CPU telemetry says of CPU-bound loading (none in this stand-in)
    assert f.workers == 2 and f.main_cpu_ms is not None
    assert speedup(f, dict(f.config)) == pytest.approx(1.0)
    assert speedup(f, {**f.config, "pin_memory": True}) == pytest.approx(1.0)  # costs nothing the model sees
    assert speedup(f, {**f.config, "num_workers": 1}) < 1.0  # fewer workers: slower, not judged on the baseline's error
