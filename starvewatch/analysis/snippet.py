"""The line to copy (issue 34): the loader's whole DataLoader(...) call with the
recommendations applied, or only the arguments to change where the configuration cannot be
written as a call. Shown by the dashboard, the reports and the notebook's summary (the training
process), so it lives with the analysis."""
from __future__ import annotations

from .diagnosis import applied_config, custom_batch_sampler

# The samplers a DataLoader call writes as an argument (shuffle=...); any other is the user's own.
# An IterableDataset's loader gets torch's _InfiniteConstantSampler whatever the call says: not
# the user's own, and nothing to write.
_SAMPLERS = {"SequentialSampler": False, "RandomSampler": True, "_InfiniteConstantSampler": False}
_DEFAULT_COLLATES = ("default_collate", "default_convert", "collate")
_ADVISED = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size", "in_order")


def call_arguments(config: dict | None, recs: list[dict], loader: str) -> tuple[dict, bool]:
    """(every DataLoader keyword argument of the loader with the recommendations applied, whether
    they can be written as one call): the user's whole configuration, so that copying the line
    keeps num_workers, shuffle, collate_fn, drop_last and the changes applied in earlier rounds
    (issue 34). Arguments torch would refuse together (worker-only ones without workers) are
    left out. Not writable: a sampler, batch_sampler or collate_fn of the user's own (the call
    cannot name them); then only the arguments to change are shown."""
    config = config or {}
    out: dict = {}
    writable = True
    if custom_batch_sampler(config):
        writable = False
    elif "batch_size" in config or any(r["loader"] == loader and r.get("parameter") == "batch_size" for r in recs):
        out["batch_size"] = config.get("batch_size")
    sampler = config.get("sampler")
    if sampler in _SAMPLERS:
        if _SAMPLERS[sampler]:
            out["shuffle"] = True
    elif sampler is not None and not custom_batch_sampler(config):
        writable = False
    applied = applied_config(config, recs, loader)
    workers = applied.get("num_workers") or 0
    out["num_workers"] = workers
    collate = config.get("collate_fn")
    if collate and collate not in _DEFAULT_COLLATES:
        if collate.isidentifier():
            out["collate_fn"] = _Name(collate)
        else:
            writable = False  # a lambda or a callable object: nothing to name in the line
    for key in ("pin_memory", "drop_last"):
        value = applied.get(key, config.get(key))
        if value:
            out[key] = True
    if workers:
        if applied.get("persistent_workers"):
            out["persistent_workers"] = True
        if applied.get("prefetch_factor") not in (None, 2):
            out["prefetch_factor"] = applied["prefetch_factor"]
        context = config.get("multiprocessing_context")
        if context not in (None, "fork"):
            out["multiprocessing_context"] = context
        if config.get("timeout"):
            out["timeout"] = config["timeout"]
    if applied.get("in_order", config.get("in_order")) is False:  # advised (issue 38) or the user's
        out["in_order"] = False
    if "batch_size" in applied and "batch_size" in out:
        out["batch_size"] = applied["batch_size"]
    return out, writable


class _Name(str):
    """An argument written as a name (the user's collate function), not a string literal."""

    def __repr__(self) -> str:
        return str(self)


def snippet(config: dict | None, recs: list[dict], loader: str) -> str | None:
    """The line to copy: `DataLoader(dataset, ...)` with the user's whole configuration and the
    recommendations applied (call_arguments), or, where that configuration cannot be written as
    a call, only the arguments to change (`num_workers=2, persistent_workers=True`)."""
    changed = {k: v for r in recs if r["loader"] == loader and r["parameter"] in _ADVISED
               for k, v in {r["parameter"]: r["suggested"], **(r.get("also") or {})}.items()}
    if not changed:
        return None
    kwargs, writable = call_arguments(config, recs, loader)
    wrapper = (config or {}).get("wrapper")  # a loader that is not a DataLoader (introspect.wrapped_loader)
    if wrapper == "torchdata.nodes":
        shown = [f"{k}={v!r}" for k, v in kwargs.items() if k in changed]
        return f"ParallelMapper(source, map_fn, {', '.join(shown)})"
    if not writable:
        applied = applied_config(config, recs, loader)
        keep = {k: applied.get(k) for k in changed}
        if not applied.get("num_workers") and (config or {}).get("persistent_workers"):
            keep["persistent_workers"] = False  # torch refuses it without workers
        return ", ".join(f"{k}={v!r}" for k, v in keep.items())
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"{'WebLoader' if wrapper == 'WebLoader' else 'DataLoader'}(dataset, {shown})"


def is_call(code: str | None) -> bool:
    """A snippet that is a whole call (else it lists only the arguments to change)."""
    return bool(code) and code.split("(", 1)[0].isidentifier() and code.endswith(")")
