"""Hugging Face `transformers.Trainer` and `accelerate`.

    from starvewatch.integrations.huggingface import StarvewatchCallback
    trainer = Trainer(..., callbacks=[StarvewatchCallback()])

The callback watches the training loader as the Trainer built it (accelerate's DataLoaderShard,
with its distributed sampler), named `train`; marks each optimizer step from `on_step_begin` to
`on_step_end`; and finishes the run at `on_train_end`. `Trainer.evaluate()` builds a new
evaluation loader each time and iterates it before any callback runs, so a callback cannot watch
it; `watch_trainer(trainer)` adds the callback and also watches every evaluation loader (`val`).

`watch_trainer` also puts starvewatch's figures where the Trainer's logs go. `Trainer.log` copies
the logs into `state.log_history` before any callback runs, and the reporting callbacks
(`report_to`: W&B, MLflow, TensorBoard...) run before the ones added later, so a callback's
`on_log` cannot add to them; `watch_trainer` wraps `trainer.log` instead. Every log the Trainer
writes (each `logging_steps`, and evaluations) then carries this process's input-wait fraction,
batches/s per loader and `verdict_level` (0 insufficient data, 1 not, 2 moderate, 3 high) under
`log_prefix` (`starvewatch/`); the Trainer's final log (the one with `train_runtime`) ends the run
and carries the final figures, the verdict band and the top recommendation as text (W&B and
TensorBoard take text; MLflow's callback logs numbers only and says it dropped the text).
`log_every_n_steps` spaces the figures further; `log_figures=False` turns them off.

With accelerate alone, watch the loader `prepare` returns, one line:

    loader = starvewatch.watch(accelerator.prepare(loader))

(accelerate's DataLoaderShard is not a DataLoader subclass, it only reports one: `watch()` watches
the real DataLoader it iterates, `base_dataloader`, in place and returns the shard.)
"""
from __future__ import annotations

import functools
import logging

import starvewatch

from ..hooks.live import live_figures, metrics, summary_figures, top_recommendation
from ..logonce import RateLimitedLog
from ._common import Mark, require, set_rank_env

_failures = RateLimitedLog(logging.getLogger("starvewatch.integrations"), interval_s=3600)

_transformers = require("transformers", "hf", "starvewatch.integrations.huggingface")


class StarvewatchCallback(_transformers.TrainerCallback):
    """Watch a `transformers.Trainer`'s training. `name` and `url` go to `starvewatch.init()`;
    `tune=True` tunes the training loader live, at epoch boundaries (`watch(tune=True)`;
    default `STARVEWATCH_TUNE`)."""

    def __init__(self, name: str | None = None, *, url: str | None = None, tune: bool | None = None) -> None:
        self.name = name
        self.tune = tune
        self.url = url
        self.summary: dict | None = None
        self._step = Mark(starvewatch.step)
        self._figures_step: int | None = None  # the global step of the last figures logged

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        set_rank_env(getattr(args, "process_index", None), getattr(args, "world_size", None),
                     getattr(args, "local_process_index", None))
        starvewatch.init(self.name, url=self.url)
        self._figures_step = None  # a new training: its steps count from here
        self._watch_train(train_dataloader, self.tune)

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self._watch_train(train_dataloader, self.tune)  # before the Trainer's iter() of this epoch

    def on_step_begin(self, args, state, control, **kwargs):
        self._step.start("train")

    def on_step_end(self, args, state, control, **kwargs):
        self._step.stop()

    def on_train_end(self, args, state, control, **kwargs):
        self._finish()

    def _finish(self) -> None:
        self._step.stop()
        self.summary = starvewatch.finish()

    def figures_for_log(self, logs: dict, global_step: int, prefix: str = "starvewatch/",
                        every_n_steps: int | None = None) -> dict:
        """What `watch_trainer` adds to one of the Trainer's logs: the live figures, or at the
        Trainer's final training log the final ones (the run ends there: all steps are done)."""
        if "train_runtime" in logs:
            self._finish()
            if self.summary is None:
                return {}
            final = summary_figures(self.summary)
            return {**metrics(final, prefix), f"{prefix}verdict": final["verdict"],
                    f"{prefix}recommendation": top_recommendation(self.summary) or "none"}
        if every_n_steps is not None and self._figures_step is not None \
                and global_step - self._figures_step < every_n_steps:
            return {}
        figures = live_figures()
        if figures is None:
            return {}
        self._figures_step = global_step
        return metrics(figures, prefix)

    @staticmethod
    def _watch_train(loader, tune: bool | None = None) -> None:
        if loader is not None:
            starvewatch.watch(loader, "train", tune=tune)  # in place; a watched loader is left as it is


def watch_trainer(trainer, name: str | None = None, *, url: str | None = None, log_figures: bool = True,
                  log_prefix: str = "starvewatch/", log_every_n_steps: int | None = None,
                  tune: bool | None = None) -> StarvewatchCallback:
    """Add the callback to `trainer`, watch its evaluation loaders too (named `val`) and, unless
    `log_figures=False`, add the figures to the Trainer's logs (see the module's docstring)."""
    if log_every_n_steps is not None and (not isinstance(log_every_n_steps, int) or log_every_n_steps < 1):
        raise ValueError(f"log_every_n_steps must be a positive integer or None (every Trainer log), "
                         f"got {log_every_n_steps!r}")
    callback = StarvewatchCallback(name, url=url, tune=tune)
    trainer.add_callback(callback)
    if log_figures:
        _add_figures_to_logs(trainer, callback, str(log_prefix), log_every_n_steps)
    build = trainer.get_eval_dataloader

    @functools.wraps(build)
    def get_eval_dataloader(*args, **kwargs):
        return starvewatch.watch(build(*args, **kwargs), "val")

    trainer.get_eval_dataloader = get_eval_dataloader
    return callback



def _add_figures_to_logs(trainer, callback: StarvewatchCallback, prefix: str, every_n_steps: int | None) -> None:
    log = trainer.log

    @functools.wraps(log)
    def log_with_figures(logs, *args, **kwargs):
        if isinstance(logs, dict):
            try:
                logs.update(callback.figures_for_log(logs, trainer.state.global_step, prefix, every_n_steps))
            except Exception as exc:  # the Trainer's own log goes on without them
                _failures.error("log", "starvewatch: adding the figures to the Trainer's log failed: %s: %s",
                                type(exc).__name__, exc)
        return log(logs, *args, **kwargs)

    trainer.log = log_with_figures
