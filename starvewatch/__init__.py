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

    Without it, a step's compute is everything between receiving a batch and asking for the
    next one (logging, checkpoints included). Inside the block is compute; loop time outside it
    is reported apart, as `other_ms`. Nested blocks: the outermost counts.

    Args:
        loader: the watched loader (or its name) the step belongs to; default: the loader
            that yielded last.

    Returns:
        A context manager, also usable as a decorator (`@starvewatch.step` or
        `@starvewatch.step("train")`).

    Example:
        ```python
        for batch in starvewatch.watch(loader):
            with starvewatch.step():
                loss = model(batch.to(device)).mean()
                loss.backward()
                optimizer.step()
            log_metrics()  # counted as other_ms, not compute
        ```
    """
    if callable(loader) and not isinstance(loader, str) and not hasattr(loader, "__iter__"):
        return _StepTimer(None)(loader)  # used as a bare decorator: @starvewatch.step
    return _StepTimer(loader)


def phase(name: str) -> _PhaseTimer:
    """Time a finer phase of the current step, as a context manager or a decorator.

    Each phase's time is stored with its step; with several ranks, the straggler rule says in
    which phase a slow rank loses its time. Phases inside a `step()` block add up within it.

    Args:
        name: the phase's name: `h2d`, `forward`, `backward`, `optimizer`, or your own.

    Returns:
        A context manager, also usable as a decorator.

    Example:
        ```python
        for batch in starvewatch.watch(loader):
            with starvewatch.phase("h2d"):
                batch = batch.to(device, non_blocking=True)
            with starvewatch.phase("forward"):
                loss = model(batch).mean()
            with starvewatch.phase("backward"):
                loss.backward()
        ```
    """
    return _PhaseTimer(name)


def tune(factory: Callable[..., Any], budget_s: float = 60, consumption_batches_per_s: float | None = None,
         run_name: str | None = None, **options: Any) -> TuneResult:
    """Measure DataLoader configurations on this machine within `budget_s` and pick one.

    Each configuration tried (num_workers, prefetch_factor, persistent_workers, and pin_memory
    with CUDA) builds the loader and iterates it without training; the result is a table and
    the `DataLoader(...)` call to use. `starvewatch tune` on the command line does the same.

    Args:
        factory: a function that builds the DataLoader from those keyword arguments, or a
            DataLoader (rebuilt from its own arguments), or `"module:function"`.
        budget_s: the time budget in seconds, all trials together.
        consumption_batches_per_s: how many batches per second the training consumes; the
            answer is then the fewest workers that cover it with a 20% margin. Default: from
            the run named `run_name`, else none (the fewest workers within 10% of the best).
        run_name: a watched run: its compute per batch gives the consumption, and the results
            are stored with it in the collector (its dashboard shows them).
        **options: `loader` (which of the run's loaders; default its first), `out` (where the
            table is printed; default stdout, False: silent), `on_trial` (called with each
            trial's result), `checkpoint_every` (a torchdata StatefulDataLoader: steps between
            checkpoints, tried as its `snapshot_every_n_steps`).

    Returns:
        A `TuneResult`: `trials` (each configuration's measured batches/s), `answer` (the one
        picked, or None), `rule` (why it was picked), and the machine's cores and device.

    Example:
        ```python
        def make_loader(**kwargs):
            return DataLoader(dataset, batch_size=64, shuffle=True, **kwargs)

        result = starvewatch.tune(make_loader, budget_s=60, run_name="train")
        print(result.answer)
        ```
    """
    from .tuning import tune as _tune
    return _tune(factory, budget_s, consumption_batches_per_s, run_name, **options)
