"""The copyable DataLoader(...) line with the recommendations applied: shown by the dashboard,
the reports, and the notebook's summary (the training process), so it lives with the analysis."""
from __future__ import annotations

from .diagnosis import applied_config, custom_batch_sampler


def snippet(config: dict | None, recs: list[dict], loader: str) -> str | None:
    """A copyable DataLoader(...) line with the recommendations applied: exactly the engine's
    applied configuration. A loader's own batching is kept (batch_size=None, a batch_sampler)."""
    changed = {r["parameter"]: r["suggested"] for r in recs if r["loader"] == loader and r["parameter"]
               in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size")}
    if not changed:
        return None
    kwargs = applied_config(config, recs, loader)
    shown = [f"{k}={v!r}" for k, v in kwargs.items()
             if k in changed or k == "batch_size" or (k == "persistent_workers" and v)]
    if custom_batch_sampler(config):
        shown.insert(0, f"batch_sampler=<your {(config or {}).get('batch_sampler')}>")
    wrapper = (config or {}).get("wrapper")  # a loader that is not a DataLoader (introspect.wrapped_loader)
    if wrapper == "torchdata.nodes":
        return f"ParallelMapper(source, map_fn, {', '.join(shown)})"
    return f"{'WebLoader' if wrapper == 'WebLoader' else 'DataLoader'}(dataset, {', '.join(shown)})"
