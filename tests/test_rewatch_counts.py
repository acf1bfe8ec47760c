"""Every step counted when the same object is watched and iterated again (issue 42): over
sequences of watch / iter / partial iteration / break / finish on lists, ranges, generators
and DataLoaders, with and without the sidecar, each run's summary counts the steps the loop
took, its delivery account holds each of them once (acknowledged + spooled + dropped), a drop
is only ever a named reason, and the collector's CSV export holds exactly the steps the
summary counts. The truth is the loop's own count and what the real collector stored."""
import csv
import io
import os

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

import starvewatch
from tests.conftest import wait_until

KINDS = ("list", "range", "generator", "dataloader")
DROP_REASONS = {"buffer_full"}  # what a loop faster than delivery may lose, counted


class Numbers(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor(i)


def _make(kind: str, n: int):
    if kind == "list":
        return list(range(n))
    if kind == "range":
        return range(n)
    if kind == "generator":
        return (i for i in range(n))  # once: iterated again it is exhausted (0 steps, truthfully)
    return DataLoader(Numbers(n), batch_size=1)


# A loop: (kind, length, watch again before it?, batches to take before a break, or None: all).
LOOP = st.tuples(st.sampled_from(KINDS), st.integers(0, 300), st.booleans(),
                 st.none() | st.integers(0, 300))
OPS = st.lists(st.one_of(LOOP, st.just(("finish",))), min_size=1, max_size=8)


def stored_steps(c, run_id: str) -> list[tuple]:
    status, body = c.request("GET", f"/api/v1/runs/{run_id}/export?format=csv")
    if status == 404:
        return []
    assert status == 200, body[:300]
    return [(r["loader"], int(r["epoch"]), int(r["step"])) for r in csv.DictReader(io.StringIO(body.decode()))]


def _finish_and_check(c, taken: dict) -> None:
    summary = starvewatch.finish()
    if summary is None or not taken:
        return
    total = sum(taken.values())
    steps = {loader["name"]: loader["steps"] for loader in summary["loaders"]}
    assert steps == {name: n for name, n in taken.items() if name in steps} and set(taken) <= set(steps), (steps, taken)
    account = summary["delivery"]
    assert set(account["dropped"]) <= DROP_REASONS, account
    assert account["acknowledged"] + account["spooled"] + sum(account["dropped"].values()) == total, account
    dropped = sum(account["dropped"].values())
    assert dropped == sum(loader["dropped_records"] for loader in summary["loaders"])
    run_id = summary["run"]["id"]
    # Acknowledged is stored already; what waited in the spool comes with the collector's sweep.
    wait_until(lambda: len(stored_steps(c, run_id)) >= total - dropped, timeout_s=240,
               what=f"{total - dropped} stored steps of {run_id}")
    stored = stored_steps(c, run_id)
    assert len(stored) == len(set(stored)) == total - dropped
    per_loader = {name: sum(1 for loader, _, _ in stored if loader == name) for name in taken}
    assert per_loader == {name: n - next(l["dropped_records"] for l in summary["loaders"] if l["name"] == name)
                          for name, n in taken.items()}


@pytest.fixture
def live_collector(collector, isolated_starvewatch, monkeypatch):
    """One real collector on the training's own directory (its sweep takes the spool), for
    every example of a test."""
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    monkeypatch.setenv("STARVEWATCH_SIDECAR", "1")  # each example sets its own; restored after the test
    return c


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=OPS, sidecar=st.sampled_from(["1", "0"]))
# The issue's loops, on objects of 10^6 items but with a few 10^5 steps stored (the collector's
# ingest and export of them is most of this test's time; the whole 2 x 10^6 is
# test_the_issue_loop_spools_every_step_with_no_collector's): a list watched again, with the
# sidecar; a range broken off and iterated again in the process itself.
@example(ops=[("list", 10**6, True, 300_000), ("list", 10**6, True, 300_000)], sidecar="1")
@example(ops=[("range", 10**6, False, 200_000), ("range", 10**6, False, 200_000), ("generator", 50, True, 10),
              ("finish",), ("range", 10**6, True, 5)], sidecar="0")
@pytest.mark.timeout(900)  # at a load of 8 to 14 on 2 cores, storing the 10^5s took minutes
def test_every_step_of_every_rewatch_is_counted_and_stored(live_collector, ops, sidecar):
    os.environ["STARVEWATCH_SIDECAR"] = sidecar  # read by each run's init (live_collector restores it)
    objects, watched, taken = {}, {}, {}
    try:
        for op in ops:
            if op[0] == "finish":
                _finish_and_check(live_collector, taken)
                taken = {}
                continue
            kind, n, rewatch, stop = op
            if (kind, n) not in objects:
                objects[kind, n] = _make(kind, n)
            if rewatch or (kind, n) not in watched:
                watched[kind, n] = starvewatch.watch(objects[kind, n], name=kind)
            count = 0
            for _ in watched[kind, n]:
                count += 1  # a batch received is a step, also the one before a break
                if stop is not None and count > stop:
                    break
            taken[kind] = taken.get(kind, 0) + count
        _finish_and_check(live_collector, taken)
    finally:
        starvewatch.finish()


@pytest.mark.parametrize("sidecar", ["1", "0"])
def test_the_issue_loop_spools_every_step_with_no_collector(monkeypatch, isolated_starvewatch, sidecar):
    """The issue's reproduction: a list of 10^6 watched again for a second epoch, no collector.
    Before: 1,659,457 steps in the summary (1,233,473 without the sidecar, whose account said
    1,212,993 spooled), finish() 18.7 s. The spool files hold exactly the steps counted."""
    from starvewatch.spool_format import read_spool_file
    monkeypatch.setenv("STARVEWATCH_SIDECAR", sidecar)
    n = 10**6
    data = list(range(n))
    for _ in range(2):
        for _ in starvewatch.watch(data, name="train"):
            pass
    summary = starvewatch.finish()
    assert [(l["steps"], l["dropped_records"]) for l in summary["loaders"]] == [(2 * n, 0)]
    assert summary["delivery"] == {"acknowledged": 0, "spooled": 2 * n, "dropped": {}}
    spooled = {0: [], 1: []}
    for path in isolated_starvewatch.glob("spool/*/*/*.json.gz"):
        steps = read_spool_file(path)["steps"]
        for epoch in spooled:
            spooled[epoch] += [s for e, s in zip(steps["epoch"], steps["step"]) if e == epoch]
    assert sorted(spooled[0]) == sorted(spooled[1]) == list(range(n))
