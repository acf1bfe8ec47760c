"""Issue 38 item 1: where each wait came from, by overlap. Real DataLoader workers (fork); the
truth comes from outside starvewatch: the test times its own loop (each next()), the dataset
and collate_fn stamp their own work into the batch (perf_counter_ns, the clock the workers and
the loop share), and the test intersects the two itself."""
from __future__ import annotations

import time
from time import perf_counter_ns

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

import starvewatch

BATCH = 4
WORKERS = 3
SLOW_WORKER = 1


def overlap(a: int, b: int, start: int, end: int) -> int:
    return max(0, min(b, end) - max(a, start))


class Stamped(Dataset):
    """Each sample: its index, its worker, when its __getitem__ began and ended. Worker
    SLOW_WORKER sleeps 10x longer than the others (`item_s`, 0 for all: a fast dataset)."""

    def __init__(self, n: int, item_s: float, slow_worker: int | None) -> None:
        self.n, self.item_s, self.slow_worker = n, item_s, slow_worker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        t0 = perf_counter_ns()
        info = get_worker_info()
        worker = info.id if info is not None else -1
        if self.item_s:
            time.sleep(self.item_s * (10 if worker == self.slow_worker else 1))
        return torch.tensor([i, worker, t0, perf_counter_ns()], dtype=torch.int64)


def slow_collate(samples):
    """The default collate, 30 ms slower, stamping its own start and end into the batch's
    last row (one tensor: one shared-memory hand-over, as for the default collate)."""
    c0 = perf_counter_ns()
    time.sleep(0.03)
    batch = torch.stack(samples)
    return torch.cat([batch, torch.tensor([[-1, -1, c0, perf_counter_ns()]])])


def stamping_collate(samples):
    """The default collate, then a last row stamping when it ended: the batch is ready to hand
    over (what follows in the worker, before the hand-over, is starvewatch's record and the
    put). Its worker's own work on the batch, with no stamp missing: a collate preempted on a
    loaded machine (4 small tensors stacked: 0.1 ms quiet, up to 29 ms measured at load 7) is
    the worker's time too."""
    batch = torch.stack(samples)
    return torch.cat([batch, torch.tensor([[-1, -1, 0, perf_counter_ns()]])])


def stamps(batch) -> tuple[int, int, int, int]:
    """(worker, first sample's start, last sample's end, collate's end) of a stamped batch."""
    samples = batch[:-1]
    return int(samples[0, 1]), int(samples[:, 2].min()), int(samples[:, 3].max()), int(batch[-1, 3])


def timed_loop(loader, name: str) -> list[tuple[int, int, object]]:
    """(wait start, wait end, batch) per step, as the loop itself saw them: the first wait
    starts at iter() (the workers' start-up is the loop's wait too)."""
    out = []
    # watch() itself (the run's set-up, the sidecar's start: ~20 ms quiet, far more at load 20)
    # comes before the loop's first wait: counted in it, it went to worker 0 in the truth only.
    watched = starvewatch.watch(loader, name)
    t_call = perf_counter_ns()
    it = iter(watched)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return out
        t_ret = perf_counter_ns()
        out.append((t_call, t_ret, batch))
        time.sleep(0.001)  # a short step: the loop waits for the workers
        t_call = perf_counter_ns()


def test_a_slow_worker_is_named_with_its_share_and_its_stage(collector, monkeypatch):
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    loader = DataLoader(Stamped(WORKERS * BATCH * 16, 0.003, SLOW_WORKER), batch_size=BATCH,
                        num_workers=WORKERS, collate_fn=stamping_collate)
    steps = timed_loop(loader, "skewed")
    total = sum(b - a for a, b, _ in steps)
    # Truth: per worker, the loop's waits for its batches up to the batch's collate's end (after
    # that, the hand-over is the main process's); the part inside the batch's own fetch.
    owed = [0] * WORKERS
    fetching = 0
    for a, b, batch in steps:
        worker, start, end, collated = stamps(batch)
        owed[worker] += max(0, min(b, collated) - a)
        fetching += overlap(a, b, start, end)
    summary = starvewatch.finish()
    run_id = summary["run"]["id"]

    [loader_summary] = summary["loaders"]
    attribution = loader_summary["attribution"]
    assert attribution["steps"] == len(steps) == 16 * WORKERS
    assert attribution["coverage"] > 0.95
    assert attribution["top_worker"] == SLOW_WORKER, attribution["workers"]
    truth = owed[SLOW_WORKER] / total
    assert truth > 0.4, (truth, owed)  # the scenario: the slow worker holds the loop back
    shares = [w["share"] for w in attribution["workers"]]
    assert abs(shares[SLOW_WORKER] - truth) < 0.10, (shares, [o / total for o in owed])
    assert attribution["top_stage"] == "fetch", attribution["stages"]
    assert abs(attribution["stages"]["fetch"]["share"] - fetching / total) < 0.10, (attribution["stages"], fetching / total)
    # Intersections, not sums: the stages and the workers add up to the wait, never more.
    assert abs(sum(s["share"] for s in attribution["stages"].values()) - 1.0) < 1e-6
    assert abs(sum(shares) + attribution["main_process_share"] - 1.0) < 1e-6
    # The loop waited through hand-overs: part of each still in the worker (its feeder).
    assert 0 < attribution["handover_send_share"] <= attribution["main_process_share"]
    # Each worker's own batch time, every batch counted: as the batch's own stamps say (from
    # the first __getitem__'s start to the collate's end). Unstamped, and the worker's: its
    # indices' unpickling and torch's fetcher before the first sample, the record and the put
    # after the collate (3 ms a batch at most, measured at load 7, most of it the first
    # batch's, in a process just started); waiting for indices (100 ms a batch for the fast
    # workers, behind the slow one) is not its batch time.
    assert attribution["worker_batches"] == [16] * WORKERS
    batch_ms = attribution["worker_batch_ms"]
    stamped = [[] for _ in range(WORKERS)]
    for _, _, batch in steps:
        worker, start, _, collated = stamps(batch)
        stamped[worker].append((collated - start) / 1e6)
    for worker, times in enumerate(stamped):
        truth_ms = sum(times) / len(times)
        assert truth_ms <= batch_ms[worker] < truth_ms * 1.1 + 6, (batch_ms, worker, truth_ms)
    assert max(range(WORKERS), key=batch_ms.__getitem__) == SLOW_WORKER

    # The collector holds the same figures (the loaders' totals went over the wire).
    remote = c.get(f"/api/v1/runs/{run_id}/summary")
    [remote_loader] = remote["loaders"]
    assert remote_loader["attribution"]["workers"] == attribution["workers"]
    assert remote_loader["attribution"]["stages"] == attribution["stages"]

    # The exports carry it: Markdown (and the HTML report, made from it) and the dashboard's bars.
    status, body = c.request("GET", f"/api/v1/runs/{run_id}/export?format=md")
    assert status == 200
    text = body.decode()
    assert "## Where the waits came from" in text
    slow_share = f"| {SLOW_WORKER} | {shares[SLOW_WORKER] * 100:.1f}% |"
    assert slow_share in text, text
    status, body = c.request("GET", f"/api/v1/runs/{run_id}/export?format=html")
    assert status == 200 and b"Where the waits came from" in body and b"Who made the loop wait" in body
    from starvewatch.dashboard import layout
    from starvewatch.monitor.outputs import figures
    fig = figures.wait_attribution(remote_loader)
    stages, workers = fig.data
    assert dict(zip(stages.x, stages.y))["fetch"] == attribution["stages"]["fetch"]["share"]
    assert list(workers.x) == ["worker 0", "worker 1", "worker 2", "main process"]
    assert list(workers.y) == shares + [attribution["main_process_share"]]
    assert f"/api/v1/runs/{run_id}/export?format=trace" in str(layout.run_page(run_id))
    status, body = c.request("GET", f"/api/v1/runs/{run_id}/export?format=trace&steps=0:5")
    assert status == 200
    import json
    trace = json.loads(body)
    assert len([e for e in trace["traceEvents"] if e.get("cat") == "starvewatch.wait"]) == 6
    assert {e["args"]["worker"] for e in trace["traceEvents"] if e.get("cat") == "starvewatch.fetch"} == {0, 1, 2}


def test_a_slow_collate_fn_is_named_with_its_share():
    # One worker: every batch's collate is in the loop's way; 32 batches outweigh the
    # worker's start-up (the first step's wait).
    loader = DataLoader(Stamped(BATCH * 32, 0.0, None), batch_size=BATCH, num_workers=1,
                        collate_fn=slow_collate)
    steps = timed_loop(loader, "collating")
    total = sum(b - a for a, b, _ in steps)
    collating = sum(overlap(a, b, int(batch[-1, 2]), int(batch[-1, 3])) for a, b, batch in steps)
    summary = starvewatch.finish()

    attribution = summary["loaders"][0]["attribution"]
    assert attribution["steps"] == len(steps)
    assert attribution["top_stage"] == "collate", attribution["stages"]
    assert collating / total > 0.4, collating / total
    assert abs(attribution["stages"]["collate"]["share"] - collating / total) < 0.10, (
        attribution["stages"], collating / total)
    assert attribution["stages"]["fetch"]["share"] < 0.1


def test_a_loader_without_workers_has_no_attribution():
    loader = DataLoader(Stamped(16, 0.0, None), batch_size=BATCH)
    for _ in starvewatch.watch(loader, "inline"):
        pass
    summary = starvewatch.finish()
    assert summary["loaders"][0]["attribution"] is None


def test_head_of_line_blocking_is_named_and_in_order_false_advised_only_where_the_order_is_free():
    shuffled = DataLoader(Stamped(WORKERS * BATCH * 12, 0.003, SLOW_WORKER), batch_size=BATCH,
                          num_workers=WORKERS, shuffle=True)
    ordered = DataLoader(Stamped(WORKERS * BATCH * 12, 0.003, SLOW_WORKER), batch_size=BATCH,
                         num_workers=WORKERS)
    timed_loop(shuffled, "shuffled")
    timed_loop(ordered, "ordered")
    summary = starvewatch.finish()

    findings = {f["loader"]: f for f in summary["findings"] if f["kind"] == "head_of_line"}
    assert set(findings) == {"shuffled", "ordered"}, summary["findings"]
    for name, finding in findings.items():
        assert finding["detail"]["worker"] == SLOW_WORKER
        assert finding["detail"]["head_of_line_share"] >= 0.2
        assert f"waited for worker {SLOW_WORKER}" in finding["title"]
    assert findings["shuffled"]["detail"]["order_free"] is True
    assert findings["ordered"]["detail"]["order_free"] is False
    assert "may rely on the order" in findings["ordered"]["fix"]
    advice = {r["loader"]: r for r in summary["recommendations"] if r["parameter"] == "in_order"}
    assert set(advice) == {"shuffled"}, summary["recommendations"]
    rec = advice["shuffled"]
    assert (rec["current"], rec["suggested"], rec["kind"]) == (True, False, "speedup")
    assert rec["expected_speedup"] > 1.2
    assert "out of sampler order" in rec["reason"] and "skew the data distribution" in rec["reason"]


def test_in_order_false_is_attributed_by_the_batch_handed_over_and_has_no_head_of_line():
    loader = DataLoader(Stamped(WORKERS * BATCH * 12, 0.003, SLOW_WORKER), batch_size=BATCH,
                        num_workers=WORKERS, shuffle=True, in_order=False, collate_fn=stamping_collate)
    steps = timed_loop(loader, "out_of_order")
    total = sum(b - a for a, b, _ in steps)
    owed = [0] * WORKERS
    for a, b, batch in steps:
        worker, _, _, collated = stamps(batch)
        owed[worker] += max(0, min(b, collated) - a)
    summary = starvewatch.finish()
    attribution = summary["loaders"][0]["attribution"]
    assert attribution["steps"] == len(steps)
    assert attribution["head_of_line_ms"] == 0
    assert not [f for f in summary["findings"] if f["kind"] == "head_of_line"]
    assert not [r for r in summary["recommendations"] if r["parameter"] == "in_order"]
    shares = [w["share"] for w in attribution["workers"]]
    for worker in range(WORKERS):
        assert abs(shares[worker] - owed[worker] / total) < 0.10, (shares, [o / total for o in owed])
