"""torchrun with two ranks (gloo, CPU), an all-reduce every step: one run, per-rank series and
verdicts, and the straggler rule naming the slow rank (analysis/stragglers.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from starvewatch.analysis.stragglers import find_stragglers, judge_window, WindowSums, windows_from_rows

from starvewatch.dashboard import callbacks
from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.store import Store

from .conftest import free_port, wait_until
from .test_dashboard_views import _text

PROGRAM = Path(__file__).parent / "programs" / "ddp_train.py"


def torchrun(collector, tmp_path, slow: str, name: str, steps: int = 60):
    env = {**os.environ, "STARVEWATCH_URL": collector.url, "STARVEWATCH_RUN_NAME": name,
           "SW_SLOW": slow, "SW_STEPS": str(steps), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "STARVEWATCH_DIR": str(tmp_path / f"sw-{name}")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(PROGRAM)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count(f"finished {steps} steps") == 2, done.stdout
    runs = wait_until(lambda: [r for r in collector.get("/api/v1/runs")["runs"]
                               if r["name"] == name and r["status"] == "finished"], what="the finished run")
    assert len(runs) == 1, runs  # both ranks in ONE run
    return runs[0]


@pytest.fixture
def ddp_collector(collector):
    return collector()


def test_slow_loading_on_rank1_is_an_input_straggler(ddp_collector, tmp_path):
    run = torchrun(ddp_collector, tmp_path, "load", "ddp-load")
    assert run["ranks"] == 2
    run_id = run["id"]
    detail = ddp_collector.get(f"/api/v1/runs/{run_id}")
    assert sorted(r["rank"] for r in detail["ranks"]) == [0, 1]
    # Per-rank series and verdicts.
    for rank in (0, 1):
        series = ddp_collector.get(f"/api/v1/runs/{run_id}/steps/series?loader=train&rank={rank}")
        assert sum(p["count"] for p in series["points"]) == 60
    waits = {rank: ddp_collector.get(f"/api/v1/runs/{run_id}/summary?rank={rank}")["verdict"]
             for rank in (0, 1)}
    assert waits[1]["input_bound"] == "high", waits
    assert waits[1]["input_wait_fraction"] > waits[0]["input_wait_fraction"] + 0.3, waits
    found = ddp_collector.get(f"/api/v1/runs/{run_id}/stragglers")
    assert found["ranks"] == [0, 1]
    assert [(s["rank"], s["kind"], s["severity"]) for s in found["stragglers"]] == [(1, "input", "critical")]
    cause = found["stragglers"][0]["cause"]
    # Its own samples: rank 1's loader loads on the training thread and is told to use workers.
    assert cause["limiting_factor"] in ("input_bound_io", "input_bound_cpu"), cause
    assert cause["recommendation"]["parameter"] == "num_workers", cause
    assert cause["host"], cause
    # Unmarked steps: the all-reduce's wait is in rank 0's compute, so compute is not judged.
    assert found["compute_measured"] == {"train": False}
    summary = ddp_collector.get(f"/api/v1/runs/{run_id}/summary")
    assert summary["stragglers"]["stragglers"][0]["rank"] == 1
    status, report = ddp_collector.request("GET", f"/api/v1/runs/{run_id}/export?format=md")
    assert status == 200
    assert "## Stragglers" in report.decode() and "**rank 1**, train: critical input straggler" in report.decode()
    # The dashboard's per-rank view marks rank 1's row (read from the collector's own database).
    store = Store(ddp_collector.directory / "starvewatch.db")
    try:
        ranks = callbacks.run_view(Query(store), run_id, None)["ranks"]
    finally:
        store.close()
    rows = {row.id: row for row in _find(ranks, "ranks-table").children[1].children}
    assert rows["rank-row-1"].className == "sw-straggler"
    assert getattr(rows["rank-row-0"], "className", None) is None
    assert "input straggler" in _text(rows["rank-row-1"]) and "input straggler" not in _text(rows["rank-row-0"])
    assert "Rank 1 (train): critical input straggler" in _text(ranks)


def _find(component, component_id):
    if getattr(component, "id", None) == component_id:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            hit = _find(child, component_id)
            if hit is not None:
                return hit
    return None


def test_slow_compute_on_rank1_is_a_compute_straggler(ddp_collector, tmp_path):
    run = torchrun(ddp_collector, tmp_path, "compute", "ddp-compute")
    found = ddp_collector.get(f"/api/v1/runs/{run['id']}/stragglers")
    assert found["compute_measured"] == {"train": True}
    assert [(s["rank"], s["kind"], s["severity"]) for s in found["stragglers"]] == [(1, "compute", "critical")]
    assert "before the collective" in found["stragglers"][0]["cause"]["text"]
    # Rank 0 waited for rank 1 inside the all-reduce: outside its marked compute.
    per_rank = found["per_rank"]["train"]
    assert per_rank["0"]["compute_excess_fraction"] == 0.0
    assert per_rank["1"]["compute_excess_fraction"] >= 0.2


# ---- the rule itself, on constructed windows -------------------------------------------------
def _window(waits_ms, computes_ms, others_ms=None, steps=20, marked=True):
    others_ms = others_ms or [0.0] * len(waits_ms)
    return {rank: WindowSums(steps, int(w * 1e6 * steps), int(c * 1e6 * steps), int(o * 1e6 * steps),
                             steps if marked else 0)
            for rank, (w, c, o) in enumerate(zip(waits_ms, computes_ms, others_ms))}


@pytest.mark.parametrize("excess_ms, expected", [(9.0, None), (10.5, "warning"), (19.5, "warning"),
                                                  (20.5, "critical")])
def test_input_thresholds_are_shares_of_the_step_time(excess_ms, expected):
    # Four ranks, step time 100 ms everywhere; rank 2 waits `excess_ms` more than the median rank.
    waits = [5.0, 5.0, 5.0 + excess_ms, 6.0]
    computes = [95.0, 95.0, 95.0 - excess_ms, 94.0]
    verdict = judge_window("train", 0, 0, _window(waits, computes, marked=False))
    result = find_stragglers([verdict] * 2)
    named = [(s["rank"], s["kind"], s["severity"]) for s in result["stragglers"]]
    assert named == ([] if expected is None else [(2, "input", expected)])


def test_unmarked_compute_is_not_judged_and_marked_compute_is():
    # Rank 1 computes 30 ms longer before the collective; rank 0 waits for it in the collective.
    unmarked = judge_window("train", 0, 0, _window([2, 2], [100, 100], marked=False))
    assert unmarked.excess[1][1] is None
    assert find_stragglers([unmarked] * 2)["stragglers"] == []
    marked = judge_window("train", 0, 0, _window([2, 2], [70, 100], [30, 0]))
    assert [(s["rank"], s["kind"], s["severity"]) for s in find_stragglers([marked] * 2)["stragglers"]] == \
        [(1, "compute", "critical")]
    # step() around a DDP backward: the collective is inside the marked compute. Rank 1's loading
    # is slow; rank 0 waits for it inside its "compute". Only rank 1 is named, for its input.
    inside = judge_window("train", 0, 0, _window([2, 32], [100, 70], [1, 1]))
    assert [(s["rank"], s["kind"]) for s in find_stragglers([inside] * 2)["stragglers"]] == [(1, "input")]


def test_one_noisy_window_names_no_one_and_partial_windows_wait():
    calm = [judge_window("train", 0, i, _window([2, 2], [50, 50], marked=False)) for i in range(4)]
    spike = judge_window("train", 0, 4, _window([2, 40], [50, 12], marked=False))
    assert find_stragglers(calm + [spike])["stragglers"] == []
    assert find_stragglers(calm + [spike] * 5)["stragglers"][0]["rank"] == 1
    # A live run: rank 1 has shipped half of this window so far.
    rows = [("train", 0, 0, 0, 20, 40_000_000, 1_000_000_000, 0, 0),
            ("train", 0, 0, 1, 10, 400_000_000, 500_000_000, 0, 0)]
    assert windows_from_rows(rows) == []


def test_a_forward_phase_is_the_compute_before_the_collective():
    # Unmarked steps (other = 0) whose compute holds the all-reduce: equal on both ranks. The
    # forward phases (a framework callback's) show rank 1 computing 30 ms longer before it.
    windows = range(2)
    rows = [("train", 0, w, rank, 20, 20 * 2_000_000, 20 * 98_000_000, 0, 0) for w in windows for rank in (0, 1)]
    forward = [("train", 0, w, rank, 20, 20 * forward_ms * 1_000_000)
               for w in windows for rank, forward_ms in ((0, 10), (1, 40))]
    assert find_stragglers(windows_from_rows(rows))["stragglers"] == []
    found = find_stragglers(windows_from_rows(rows, forward_rows=forward))
    assert [(s["rank"], s["kind"], s["severity"], s["excess_fraction"]) for s in found["stragglers"]] == \
        [(1, "compute", "critical", 0.3)]
    # Forward phases on only a few of one rank's steps: not enough to judge.
    assert find_stragglers(windows_from_rows(rows, forward_rows=[
        f if f[3] == 0 else f[:4] + (5, 5 * 40_000_000) for f in forward]))["stragglers"] == []


def test_a_run_too_short_to_judge_names_no_one():
    slow_rank_1 = _window([2, 40], [50, 12], marked=False)
    one = [judge_window("train", 0, 0, slow_rank_1)]
    assert find_stragglers(one)["stragglers"] == []
    assert find_stragglers(one + [judge_window("train", 0, 1, slow_rank_1)])["stragglers"][0]["rank"] == 1
    # An epoch's last steps, as a window of their own: 2 steps on every rank are not judged.
    assert judge_window("train", 0, 7, _window([2, 40], [50, 12], steps=2, marked=False)) is None
    assert judge_window("train", 0, 7, _window([2, 40], [50, 12], steps=5, marked=False)) is not None


def test_a_long_run_is_judged_on_each_ranks_recent_steps(tmp_path):
    """Rank by rank (as a spool import stores them), longer than the bound: every rank's latest
    records are read, so windows still align, and the work stays bounded."""
    import orjson

    from starvewatch.monitor.web.wire_models import EventBatch

    from .test_collector_api import batch
    store = Store(tmp_path / "db.sqlite")
    try:
        for rank, (wait, compute) in enumerate(((2_000_000, 8_000_000), (9_000_000, 1_000_000))):
            for k in range(10):
                store.ingest(EventBatch.model_validate_json(orjson.dumps(batch(
                    run_id="long", stream=f"s{rank}", seq=k + 1, rank=rank, n=1000, step0=k * 1000,
                    wait_ns=wait, compute_ns=compute))))
        query = Query(store)
        query.STRAGGLER_ROWS = 4000  # 2,000 recent records per rank
        found = query.stragglers("long")
        assert [(s["rank"], s["kind"], s["severity"]) for s in found["stragglers"]] == [(1, "input", "critical")]
        assert found["windows"] == 2000 // 20  # steps 8000..9999 of both ranks, nothing older
    finally:
        store.close()
