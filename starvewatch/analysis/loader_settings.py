"""A loader's settings as they act: torch's implied defaults are not changes a user made
(issue 34). Shared by compare, verify-after-change and the regression check."""
from __future__ import annotations

# Settings that only act with workers, and what torch takes each to be when it is left out.
WORKER_ONLY = {"prefetch_factor": 2, "persistent_workers": False, "multiprocessing_context": None,
               "timeout": 0, "worker_init_fn": None, "in_order": True}
DEFAULT_START_METHODS = (None, "fork")  # Linux's default context: None and 'fork' are one


def effective_config(config: dict | None) -> dict:
    """With num_workers > 0, a worker-only setting left out (None) is torch's default
    (prefetch_factor 2, the default multiprocessing context); with no workers, the worker-only
    settings do nothing, whatever they say."""
    out = dict(config or {})
    workers = bool(out.get("num_workers"))
    for key, default in WORKER_ONLY.items():
        if not workers:
            out[key] = None
        elif out.get(key) is None:
            out[key] = default
    if out.get("multiprocessing_context") in DEFAULT_START_METHODS:
        out["multiprocessing_context"] = None
    return out


def setting_changed(before: dict | None, after: dict | None, key: str) -> bool:
    """Did `key`'s effect change between two configurations? A worker-only setting changes only
    where it acts: with workers on both sides, its value; with workers on one side only, when
    that side's value is not torch's default (a prefetch_factor=4 set along with the workers)."""
    a, b = effective_config(before), effective_config(after)
    if key in WORKER_ONLY and not (a.get("num_workers") and b.get("num_workers")):
        if not a.get("num_workers") and not b.get("num_workers"):
            return False
        acting = b if b.get("num_workers") else a
        return acting.get(key) != WORKER_ONLY[key]
    return a.get(key) != b.get(key)


def tuned_part(config: dict) -> dict:
    """The settings tuning may change, with torch's defaults filled in."""
    workers = int(config.get("num_workers") or 0)
    prefetch = config.get("prefetch_factor")
    return {"num_workers": workers,
            "prefetch_factor": (prefetch if prefetch is not None else 2) if workers else prefetch,
            "persistent_workers": bool(config.get("persistent_workers")),
            "pin_memory": bool(config.get("pin_memory")),
            "in_order": config.get("in_order") is not False}
