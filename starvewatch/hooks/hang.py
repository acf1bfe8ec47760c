"""Who holds the batch a stalled loop waits for: the worker, its state, the dataset indices it
is loading, and where to get its stack. Runs on the sampler thread once per stall, never on
the hot path; reads torch's iterator defensively (private fields, any version may differ).

The stack itself comes from stacks.py: a worker's through its faulthandler signal (sent by the
sidecar, or by the sampler thread without one), the training process's own threads when the
loader runs in it (num_workers=0) or when the loop hangs inside `iter()`.
"""
from __future__ import annotations

import os

from .stacks import dump_self


def expected_worker(inner) -> int | None:
    """The worker that holds the batch torch returns next (`_rcvd_idx` mapped through
    `_task_info`); None when that batch already arrived or the iterator is not torch's."""
    try:
        info = inner._task_info.get(inner._rcvd_idx)
    except Exception:
        return None
    if info is None or len(info) != 1:
        return None
    return int(info[0])


def _main_stack(session) -> str | None:
    try:
        return dump_self(str(session.stack_dir_made() / f"main-{os.getpid()}.stack"))
    except OSError:
        return None


def describe(session, state, inner, phase: str, snapshot: dict | None) -> tuple[dict, tuple | None]:
    """The stall event's fields about the hang, and a stack request (pid, signal, path) for a
    worker's stack, or None when the stack is already in the fields (or unavailable)."""
    fields = {"phase": phase, "worker": None, "worker_pid": None, "worker_state": None,
              "indices": None, "stack": None}
    board = state.board
    workers = (snapshot or {}).get("workers") or []
    if not (state.config or {}).get("num_workers"):  # the loader runs in the training process
        # No indices: they are a local of torch's fetch frame, and reading another thread's
        # frames can crash CPython 3.11 (python/cpython#111363); the stack shows where it is.
        fields["worker_state"] = "in training process"
        fields["stack"], fields["stack_of"] = _main_stack(session), "training process"
        return fields, None
    worker = expected_worker(inner) if inner is not None and board is not None else None
    if worker is None and phase == "iter":
        worker = 0  # torch hands the epoch's first batch to worker 0
    if worker is None or worker >= len(workers):  # (no worker sampled yet, too)
        # Torch's bookkeeping unreadable: the workers' states are in the event, the main
        # process's threads show where the loop waits.
        fields["stack"], fields["stack_of"] = _main_stack(session), "training process"
        return fields, None
    entry = workers[worker]
    current = board.current(worker) or {}  # (board: a worker was sampled, so it exists)
    started = bool(entry.get("pid"))  # a worker not started yet loads nothing so far
    fields.update(worker=worker, worker_pid=entry.get("pid"), worker_state=entry.get("state"),
                  indices=current.get("indices") if started and current.get("fetch_started_ns") else None)
    if current.get("fetch_started_ns"):
        fields["fetching"] = True
    request = None
    path = board.stack_path(worker)
    if entry.get("pid") and current.get("stack_signal") and path:
        request = (entry["pid"], current["stack_signal"], path)
        fields["stack_of"] = "worker"
    else:  # a worker not started (or without a free signal): where the training process is
        fields["stack"], fields["stack_of"] = _main_stack(session), "training process"
    return fields, request
