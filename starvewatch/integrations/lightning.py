"""PyTorch Lightning: one callback watches the train and validation loaders, marks the training
steps and finishes the run with the trainer.

    from starvewatch.integrations.lightning import StarvewatchCallback
    trainer = Trainer(callbacks=[StarvewatchCallback()])

Loaders are watched as Lightning hands them to its loops, so a loader Lightning rebuilt with a
DistributedSampler is the one watched; they are named `train` and `val` (`train_1`... for more).
Each training batch is marked as a step from `on_train_batch_start` to `on_train_batch_end`;
time outside it (Lightning's own bookkeeping) is reported as `other_ms`. Phases `forward` (up to
`on_before_backward`) and `backward` are recorded: under DDP the forward phase is the compute
before the gradient all-reduce, which the straggler rule compares across ranks.
"""
from __future__ import annotations

import starvewatch

from ._common import Mark, loader_name, require, set_rank_env, watch_current


def _lightning():
    try:
        return require("lightning.pytorch", "lightning", "starvewatch.integrations.lightning")
    except ImportError:
        try:  # the standalone package, for projects that still import pytorch_lightning
            return require("pytorch_lightning", "lightning", "starvewatch.integrations.lightning")
        except ImportError:
            raise ImportError("starvewatch.integrations.lightning needs PyTorch Lightning, which is not "
                              "installed: pip install 'starvewatch[lightning]'") from None


_pl = _lightning()


def _watch_combined(combined, base: str) -> None:
    """Watch every loader of a Lightning CombinedLoader, including its epoch in progress."""
    if combined is None:
        return
    loaders = list(getattr(combined, "flattened", []) or [])
    keys = list(combined.iterables.keys()) if isinstance(getattr(combined, "iterables", None), dict) else None
    mode_iterator = getattr(combined, "_iterator", None)  # Lightning made this epoch's iterators already
    current = getattr(mode_iterator, "iterators", None)
    for i, loader in enumerate(loaders):
        name = loader_name(base, i, keys[i] if keys and i < len(keys) else None)
        index = i if current is not None and len(current) == len(loaders) else None
        swap = watch_current(loader, current[index] if index is not None else None, name)
        if swap is not None:
            current[index] = swap


class StarvewatchCallback(_pl.Callback):
    """Watch a Lightning Trainer's loaders. `name` and `url` are passed to `starvewatch.init()`."""

    def __init__(self, name: str | None = None, *, url: str | None = None) -> None:
        super().__init__()
        self.name = name
        self.url = url
        self.summary: dict | None = None
        self._step = Mark(starvewatch.step)
        self._phase = Mark(starvewatch.phase)

    # ---- the run -------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        set_rank_env(trainer.global_rank, trainer.world_size, trainer.local_rank)
        starvewatch.init(self.name, url=self.url)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._finish()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._finish()

    def _finish(self) -> None:
        self._phase.stop()
        self._step.stop()
        self.summary = starvewatch.finish()

    # ---- loaders: watched when Lightning has built them for this epoch --------------------
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        _watch_combined(getattr(trainer.fit_loop, "_combined_loader", None), "train")

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        loop = trainer.fit_loop.epoch_loop.val_loop if trainer.state.fn == "fit" else trainer.validate_loop
        _watch_combined(getattr(loop, "_combined_loader", None), "val")

    # ---- steps and their phases -----------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step.start("train")
        self._phase.start("forward")

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        # DDP's gradient all-reduce runs inside backward: the forward phase is the compute
        # before the collective, which the straggler rule compares across ranks.
        self._phase.start("backward")

    def on_after_backward(self, trainer, pl_module) -> None:
        self._phase.stop()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._phase.stop()
        self._step.stop()
