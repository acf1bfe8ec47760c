"""Every private torch internal live tuning uses (issue 39), in one place and version-gated.

- A tuned loader is iterated through a *twin*: a second object of the user's own DataLoader
  class sharing its dataset, sampler, collate_fn and the rest (`__dict__` copied), with the
  tuned settings. torch freezes `persistent_workers` once a loader is built (`__setattr__`
  raises), so a twin is built anew for it; `num_workers`, `prefetch_factor`, `pin_memory` and
  `in_order` are set on the twin as torch allows. The user's object is never iterated itself
  and keeps its identity, class swap and settings.
- `_iterator` (a persistent loader's iterator), `_workers` and `_shutdown_workers()` (to end a
  twin's workers and check them gone), and the generator a new iterator draws its base seed
  from (`generator`: the twin's is private, so tuning never draws from the user's RNG more or
  less often than the untuned loader would).

Checked against torch 2.0-2.13 (`SUPPORTED`); any other version is refused by `supported()`,
and tuning says it is off."""
from __future__ import annotations

SUPPORTED = ((2, 0), (2, 13))  # inclusive range of torch (major, minor) this module was checked on
LIVE_SETTABLE = ("num_workers", "prefetch_factor", "pin_memory", "in_order")


def torch_version() -> tuple[int, int] | None:
    try:
        import torch
        major, minor = torch.__version__.split(".")[:2]
        return int(major), int(minor)
    except Exception:  # no torch, or a version string we cannot read
        return None


def supported() -> bool:
    version = torch_version()
    return version is not None and SUPPORTED[0] <= version <= SUPPORTED[1]


def is_plain_dataloader(loader) -> bool:
    """A torch DataLoader (or a user's subclass) whose iteration the twin reproduces: not
    torchdata's StatefulDataLoader (its state_dict reads the object's own iterator)."""
    try:
        from torch.utils.data import DataLoader
    except Exception:
        return False
    if not isinstance(loader, DataLoader):
        return False
    return not any((c.__module__ or "").startswith("torchdata") for c in type(loader).__mro__)


def make_twin(loader, base_class: type, settings: dict, generator, batch_feed=None):
    """A new object of `base_class` (the user's class, before the watch swap) with the
    loader's state and `settings`; no iterator of its own yet. `batch_feed`: its batch_sampler
    instead of the user's (frozen by torch once built: set in the twin's __dict__), so that two
    iterators in turn can take one epoch's index batches (a mid-epoch switch)."""
    twin = object.__new__(base_class)
    state = dict(loader.__dict__)
    state["_iterator"] = None
    state["persistent_workers"] = bool(settings["persistent_workers"])
    state["generator"] = generator
    if batch_feed is not None:
        state["batch_sampler"] = batch_feed
    twin.__dict__.update(state)
    apply_live(twin, settings)
    return twin


def feeds_batches(loader) -> bool:
    """A map-style loader that batches with a batch_sampler (its own, or torch's from
    batch_size): the one kind an epoch can be switched in the middle of, by index batches."""
    try:
        from torch.utils.data import IterableDataset
    except Exception:
        return False
    return (not isinstance(getattr(loader, "dataset", None), IterableDataset)
            and getattr(loader, "batch_sampler", None) is not None)


def apply_live(twin, settings: dict) -> None:
    """The settings torch lets a built loader take (a 0 -> N change gets its prefetch_factor:
    torch's next iter() raises TypeError without one)."""
    workers = int(settings["num_workers"])
    prefetch = settings.get("prefetch_factor")
    if workers and prefetch is None:
        prefetch = 2
    twin.num_workers = workers
    twin.prefetch_factor = prefetch if workers else twin.prefetch_factor
    twin.pin_memory = bool(settings["pin_memory"])
    if hasattr(twin, "in_order"):
        twin.in_order = bool(settings["in_order"])


def held_iterator(twin):
    """The twin's own (persistent) iterator, or None."""
    return twin.__dict__.get("_iterator")


def worker_processes(iterator) -> list:
    return list(getattr(iterator, "_workers", None) or [])


def shut_down(iterator, timeout_s: float = 10.0) -> bool:
    """End an iterator's workers (torch's own shutdown: a no-op when they already ended) and
    check them gone; False when one is still alive."""
    workers = worker_processes(iterator)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    for w in workers:
        w.join(timeout_s)
    return not any(w.is_alive() for w in workers)


def draw_base_seed(generator) -> int:
    """What an untuned iterator draws for its base seed, from the same generator (the loader's,
    or the global RNG when it has none)."""
    import torch
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def private_generator(seed: int):
    import torch
    g = torch.Generator()
    g.manual_seed(seed)
    return g
