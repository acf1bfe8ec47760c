"""`starvewatch tune`: the budget, worker cleanup, memory skips and the answer rule, with real
DataLoader workers and sleeping datasets (tiny budgets)."""
import os
import re
import subprocess
import sys
import time

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import starvewatch
from starvewatch.tuning import LoaderConfig, TrialFailed
from starvewatch.tuning.answer import choose, snippet
from starvewatch.tuning.config import FactoryError
from starvewatch.tuning.search import MemoryModel
from starvewatch.tuning.trial import TrialResult


class Sleepy(Dataset):
    """I/O-bound: every item sleeps (a read from slow storage)."""

    def __init__(self, item_ms=5.0, n=100_000, size=16):
        self.item_ms, self.n, self.size = item_ms, n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.item_ms / 1000)
        return torch.zeros(self.size)


class Broken(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        raise ValueError("corrupt record 7")


def sleepy_factory(item_ms=5.0, batch_size=4, size=16):
    def make(**kwargs):
        return DataLoader(Sleepy(item_ms, size=size), batch_size=batch_size, **kwargs)
    return make


def own_workers(before):
    """This process's child processes that are alive (zombies count as gone) and new."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in before and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_budget_is_kept_and_no_worker_survives_a_trial():
    """Items of 0.6 s: every trial is cut short mid-batch, its workers killed, and the call
    ends within the budget + 5%."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    survivors, trials_seen = [], []

    def after_trial(trial):
        trials_seen.append(trial)
        survivors.append(own_workers(before))

    budget = 3.0
    start = time.perf_counter()
    result = starvewatch.tune(sleepy_factory(item_ms=600, batch_size=1), budget_s=budget, out=False,
                              on_trial=after_trial)
    elapsed = time.perf_counter() - start
    assert elapsed <= budget * 1.05, elapsed
    assert result.elapsed_s <= budget * 1.05
    assert any(t.config.num_workers for t in trials_seen)
    assert any(t.worker_pids for t in trials_seen), "no trial started workers: the check proves nothing"
    assert survivors and all(s == [] for s in survivors), survivors
    assert any(t.status == "cut_short" for t in trials_seen)
    assert own_workers(before) == []


def test_measures_and_cleans_up_every_trial_of_a_normal_search():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    survivors = []
    result = starvewatch.tune(sleepy_factory(item_ms=4), budget_s=4, out=False,
                              on_trial=lambda t: survivors.append((t.config.label(), own_workers(before))))
    measured = [t for t in result.trials if t.usable]
    assert len(measured) >= 3
    worker_trials = [t for t in measured if t.config.num_workers]
    assert worker_trials and all(t.worker_uss_bytes for t in worker_trials)
    assert all(t.batch_bytes == 4 * 16 * 4 for t in measured)  # 4 items of 16 float32
    assert all(t.cpu_pct is not None for t in measured)
    assert [s for _, s in survivors] == [[]] * len(survivors), survivors
    assert result.answer is not None and result.answer.config.num_workers >= 1  # sleeping items: workers help


def test_consumption_rate_changes_the_answer():
    make = sleepy_factory(item_ms=10)
    free = starvewatch.tune(make, budget_s=6, out=False)
    assert free.answer is not None and free.answer.config.num_workers >= 1
    zero = next(t for t in free.trials if t.config == LoaderConfig(0))
    # A loop that consumes far less than the training thread alone delivers: no worker needed.
    slow_loop = zero.batches_per_s / 3
    covered = starvewatch.tune(make, budget_s=3, consumption_batches_per_s=slow_loop, out=False)
    assert covered.answer.config == LoaderConfig(0)
    assert covered.answer.batches_per_s >= 1.2 * slow_loop
    assert "consumption" in covered.rule


def _trial(workers, rate, prefetch=2, uss=100 << 20, batch_bytes=1 << 20):
    t = TrialResult(LoaderConfig(workers, prefetch if workers else None), batches_per_s=rate, window_batches=10,
                    worker_uss_bytes=uss if workers else None, batch_bytes=batch_bytes)
    return t


def test_answer_rule():
    trials = [_trial(0, 20), _trial(1, 40), _trial(2, 79), _trial(4, 100), _trial(4, 104, prefetch=4),
              _trial(8, 105)]
    # Without a consumption rate: the fewest workers within 10% of the best (105 -> >= 94.5).
    pick, why = choose(trials, None)
    assert pick.config == LoaderConfig(4, 2)  # 4 workers; prefetch 2 holds less memory than 4
    assert "within 10%" in why
    # With one: the fewest workers covering consumption x 1.2.
    assert choose(trials, 65)[0].config == LoaderConfig(2, 2)      # 78 needed, 79 delivered
    assert choose(trials, 66)[0].config == LoaderConfig(4, 2)      # 79.2 needed
    assert choose(trials, 10)[0].config == LoaderConfig(0)
    # Nothing covers: the fewest workers near the best, and it says the loop will still wait.
    pick, why = choose(trials, 200)
    assert pick.config == LoaderConfig(4, 2) and "no configuration covers" in why
    # Unmeasured trials never answer.
    assert choose([TrialResult(LoaderConfig(2), status="skipped", reason="x")], None)[0] is None


def test_persistent_workers_only_when_resuming_saves_a_measurable_share_of_an_epoch():
    def pair(epoch_batches):
        off = _trial(2, 100.0)
        off.startup_s, off.epoch_batches = 0.5, epoch_batches
        on = TrialResult(LoaderConfig(2, 2, True), batches_per_s=99.0, window_batches=10, startup_s=0.5,
                         restart_s=0.01, epoch_batches=epoch_batches, worker_uss_bytes=100 << 20,
                         batch_bytes=1 << 20)
        return [_trial(0, 20), off, on]
    # 100-batch epochs last 1 s: spawning every epoch costs 0.5 s of it.
    assert choose(pair(100), None)[0].config.persistent_workers is True
    # 100,000-batch epochs: 0.5 s is 0.05% of the epoch; the 1% faster steady figure is noise.
    assert choose(pair(100_000), None)[0].config.persistent_workers is False


def test_snippet_is_ready_to_paste():
    assert snippet(LoaderConfig(3, 4, True), 64) == \
        "DataLoader(dataset, batch_size=64, num_workers=3, prefetch_factor=4, persistent_workers=True)"
    assert snippet(LoaderConfig(0, 4, True, True), None) == "DataLoader(dataset, num_workers=0, pin_memory=True)"


def test_a_trial_that_would_not_fit_in_dev_shm_is_skipped_with_the_reason(monkeypatch, capsys):
    # 4 x 16 KiB items: 64 KiB batches. A /dev/shm of 100 KiB cannot hold 2 in flight + 1. The
    # limit is absolute: free = limit - used is at most 100 KiB whatever other processes hold
    # there meanwhile (a limit of used-at-start + 100 KiB read "0 bytes" free once they grew).
    monkeypatch.setenv("STARVEWATCH_SHM_LIMIT_BYTES", str(100 * 2**10))
    result = starvewatch.tune(sleepy_factory(item_ms=1, size=4096), budget_s=5)
    skipped = [t for t in result.trials if t.status == "skipped"]
    assert skipped and skipped[0].config.num_workers == 1
    assert "would need 192 KiB of /dev/shm (3 batches in flight x 64 KiB)" in skipped[0].reason
    free = re.search(r"but ([\d.]+) (bytes|KiB) is free$", skipped[0].reason)  # what others left of it
    assert free and float(free[1]) * (2**10 if free[2] == "KiB" else 1) <= 100 * 2**10
    assert not any(t.worker_pids for t in result.trials)  # no worker was started
    assert result.answer.config == LoaderConfig(0)
    printed = capsys.readouterr().out
    assert f"skipped: {skipped[0].reason}" in printed


def test_memory_model_predicts_from_one_worker_and_the_batch():
    model = MemoryModel()
    model.learn(_trial(1, 10, uss=200 << 20, batch_bytes=8 << 20))
    ram, shm = model.predict(LoaderConfig(4, 2))
    assert shm == (4 * 2 + 1) * (8 << 20)
    assert ram == 4 * (200 << 20) + shm
    reason, _, _ = model.check(LoaderConfig(100_000, 2))
    assert reason is not None and ("RAM" in reason or "/dev/shm" in reason)


def test_a_dataloader_is_rebuilt_from_its_own_arguments():
    loader = DataLoader(Sleepy(2), batch_size=3, num_workers=0, drop_last=True)
    result = starvewatch.tune(loader, budget_s=2, out=False)
    assert result.current == LoaderConfig(0)
    assert result.batch_size == 3
    assert all(t.samples_per_batch == 3 for t in result.trials if t.usable)
    assert result.snippet.startswith("DataLoader(dataset, batch_size=3, num_workers=")


def test_bad_factories_get_a_clear_error():
    with pytest.raises(FactoryError, match="keyword arguments"):
        starvewatch.tune(lambda: DataLoader(Sleepy()), budget_s=1, out=False)
    with pytest.raises(FactoryError, match="ignored the arguments"):
        starvewatch.tune(lambda **kw: DataLoader(Sleepy()), budget_s=1, out=False)
    with pytest.raises(FactoryError, match="not a DataLoader"):
        starvewatch.tune(lambda **kw: [1, 2], budget_s=1, out=False)
    with pytest.raises(TrialFailed, match="corrupt record 7"):
        starvewatch.tune(lambda **kw: DataLoader(Broken(), batch_size=2, **kw), budget_s=1, out=False)
    with pytest.raises(ValueError, match="budget_s"):
        starvewatch.tune(sleepy_factory(), budget_s=0, out=False)


FACTORY_MODULE = """
import time, torch
from torch.utils.data import DataLoader, Dataset

class Items(Dataset):
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.zeros(8)

def make_loader(**kwargs):
    return DataLoader(Items(), batch_size=8, **kwargs)
"""


def test_cli_prints_the_table_and_the_dataloader_call(tmp_path):
    (tmp_path / "mytrain.py").write_text(FACTORY_MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), str(tmp_path)]))
    done = subprocess.run([sys.executable, "-m", "starvewatch", "tune", "mytrain:make_loader", "--budget", "2",
                           "--consumption", "5"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "configuration" in done.stdout and "batches/s" in done.stdout and "worker mem" in done.stdout
    assert "DataLoader(dataset, batch_size=8, num_workers=0)" in done.stdout  # 5 batches/s: no worker needed
    bad = subprocess.run([sys.executable, "-m", "starvewatch", "tune", "mytrain:nothing"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "has no attribute 'nothing'" in bad.stderr and "Traceback" not in bad.stderr
    usage = subprocess.run([sys.executable, "-m", "starvewatch", "tune", "mytrain:make_loader", "--budget", "-1"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "--budget" in usage.stderr


def test_throughput_is_the_best_third_of_the_window():
    from starvewatch.tuning.trial import _best_segment_rate
    steady = [0.01 * i for i in range(1, 301)]  # 100 batches/s for 3 s
    assert _best_segment_rate(steady, 0.0) == pytest.approx(100, rel=0.02)
    # Another process took the core during the middle second: 25 batches/s there.
    slowed = [0.01 * i for i in range(1, 101)] + [1 + 0.04 * i for i in range(1, 26)] + \
        [2 + 0.01 * i for i in range(1, 101)]
    assert _best_segment_rate(slowed, 0.0) == pytest.approx(100, rel=0.02)
    assert len(slowed) / slowed[-1] == pytest.approx(75, rel=0.02)  # what the whole window says
    assert _best_segment_rate(steady[:30], 0.0) is None  # too few batches for thirds to mean anything


def _modelled_tuner(monkeypatch, throughput, consumption=None, cores=2):
    """A Tuner whose trials return throughput(workers, prefetch) at once: the search's choices
    alone, with no loader run (the real trials are tested above)."""
    from starvewatch.tuning import search
    measured = []

    def fake_trial(factory, cfg, deadline, **kwargs):
        measured.append((cfg.num_workers, cfg.prefetch_factor))
        return TrialResult(cfg, batches_per_s=throughput(cfg.num_workers, cfg.prefetch_factor), window_batches=50)
    monkeypatch.setattr(search, "run_trial", fake_trial)
    monkeypatch.setattr(search, "build", lambda factory, cfg: None)
    monkeypatch.setattr(search, "free_memory", lambda: (64 << 30, 64 << 30))
    tuner = search.Tuner(lambda **kw: None, budget_s=600, consumption_batches_per_s=consumption, cores=cores)
    tuner.run()
    return choose(tuner.trials, consumption)[0], measured


def test_a_deeper_queue_that_helps_is_searched_for_fewer_workers(monkeypatch):
    # Bursty loading: with prefetch_factor=4 each worker delivers 50 batches/s, with 2 only 30.
    def bursty(workers, prefetch):
        return 20.0 if not workers else workers * (50.0 if prefetch == 4 else 30.0)
    pick, measured = _modelled_tuner(monkeypatch, bursty, consumption=300 / 1.2)
    # 300 batches/s needed: 10 workers at prefetch 2, but 6 at prefetch 4 (found by bisection).
    assert pick.config == LoaderConfig(6, 4), measured
    assert (5, 4) in measured  # ... and 5 at prefetch 4 was measured, short of it


def test_a_deeper_queue_is_tried_when_the_training_thread_alone_came_first(monkeypatch):
    # Workers at prefetch 2 never beat the training thread alone (a costly hand-over), but a
    # deeper queue at the best count does.
    def costly_handover(workers, prefetch):
        if not workers:
            return 150.0
        return (200.0 if prefetch == 4 else 140.0) if workers >= 4 else 100.0
    pick, measured = _modelled_tuner(monkeypatch, costly_handover)
    assert (4, 4) in measured
    assert pick.config.prefetch_factor == 4 and pick.config.num_workers <= 4, measured


def test_the_doubling_follows_a_deeper_queue_that_pays(monkeypatch):
    # Bursty loading on a host that tops out at 700 batches/s: 4 deep, each worker delivers
    # 45 batches/s, 2 deep only 28. Doubling 2 deep would climb to 23 workers first.
    def bursty(workers, prefetch):
        return 20.0 if not workers else min(700.0, workers * (45.0 if prefetch == 4 else 28.0))
    pick, measured = _modelled_tuner(monkeypatch, bursty)
    assert pick.config == LoaderConfig(14, 4), measured  # the fewest within 10% of 700, 4 deep
    assert max(w for w, p in measured if p == 2) == 4, measured  # 2 deep was left at the probe


def test_a_deeper_queue_that_does_not_pay_leaves_the_doubling_at_two(monkeypatch):
    def steady(workers, prefetch):
        return 20.0 if not workers else min(400.0, workers * 50.0 * (1.05 if prefetch == 4 else 1.0))
    pick, measured = _modelled_tuner(monkeypatch, steady)
    assert {(4, 4), (8, 4)} <= set(measured)  # probed twice, then no more
    assert not any(p == 4 and w > 8 for w, p in measured), measured
    assert pick.config.num_workers in (8, 7), measured


@pytest.mark.timeout(20)
def test_refinement_ends_when_the_midpoint_gave_no_figure(monkeypatch):
    """A refinement midpoint whose trial gave no figure (cut short, failed) is measured once;
    asked for again, it adds no trial, and the refinement ends instead of spinning (the
    budget clock only advances with new trials)."""
    def no_figure_at_6(workers, prefetch):
        if workers == 6:
            return None
        return 20.0 if not workers else min(400.0, workers * 50.0)
    pick, measured = _modelled_tuner(monkeypatch, no_figure_at_6)
    assert pick is not None and pick.config.num_workers == 8, measured
    assert measured.count((6, 2)) == 1, measured


def test_a_high_draw_for_the_best_is_measured_again_and_no_longer_sets_the_target(monkeypatch):
    # CPU-bound on 2 cores: every count from 2 on gives 190 batches/s, but 8 workers' first
    # trial drew 230. Taken as is, the target (90% of 230 = 207) leaves 8 workers the answer.
    draws = {}

    def cpu_bound(workers, prefetch):
        draws[(workers, prefetch)] = draws.get((workers, prefetch), 0) + 1
        if (workers, prefetch) == (8, 2) and draws[(8, 2)] == 1:
            return 230.0
        return {0: 140.0, 1: 100.0}.get(workers, 190.0)
    pick, measured = _modelled_tuner(monkeypatch, cpu_bound)
    assert measured.count((8, 2)) == 2, measured  # measured again: mean 210, target 189
    assert pick.config.num_workers == 2 and pick.runs == 2, measured  # the answer, confirmed too
    assert "mean of 2 runs" in answer_table(pick)


def answer_table(trial) -> str:
    from starvewatch.tuning.answer import table
    return table([trial], trial)


def _started_workers():
    """A DataLoader iterator whose two workers are up, their pids registered with torch's
    SIGCHLD check, as a trial's is when its time ends while the iterator is being built."""
    it = iter(DataLoader(Sleepy(item_ms=1), batch_size=4, num_workers=2))
    next(it)
    return it, [w.pid for w in it._workers]


def _zombie(pid) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_kill_the_sigchld_check_sees_raises_in_the_training_thread():
    """The failure the trial's kill avoids, shown: killed, not reaped, then SIGCHLD handled."""
    import signal

    from tests.conftest import wait_until
    it, pids = _started_workers()
    try:
        with pytest.raises(RuntimeError, match="killed by signal"):  # as the SIGCHLD comes, or below
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda: all(_zombie(pid) for pid in pids), timeout_s=10, what="the killed workers exiting")
            signal.raise_signal(signal.SIGCHLD)
    finally:
        it._shutdown_workers()


def test_the_trial_kills_workers_of_an_iterator_it_never_saw_without_an_error():
    import signal

    from starvewatch.tuning.trial import _kill_and_reap
    it, pids = _started_workers()
    try:
        handler = signal.getsignal(signal.SIGCHLD)
        assert _kill_and_reap(pids) == 2
        assert signal.getsignal(signal.SIGCHLD) is handler  # torch's check is back in place
        assert not any(psutil.pid_exists(pid) for pid in pids)  # gone, and reaped: no zombie left
        signal.raise_signal(signal.SIGCHLD)  # torch's check, now: nothing to complain about
    finally:
        it._shutdown_workers()
