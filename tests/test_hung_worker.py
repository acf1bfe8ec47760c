"""Issue 16, item 1: a stall names the worker that holds the batch, its state, the batch's
dataset indices and the worker's Python stack (real DataLoader workers, fork and spawn).

The dataset blocks on one index until the test creates a gate file (a file works across fork
and spawn); the block gives up after a deadline of its own, so a failing test never hangs.
"""
from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import starvewatch
from starvewatch.hooks.report import format_report
from starvewatch.hooks.session import current_session
from starvewatch.monitor.outputs.export import render_html, to_markdown
from starvewatch.hooks.stacks import register, request
from tests.conftest import wait_until

BATCH = 4
BLOCKED_INDEX = 21  # batch 5 (indices 20..23): with 2 workers, worker 1 loads it
GIVE_UP_S = 60.0


def blocked_here_until(gate: str) -> None:
    """The function the stack must show."""
    deadline = time.monotonic() + GIVE_UP_S
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.005)


class BlocksOnOneIndex(Dataset):
    def __init__(self, gate: str, n: int = 48) -> None:
        self.gate, self.n = gate, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == BLOCKED_INDEX:
            blocked_here_until(self.gate)
        return torch.tensor([i])


class BlocksInIter(IterableDataset):
    def __init__(self, gate: str) -> None:
        self.gate = gate

    def __iter__(self):
        blocked_here_until(self.gate)  # before the first batch: inside iter(loader)
        return iter(range(8))


def _blocked_stall(stalls: list[dict], step: int) -> dict | None:
    """The stall of the blocked batch (a slow worker start-up on a busy machine may add one
    at step 0, which is a stall too)."""
    found = [s for s in stalls if s.get("step") == step]
    assert len(found) <= 1, found
    return found[0] if found else None


def _release_when_stack_arrives(gate: str, step: int) -> threading.Thread:
    """Creates the gate once the blocked batch's stall event carries a stack (or after a
    bounded wait, and then the test fails on what is missing)."""
    session = current_session()

    def run():
        try:
            wait_until(lambda: (_blocked_stall(session.stalls, step) or {}).get("stack"),
                       timeout_s=40, what="a stall with a stack")
        finally:
            open(gate, "w").close()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def stall_quickly(monkeypatch):
    monkeypatch.setenv("STARVEWATCH_STALL_MIN_S", "0.4")


@pytest.mark.parametrize("context,sidecar", [("fork", "1"), ("spawn", "0")])
def test_the_stall_names_the_worker_its_state_indices_and_stack(tmp_path, monkeypatch, stall_quickly,
                                                                 context, sidecar):
    monkeypatch.setenv("STARVEWATCH_SIDECAR", sidecar)  # the stack through the sidecar, or not
    gate = str(tmp_path / "gate")
    loader = starvewatch.watch(DataLoader(BlocksOnOneIndex(gate), batch_size=BATCH, num_workers=2,
                                          multiprocessing_context=context))
    session = current_session()
    releaser = _release_when_stack_arrives(gate, step=5)
    seen = [int(b[0]) for b in loader]
    releaser.join(5)
    assert seen == list(range(0, 48, BATCH))
    summary = starvewatch.finish()
    stall = _blocked_stall(summary["stalls"], 5)
    assert stall["step"] == 5 and stall["phase"] == "next" and stall["ended_ns"]
    assert stall["worker"] == 1
    worker_pids = {w["id"]: w["pid"] for w in stall["workers"]}
    assert stall["worker_pid"] == worker_pids[1] and worker_pids[0] != worker_pids[1]
    assert stall["worker_state"] in ("sleeping", "running")
    assert stall["indices"] == [20, 21, 22, 23]
    assert "blocked_here_until" in stall["stack"] and "__getitem__" in stall["stack"]
    assert "most recent call first" in stall["stack"] and stall["stack_of"] == "worker"
    stack_files = list(session.stack_dir.glob("worker-1.stack"))
    assert stack_files and "blocked_here_until" in stack_files[0].read_text()
    # The console line (and `starvewatch runs ID`), the Markdown and HTML exports say it too.
    # (A slow spawn start-up may add a stall at batch 1, worker 1 not started yet: not this one.)
    line = next(l for l in format_report(summary).splitlines() if "stall on train" in l and "batch 5 " in l)
    assert f"worker 1 (pid {worker_pids[1]}" in line and "loading indices 20, 21, 22, 23" in line
    assert "in blocked_here_until" in line  # the innermost frame of the loading thread
    markdown = to_markdown(summary)
    assert "loading indices 20, 21, 22, 23" in markdown and "blocked_here_until" in markdown
    assert "in blocked_here_until" in render_html(summary, {}, {}, [])


def test_without_workers_the_training_threads_stack(tmp_path, stall_quickly):
    gate = str(tmp_path / "gate")
    loader = starvewatch.watch(DataLoader(BlocksOnOneIndex(gate), batch_size=BATCH, num_workers=0))
    releaser = _release_when_stack_arrives(gate, step=5)
    assert len(list(loader)) == 12
    releaser.join(5)
    stall = _blocked_stall(starvewatch.finish()["stalls"], 5)
    assert stall["worker"] is None and stall["worker_state"] == "in training process"
    # No indices in the training process: they would be read from another thread's frame.
    assert stall["phase"] == "next" and stall["indices"] is None
    assert stall["stack_of"] == "training process"
    assert "blocked_here_until" in stall["stack"] and "__getitem__" in stall["stack"]


def test_a_hang_inside_iter_is_reported_like_one_in_next(tmp_path, stall_quickly):
    gate = str(tmp_path / "gate")
    loader = starvewatch.watch(DataLoader(BlocksInIter(gate), batch_size=2, num_workers=0))
    releaser = _release_when_stack_arrives(gate, step=0)
    assert len(list(loader)) == 4
    releaser.join(5)
    [stall] = starvewatch.finish()["stalls"]
    assert stall["phase"] == "iter" and stall["step"] == 0 and stall["ended_ns"]
    assert "blocked_here_until" in stall["stack"] and "__iter__" in stall["stack"]
    assert stall["indices"] is None


def test_a_users_handler_is_never_replaced_and_strangers_are_never_signalled(tmp_path):
    import signal
    taken = []
    first = None
    try:
        # Take every candidate signal but the last one: register() must pick that one.
        candidates = list(range(signal.SIGRTMIN + 6, signal.SIGRTMAX - 4))
        for signum in candidates[:-1]:
            signal.signal(signum, lambda *a: None)
            taken.append(signum)
        first = register(str(tmp_path / "mine.stack"))
        assert first == candidates[-1]
        assert all(signal.getsignal(s) is not signal.SIG_DFL for s in taken)
        # Not a child of the given parent: no signal is sent (its default action would kill).
        assert request(os.getpid(), first, str(tmp_path / "mine.stack"), parent_pid=1) is None
        text = request(os.getpid(), first, str(tmp_path / "mine.stack"), parent_pid=os.getppid())
        assert "test_a_users_handler_is_never_replaced" in text
    finally:
        import faulthandler
        if first:
            faulthandler.unregister(first)
            from starvewatch.hooks import stacks
            while stacks._KEEP:  # in a worker the file stays open for life; here the test ends
                stacks._KEEP.pop().close()
        for signum in taken:
            signal.signal(signum, signal.SIG_DFL)


def test_the_console_line_names_the_batch_and_a_worker_that_has_not_started():
    """Under spawn a worker may not have started when the loop first waits for it: the line
    says so instead of 'pid None', and names the batch so two stalls read apart."""
    run = {"id": "r", "name": "n", "status": "finished"}
    not_started = {"loader": "train", "wait_s": 1.2, "step": 1, "epoch": 0, "worker": 1,
                   "worker_pid": None, "worker_state": "not_started", "phase": "next"}
    hung = dict(not_started, step=5, wait_s=3.0, worker_pid=77, worker_state="sleeping", indices=[20, 21])
    verdict = {"input_bound": "high", "input_wait_fraction": 0.5}
    summary = {"run": run, "verdict": verdict, "loaders": [], "stalls": [not_started, hung]}
    lines = [l for l in format_report(summary).splitlines() if "stall on train" in l]
    assert lines[0].endswith("waited 1.2 s for batch 1 of epoch 0: worker 1 (not started yet)")
    assert "for batch 5 of epoch 0: worker 1 (pid 77, sleeping); loading indices 20, 21" in lines[1]
