"""Who made the loop wait: a loader's attributed waits (stats.LoaderTotals, filled by
hooks/delivery/attribution.py) as shares per stage and per worker. Pure, like summary.py.

Shares are of the attributed wait (the steps whose batch was found in the workers' records;
`coverage` says which part of the loader's wait that is). Each is a sum of intersections of
the loop's blocked intervals with what the batch's worker was doing, so stages and workers
add up to the wait, never to more.
"""
from __future__ import annotations

from ..stats import WAIT_STAGES, LoaderTotals

# What each stage is, in one phrase (docs/what-it-measures.md defines them in full).
STAGE_TEXT = {
    "startup": "worker starting up",
    "idle": "worker idle, waiting for indices",
    "not_scheduled": "worker busy with earlier batches",
    "fetch": "fetching samples",
    "collate": "collating",
    "handover": "hand-over to the loop (result queue, pin memory)",
    "unknown": "not recorded",
}


def attribution_of(t: LoaderTotals) -> dict | None:
    """The `attribution` of a loader summary; None when no wait was attributed (no workers,
    or none of their records joined a step)."""
    total = t.attributed_wait_ns
    if not t.attributed_steps or total <= 0:
        return None
    stages = {stage: {"ms": getattr(t, f"wait_{stage}_ns") / 1e6,
                      "share": getattr(t, f"wait_{stage}_ns") / total}
              for stage in WAIT_STAGES}
    workers = [{"worker": w, "ms": ns / 1e6, "share": ns / total,
                "head_of_line_ms": (t.worker_hol_ns[w] if w < len(t.worker_hol_ns) else 0) / 1e6}
               for w, ns in enumerate(t.worker_wait_ns)]
    batch_ms = [ns / n / 1e6 if n else None for n, ns in zip(t.worker_batches, t.worker_batch_ns)]
    top_stage = max(WAIT_STAGES, key=lambda s: stages[s]["share"])
    top_worker = max(workers, key=lambda w: w["share"]) if workers else None
    return {
        "steps": t.attributed_steps,
        "wait_ms": total / 1e6,
        "coverage": min(1.0, total / t.wait_ns) if t.wait_ns else None,
        "stages": stages,
        "workers": workers,
        "main_process_share": stages["handover"]["share"],
        # Of the hand-over, the part still in the batch's worker: its feeder pickling the batch
        # (tensors into shared memory) and writing it into the result queue.
        "handover_send_share": t.wait_handover_send_ns / total,
        "top_stage": top_stage,
        "top_worker": top_worker["worker"] if top_worker and top_worker["share"] > 0 else None,
        "head_of_line_ms": t.hol_wait_ns / 1e6,
        "head_of_line_share": t.hol_wait_ns / total,
        "worker_batches": list(t.worker_batches),
        "worker_batch_ms": batch_ms,
    }
