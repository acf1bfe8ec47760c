"""Is this run slower than the one before it? (issue 34: throughput is the success measure.)

The wait fraction is only the means: a change that removes the wait and slows the step (workers
that take the cores the training step needed) reads "not input-bound" and is a loss. Judged on
the training loader's samples/s (batches/s where samples are unknown) with the interval
verify-after-change and compare use (verification.speedup_interval: each run's spread plus
run-to-run noise); a drop is reported only where the whole interval lies below 1. The likely
cause comes from the evidence of the two runs (the compute per batch, the wait, the time
outside step(), the settings that changed). Pure: two summaries in, one dict (or None) out.
"""
from __future__ import annotations

from .loader_settings import setting_changed
from .verification import speedup_interval

# A part of the step that grew by this factor or more is named as the likely cause.
GREW = 1.3
SETTINGS = ("num_workers", "batch_size", "pin_memory", "persistent_workers", "prefetch_factor")


def _train(summary: dict) -> dict | None:
    name = (summary.get("verdict") or {}).get("training_loader")
    parts = summary.get("loaders") or []
    return next((p for p in parts if p["name"] == name), None) or (parts[0] if parts else None)


def _mean(part: dict, key: str) -> float | None:
    return (part.get(key) or {}).get("mean")


def _cores(summary: dict) -> int | None:
    system = summary.get("system") or {}
    return system.get("usable_cores") or system.get("cpu_count")


def changed_settings(before: dict | None, after: dict | None) -> dict:
    """The DataLoader settings whose effect changed (loader_settings.effective_config: torch's implied
    defaults are not changes)."""
    return {k: [(before or {}).get(k), (after or {}).get(k)] for k in SETTINGS if setting_changed(before, after, k)}


def likely_cause(old: dict, new: dict, previous: dict, current: dict) -> str | None:
    changed = changed_settings(old.get("config"), new.get("config"))
    workers = changed.get("num_workers")
    more_workers = workers is not None and (workers[1] or 0) > (workers[0] or 0)
    c0, c1 = _mean(old, "compute_ms"), _mean(new, "compute_ms")
    if c0 and c1 and c1 >= GREW * c0:
        text = f"compute per batch rose {c1 / c0:.1f}x ({c0:.0f} → {c1:.0f} ms)"
        cores = _cores(current)
        if more_workers:
            text += (f": the new workers compete with the training step for "
                     f"{cores} core{'s' if cores != 1 else ''}" if cores else ": the new workers compete with the training step for the cores")
        return text
    w0, w1 = old.get("input_wait_fraction"), new.get("input_wait_fraction")
    if w0 is not None and w1 is not None and w1 > w0 + 0.05:
        return f"the input wait rose from {100 * w0:.1f}% to {100 * w1:.1f}% of the step"
    o0 = (old.get("other_ms_total") or 0) / max(1, old.get("steps") or 1)
    o1 = (new.get("other_ms_total") or 0) / max(1, new.get("steps") or 1)
    if o1 > 1 and o1 >= GREW * max(o0, 1e-9):
        return f"the time outside the step() block rose from {o0:.1f} to {o1:.1f} ms a step"
    if changed:
        return "settings changed: " + ", ".join(f"{k} {a!r} → {b!r}" for k, (a, b) in changed.items())
    return None


def regression(previous: dict | None, current: dict) -> dict | None:
    """{"previous_run", "speedup", "interval", "basis", "before", "after", "cause", "sentence"}
    when this run's training loader is slower than the previous run's beyond noise; else None."""
    if not previous:
        return None
    old, new = _train(previous), _train(current)
    if old is None or new is None or not old.get("steps") or not new.get("steps"):
        return None
    measured = speedup_interval(old, new)
    if measured is None or measured["high"] >= 1.0:
        return None
    key = "samples_per_s" if measured["basis"] == "samples/s" else "batches_per_s"
    before, after = old.get(key), new.get(key)
    cause = likely_cause(old, new, previous, current)
    slower = 1 - measured["speedup"]
    rates = f"{before:.2f} → {after:.2f} {measured['basis']}" if before and after else measured["basis"]
    sentence = (f"{100 * slower:.0f}% slower than the previous run ({rates}; measured "
                f"{measured['speedup']:.2f}x, 95% interval {measured['low']:.2f}-{measured['high']:.2f}x)")
    if cause:
        sentence += f": {cause}"
    return {"previous_run": (previous.get("run") or {}).get("id"), "loader": new["name"],
            "speedup": round(measured["speedup"], 3),
            "interval": [round(measured["low"], 3), round(measured["high"], 3)],
            "basis": measured["basis"], "before": before, "after": after, "cause": cause,
            "sentence": sentence + "."}
