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

The figures go where the run's other metrics go: every `log_every_n_steps` training batches (the
Trainer's own interval unless given) the callback logs this process's input-wait fraction,
batches/s per loader and the verdict band (`verdict_level`: 0 insufficient data, 1 not,
2 moderate, 3 high) through `trainer.loggers` (`log_metrics`: CSV, TensorBoard, W&B, MLflow...),
under `log_prefix` (`starvewatch/`). At the end it logs the final figures and, as text through
`log_hyperparams`, the verdict band and the top recommendation. `log_figures=False` turns it off.
Lightning's loggers write from rank 0 only, so they show rank 0's figures.
"""
from __future__ import annotations

import logging

import starvewatch

from ..hooks.live import live_figures, metrics, summary_figures, top_recommendation
from ..logonce import RateLimitedLog
from ._common import Mark, loader_name, require, set_rank_env, watch_current

_failures = RateLimitedLog(logging.getLogger("starvewatch.integrations"), interval_s=3600)


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


def _watch_combined(combined, base: str, tune: bool | None = None) -> None:
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
        swap = watch_current(loader, current[index] if index is not None else None, name, tune)
        if swap is not None:
            current[index] = swap


class StarvewatchCallback(_pl.Callback):
    """Watch a Lightning Trainer's loaders. `name` and `url` are passed to `starvewatch.init()`;
    `log_figures`, `log_prefix` and `log_every_n_steps` say what goes to the trainer's loggers.
    `tune=True` tunes the training loaders live, at epoch boundaries (`watch(tune=True)`;
    default `STARVEWATCH_TUNE`)."""

    def __init__(self, name: str | None = None, *, url: str | None = None, log_figures: bool = True,
                 log_prefix: str = "starvewatch/", log_every_n_steps: int | None = None,
                 tune: bool | None = None) -> None:
        super().__init__()
        self.tune = tune
        if log_every_n_steps is not None and (not isinstance(log_every_n_steps, int) or log_every_n_steps < 1):
            raise ValueError(f"log_every_n_steps must be a positive integer or None (the Trainer's), "
                             f"got {log_every_n_steps!r}")
        self.name = name
        self.url = url
        self.log_figures = bool(log_figures)
        self.log_prefix = str(log_prefix)
        self.log_every_n_steps = log_every_n_steps
        self.summary: dict | None = None
        self._step = Mark(starvewatch.step)
        self._phase = Mark(starvewatch.phase)
        self._train_batches = 0

    # ---- the run -------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        set_rank_env(trainer.global_rank, trainer.world_size, trainer.local_rank)
        starvewatch.init(self.name, url=self.url)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._finish(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._finish(trainer)

    def _finish(self, trainer) -> None:
        self._phase.stop()
        self._step.stop()
        self.summary = starvewatch.finish()
        if self.summary is not None and self.log_figures:
            self._log(trainer, lambda: summary_figures(self.summary), final=True)

    # ---- the figures, through the trainer's loggers -----------------------------------------
    def _log(self, trainer, figures, final: bool = False) -> None:
        """Never raises: a logger that fails costs its own log line, not the other loggers' nor
        the training (one warning an hour says so)."""
        loggers = list(getattr(trainer, "loggers", None) or [])
        if not loggers:
            return
        try:
            current = figures()
            if current is None:
                return
            values = metrics(current, self.log_prefix)
            text = None
            if final:
                text = {f"{self.log_prefix}verdict": current["verdict"],
                        f"{self.log_prefix}recommendation": top_recommendation(self.summary) or "none"}
        except Exception as exc:
            _failures.error("figures", "starvewatch: reading the figures to log failed: %s: %s",
                            type(exc).__name__, exc)
            return
        for logger in loggers:
            try:
                logger.log_metrics(values, step=trainer.global_step)
                if text is not None:
                    logger.log_hyperparams(text)
            except Exception as exc:
                _failures.error(f"log {type(logger).__name__}", "starvewatch: logging the figures through %s "
                                "failed: %s: %s", type(logger).__name__, type(exc).__name__, exc)

    def _log_every(self, trainer) -> int:
        if self.log_every_n_steps is not None:
            return self.log_every_n_steps
        return int(getattr(trainer, "log_every_n_steps", 0) or 0)

    # ---- loaders: watched when Lightning has built them for this epoch --------------------
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        _watch_combined(getattr(trainer.fit_loop, "_combined_loader", None), "train", self.tune)

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
        self._train_batches += 1
        if self.log_figures:
            every = self._log_every(trainer)
            if every and self._train_batches % every == 0:
                self._log(trainer, live_figures)
