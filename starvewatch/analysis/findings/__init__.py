"""Findings no step timing shows, from the workers' telemetry: summary["findings"].

Pure functions of the "workers" events (the sampler's snapshots, each worker's latest USS/PSS
reading from the sidecar merged in), shared by `finish()` and the collector. This module
gathers every family, each in its own module: worker_memory.py (memory growth),
shm_exhaustion.py (/dev/shm and SIGBUS), duplicate_shards.py, idle_workers.py and
snapshot_cost.py; and says a finding in one line.
"""
from __future__ import annotations

from .duplicate_shards import shard_findings
from .idle_workers import idle_worker_findings
from .shm_exhaustion import shm_findings, sigbus_findings
from .snapshot_cost import snapshot_findings
from .worker_memory import memory_growth_findings, worker_memory_series


def findings_from(worker_events: list[dict], configs: dict[str, dict | None],
                  system: dict | None = None, *, waits: dict[str, float | None] | None = None,
                  world_size: int = 1, batches_per_s: dict[str, float | None] | None = None) -> list[dict]:
    """Every finding of a run, from its "workers" events (summary["findings"]); `waits`: each
    loader's input-wait fraction (idle workers matter while the loop waits)."""
    mem_total = (system or {}).get("mem_total_bytes")
    shm = shm_findings(worker_events, configs, system)
    shards = shard_findings(worker_events, configs)
    idle = idle_worker_findings(worker_events, configs, waits or {}, world_size,
                                frozenset(f["loader"] for f in shards))
    return (memory_growth_findings(worker_memory_series(worker_events), configs, mem_total)
            + shm + sigbus_findings(worker_events, configs, shm, system) + shards + idle
            + snapshot_findings(worker_events, configs, batches_per_s or {}))


def finding_line(finding: dict) -> str:
    return f"[{finding.get('severity')}] {finding.get('title')}"
