"""The shared-memory findings: /dev/shm foreseen too small for the batches in flight (kind
"shm_risk"), and workers that died of SIGBUS because it ran out (kind "sigbus").

Its own module because both read the same estimate (batch bytes x prefetch_factor x
num_workers against /dev/shm): the SIGBUS finding's fix is the shm estimate's. Pure functions
of the "workers" events; findings.py gathers them with the others.
"""
from __future__ import annotations

from ..sample_buckets import worker_parts
from ..sentences import plural


def shm_findings(worker_events: list[dict], configs: dict[str, dict | None],
                 system: dict | None) -> list[dict]:
    """/dev/shm foreseen: batches in flight from the workers (batch bytes x prefetch_factor x
    num_workers, the batch bytes sampled in the workers) against /dev/shm. Torch passes every
    worker's batch through shared memory; when it runs out, a worker dies of SIGBUS."""
    system = system or {}
    total, used = system.get("shm_total_bytes"), system.get("shm_used_max_bytes")
    if not total:
        return []
    batch_bytes: dict[str, int] = {}
    for event in worker_events:
        part = worker_parts(event)["agg"].get("batch_bytes")
        if part is not None:
            name = event.get("loader")
            batch_bytes[name] = max(batch_bytes.get(name, 0), int(part[3]))
    findings = []
    for loader, per_batch in batch_bytes.items():
        config = configs.get(loader) or {}
        workers = config.get("num_workers") or 0
        prefetch = config.get("prefetch_factor") or 2
        need = per_batch * prefetch * workers
        # Our own batches in flight are part of the peak use: what else holds /dev/shm is
        # the peak use minus them (at least nothing).
        others = max(0, (used or 0) - need)
        room = max(0, total - others)
        # A loader whose batches are a sliver of /dev/shm is not what fills it (others are).
        if workers <= 0 or need <= 0.5 * room or need < 0.01 * total:
            continue
        slots = int(0.8 * room // per_batch)
        if slots >= workers:
            settings = f"num_workers={workers}, prefetch_factor={slots // workers}"
        elif slots >= 1:
            settings = f"num_workers={slots}, prefetch_factor=1"
        else:
            settings = "smaller batches (no batch fits twice)"
        findings.append({
            "kind": "shm_risk", "loader": loader,
            "severity": "critical" if need > room else "warning",
            "title": (f"'{loader}' needs about {need / 2**20:.0f} MiB of /dev/shm for batches in flight "
                      f"({per_batch / 2**20:.1f} MiB x prefetch_factor {prefetch} x {plural(workers, 'worker')}), "
                      f"{room / 2**20:.0f} MiB available: workers die with a Bus error (SIGBUS) when it fills"),
            "detail": {"batch_bytes": per_batch, "prefetch_factor": prefetch, "num_workers": workers,
                       "shm_needed_bytes": need, "shm_total_bytes": total, "shm_used_max_bytes": used,
                       "shm_available_bytes": room},
            "fix": (f"DataLoader(..., {settings}) fits in the /dev/shm there is; or give the "
                    f"container more shared memory (docker run --shm-size={int(need * 1.25 / 2**20) + 1}m, "
                    f"Kubernetes: an emptyDir with medium: Memory at /dev/shm)."),
        })
    return findings


def sigbus_findings(worker_events: list[dict], configs: dict[str, dict | None],
                    shm: list[dict], system: dict | None) -> list[dict]:
    """A worker killed by SIGBUS (read from the zombie's exit code by the sidecar): under
    torch, /dev/shm ran out. The fix: the settings that fit, from the shm estimate."""
    dead: dict[str, set] = {}
    for event in worker_events:
        for pid in worker_parts(event)["sigbus_pids"]:
            dead.setdefault(event.get("loader"), set()).add(pid)
    estimates = {f["loader"]: f for f in shm}
    out = []
    for loader, pids in dead.items():
        config = configs.get(loader) or {}
        estimate = estimates.get(loader)
        out.append({
            "kind": "sigbus", "loader": loader, "severity": "critical",
            "title": (f"{len(pids)} DataLoader worker(s) of '{loader}' died of SIGBUS (Bus error): "
                      f"shared memory (/dev/shm) ran out for the batches in flight"),
            "detail": {"worker_pids": sorted(p for p in pids if p is not None),
                       "num_workers": config.get("num_workers"),
                       "prefetch_factor": config.get("prefetch_factor"),
                       **({k: estimate["detail"][k] for k in ("batch_bytes", "shm_needed_bytes",
                                                               "shm_available_bytes")} if estimate else {}),
                       "shm_total_bytes": (system or {}).get("shm_total_bytes")},
            "fix": estimate["fix"] if estimate else (
                "Fewer batches in flight (a lower prefetch_factor or num_workers), smaller batches, "
                "or more shared memory (docker run --shm-size=...)."),
        })
    return out
