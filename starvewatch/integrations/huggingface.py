"""Hugging Face `transformers.Trainer` and `accelerate`.

    from starvewatch.integrations.huggingface import StarvewatchCallback
    trainer = Trainer(..., callbacks=[StarvewatchCallback()])

The callback watches the training loader as the Trainer built it (accelerate's DataLoaderShard,
with its distributed sampler), named `train`; marks each optimizer step from `on_step_begin` to
`on_step_end`; and finishes the run at `on_train_end`. `Trainer.evaluate()` builds a new
evaluation loader each time and iterates it before any callback runs, so a callback cannot watch
it; `watch_trainer(trainer)` adds the callback and also watches every evaluation loader (`val`).

With accelerate alone, watch the loader `prepare` returns, one line:

    loader = starvewatch.watch(accelerator.prepare(loader))

(accelerate's DataLoaderShard is not a DataLoader subclass, it only reports one: `watch()` watches
the real DataLoader it iterates, `base_dataloader`, in place and returns the shard.)
"""
from __future__ import annotations

import functools

import starvewatch

from ._common import Mark, require, set_rank_env

_transformers = require("transformers", "hf", "starvewatch.integrations.huggingface")


class StarvewatchCallback(_transformers.TrainerCallback):
    """Watch a `transformers.Trainer`'s training. `name` and `url` go to `starvewatch.init()`."""

    def __init__(self, name: str | None = None, *, url: str | None = None) -> None:
        self.name = name
        self.url = url
        self.summary: dict | None = None
        self._step = Mark(starvewatch.step)

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        set_rank_env(getattr(args, "process_index", None), getattr(args, "world_size", None),
                     getattr(args, "local_process_index", None))
        starvewatch.init(self.name, url=self.url)
        self._watch_train(train_dataloader)

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self._watch_train(train_dataloader)  # before the Trainer's iter() of this epoch

    def on_step_begin(self, args, state, control, **kwargs):
        self._step.start("train")

    def on_step_end(self, args, state, control, **kwargs):
        self._step.stop()

    def on_train_end(self, args, state, control, **kwargs):
        self._step.stop()
        self.summary = starvewatch.finish()

    @staticmethod
    def _watch_train(loader) -> None:
        if loader is not None:
            starvewatch.watch(loader, "train")  # in place; a watched loader is left as it is


def watch_trainer(trainer, name: str | None = None, *, url: str | None = None) -> StarvewatchCallback:
    """Add the callback to `trainer` and watch its evaluation loaders too (named `val`)."""
    callback = StarvewatchCallback(name, url=url)
    trainer.add_callback(callback)
    build = trainer.get_eval_dataloader

    @functools.wraps(build)
    def get_eval_dataloader(*args, **kwargs):
        return starvewatch.watch(build(*args, **kwargs), "val")

    trainer.get_eval_dataloader = get_eval_dataloader
    return callback

