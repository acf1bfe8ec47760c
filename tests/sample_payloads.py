"""Batches with host, GPU and DataLoader-worker samples as the hooks send them (samplers.py),
over hours of simulated time: for the storage budget's sample folding (test_sample_budget.py)
and the schema-3 database in tests/data (made with the code before the fold existed)."""
SECOND = 1_000_000_000
T0_S = 1_700_000_000
MEMORY_EVERY_S = 30  # the sidecar's USS/PSS readings: each one repeats in the snapshots until the next


def host_sample(t_s: int, i: int, cores: int = 8) -> dict:
    return {"kind": "host", "t_ns": t_s * SECOND + 123, "interval_s": 9.5 + (i % 3) * 0.5,
            "cpu_pct": 55.0 + (i * 7 % 40) + 0.125, "process_cpu_pct": 90.0 + i % 20,
            "cpu_per_core_pct": [float((i + c) % 100) for c in range(cores)],
            "iowait_pct": (i % 5) * 1.5, "mem_available_bytes": 8_000_000_000 - (i % 11) * 100_000_000,
            "mem_total_bytes": 16 * 2**30, "swap_in_bytes_per_s": 0.0, "swap_out_bytes_per_s": 0.0,
            "disk_read_bytes_per_s": 1e6 * (i % 4), "shm_used_bytes": 2**20 * (10 + i % 30),
            "shm_total_bytes": 2**30, "cpu_count": cores, "usable_cores": cores, "cpu_quota_cores": None}


def gpu_sample(t_s: int, i: int) -> dict:
    return {"kind": "gpu", "t_ns": t_s * SECOND + 456,
            "devices": [{"name": "H100", "gpu_util_pct": 20.0 + (i * 13 % 50), "mem_used_bytes": 40e9 + (i % 13) * 1e8,
                         "mem_total_bytes": 80e9}]}


def worker_snapshot(t_s: int, i: int, rank: int, workers: int = 4) -> dict:
    reading_s = t_s - t_s % MEMORY_EVERY_S
    served = (reading_s - T0_S) // MEMORY_EVERY_S * 96  # samples each worker served by the reading
    return {"t_ns": t_s * SECOND + 789, "loader": "train", "configured_workers": workers,
            "alive_workers": workers - (1 if i % 97 == 5 else 0), "queue_depth": i % 3, "queue_capacity": 8,
            "workers": [{"id": k, "pid": 1000 + 10 * rank + k, "state": "running", "batches": i * 3 + k,
                         "load_ms_mean": 20.0 + k, "cpu_fraction": 0.9, "cpu_pct": 80.0 + k + i % 7,
                         "rss_bytes": 300_000_000 + k, "uss_bytes": 100_000_000 + served * 20_000 + k * 1000,
                         "pss_bytes": 150_000_000 + served * 20_000, "mem_t_ns": reading_s * SECOND,
                         "samples": served, "batch_bytes": 2**20 * (1 + (i + k) % 3)} for k in range(workers)]}


def sample_batch(rank: int, seq: int, start_s: int, seconds: int, every_s: int, run_id: str = "run-a",
                 steps: bool = True, status: str = "live", cores: int = 8, stream: str | None = None) -> dict:
    """One rank's batch covering [start_s, start_s + seconds): a sample of each kind and a step
    every `every_s` seconds (steps input-bound: 20 ms wait against 8 ms compute)."""
    times = list(range(start_s, start_s + seconds, every_s))
    first = (start_s - T0_S) // every_s
    n = len(times) if steps else 0
    step0 = first
    return {
        "schema": "starvewatch.events/1", "run_id": run_id, "rank": rank, "stream": stream or f"host-{rank}-s", "seq": seq,
        "status": status,
        "run": {"id": run_id, "name": "samples-test", "started_at": T0_S, "rank": rank, "world_size": 2},
        "loaders": [{"name": "train", "config": {"num_workers": 4, "batch_size": 32, "prefetch_factor": 2},
                     "totals": {"steps": step0 + n, "epochs": 1, "wait_ns": (step0 + n) * 20_000_000,
                                "compute_ns": (step0 + n) * 8_000_000, "samples": (step0 + n) * 32}}],
        "steps": {"loader": ["train"] * n, "epoch": [0] * n, "step": list(range(step0, step0 + n)),
                  "start_ns": [t * SECOND for t in times[:n]], "wait_ns": [20_000_000 + (j % 5) * 100_000 for j in range(n)],
                  "compute_ns": [8_000_000] * n, "other_ns": [0] * n, "batch_size": [32] * n,
                  "gpu_idle_ns": [None] * n},
        "samples": [s for j, t in enumerate(times) for s in (host_sample(t, first + j, cores), gpu_sample(t, first + j))],
        "workers": [worker_snapshot(t, first + j, rank) for j, t in enumerate(times)],
    }
