"""Live tuning (issue 39): the pure decisions, and the tuner on real DataLoader workers: no sample
lost or doubled across 0 -> N, N -> M and a revert, the user's RNG stream untouched, a change
that fails reverted without an exception, and a starved loop that ends with more workers."""
import time
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import starvewatch
from starvewatch.analysis import live_tuning
from starvewatch.hooks import loader as sw_loader
from starvewatch.hooks import session as sw_session
from starvewatch.hooks.live_tuner import LoaderTuner


def _figures(mean_ms: float, sd_ms: float = 0.5, steps: int = 32) -> dict:
    return {"step_time": {"mean_ms": mean_ms, "sd_ms": sd_ms, "steps": steps, "samples_per_step": 4}}


def _bounds(**kw):
    return live_tuning.bounds_for(kw.pop("cores", 4), **kw)


# ---- the pure decisions ----------------------------------------------------------------------

def test_a_change_beyond_noise_is_kept_and_one_within_it_reverted():
    plan = live_tuning.TuningPlan({"num_workers": 0}, _bounds())
    first = plan.window_done(_figures(50))
    assert first["decision"] == "measured" and first["next"]["num_workers"] == 2
    assert first["next"]["prefetch_factor"] == 2  # 0 -> N gets its prefetch_factor
    kept = plan.window_done(_figures(25))  # twice as fast: beyond the interval's noise floor
    assert kept["decision"] == "kept" and plan.current["num_workers"] == 2
    assert kept["next"]["num_workers"] == 4
    within = plan.window_done(_figures(24))  # 4% faster: within the run-to-run floor
    assert within["decision"] == "reverted" and plan.current["num_workers"] == 2
    slower = plan.window_done(_figures(40))  # the next candidate (prefetch 4) is slower
    assert slower["decision"] == "slower_reverted" and plan.current["prefetch_factor"] == 2
    while not plan.done:
        plan.window_done(_figures(25))
    out = plan.outcome()
    assert out["start"]["num_workers"] == 0 and out["final"]["num_workers"] == 2
    assert out["gain"]["low"] > 1.0 and out["stopped"] == "no candidate left"


def test_bounds_cores_memory_and_iterable_datasets():
    # CPU-bound: never more workers than usable cores
    assert all(c["num_workers"] <= 2 for c in live_tuning.candidates({"num_workers": 2}, _bounds(cores=2)))
    # waiting loading: beyond the cores, but within memory (the advice model's budget)
    most = live_tuning.memory_workers("train", {"num_workers": 2}, 1 << 30,
                                      {"mem_available_min_bytes": 2 << 30})
    assert most == 3  # 0.8 x (2 GiB free + 2 x 1 GiB held) / 1 GiB
    cands = live_tuning.candidates({"num_workers": 2},
                                   _bounds(cores=2, loading_waits=True, memory_most=most))
    assert [c["num_workers"] for c in cands][0] == 3
    # an IterableDataset: never 0 -> N; N -> M only where the workers shard
    assert live_tuning.candidates({"num_workers": 0}, _bounds(iterable=True, shards_by_worker=True)) == []
    assert {c["num_workers"] for c in live_tuning.candidates({"num_workers": 1}, _bounds(iterable=True))} == {1}
    assert 2 in {c["num_workers"] for c in live_tuning.candidates(
        {"num_workers": 1}, _bounds(iterable=True, shards_by_worker=True))}


def test_advice_goes_first_and_in_order_only_from_advice():
    advice = [{"parameter": "in_order", "suggested": False, "kind": "speedup"},
              {"parameter": "num_workers", "suggested": 99, "kind": "speedup"}]  # past the cores: dropped
    cands = live_tuning.candidates({"num_workers": 2}, _bounds(cores=4), advice)
    assert cands[0]["in_order"] is False and all(c["num_workers"] <= 4 for c in cands)
    assert all(c["in_order"] for c in live_tuning.candidates({"num_workers": 2}, _bounds(cores=4)))


# ---- the search's shortfalls the acceptance benchmark showed (issue 39) -----------------------

def _window(steady_ms: float, steps: int = 16, epochs: int = 1, startup_ms: float = 0.0) -> dict:
    """A window's figures from its step durations: `epochs` epochs, each first step paying
    `startup_ms` more (the workers' start-up)."""
    per_epoch = steps // epochs
    durations = [int((steady_ms + (startup_ms if i % per_epoch == 0 else 0)) * 1e6) for i in range(steps)]
    return live_tuning.window_figures(durations, 4, epochs)


def test_window_figures_say_how_much_of_a_window_the_start_up_took():
    up = _window(5, steps=16, startup_ms=250)["startup"]
    assert up["excess_ms"] == pytest.approx(250) and up["share"] == pytest.approx(250 / 330)
    assert live_tuning.startup_dominates(_window(5, startup_ms=250))
    assert not live_tuning.startup_dominates(_window(5, startup_ms=2))
    two = _window(5, steps=24, epochs=2, startup_ms=3)["startup"]
    assert two["excess_ms"] == pytest.approx(6)  # both epochs' start-ups
    assert live_tuning.short_epochs(_window(5, steps=24, epochs=2, startup_ms=3))
    assert not live_tuning.short_epochs(_window(5, steps=64, epochs=1, startup_ms=3))


def test_in_short_epochs_more_workers_come_persistent():
    # two epochs a window from 0 workers: the first candidate is "2 workers, persistent"
    plan = live_tuning.TuningPlan({"num_workers": 0}, _bounds(cores=4))
    first = plan.window_done(_window(20, steps=24, epochs=2))
    assert first["next"]["num_workers"] == 2 and first["next"]["persistent_workers"] is True
    # long epochs without a start-up share: workers alone, persistence a change of its own
    long = live_tuning.TuningPlan({"num_workers": 0}, _bounds(cores=4))
    nxt = long.window_done(_window(20, steps=64, epochs=1, startup_ms=5))["next"]
    assert nxt["num_workers"] == 2 and nxt["persistent_workers"] is False
    # N -> 2N paired too, from non-persistent workers whose start-up weighs on the window
    assert live_tuning.candidates({"num_workers": 2}, _bounds(cores=8), short=True)[0] == \
        {"num_workers": 4, "prefetch_factor": 2, "persistent_workers": True, "pin_memory": False, "in_order": True}


def test_a_persistent_trial_is_judged_without_its_one_time_start_up():
    # start-up bound: 2 workers starting in 250 ms every epoch of 16 steps of 5 ms
    plan = live_tuning.TuningPlan({"num_workers": 2}, _bounds(cores=2))
    first = plan.window_done(_window(5, startup_ms=250))
    assert first["next"]["persistent_workers"] is True and first["next"]["num_workers"] == 2
    # its first window holds its own start-up once: taken out, it is 4x faster, kept
    kept = plan.window_done(_window(5, startup_ms=250))
    assert kept["decision"] == "kept" and plan.current["persistent_workers"] is True
    assert kept["excluded_startup_ms"] == pytest.approx(250)
    assert kept["figures"]["step_time"]["mean_ms"] == pytest.approx(5)
    assert "startup" not in kept["figures"]  # records carry TuningFigures' fields only
    # a non-persistent trial keeps its start-up: it pays it every epoch
    other = live_tuning.TuningPlan({"num_workers": 0}, _bounds(cores=4))
    other.window_done(_window(7, steps=64))  # long epochs: 0 -> 2 not persistent
    judged = other.window_done(_window(5, steps=64, startup_ms=250))
    assert "excluded_startup_ms" not in judged and judged["decision"] != "kept"


def test_fewer_workers_where_start_up_dominates_or_the_loop_is_not_input_bound():
    # the start-up dominates: persistent first, then straight to 0 workers (map-style)
    cands = live_tuning.candidates({"num_workers": 2}, _bounds(cores=2), startup_bound=True)
    assert cands[0]["persistent_workers"] is True and cands[0]["num_workers"] == 2
    assert cands[1] == {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False,
                        "pin_memory": False, "in_order": True}
    plan = live_tuning.TuningPlan({"num_workers": 2}, _bounds(cores=2))
    plan.window_done(_window(5, startup_ms=250))
    plan.window_done(_window(25, startup_ms=250))  # the persistent trial: slower, reverted
    assert plan.current["persistent_workers"] is False and plan.trying["num_workers"] == 0
    assert plan.window_done(_window(7))["decision"] == "kept" and plan.current["num_workers"] == 0
    # not input-bound: halving, last of the candidates
    halved = live_tuning.candidates({"num_workers": 4}, _bounds(cores=8, input_bound=False))
    assert halved[-1]["num_workers"] == 2
    # input-bound or not known, without a start-up that dominates: never fewer
    for known in (True, None):
        assert all(c["num_workers"] >= 4 for c in
                   live_tuning.candidates({"num_workers": 4}, _bounds(cores=8, input_bound=known)))
    # an IterableDataset: halving only where its workers shard, never to 0
    it = live_tuning.candidates({"num_workers": 2}, _bounds(cores=2, iterable=True, shards_by_worker=True),
                                startup_bound=True)
    assert {c["num_workers"] for c in it} == {1, 2}
    assert 0 not in {c["num_workers"] for c in live_tuning.candidates(
        {"num_workers": 1}, _bounds(cores=2, iterable=True, shards_by_worker=True), startup_bound=True)}


# ---- the tuner on real workers ---------------------------------------------------------------

class Indices(Dataset):
    def __init__(self, n: int = 64, sleep_s: float = 0.0) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return i


def _epochs(loader, n: int, step_s: float = 0.0) -> list[list[int]]:
    out = []
    for _ in range(n):
        seen = []
        for batch in loader:
            seen += batch.tolist()
            if step_s:
                time.sleep(step_s)
        out.append(seen)
    return out


def _tuner(loader):
    return type(loader)._starvewatch_tuner


def _forced(monkeypatch, low: float, high: float) -> None:
    """Every trial's interval fixed, and the plan's own candidates only (the run's advice
    depends on timing): these tests are about applying decisions, not making them."""
    monkeypatch.setattr(live_tuning, "speedup_interval",
                        lambda a, b: {"speedup": (low + high) / 2, "low": low, "high": high, "basis": "samples/s"})
    monkeypatch.setattr(LoaderTuner, "_advice", lambda self: [])


def test_tuned_epochs_hold_every_sample_once_through_0_to_n_n_to_m_and_persistent(memory_run, monkeypatch):
    _forced(monkeypatch, 1.5, 2.0)  # every change kept
    monkeypatch.setattr("starvewatch.cpus.usable_cores", lambda *a, **k: 3)
    loader = starvewatch.watch(DataLoader(Indices(), batch_size=4, shuffle=True), tune=True)
    epochs = _epochs(loader, 6)
    tuner = _tuner(loader)
    used = [r["config"]["num_workers"] for r in tuner.records]
    assert used[:3] == [0, 2, 3], tuner.records  # 0 -> 2, then 2 -> 3 (the cores' bound)
    assert any(r["config"]["persistent_workers"] for r in tuner.records)
    for seen in epochs:
        assert Counter(seen) == Counter(range(64))
    assert isinstance(loader, DataLoader) and loader.num_workers == 0  # the user's object as it was
    summary = starvewatch.finish()
    assert summary["live_tuning"]["loaders"][0]["final"]["num_workers"] == 3
    assert summary["live_tuning"]["records"] and sw_session.current_session() is not None


def test_a_reverted_change_loses_no_sample(memory_run, monkeypatch):
    _forced(monkeypatch, 0.5, 0.8)  # every change slower: reverted
    loader = starvewatch.watch(DataLoader(Indices(), batch_size=4, num_workers=1), tune=True)
    epochs = _epochs(loader, 4)
    tuner = _tuner(loader)
    decisions = [r["decision"] for r in tuner.records]
    assert decisions[0] == "measured" and decisions[1] == "slower_reverted"
    # back to 1 worker after each revert; the epoch running now runs the next trial
    assert tuner.plan.current["num_workers"] == 1 and tuner.twin_config == tuner.plan.config()
    for seen in epochs:
        assert sorted(seen) == list(range(64))  # (in_order: the same order as well)


def test_tuning_leaves_the_users_random_stream_as_it_was(memory_run, monkeypatch):
    _forced(monkeypatch, 1.5, 2.0)  # 0 -> 2 workers, then persistent ones: other draws if unguarded

    def run(tune: bool) -> tuple[list, torch.Tensor]:
        torch.manual_seed(1234)
        loader = starvewatch.watch(DataLoader(Indices(), batch_size=4, shuffle=True), f"l{tune}", tune=tune)
        seen = _epochs(loader, 5)
        return seen, torch.rand(4)

    untuned_order, untuned_after = run(False)
    tuned_order, tuned_after = run(True)
    assert torch.equal(untuned_after, tuned_after)
    assert tuned_order == untuned_order  # the sampler drew the same permutations


def _fail_in_workers(worker_id):
    raise RuntimeError("this worker cannot start")


def test_a_change_that_fails_is_reverted_with_one_line_and_no_exception(memory_run, monkeypatch, capsys):
    monkeypatch.setattr(memory_run[0].settings, "quiet", False)
    monkeypatch.setattr(LoaderTuner, "_advice", lambda self: [])  # the first candidate: 0 -> 2
    loader = starvewatch.watch(DataLoader(Indices(), batch_size=4, worker_init_fn=_fail_in_workers),
                               tune=True)
    epochs = _epochs(loader, 4)  # window 1 at 0 workers, then 0 -> 2 fails at its first batch
    tuner = _tuner(loader)
    assert tuner.disabled and tuner.twin_config["num_workers"] == 0
    assert [r["decision"] for r in tuner.records][-1] == "disabled"
    for seen in epochs:
        assert sorted(seen) == list(range(64))
    lines = [l for l in capsys.readouterr().err.splitlines() if "tuning 'train'" in l]
    assert len(lines) == 1 and "reverted and off" in lines[0] and "num_workers 0 -> 2" in lines[0]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(64))


def test_an_iterable_dataset_is_never_taken_from_0_to_n_workers(memory_run, monkeypatch):
    _forced(monkeypatch, 1.5, 2.0)
    loader = starvewatch.watch(DataLoader(Stream(), batch_size=4), tune=True)
    epochs = _epochs(loader, 3)
    assert _tuner(loader).plan.done and _tuner(loader).twin_config["num_workers"] == 0
    for seen in epochs:
        assert sorted(seen) == list(range(64))


def test_the_untuned_class_is_the_plain_one(memory_run):
    plain = starvewatch.watch(DataLoader(Indices(), batch_size=4), "plain")
    assert type(plain)._starvewatch_tuner is None
    assert type(plain).__iter__.__code__ is sw_loader.watched_dataloader_class(DataLoader, None).__iter__.__code__


def test_a_starved_loop_ends_with_more_workers_and_faster(memory_run):
    """Sleeps in __getitem__ (I/O-like latency) and in the step: 0 workers is starved. Timed on
    the test's own clock, with a wide margin (sleeps overlap even on a loaded machine)."""
    loader = starvewatch.watch(DataLoader(Indices(64, sleep_s=0.02), batch_size=4), tune=True)
    times = []
    for _ in range(5):  # each epoch is one window (16 steps): decisions at epochs 3, 4 and 5
        t0 = time.perf_counter()
        _epochs(loader, 1, step_s=0.004)
        times.append(time.perf_counter() - t0)
    tuner = _tuner(loader)
    assert tuner.plan.current["num_workers"] >= 2, tuner.records
    assert "kept" in [r["decision"] for r in tuner.records]
    assert min(times[2:]) < 0.75 * times[0], times


@pytest.mark.parametrize("value,expected", [("1", True), ("0", False), ("maybe", False)])
def test_starvewatch_tune_reads_as_a_flag(monkeypatch, value, expected):
    from starvewatch.hooks.settings import HookSettings
    monkeypatch.setenv("STARVEWATCH_TUNE", value)
    assert HookSettings.from_env().tune is expected


def test_the_summary_and_report_give_start_final_gain_and_the_line_to_copy(memory_run, monkeypatch):
    from starvewatch.hooks.report import format_report
    _forced(monkeypatch, 1.5, 2.0)
    monkeypatch.setattr("starvewatch.cpus.usable_cores", lambda *a, **k: 2)
    loader = starvewatch.watch(DataLoader(Indices(), batch_size=4, shuffle=True), tune=True)
    _epochs(loader, 3)
    summary = starvewatch.finish()
    (outcome,) = summary["live_tuning"]["loaders"]
    assert outcome["start"]["num_workers"] == 0 and outcome["final"]["num_workers"] == 2
    assert outcome["gain"]["low"] == 1.5
    assert "num_workers=2" in outcome["line"] and "shuffle=True" in outcome["line"]
    text = format_report(summary)
    assert "tuned train: num_workers 0 -> 2" in text and outcome["line"] in text


def test_a_loader_rebuilt_every_epoch_gets_the_found_configuration(memory_run, monkeypatch):
    _forced(monkeypatch, 1.5, 2.0)
    monkeypatch.setattr("starvewatch.cpus.usable_cores", lambda *a, **k: 2)
    ds = Indices()
    seen_workers = []
    for _ in range(4):
        loader = starvewatch.watch(DataLoader(ds, batch_size=4), tune=True)  # one call site, one dataset
        (seen,) = _epochs(loader, 1)
        assert sorted(seen) == list(range(64))
        seen_workers.append(_tuner(loader).twin_config["num_workers"])
        assert loader.num_workers == 0
    assert seen_workers[:2] == [0, 2] and seen_workers[-1] == 2
    assert sw_session.current_session() is memory_run[0]  # never a new run, as a re-watch with other settings


def test_tuning_records_reach_the_collector_and_its_summary(collector, monkeypatch):
    """Each window's record and each loader's outcome travel with the batches (the events
    table), and the collector's summary carries the same `tuning` section as finish()'s."""
    _forced(monkeypatch, 1.5, 2.0)
    monkeypatch.setattr("starvewatch.cpus.usable_cores", lambda *a, **k: 2)
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    loader = starvewatch.watch(DataLoader(Indices(), batch_size=4), tune=True)
    _epochs(loader, 3)
    local = starvewatch.finish()
    remote = c.get(f"/api/v1/runs/{local['run']['id']}/summary")
    assert [(r["window"], r["decision"], r["config"]["num_workers"]) for r in remote["live_tuning"]["records"]] == \
        [(r["window"], r["decision"], r["config"]["num_workers"]) for r in local["live_tuning"]["records"]]
    (outcome,) = remote["live_tuning"]["loaders"]
    assert outcome["final"] == local["live_tuning"]["loaders"][0]["final"] and outcome["final"]["num_workers"] == 2
    assert outcome["line"] == local["live_tuning"]["loaders"][0]["line"] and "num_workers=2" in outcome["line"]
    assert outcome["gain"]["low"] == 1.5


class Sharded(IterableDataset):
    """Each worker yields its own share (the shard check's "shards by worker")."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(worker, 64, workers))


@pytest.mark.parametrize("shards", [True, False])
def test_an_iterable_dataset_goes_n_to_m_only_where_its_workers_shard(memory_run, monkeypatch, shards):
    _forced(monkeypatch, 1.5, 2.0)
    monkeypatch.setattr("starvewatch.cpus.usable_cores", lambda *a, **k: 4)
    monkeypatch.setattr(LoaderTuner, "_shards_by_worker", lambda self: shards)
    loader = starvewatch.watch(DataLoader(Sharded(), batch_size=4, num_workers=2), tune=True)
    epochs = _epochs(loader, 3)
    # the trials begun (the third epoch's too): where the start-up dominates, persistent first
    used = {c["num_workers"] for c in _tuner(loader).plan.tried}
    assert used == ({2, 4} if shards else {2}), _tuner(loader).records
    for seen in epochs:
        assert sorted(seen) == list(range(64))


def test_a_persistent_loader_keeps_the_users_random_stream_too(memory_run, monkeypatch):
    _forced(monkeypatch, 1.5, 2.0)
    monkeypatch.setattr("starvewatch.cpus.usable_cores", lambda *a, **k: 2)

    def run(tune: bool):
        torch.manual_seed(99)
        loader = starvewatch.watch(DataLoader(Indices(), batch_size=4, shuffle=True, num_workers=1,
                                              persistent_workers=True), f"p{tune}", tune=tune)
        seen = _epochs(loader, 4)
        return seen, torch.rand(3)

    untuned_order, untuned_after = run(False)
    tuned_order, tuned_after = run(True)
    assert torch.equal(untuned_after, tuned_after) and tuned_order == untuned_order


class DiesMidEpoch(Dataset):
    """Worker 1, loading item 40 or later, dies (a crash, as the OOM killer does) once `flag`
    exists: the test creates it after its first batch, so the crash comes mid-epoch."""

    def __init__(self, flag) -> None:
        self.flag = str(flag)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        import os
        info = torch.utils.data.get_worker_info()
        # one worker only: a second death after the test would reach pytest (torch's SIGCHLD handler)
        if i >= 40 and info is not None and info.id == 1 and os.path.exists(self.flag):
            os._exit(1)
        return i


def test_a_worker_crash_mid_epoch_turns_tuning_off_for_the_next_epochs(memory_run, monkeypatch, tmp_path):
    _forced(monkeypatch, 1.5, 2.0)
    flag = tmp_path / "first-batch-seen"
    loader = starvewatch.watch(DataLoader(DiesMidEpoch(flag), batch_size=4), tune=True)
    (first,) = _epochs(loader, 1)  # 0 workers: the dataset never dies in the main process
    import signal
    previous = signal.getsignal(signal.SIGCHLD)
    try:
        with pytest.raises((RuntimeError, OSError)):  # (how torch reports it depends on the moment)
            for i, _ in enumerate(loader):  # 0 -> 2 workers: one dies mid-epoch, as it would untuned
                # torch's SIGCHLD handler would raise wherever the test is when the death is
                # signalled; without it the iterator finds the dead worker itself (within 5 s)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                flag.touch()
    finally:
        signal.signal(signal.SIGCHLD, previous)
    assert i >= 1  # the first batch came, and more
    tuner = _tuner(loader)
    assert tuner.disabled and "num_workers 0 -> 2" in tuner.disabled
    later = _epochs(loader, 2)
    assert tuner.twin_config["num_workers"] == 0
    for seen in [first] + later:
        assert sorted(seen) == list(range(64))


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_the_run_page_shows_the_tuning_timeline_stored_once(tmp_path, request, database):
    """The records as the collector stores them (a batch split in two parts carries them in
    both, a replay again): one row per window on the run page's panel, the outcome and its line;
    on either store."""
    import orjson
    from starvewatch.dashboard.tuning_panel import live_panel
    from starvewatch.monitor.storage.open_store import open_store
    from starvewatch.monitor.storage.query import Query
    from starvewatch.monitor.web.wire_models import EventBatch
    from tests.test_collector_api import batch
    from tests.test_dashboard_views import _text

    cfg = {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False, "pin_memory": False,
           "in_order": True}
    two = dict(cfg, num_workers=2, prefetch_factor=2)
    figures = {"step_time": {"mean_ms": 50.0, "sd_ms": 2.0, "steps": 16, "samples_per_step": 4},
               "samples_per_s": 80.0}
    records = [
        {"schema": "starvewatch.live_tuning/1", "loader": "train", "window": 1, "decision": "measured", "config": cfg,
         "figures": figures, "next": two, "t_ns": 1_700_000_001 * 10**9},
        {"schema": "starvewatch.live_tuning/1", "loader": "train", "window": 2, "decision": "kept", "config": two,
         "figures": dict(figures, samples_per_s=150.0),
         "interval": {"speedup": 1.8, "low": 1.4, "high": 2.3, "basis": "samples/s"}, "t_ns": 1_700_000_002 * 10**9},
        {"schema": "starvewatch.live_tuning/1", "loader": "train", "decision": "outcome", "start": cfg, "final": two,
         "windows": 2, "gain": {"speedup": 1.8, "low": 1.4, "high": 2.3, "basis": "samples/s"},
         "line": "DataLoader(dataset, batch_size=4, num_workers=2)", "t_ns": 1_700_000_003 * 10**9}]
    store = open_store(str(tmp_path / "db.sqlite") if database == "sqlite" else request.getfixturevalue("postgres_url"))
    whole = dict(batch(n=10), tuning=records)
    for part in ([0, 6], [6, 10]):  # the batch split in two parts: each carries the records
        store.ingest(EventBatch.model_validate_json(orjson.dumps(dict(whole, part=part, steps={
            k: v[part[0]:part[1]] for k, v in whole["steps"].items()}))))
    store.ingest(EventBatch.model_validate_json(orjson.dumps(dict(whole, seq=1))))  # a replay
    live = Query(store).live_tuning("run-a")
    assert [(r["window"], r["decision"]) for r in live["records"]] == [(1, "measured"), (2, "kept")]
    assert [o["final"]["num_workers"] for o in live["loaders"]] == [2]
    text = _text(live_panel(live))
    assert "0 workers" in text and "2 workers" in text and "1.80x [1.40, 2.30]" in text and "kept" in text
    assert "train: 0 workers -> 2 workers, measured 1.80x" in text
    assert "DataLoader(dataset, batch_size=4, num_workers=2)" in text
    summary = Query(store).summary("run-a")
    assert summary["live_tuning"]["loaders"][0]["line"] == records[2]["line"]
    from starvewatch.monitor.outputs.export import to_markdown
    report = to_markdown(summary)  # the Markdown export: the windows, start -> final, the line
    assert "## Live tuning" in report and "Measured tuning" not in report
    assert "| train | 2 | 2 | 2 | False | 150.0 | 1.80x [1.40, 2.30] | kept |" in report
    assert "tuned train: num_workers 0 -\\> 2: 1.80x" in report and records[2]["line"] in report


def test_what_cannot_be_tuned_says_so_once_and_iterates_as_before(memory_run, monkeypatch, capsys):
    from torchdata.stateful_dataloader import StatefulDataLoader
    monkeypatch.setattr(memory_run[0].settings, "quiet", False)
    plain_list = starvewatch.watch([torch.arange(4)] * 3, "batches", tune=True)
    stateful = starvewatch.watch(StatefulDataLoader(Indices(), batch_size=4), "stateful", tune=True)
    assert sum(1 for _ in plain_list) == 3
    for seen in _epochs(stateful, 2):
        assert sorted(seen) == list(range(64))
    assert _tuner(stateful).plan is None and _tuner(stateful).twin is None
    lines = [l for l in capsys.readouterr().err.splitlines() if "starvewatch: tuning" in l]
    assert len(lines) == 2, lines
    assert "'batches': off (list is not a torch DataLoader)" in lines[0]
    assert "'stateful'" in lines[1] and "StatefulDataLoader keeps state in its own iterator" in lines[1]


def test_starvewatch_tune_turns_it_on_for_every_watched_dataloader(memory_run, monkeypatch):
    monkeypatch.setattr(memory_run[0].settings, "tune", True)  # what STARVEWATCH_TUNE=1 reads as
    on = starvewatch.watch(DataLoader(Indices(), batch_size=4), "on")
    off = starvewatch.watch(DataLoader(Indices(), batch_size=4), "off", tune=False)  # the argument wins
    assert _tuner(on) is not None and _tuner(off) is None


def test_no_decision_while_a_stall_of_the_loader_is_open(memory_run, monkeypatch):
    _forced(monkeypatch, 1.5, 2.0)
    loader = starvewatch.watch(DataLoader(Indices(), batch_size=4), tune=True)
    memory_run[0].stalls.append({"loader": "train", "started_ns": 1, "wait_s": 12.0})  # open: no ended_ns
    _epochs(loader, 3)
    tuner = _tuner(loader)
    assert [r["decision"] for r in tuner.records] == ["stall_open", "stall_open"]
    assert tuner.twin_config["num_workers"] == 0
    memory_run[0].stalls[0]["ended_ns"] = 2  # the stall ended: the next window decides
    _epochs(loader, 1)
    assert tuner.records[-1]["decision"] == "measured" and tuner.twin_config["num_workers"] == 2


@pytest.mark.parametrize("kept", [True, False])
def test_a_mid_epoch_switch_delivers_every_sample_once_in_the_samplers_order(memory_run, monkeypatch, kept):
    """An epoch of 200 batches is decided every 64 steps: the old iterator stops taking index
    batches, delivers what its workers hold, and the new one takes the rest (kept: 0 -> 2
    workers, then more changes; reverted: 0 -> 2 and back). The shuffled order of every epoch
    and the user's random stream are those of the untuned loader."""
    if kept:
        _forced(monkeypatch, 1.5, 2.0)
    else:
        _forced(monkeypatch, 0.5, 0.8)
    monkeypatch.setattr("starvewatch.cpus.usable_cores", lambda *a, **k: 2)

    def run(tune: bool):
        torch.manual_seed(5)
        loader = starvewatch.watch(DataLoader(Indices(400), batch_size=2, shuffle=True), f"m{tune}", tune=tune)
        return _epochs(loader, 2), torch.rand(3), loader

    untuned, untuned_after, _ = run(False)
    tuned, tuned_after, loader = run(True)
    records = _tuner(loader).records
    mid = [(r["window"], r["decision"], r["config"]["num_workers"]) for r in records if r.get("mid_epoch")]
    assert mid[:2] == ([(1, "measured", 0), (2, "kept", 2)] if kept else [(1, "measured", 0), (2, "slower_reverted", 2)])
    assert tuned == untuned and torch.equal(tuned_after, untuned_after)
    for seen in tuned:
        assert Counter(seen) == Counter(range(400))


def test_a_mid_epoch_switch_that_fails_gives_its_index_batches_back(memory_run, monkeypatch):
    """0 -> 2 workers in the middle of an epoch, where the workers cannot start: the index
    batches they were handed go to the last good configuration first: the epoch is whole and
    in the sampler's order, tuning off with its line."""
    _forced(monkeypatch, 1.5, 2.0)

    def run(tune: bool):
        torch.manual_seed(7)
        loader = starvewatch.watch(DataLoader(Indices(400), batch_size=2, shuffle=True,
                                              worker_init_fn=_fail_in_workers), f"f{tune}", tune=tune)
        return _epochs(loader, 2), loader

    untuned, _ = run(False)
    tuned, loader = run(True)
    tuner = _tuner(loader)
    assert tuner.disabled and "num_workers 0 -> 2" in tuner.disabled
    assert tuner.records[0].get("mid_epoch") and tuner.records[-1]["decision"] == "disabled"
    assert tuned == untuned


def test_under_torchrun_each_rank_says_it_tunes_on_its_own(memory_run, monkeypatch, capsys):
    session = memory_run[0]
    monkeypatch.setattr(session.settings, "quiet", False)
    monkeypatch.setattr(session, "world_size", 2)
    monkeypatch.setattr(session, "rank", 1)
    loader = starvewatch.watch(DataLoader(Indices(), batch_size=4), tune=True)
    assert _tuner(loader).disabled is None
    lines = [l for l in capsys.readouterr().err.splitlines() if "starvewatch: tuning" in l]
    assert lines == ["starvewatch: tuning 'train': rank 1 of 2 tunes on its own measurements"]


def test_a_decision_point_never_waits_for_the_advice(memory_run, monkeypatch):
    """The ranked advice (a summarize() of the run) is computed on the tuner's own thread: here
    it blocks until the test lets it go, and the loop goes through its decisions meanwhile, no
    step slower than a generous bound on the loop's own clock; once the list is ready, the next
    decision uses it."""
    import threading
    _forced(monkeypatch, 1.5, 2.0)
    monkeypatch.setattr("starvewatch.cpus.usable_cores", lambda *a, **k: 4)
    release, threads = threading.Event(), []

    def slow_advice(self):
        threads.append(threading.current_thread())
        release.wait(60)  # a computation far slower than a window: a loop waiting on it would show it
        return [{"parameter": "num_workers", "suggested": 3, "kind": "speedup"}]

    monkeypatch.setattr(LoaderTuner, "_advice", slow_advice)
    loader = starvewatch.watch(DataLoader(Indices(), batch_size=4), tune=True)
    tuner = _tuner(loader)
    try:
        steps_s = []
        for _ in range(3):
            t = time.perf_counter()
            it = iter(loader)  # an epoch boundary's decision happens here
            while True:
                try:
                    next(it)
                except StopIteration:
                    break
                steps_s.append(time.perf_counter() - t)  # the step with the iter() before it, if any
                t = time.perf_counter()
        decided = [r["decision"] for r in tuner.records]
        assert decided == ["measured", "kept"], tuner.records  # two decisions while the advice was blocked
        assert max(steps_s) < 20.0, max(steps_s)  # far under the 60 s the advice would have cost each
        assert tuner.advice.computed == 0 and all("advice" not in r for r in tuner.records)
    finally:
        release.set()
    deadline = time.monotonic() + 60
    while not tuner.advice.ready and time.monotonic() < deadline:
        time.sleep(0.01)  # waiting for the other thread's swap: the state under test, not a guess
    assert tuner.advice.ready and threads and all(t is not threading.main_thread() for t in threads)
    _epochs(loader, 1)
    assert tuner.records[-1].get("advice") == ["num_workers"], tuner.records[-1]


def test_an_accelerate_dataloadershard_is_tuned_through_the_loader_it_iterates(memory_run, monkeypatch):
    """accelerate's prepared loader iterates a real DataLoader (its base_dataloader, watched in
    place): tuning that one changes its workers at epoch boundaries and mid-epoch (inside the
    inner iterator, which accelerate's look-ahead does not see), and every epoch is the untuned
    one's: the same samples in the same shuffled order, the same random stream after, one
    accelerate epoch per pass."""
    from accelerate.data_loader import DataLoaderShard
    _forced(monkeypatch, 1.5, 2.0)
    monkeypatch.setattr("starvewatch.cpus.usable_cores", lambda *a, **k: 2)

    def run(tune: bool, n: int):
        torch.manual_seed(11)
        loader = starvewatch.watch(DataLoaderShard(Indices(n), batch_size=2, shuffle=True), f"acc{tune}{n}", tune=tune)
        return _epochs(loader, 3), torch.rand(3), loader

    for n in (32, 400):  # epochs of 16 batches (decided at their ends), of 200 (also mid-epoch)
        untuned, untuned_after, _ = run(False, n)
        tuned, tuned_after, loader = run(True, n)
        assert type(loader).__name__ == "DataLoaderShard" and loader.iteration == 3
        records = _tuner(loader.base_dataloader).records
        assert [r["decision"] for r in records][:2] == ["measured", "kept"], records
        assert any(r["config"]["num_workers"] == 2 for r in records)
        assert any(r.get("mid_epoch") for r in records) == (n == 400)
        assert tuned == untuned and torch.equal(tuned_after, untuned_after)
        for seen in tuned:
            assert Counter(seen) == Counter(range(n))


def test_what_tuning_measured_replaces_the_models_advice_on_the_settings_it_searched():
    """The model reads totals that mix every configuration tried: after tuning 0 -> 4 workers it
    would still say "num_workers=1 (now 0)". Its advice on tuned settings of a tuned loader goes;
    protective advice, other settings and other loaders stay; a disabled tuning replaces nothing;
    `tuning` (starvewatch tune's results) is left alone."""
    from starvewatch.analysis.live_tuning import with_live_tuning
    recs = [{"loader": "train", "parameter": "num_workers", "suggested": 1},
            {"loader": "train", "parameter": "batch_size", "suggested": 128},
            {"loader": "train", "parameter": "num_workers", "suggested": 1, "kind": "protective"},
            {"loader": "val", "parameter": "num_workers", "suggested": 2},
            {"loader": "test", "parameter": "prefetch_factor", "suggested": 4}]
    outcomes = [{"loader": "train", "start": {"num_workers": 0}, "final": {"num_workers": 4}},
                {"loader": "test", "start": {"num_workers": 2}, "final": {"num_workers": 2}, "disabled": "crash"}]
    summary = with_live_tuning({"recommendations": list(recs), "tuning": {"trials": []}}, [], outcomes)
    assert summary["recommendations"] == recs[1:]
    assert summary["live_tuning"]["replaced"] == ["train: num_workers=1"]
    assert summary["tuning"] == {"trials": []}
