"""The diagnosis engine as pure functions over constructed measurements: every rule in
`RULES` fires on a case built for it, one answer per setting, joint predictions, cores per
host, batching kept, verify-after-change by samples/s."""
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

from starvewatch.analysis.summary import LoaderData, summarize
from starvewatch.analysis.diagnosis import DEFAULT, applied_config, joint_changes_note, verify
from starvewatch.monitor.outputs.export import snippet
from starvewatch.analysis.throughput_model import ranks_per_host
from starvewatch.analysis.rules import RULES
from starvewatch.stats import LoaderTotals, RecordStats

MS = 1_000_000
GIB = 2**30
# A GPU 35% busy whose memory has room for twice the batch (10 of 80 GiB at peak).
GPU_ROOM = {"gpu_util_mean": 35.0, "gpu_samples": 5, "gpu_mem_used_max_bytes": 10 * GIB, "gpu_mem_total_bytes": 80 * GIB}


def loader(name="train", steps=200, wait_ms=20.0, compute_ms=10.0, workers=0, epochs=2, first_wait_ms=None,
           persistent=False, prefetch=None, waits=None, batch_size=32, batch_sampler="BatchSampler",
           ranks=(0,), compute_jitter_ms=0.0, wait_cpu_fraction=None):
    samples_per_step = batch_size or 32
    totals = LoaderTotals(steps=steps, epochs=epochs, wait_ns=int(steps * wait_ms * MS),
                          compute_ns=int(steps * compute_ms * MS), samples=steps * samples_per_step)
    if wait_cpu_fraction is not None:  # the sampled waits and the training thread's CPU in them
        totals.wait_probe_ns, totals.wait_probe_cpu_ns = 100 * MS, int(100 * MS * wait_cpu_fraction)
    rec = RecordStats()
    per_epoch = steps // epochs
    step_idx = [i % per_epoch for i in range(steps)]
    wait_col = waits or [int(wait_ms * MS)] * steps
    if first_wait_ms is not None:
        wait_col = [int(first_wait_ms * MS) if s == 0 else w for s, w in zip(step_idx, wait_col)]
    totals.wait_ns = sum(wait_col)
    computes = [int((compute_ms + (compute_jitter_ms if i % 2 else -compute_jitter_ms)) * MS) for i in range(steps)]
    totals.compute_ns = sum(computes)
    rec.add_columns(step_idx, wait_col, computes, [None] * steps)
    config = {"num_workers": workers, "batch_size": batch_size, "pin_memory": False, "persistent_workers": persistent,
              "prefetch_factor": (prefetch or 2) if workers else None,
              "batch_sampler": batch_sampler if batch_size or batch_sampler != "BatchSampler" else None}
    return LoaderData(name=name, config=config, totals=totals, records=rec, ranks=list(ranks))


def system(cpu_fraction=None, load_ms=None, name="train", cpu_count=2, **extra):
    out = {"cpu_count": cpu_count, "cpu_pct_mean": 50.0, "gpu_samples": 0,
           "loaders": {name: {"worker_load_ms_mean": load_ms, "worker_cpu_fraction": cpu_fraction}}}
    out.update(extra)
    return out


def run(*loaders, system_info=None, previous=None, meta=None):
    return summarize({"id": "r", "name": "n", **(meta or {})}, list(loaders), system=system_info, previous=previous)


def fired(summary) -> list[tuple]:
    return [(r["loader"], r["parameter"], r["suggested"], r["kind"]) for r in summary["recommendations"]]


# ---- one case per rule ----------------------------------------------------------------------
def case_not_a_dataloader():
    data = loader(wait_ms=20, compute_ms=10)
    data.config = None
    return run(data, system_info=system())


def case_more_workers():
    return run(loader(wait_ms=20, compute_ms=10, workers=0), system_info=system())


def case_main_process_share():
    # 4 workers load a batch in 8 ms (they keep up with 10 ms of compute), yet the loop waits
    # 20 ms, 90% of it on its own CPU: receiving and rebuilding batches
    return run(loader(wait_ms=20, compute_ms=10, workers=4, persistent=True, wait_cpu_fraction=0.9),
               system_info=system(cpu_fraction=0.1, load_ms=8))


def case_lighter_transforms():
    return run(loader(wait_ms=10, compute_ms=5, workers=2, persistent=True),
               system_info=system(cpu_fraction=0.9, load_ms=30))


def case_persistent_workers():
    return run(loader(wait_ms=1, compute_ms=5, workers=2, epochs=10, steps=200, first_wait_ms=400),
               system_info=system(cpu_fraction=0.2, load_ms=2))


def case_build_once():
    # 2 workers, persistent, but the loader is built anew every epoch (9 re-creations)
    data = loader(wait_ms=1, compute_ms=5, workers=2, epochs=10, steps=200, first_wait_ms=400, persistent=True)
    data.totals.rebuilds = 9
    return run(data, system_info=system(cpu_fraction=0.2, load_ms=2))


def case_deeper_prefetch():
    waits = [int(0.1 * MS)] * 200
    for i in range(0, 200, 25):
        waits[i + 1] = int(60 * MS)
    return run(loader(workers=2, wait_ms=0, compute_ms=20, waits=waits, epochs=1, prefetch=2, persistent=True),
               system_info=system(cpu_fraction=0.1, load_ms=5))


def case_faster_storage():
    return run(loader(wait_ms=20, compute_ms=10, workers=2, persistent=True),
               system_info=system(cpu_fraction=0.1, load_ms=60, iowait_pct_mean=45.0))


def case_pin_memory():
    return run(loader(wait_ms=20, compute_ms=10, workers=0),
               system_info=system(gpu_samples=4, gpu_util_mean=30.0))


def case_cpu_oversubscribed():
    return run(loader(wait_ms=10, compute_ms=5, workers=8, persistent=True),
               system_info=system(cpu_fraction=0.95, load_ms=80, cpu_pct_mean=97.0))


def case_memory_budget():
    # 4 workers x 8 batches of 1 MiB; /dev/shm has 20 MiB for us: 0.8 x 20 = 16 MiB -> depth 4
    return run(loader(wait_ms=0.1, compute_ms=20, workers=4, prefetch=8, persistent=True),
               system_info=system(load_ms=2, shm_total_bytes=100 * 2**20, shm_used_min_bytes=80 * 2**20,
                                  shm_used_max_bytes=112 * 2**20))


def case_larger_batches():
    return run(loader(wait_ms=0.1, compute_ms=10), system_info=GPU_ROOM)


def skewed(sampler="RandomSampler", in_order=True, waits=None):
    """3 workers, one 10x slower (8 vs 80 ms a batch): in order, the loop (12 ms of compute)
    waits 15 ms a step for it, 60% of that while later batches were ready."""
    data = loader(wait_ms=15, compute_ms=12, workers=3, persistent=True, epochs=1, waits=waits)
    data.config.update(sampler=sampler, in_order=in_order)
    t, steps = data.totals, data.totals.steps
    t.attributed_steps, t.attributed_wait_ns = steps, t.wait_ns
    t.wait_fetch_ns, t.wait_handover_ns = t.wait_ns * 9 // 10, t.wait_ns - t.wait_ns * 9 // 10
    t.hol_wait_ns = t.wait_ns * 6 // 10
    t.worker_wait_ns, t.worker_hol_ns = [0, t.wait_fetch_ns, 0], [0, t.hol_wait_ns, 0]
    t.worker_batches = [67, 67, 66]
    t.worker_batch_ns = [67 * 8 * MS, 67 * 80 * MS, 66 * 8 * MS]
    return data


def case_out_of_order():
    return run(skewed(), system_info=system(cpu_fraction=0.1, load_ms=32))


CASES = {"not_a_dataloader": (case_not_a_dataloader, ("train", None, "DataLoader(num_workers=3)", "speedup")),
         "more_workers": (case_more_workers, ("train", "num_workers", 3, "speedup")),
         "main_process_share": (case_main_process_share, ("train", None, "lighter_batches", "speedup")),
         "lighter_transforms": (case_lighter_transforms, ("train", None, "gpu_transforms", "speedup")),
         "persistent_workers": (case_persistent_workers, ("train", "persistent_workers", True, "speedup")),
         "build_once": (case_build_once, ("train", None, "build_once", "speedup")),
         "deeper_prefetch": (case_deeper_prefetch, ("train", "prefetch_factor", 6, "speedup")),  # 2 x p99 / compute
         "faster_storage": (case_faster_storage, ("train", None, "faster_storage", "speedup")),
         "pin_memory": (case_pin_memory, ("train", "pin_memory", True, "protective")),
         "cpu_oversubscribed": (case_cpu_oversubscribed, ("train", "num_workers", 2, "protective")),
         "memory_budget": (case_memory_budget, ("train", "prefetch_factor", 4, "protective")),
         "larger_batches": (case_larger_batches, ("train", "batch_size", 64, "speedup")),
         "out_of_order": (case_out_of_order, ("train", "in_order", False, "speedup"))}


def test_in_order_false_is_predicted_from_the_workers_batch_times_and_only_where_the_order_is_free():
    s = case_out_of_order()
    [rec] = [r for r in s["recommendations"] if r["parameter"] == "in_order"]
    # In order the 80 ms worker paces every round of 3 (26.7 ms a batch, 27 ms steps now);
    # out of order the three serve 1 / (1/8 + 1/80 + 1/8) = 3.8 ms a batch: compute-bound at 12.
    assert 2.0 < rec["expected_speedup"] < 2.4, rec
    [finding] = [f for f in s["findings"] if f["kind"] == "head_of_line"]
    assert finding["detail"]["worker"] == 1 and finding["detail"]["order_free"] is True
    # The line to copy carries the change (it was None: in_order was no argument it wrote).
    line = snippet(skewed().config, s["recommendations"], "train")
    assert "in_order=False" in line and "shuffle=True" in line and "num_workers=3" in line, line
    for data in (skewed(sampler="SequentialSampler"), skewed(in_order=False)):
        s = run(data, system_info=system(cpu_fraction=0.1, load_ms=32))
        assert not [r for r in s["recommendations"] if r["parameter"] == "in_order"]
    # In order the slow worker's batches come as bursts (a long wait every third step, the
    # others short): those go with in_order=False, not into the prediction after it.
    bursty = skewed(waits=[int((41 if i % 3 == 0 else 2) * MS) for i in range(200)])
    s = run(bursty, system_info=system(cpu_fraction=0.1, load_ms=32))
    [rec] = [r for r in s["recommendations"] if r["parameter"] == "in_order"]
    assert rec["expected_speedup"] > 1.5, rec
    assert not [r for r in s["recommendations"] if r["parameter"] == "prefetch_factor"]
    # A torch without in_order (before 2.6): named, with the version that has it, no advice.
    data = skewed()
    del data.config["in_order"]
    s = run(data, system_info=system(cpu_fraction=0.1, load_ms=32))
    assert not [r for r in s["recommendations"] if r["parameter"] == "in_order"]
    [finding] = [f for f in s["findings"] if f["kind"] == "head_of_line"]
    assert "torch 2.6" in finding["fix"]


def test_every_rule_has_a_case():
    assert sorted(CASES) == sorted(rule.name for rule in RULES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fires_on_its_case_with_a_valid_configuration(name):
    build, expected = CASES[name]
    s = build()
    assert expected in fired(s)
    for r in s["recommendations"]:
        assert r["kind"] in ("speedup", "protective") and r["measured"] is False
        if r["kind"] == "speedup":
            assert r["expected_speedup"] > DEFAULT.min_gain
        else:
            assert r["expected_speedup"] is None and r["risk"]
    for part in s["loaders"]:  # every recommended configuration constructs a DataLoader
        if part["config"]:
            DataLoader(TensorDataset(torch.zeros(8)), **applied_config(part["config"], s["recommendations"], part["name"]))


def test_healthy_run_gets_no_recommendation():
    s = run(loader(wait_ms=0.1, compute_ms=10))
    assert s["verdict"]["input_bound"] == "not" and s["verdict"]["limiting_factor"] == "compute_bound"
    assert s["recommendations"] == [] and s["plans"] == []


def test_too_few_steps_is_insufficient_data():
    s = run(loader(steps=10, wait_ms=50))
    assert s["loaders"][0]["verdict"] == "insufficient_data" and s["verdict"]["input_bound"] == "insufficient_data"


def test_workers_at_zero_get_a_concrete_count_and_the_plan_is_the_shown_advice():
    s = case_more_workers()
    top = s["recommendations"][0]
    assert (top["parameter"], top["current"], top["suggested"]) == ("num_workers", 0, 3)  # ceil(20 / 10 x 1.2)
    assert top["evidence"]["load_ms"] == pytest.approx(20, rel=0.02) and top["evidence"]["workers_needed"] == 3
    assert top["expected_speedup"] > 2
    plan = s["plans"][0]
    assert plan["config"] == applied_config(s["loaders"][0]["config"], s["recommendations"], "train")
    # iterated twice: the workers come with persistent_workers=True (issue 35 item 3)
    assert plan["changes"] == {"num_workers": 3, "persistent_workers": True}
    assert snippet(s["loaders"][0]["config"], s["recommendations"], "train") == \
        "DataLoader(dataset, batch_size=32, num_workers=3, persistent_workers=True)"


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


def test_a_saturated_host_rations_cpu_time_so_a_lower_fraction_is_cpu_bound():
    quiet = run(loader(wait_ms=30, compute_ms=5, workers=1), system_info=system(cpu_fraction=0.25, load_ms=35))
    busy = run(loader(wait_ms=30, compute_ms=5, workers=1),
               system_info=system(cpu_fraction=0.25, load_ms=35, cpu_pct_mean=99.0))
    sleeping = run(loader(wait_ms=30, compute_ms=5, workers=1),
                   system_info=system(cpu_fraction=0.04, load_ms=35, cpu_pct_mean=99.0))
    assert quiet["verdict"]["limiting_factor"] == "input_bound_io"
    assert busy["verdict"]["limiting_factor"] == "input_bound_cpu"
    assert sleeping["verdict"]["limiting_factor"] == "input_bound_io"
    # there the whole fetch is the transforms' doing (running, or waiting for a core)
    cores_full = run(loader(wait_ms=10, compute_ms=5, workers=2, persistent=True),
                     system_info=system(cpu_fraction=0.2, load_ms=30, cpu_pct_mean=99.0))
    top = cores_full["recommendations"][0]
    assert top["suggested"] == "gpu_transforms"
    # the epoch's start (60 ms) loses the first batch's load (30 ms) as well
    assert top["expected_speedup"] == pytest.approx(15 / (5 + 0.5 + (60 - 30) / 200), rel=0.02)


def test_cpu_bound_at_the_core_count_gets_lighter_transforms_and_never_more_workers():
    s = case_lighter_transforms()
    assert [r["parameter"] for r in s["recommendations"]] == [None]
    # the CPU part of loading (90%) leaves the host: 30 ms -> 3 ms a batch, 15 ms -> 5.5 ms a step
    # (and the epoch's start, 60 ms, the 27 ms of CPU its first batch's load no longer takes)
    assert s["recommendations"][0]["expected_speedup"] == pytest.approx(15 / (5 + 0.5 + (60 - 27) / 200), rel=0.05)


def test_storage_bound_reads_get_faster_storage_not_more_workers():
    """High machine-wide iowait: the readers are blocked on the device, so more of them only
    queue; the gain claimed is the one if reads cost nothing (the CPU share of loading stays)."""
    s = case_faster_storage()  # load 60 ms per batch on 2 workers against 10 ms of compute
    assert [r["parameter"] for r in s["recommendations"]] == [None]
    rec = s["recommendations"][0]
    assert rec["suggested"] == "faster_storage" and "iowait 45%" in rec["reason"]
    # reads free: 60 ms x 0.1 CPU = 6 ms of loading on 2 workers, under the 10 ms of compute
    assert rec["expected_speedup"] == pytest.approx(30 / 10.5, rel=0.02)
    lighter_cpu = run(loader(wait_ms=20, compute_ms=10, workers=2, persistent=True),
                      system_info=system(cpu_fraction=0.6, load_ms=60, iowait_pct_mean=45.0))
    assert lighter_cpu["recommendations"][0]["expected_speedup"] < rec["expected_speedup"]
    quiet_disk = run(loader(wait_ms=20, compute_ms=10, workers=2, persistent=True),
                     system_info=system(cpu_fraction=0.1, load_ms=60, iowait_pct_mean=5.0))
    assert [r["parameter"] for r in quiet_disk["recommendations"]] == ["num_workers"]


def test_workers_that_fill_the_cores_are_cpu_bound_even_when_the_host_reads_unsaturated():
    """6 workers spinning on 2 cores each get a third of a core (CPU fraction 0.35, under the
    0.5 of a CPU-bound fetch) and a short run's host figure may read 80%: the workers' own
    counters say they use 2.1 cores, all there are."""
    s = run(loader(wait_ms=10, compute_ms=4, workers=6, persistent=True),
            system_info=system(cpu_fraction=0.35, load_ms=48, cpu_pct_mean=80.0))
    assert s["verdict"]["limiting_factor"] == "input_bound_cpu"
    kinds = {(r["parameter"], r["suggested"], r["kind"]) for r in s["recommendations"]}
    assert (None, "gpu_transforms", "speedup") in kinds and ("num_workers", 2, "protective") in kinds
    assert not any(r["parameter"] == "num_workers" and r["kind"] == "speedup" for r in s["recommendations"])
    protective = next(r for r in s["recommendations"] if r["kind"] == "protective")
    assert "uses 2.1 cores" in protective["reason"]
    sleeping = run(loader(wait_ms=10, compute_ms=4, workers=6, persistent=True),
                   system_info=system(cpu_fraction=0.1, load_ms=48, cpu_pct_mean=80.0))
    assert sleeping["verdict"]["limiting_factor"] == "input_bound_io"


def test_the_main_process_share_is_named_and_more_workers_are_not_advised():
    s = case_main_process_share()
    assert s["verdict"]["limiting_factor"] == "input_bound_main"
    assert [r["parameter"] for r in s["recommendations"]] == [None]
    top = s["recommendations"][0]
    assert top["evidence"]["main_share_ms"] == pytest.approx(18, rel=0.02)  # 90% of the 20 ms wait on CPU
    # the hand-over falls from 18 ms to 0.5 ms: 30 ms -> max(10, 8 / 4) + 0.5 + 60 / 200 ms
    assert top["expected_speedup"] == pytest.approx(30 / (10.5 + 60 / 200), rel=0.02)
    latency = run(loader(wait_ms=20, compute_ms=10, workers=1, persistent=True, wait_cpu_fraction=0.02),
                  system_info=system(cpu_fraction=0.05, load_ms=30))
    assert latency["verdict"]["limiting_factor"] == "input_bound_io"  # blocked on the queue: workers
    assert latency["recommendations"][0]["parameter"] == "num_workers"


def test_a_hand_over_beside_bursts_is_not_main_bound():
    """A 1.2 ms hand-over on the training thread's CPU (most waits), and a 60 ms read every 25th
    batch that workers keeping up on average cannot absorb: the bursts are most of the wait, so
    the answer is a deeper queue, not lighter batches (the bursty scenario of the harness)."""
    waits = [int(1.2 * MS)] * 200
    for i in range(0, 200, 25):
        waits[i + 1] = int(60 * MS)
    bursty = run(loader(workers=2, wait_ms=0, compute_ms=20, waits=waits, epochs=1, prefetch=2, persistent=True,
                        wait_cpu_fraction=0.8), system_info=system(cpu_fraction=0.1, load_ms=5))
    assert bursty["verdict"]["limiting_factor"] == "input_bound_io"
    assert bursty["recommendations"][0]["parameter"] == "prefetch_factor"
    assert all(r["suggested"] != "lighter_batches" for r in bursty["recommendations"])
    # The same hand-over with no bursts is the whole wait: main-bound.
    steady = run(loader(workers=2, wait_ms=0, compute_ms=20, waits=[int(1.2 * MS)] * 200, epochs=1, prefetch=2,
                        persistent=True, wait_cpu_fraction=0.8), system_info=system(cpu_fraction=0.1, load_ms=5))
    assert steady["verdict"]["limiting_factor"] == "input_bound_main"


def test_epoch_startup_is_named_and_measured():
    s = case_persistent_workers()
    assert s["verdict"]["limiting_factor"] == "epoch_startup"
    top = s["recommendations"][0]
    assert top["evidence"]["first_batch_wait_ms"] == pytest.approx(400, rel=0.02)


def test_one_answer_per_setting_under_memory_pressure():
    """A starved loader under a memory bound gets one num_workers: the largest that fits."""
    s = run(loader(wait_ms=30, compute_ms=5, workers=2, persistent=True),
            system_info=system(cpu_fraction=0.05, load_ms=35, mem_available_min_bytes=2 * GIB,
                               loaders={"train": {"worker_load_ms_mean": 35, "worker_cpu_fraction": 0.05,
                                                  "worker_mem_bytes_max": GIB // 2}}))
    workers = [r for r in s["recommendations"] if r["parameter"] == "num_workers"]
    # free 2 GiB + 2 x 0.5 GiB held, less 20% = 2.4 GiB -> 4 workers of 0.5 GiB (9 wanted)
    assert [(r["suggested"], r["kind"]) for r in workers] == [(4, "speedup")]
    assert "memory allows at most 4 workers" in workers[0]["reason"]
    assert workers[0]["evidence"]["workers_needed"] == 9 and workers[0]["evidence"]["worker_mem_bytes"] == GIB // 2
    assert s["plans"][0]["config"]["num_workers"] == 4


def test_memory_bound_below_current_workers_is_protective_and_shown_apart():
    s = run(loader(wait_ms=30, compute_ms=5, workers=8, persistent=True),
            system_info=system(cpu_fraction=0.05, load_ms=300, mem_available_min_bytes=GIB // 4,
                               loaders={"train": {"worker_load_ms_mean": 300, "worker_cpu_fraction": 0.05,
                                                  "worker_mem_bytes_max": GIB // 2}}))
    workers = [r for r in s["recommendations"] if r["parameter"] == "num_workers"]
    # (0.25 + 8 x 0.5) x 0.8 = 3.4 GiB -> 6 workers, although the loading wants more
    assert [(r["suggested"], r["kind"]) for r in workers] == [(6, "protective")]
    assert workers[0]["expected_speedup"] is None and "OOM" in workers[0]["risk"]
    assert s["plans"][0]["config"]["num_workers"] == 6


def test_joint_prediction_is_one_model_run_not_a_product():
    s = run(loader(wait_ms=10, compute_ms=5, workers=1, epochs=10, steps=400, first_wait_ms=300),
            system_info=system(cpu_fraction=0.1, load_ms=12))
    gains = {r["parameter"]: r["expected_speedup"] for r in s["recommendations"]}
    assert set(gains) == {"num_workers", "persistent_workers"}
    plan = s["plans"][0]
    assert plan["changes"] == {"num_workers": 3, "persistent_workers": True}
    # now: (10 x 300 + 390 x 10) / 400 + 5 = 22.25 ms; after: max(5, 12 / 3) + 0.5 + 435 / 400 ms
    # (the start-up measured with 1 worker, 290 ms, for 3 workers on 2 cores: x 3/2)
    # (and each of the 9 later epochs begins with an empty queue: one 12 ms load)
    assert plan["expected_speedup"] == pytest.approx(22.25 / (5.5 + 290 * 1.5 / 400 + 12 * 9 / 400), rel=0.01)
    # the workers are advised with persistent_workers=True (iterated 10 times): the same joint gain
    assert gains["num_workers"] == plan["expected_speedup"]
    assert gains["persistent_workers"] == pytest.approx(22.25 / (12.5 + 290 / 400 + 12 * 9 / 400), rel=0.01)


def test_protective_advice_follows_the_speedups():
    s = case_pin_memory()
    kinds = [r["kind"] for r in s["recommendations"]]
    assert kinds == sorted(kinds, key=lambda k: k != "speedup") and kinds[0] == "speedup" and "protective" in kinds


# ---- cores per host -------------------------------------------------------------------------
def test_ranks_per_host_from_local_world_size_then_hostnames():
    hosts = {str(r): f"node{r // 8}" for r in range(64)}  # 8 hosts x 8 ranks
    assert ranks_per_host({"local_world_size": 4, "rank_hosts": hosts}, list(range(64))) == (4, "LOCAL_WORLD_SIZE")
    assert ranks_per_host({"rank_hosts": hosts}, list(range(64))) == (8, "hostnames")
    uneven = {"0": "a", "1": "a", "2": "a", "3": "b"}
    assert ranks_per_host({"rank_hosts": uneven}, [0, 1, 2, 3]) == (3, "hostnames")
    assert ranks_per_host({}, [0, 1, 2]) == (1, "one rank assumed")


def test_64_ranks_on_96_core_hosts_get_12_cores_each_not_1():
    ranks = list(range(64))
    hosts = {str(r): f"node{r // 8}" for r in ranks}
    s = run(loader(wait_ms=30, compute_ms=5, workers=1, ranks=ranks),
            system_info=system(cpu_fraction=0.95, load_ms=60, cpu_count=96), meta={"rank_hosts": hosts})
    top = s["recommendations"][0]
    assert (top["parameter"], top["suggested"]) == ("num_workers", 12)  # ceil(60/5x1.2)=15, capped at 96/8
    assert top["evidence"]["cores"] == 12 and top["evidence"]["ranks_per_host"] == 8


# ---- batching kept ------------------------------------------------------------------------
def test_batch_size_none_keeps_automatic_batching_off():
    s = run(loader(wait_ms=0.1, compute_ms=10, batch_size=None, batch_sampler=None),
            system_info=GPU_ROOM)
    top = s["recommendations"][0]
    assert (top["parameter"], top["suggested"]) == (None, "larger_batches") and "batch_size=None" in top["reason"]
    assert top["expected_speedup"] == pytest.approx(2 / 1.35, rel=0.01)
    starved = run(loader(wait_ms=20, compute_ms=10, batch_size=None, batch_sampler=None), system_info=system())
    kwargs = applied_config(starved["loaders"][0]["config"], starved["recommendations"], "train")
    assert kwargs["batch_size"] is None and kwargs["num_workers"] == 3
    batches = DataLoader(TensorDataset(torch.zeros(8, 3)), **kwargs)
    assert next(iter(batches))[0].shape == (3,)  # items pass through unbatched, as before


def test_custom_batch_sampler_is_kept():
    s = run(loader(wait_ms=20, compute_ms=10, batch_size=None, batch_sampler="BucketSampler"), system_info=system())
    kwargs = applied_config(s["loaders"][0]["config"], s["recommendations"], "train")
    assert "batch_size" not in kwargs and kwargs["num_workers"] == 3
    data = TensorDataset(torch.zeros(8, 3))
    DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 4, False), **kwargs)
    assert snippet(s["loaders"][0]["config"], s["recommendations"], "train") == \
        "num_workers=3, persistent_workers=True"  # a batch sampler of the user's own: only the arguments to change
    host = run(loader(wait_ms=0.1, compute_ms=10, batch_size=None, batch_sampler="BucketSampler"),
               system_info=GPU_ROOM)
    assert "batch_sampler (BucketSampler)" in host["recommendations"][0]["reason"]


# ---- verify after change ------------------------------------------------------------------
def test_verify_confirms_a_real_gain_with_its_interval():
    before = case_more_workers()
    good = run(loader(wait_ms=0.5, compute_ms=10, workers=3, compute_jitter_ms=1, persistent=True), previous=before)
    result = {r["parameter"]: r for r in good["verification"]["results"]}["num_workers"]
    assert result["status"] == "confirmed" and result["basis"] == "samples/s"
    low, high = result["interval"]
    assert low < result["measured_speedup"] < high
    assert result["measured_speedup"] == pytest.approx(30 / 10.5, rel=0.01)
    assert good["verification"]["changed"]["train"]["num_workers"] == [0, 3]
    bad = run(loader(wait_ms=19, compute_ms=10, workers=3, persistent=True), previous=before)
    assert {r["parameter"]: r["status"] for r in bad["verification"]["results"]}["num_workers"] == "refuted"
    assert verify(before, before) is None  # nothing changed: nothing to verify


def test_verify_is_inconclusive_when_the_spread_hides_the_difference():
    before = case_more_workers()
    waits = [int((1 if i % 2 else 35) * MS) for i in range(6)]
    noisy = run(loader(waits=waits, compute_ms=10, workers=3, compute_jitter_ms=9.9, steps=6, epochs=1, persistent=True),
                previous=before)
    result = {r["parameter"]: r for r in noisy["verification"]["results"]}["num_workers"]
    assert result["interval"][0] < 1 < result["interval"][1] and result["status"] == "inconclusive"


def test_a_batch_size_change_is_judged_per_sample():
    before = case_larger_batches()
    after = run(loader(wait_ms=0.1, compute_ms=13.5, batch_size=64), previous=before)
    result = after["verification"]["results"][0]
    # batches/s fell (13.6 ms a step instead of 10.1) but samples/s rose 1.48x
    assert after["loaders"][0]["batches_per_s"] < before["loaders"][0]["batches_per_s"]
    assert result["status"] == "confirmed" and result["measured_speedup"] == pytest.approx(2 * 10.1 / 13.6, rel=0.01)


def test_changes_applied_together_are_judged_against_the_joint_prediction():
    before = run(loader(wait_ms=10, compute_ms=5, workers=1, epochs=10, steps=400, first_wait_ms=300),
                 system_info=system(cpu_fraction=0.1, load_ms=12))
    after = run(loader(wait_ms=0.5, compute_ms=5, workers=3, epochs=10, steps=400, persistent=True), previous=before)
    results = {r["parameter"]: r for r in after["verification"]["results"]}
    assert results["num_workers"]["judged_against"] == before["plans"][0]["expected_speedup"]
    assert results["num_workers"]["applied_together"] == ["persistent_workers=True"]
    assert joint_changes_note(after["verification"]) == [
        "train: num_workers=3, persistent_workers=True were applied together; the measured speed-up "
        "is theirs jointly, judged against their joint prediction."]


def test_thresholds_live_in_one_documented_dataclass():
    assert DEFAULT.worker_headroom == 1.2 and DEFAULT.min_gain > 1 and DEFAULT.memory_reserve_fraction == 0.2
    assert "Every number" in type(DEFAULT).__doc__


def test_the_training_process_reports_local_world_size_for_the_diagnosis(monkeypatch):
    from starvewatch.hooks.identity import rank_info
    assert rank_info()["local_world_size"] is None  # not under torchrun: one rank assumed
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    meta = rank_info()
    assert meta["local_world_size"] == 4
    assert ranks_per_host(meta, [meta["rank"]]) == (4, "LOCAL_WORLD_SIZE")


def test_slow_workers_with_long_tail_waits_still_get_more_workers():
    """Long waits from workers that do not keep up are not 'bursts' a deeper queue absorbs:
    counted twice they made every worker count look useless and the advice vanished."""
    waits = [int(8 * MS)] * 200
    for i in range(0, 200, 10):
        waits[i + 1] = int(400 * MS)
    s = run(loader(workers=6, compute_ms=9.5, waits=waits, epochs=1, persistent=True),
            system_info=system(cpu_fraction=0.07, load_ms=238))
    top = s["recommendations"][0]
    assert top["parameter"] == "num_workers" and top["suggested"] > 6 and top["expected_speedup"] > 1.5


def test_a_saturated_cpu_does_not_cap_workers_whose_loading_waits():
    """Issue 35 item 4: loading that waits (reads, latency; workers at 3% CPU) is sized by its
    latency however busy the host: a sleeping worker takes no core (measured 1.69x for 4
    workers at >= 90% host CPU where the old cap gave no advice at all)."""
    free = run(loader(wait_ms=30, compute_ms=5, workers=1), system_info=system(cpu_fraction=0.03, load_ms=35))
    busy = run(loader(wait_ms=30, compute_ms=5, workers=1),
               system_info=system(cpu_fraction=0.03, load_ms=35, cpu_pct_mean=99.0))
    assert next(r for r in free["recommendations"] if r["parameter"] == "num_workers")["suggested"] == 9
    rec = next(r for r in busy["recommendations"] if r["parameter"] == "num_workers")
    assert rec["suggested"] == 9 and "capped" not in rec["reason"] and "waiting" in rec["reason"]
    # CPU-bound loading on the same busy host is still capped at the cores
    cpu = run(loader(wait_ms=30, compute_ms=5, workers=1),
              system_info=system(cpu_fraction=0.9, load_ms=35, cpu_pct_mean=99.0))
    assert next(r for r in cpu["recommendations"] if r["parameter"] == "num_workers")["suggested"] == 2


def test_host_rates_weigh_by_the_interval_each_sample_covers():
    """The last host sample is taken at stop and may cover a fraction of a second of
    teardown: it must not count as much as a whole interval of training."""
    from starvewatch.analysis.system import overview
    samples = [("samples", {"kind": "host", "iowait_pct": 40.0, "cpu_pct": 20.0, "interval_s": 1.0}),
               ("samples", {"kind": "host", "iowait_pct": 40.0, "cpu_pct": 20.0, "interval_s": 1.0}),
               ("samples", {"kind": "host", "iowait_pct": 0.0, "cpu_pct": 90.0, "interval_s": 0.2})]
    out = overview(samples)
    assert out["iowait_pct_mean"] == pytest.approx(80 / 2.2)
    assert out["cpu_pct_mean"] == pytest.approx((40 + 18) / 2.2)
    older = overview([(k, {f: v for f, v in e.items() if f != "interval_s"}) for k, e in samples])
    assert older["iowait_pct_mean"] == pytest.approx(80 / 3)  # without intervals: one second each


def test_in_order_false_is_verified_after_the_change_like_any_advice():
    before = case_out_of_order()
    after = loader(wait_ms=1, compute_ms=12, workers=3, persistent=True, epochs=1)
    after.config.update(sampler="RandomSampler", in_order=False)
    s = run(after, system_info=system(cpu_fraction=0.1, load_ms=32), previous=before)
    [result] = s["verification"]["results"]
    assert (result["parameter"], result["applied"], result["status"]) == ("in_order", True, "confirmed")
    assert s["verification"]["changed"] == {"train": {"in_order": [True, False]}}


# ---- records no real loader makes: a summary still finishes -----------------------------------
def test_a_load_a_billion_times_the_compute_plans_at_most_max_workers(monkeypatch):
    """Found by tests/test_fuzz_api.py under load: a stored loader waiting 1 s per step against
    1 ns of compute sized ~10^9 workers, and worker_plan predicted every count up to it, so the
    collector's GET of that run's summary never answered. Each count is one `speedup` call:
    counted here (and stopped past any bound), so the test fails at once rather than hanging."""
    from starvewatch.analysis import rules
    calls = {"n": 0}
    real = rules.speedup

    def counted(*args, **kwargs):
        calls["n"] += 1
        assert calls["n"] <= 10_000, "worker_plan predicts worker counts without a bound"
        return real(*args, **kwargs)

    monkeypatch.setattr(rules, "speedup", counted)
    s = run(loader(steps=20, wait_ms=1000, compute_ms=1e-6, workers=2, epochs=1))
    workers = [r for r in s["recommendations"] if r["parameter"] == "num_workers"]
    assert [r["kind"] for r in workers] == ["speedup"]
    assert 2 < workers[0]["suggested"] <= DEFAULT.max_workers
    assert workers[0]["evidence"]["workers_needed"] > 10**8  # what the loading asks for, said as it is
    assert calls["n"] <= 2 * DEFAULT.max_workers + 10


def test_a_huge_prefetch_factor_over_the_shm_budget_gets_the_deepest_that_fits(monkeypatch):
    """A prefetch_factor of 2**62 (a valid 64-bit number in a batch) over the /dev/shm budget:
    the deepest prefetch that fits is found by bisection; trying every depth below 2**62 never
    ended. Each depth tried is one floor() of the budget: counted (and stopped past any bound)."""
    import math
    from starvewatch.analysis import rules

    class CountedMath:
        calls = 0

        def __getattr__(self, name):
            return getattr(math, name)

        def floor(self, x):
            CountedMath.calls += 1
            assert CountedMath.calls <= 10_000, "memory_budget tries prefetch depths without a bound"
            return math.floor(x)

    monkeypatch.setattr(rules, "math", CountedMath())
    # As case_memory_budget: 4 workers; 32 MiB of batches in /dev/shm at depth 2**62; 16 MiB
    # budget: a depth d fits 4 workers while d x (32 MiB / (4 x 2**62)) x 4 <= 16 MiB -> 2**61.
    s = run(loader(wait_ms=0.1, compute_ms=20, workers=4, prefetch=2**62, persistent=True),
            system_info=system(load_ms=2, shm_total_bytes=100 * 2**20, shm_used_min_bytes=80 * 2**20,
                               shm_used_max_bytes=112 * 2**20))
    depth = [r["suggested"] for r in s["recommendations"] if r["parameter"] == "prefetch_factor"]
    assert depth and abs(depth[0] - 2**61) <= 2**40, depth  # 2**61, within float rounding
    assert 0 < CountedMath.calls <= 500


def test_bursts_on_one_worker_that_keeps_up_still_get_a_deeper_queue():
    """Head-of-line waits from one worker that is slow only now and then (a few 60 ms items on
    worker 1, 2 ms a batch otherwise, 20 ms of compute) are bursts a deeper queue absorbs: the
    slow worker's pace in order (6.8 / 2 = 3.4 ms a batch) keeps up with the loop. Only where
    that pace is slower than the loop (the 10x slower worker of `skewed`) does the deeper queue
    go (test above)."""
    waits = [int(0.1 * MS)] * 200
    for i in range(0, 200, 25):
        waits[i + 1] = int(60 * MS)
    data = loader(workers=2, wait_ms=0, compute_ms=20, waits=waits, epochs=1, prefetch=2, persistent=True)
    t = data.totals
    t.attributed_steps, t.attributed_wait_ns = t.steps, t.wait_ns
    t.wait_fetch_ns, t.hol_wait_ns = t.wait_ns, t.wait_ns * 8 // 10
    t.worker_wait_ns, t.worker_hol_ns = [0, t.wait_ns], [0, t.hol_wait_ns]
    t.worker_batches = [100, 100]
    t.worker_batch_ns = [100 * 2 * MS, 100 * 2 * MS + 8 * 60 * MS]
    s = run(data, system_info=system(cpu_fraction=0.1, load_ms=5))
    assert [f["kind"] for f in s["findings"]] == ["head_of_line"]  # named, as it is
    [rec] = [r for r in s["recommendations"] if r["parameter"] == "prefetch_factor"]
    assert rec["suggested"] == 6 and rec["kind"] == "speedup"
