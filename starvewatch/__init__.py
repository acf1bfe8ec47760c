"""starvewatch: a live GPU-starvation monitor for PyTorch training.

    loader = starvewatch.watch(loader)

Importing this package imports only the standard library: torch, psutil, pynvml and the
collector's web stack are loaded lazily, when used.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .hooks.loader import _PhaseTimer, _StepTimer
from .hooks.session import finish, init, watch
from .schema import SUMMARY_SCHEMA
from .version import __version__

if TYPE_CHECKING:  # for the annotations only: importing tuning would import more than the stdlib
    from .tuning import TuneResult

__all__ = ["init", "watch", "step", "phase", "finish", "tune", "SUMMARY_SCHEMA", "__version__"]


def step(loader=None):
    """Mark the compute of a step, as a context manager or a decorator.

    `with starvewatch.step():` attributes to the loader that yielded last; pass a watched
    loader or its name to choose. Loop time outside the block is reported as `other_ms`.
    """
    if callable(loader) and not isinstance(loader, str) and not hasattr(loader, "__iter__"):
        return _StepTimer(None)(loader)  # used as a bare decorator: @starvewatch.step
    return _StepTimer(loader)


def phase(name: str) -> _PhaseTimer:
    """Time a finer phase of the current step (h2d, forward, backward, optimizer...)."""
    return _PhaseTimer(name)


def tune(factory: Callable[..., Any], budget_s: float = 60, consumption_batches_per_s: float | None = None,
         run_name: str | None = None, **options: Any) -> TuneResult:
    """Measure DataLoader configurations on this machine within `budget_s` and pick one.

    `factory` builds the DataLoader from keyword arguments (num_workers, prefetch_factor,
    persistent_workers, pin_memory); a DataLoader is accepted too. See starvewatch.tuning.tune.
    """
    from .tuning import tune as _tune
    return _tune(factory, budget_s, consumption_batches_per_s, run_name, **options)
