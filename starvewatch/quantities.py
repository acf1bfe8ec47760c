"""Named quantities as words and units: `load_ms_per_batch: 26.71` reads "load per batch | 26.7 ms".

Evidence, findings' details and loader configurations are dicts whose keys carry their unit as a
suffix (`_ms`, `_bytes`, `_fraction`, `_pct`); this module turns one entry into a label and a
value a person reads, so no page ever shows a dict as JSON."""
from __future__ import annotations

# Keys whose name alone does not say it well; any other key is read from its suffix.
LABELS = {
    "load_ms_per_batch": "load per batch",
    "load_ms": "load per batch",
    "compute_ms": "compute per batch",
    "wait_ms": "wait per batch",
    "worker_load_ms": "worker load per batch",
    "main_share_ms": "main process's share per batch",
    "ranks_per_host": "ranks on this host",
    "worker_mem_bytes": "memory per worker",
    "compute_ms_mean": "compute per batch",
    "wait_ms_mean": "wait per batch",
    "input_wait_fraction": "input wait",
    "wait_cpu_fraction": "CPU busy while waiting",
    "worker_cpu_fraction": "workers' CPU while loading",
    "usable_cores": "cores",
    "cores": "cores",
    "workers_needed": "workers needed",
    "num_workers": "workers now",
    "first_batch_wait_ms": "first batch of an epoch",
    "cpu_pct_mean": "host CPU (mean)",
    "iowait_pct_mean": "I/O wait (mean)",
    "gpu_util_mean": "GPU utilization (mean)",
    "wait_p50_ms": "wait p50",
    "wait_p99_ms": "wait p99",
    "shm_used_max_bytes": "/dev/shm used (max)",
    "shm_total_bytes": "/dev/shm size",
    "cpu_bound_loading": "loading is CPU-bound",
    "main_cpu_ms": "training process CPU per batch",
    "others_cores": "cores other processes used",
}

# (suffix, unit): the longest matching suffix wins; the suffix is dropped from the label.
SUFFIXES = (("_ms_per_batch", "ms"), ("_ms_mean", "ms"), ("_ms_max", "ms"), ("_ms", "ms"), ("_ns", "ns"),
            ("_s", "s"), ("_bytes", "bytes"), ("_fraction", "%"), ("_pct_mean", "%"), ("_pct", "%"),
            ("_per_s", "/s"))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # not reached


def _number(x: float) -> str:
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    magnitude = abs(x)
    return f"{x:,.1f}" if magnitude >= 10 else f"{x:.2f}" if magnitude >= 0.1 else f"{x:.3g}"


def _per(key: str) -> tuple[str, str] | None:
    """`growth_bytes_per_epoch` -> ("growth_bytes", "epoch"): a unit per something else."""
    base, sep, per = key.rpartition("_per_")
    if sep and base and per != "s" and unit_of(base) is not None and key not in LABELS:
        return base, per.replace("_", " ")
    return None


def label(key: str) -> str:
    if key in LABELS:
        return LABELS[key]
    per = _per(key)
    if per is not None:
        return f"{label(per[0])} per {per[1]}"
    for suffix, _ in SUFFIXES:
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
            break
    return key.replace("_", " ")


def unit_of(key: str) -> str | None:
    for suffix, unit in SUFFIXES:
        if key.endswith(suffix):
            return unit
    return None


def value(key: str, x) -> str:
    """The value of one named quantity as text: units from the key, lists and dicts spelled out."""
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, dict):
        return ", ".join(f"{label(k)} {value(k, v)}" for k, v in x.items()) or "none"
    if isinstance(x, (list, tuple)):
        return ", ".join(value(key, v) for v in x) or "none"
    if not isinstance(x, (int, float)):
        return str(x)
    per = _per(key)
    if per is not None:
        return value(per[0], x)
    unit = unit_of(key)
    if unit == "%":
        # Fractions are 0..1; *_pct values are already percentages.
        return f"{100 * x:.1f}%" if key.endswith("_fraction") else f"{x:.0f}%"
    if unit == "bytes":
        return human_bytes(x)
    if unit == "ns":
        return f"{x / 1e6:,.2f} ms"
    return f"{_number(x)} {unit}" if unit else _number(x)


# The quantities a rule reasons with come first, in the order a person checks them.
FIRST = ("load_ms_per_batch", "load_ms", "compute_ms_mean", "compute_ms", "wait_ms_mean", "wait_ms", "usable_cores", "cores", "workers_needed",
         "num_workers", "input_wait_fraction")


def rows(quantities: dict | None) -> list[tuple[str, str]]:
    """(label, value) per quantity that has one; unknown values (None) are left out."""
    items = [(k, v) for k, v in (quantities or {}).items() if v is not None]
    items.sort(key=lambda kv: FIRST.index(kv[0]) if kv[0] in FIRST else len(FIRST))  # stable: others keep order
    return [(label(k), value(k, v)) for k, v in items]


def speedup_text(prediction: dict) -> str:
    """A prediction's speed-up as text: "1.85x", with its range where it has one (the
    uncertainty is large): "1.85x (likely 1.52-2.31x)"."""
    text = f"{prediction['expected_speedup']:.2f}x"
    ends = prediction.get("expected_speedup_range")
    if ends:
        text += f" (likely {ends[0]:.2f}-{ends[1]:.2f}x)"
    return text
