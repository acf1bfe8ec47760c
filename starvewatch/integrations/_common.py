"""What the framework callbacks share: importing a framework with an install hint, naming loaders,
wrapping an epoch's iterator that the framework created before the callback could watch."""
from __future__ import annotations

import importlib
import os

import starvewatch


def require(module: str, extra: str, what: str):
    """Import an optional framework, or say exactly how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs {module.split('.')[0]!r}, which is not installed: "
                          f"pip install 'starvewatch[{extra}]'") from exc


def loader_name(base: str, index: int, key=None) -> str:
    """`train`, then `train_1`, `train_2`... (or `train_<key>` for a dict of loaders)."""
    if key is not None and not isinstance(key, int):
        return f"{base}_{key}"
    return base if index == 0 else f"{base}_{index}"


def set_rank_env(rank: int | None, world_size: int | None, local_rank: int | None) -> None:
    """Tell `init()` the rank a framework knows when its launcher did not export it."""
    for var, value in (("RANK", rank), ("WORLD_SIZE", world_size), ("LOCAL_RANK", local_rank)):
        if value is not None and var not in os.environ:
            os.environ[var] = str(value)


def is_watched(obj) -> bool:
    """True for what `watch()` returned (the marker every watched class carries)."""
    return bool(getattr(type(obj), "__starvewatch_watched__", False))


def watch_current(loader, iterator, name: str, tune: bool | None = None):
    """Watch `loader` for its next epochs; for this epoch, whose iterator the framework made
    before the callback ran, return a watched wrapper of that iterator (None: nothing to swap).
    A loader rebuilt from a watched one's type (a DistributedSampler added) is already watched."""
    if is_watched(loader):
        return None
    starvewatch.watch(loader, name, tune=tune)  # tuned from its next epoch (live_tuner.py)
    if iterator is None or is_watched(iterator):
        return None
    return starvewatch.watch(iterator, name)


class Mark:
    """`starvewatch.step(name)` or `starvewatch.phase(name)` (the `timer` given) entered and left
    from two different framework hooks; starting a mark ends the one in progress."""

    def __init__(self, timer) -> None:
        self._make = timer
        self._timer = None

    def start(self, name: str) -> None:
        self.stop()
        self._timer = self._make(name)
        self._timer.__enter__()

    def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.__exit__(None, None, None)
