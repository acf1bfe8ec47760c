"""starvewatch: a live GPU-starvation monitor for PyTorch training.

    loader = starvewatch.watch(loader)

Importing this package imports only the standard library: torch, psutil, pynvml and the
collector's web stack are loaded lazily, when used.
"""
from __future__ import annotations

from .hooks.loader import _PhaseTimer, _StepTimer
from .hooks.session import finish, init, watch
from .schema import SUMMARY_SCHEMA
from .version import __version__

__all__ = ["init", "watch", "step", "phase", "finish", "SUMMARY_SCHEMA", "__version__"]


def step(loader=None):
    """Mark the compute of a step, as a context manager or a decorator.

    `with starvewatch.step():` attributes to the loader that yielded last; pass a watched
    loader or its name to choose. Loop time outside the block is reported as `other_ms`.
    """
    if callable(loader) and not isinstance(loader, str) and not hasattr(loader, "__iter__"):
        return _StepTimer(None)(loader)  # used as a bare decorator: @starvewatch.step
    return _StepTimer(loader)


def phase(name: str):
    """Time a finer phase of the current step (h2d, forward, backward, optimizer...)."""
    return _PhaseTimer(name)
