"""What a trial configures, and how a loader is built for it.

A factory is any callable that builds a DataLoader from keyword arguments
(`num_workers`, `prefetch_factor`, `persistent_workers`, `pin_memory`); a plain DataLoader is
accepted too and rebuilt from its own arguments.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LoaderConfig:
    """The DataLoader arguments the tuner varies. prefetch_factor and persistent_workers only
    exist with workers (torch refuses them with num_workers=0): normalized here."""

    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    # torchdata's StatefulDataLoader only: None leaves the factory's own (torchdata's default: 1)
    snapshot_every_n_steps: int | None = None

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.num_workers == 0:
            object.__setattr__(self, "prefetch_factor", None)
            object.__setattr__(self, "persistent_workers", False)
        elif self.prefetch_factor is None:
            object.__setattr__(self, "prefetch_factor", 2)  # torch's default with workers

    def kwargs(self) -> dict:
        out = {"num_workers": self.num_workers, "persistent_workers": self.persistent_workers,
               "pin_memory": self.pin_memory}
        if self.num_workers:
            out["prefetch_factor"] = self.prefetch_factor
        if self.snapshot_every_n_steps is not None:
            out["snapshot_every_n_steps"] = self.snapshot_every_n_steps
        return out

    def label(self) -> str:
        if not self.num_workers:
            text = "num_workers=0"
        else:
            text = f"num_workers={self.num_workers}, prefetch_factor={self.prefetch_factor}"
            if self.persistent_workers:
                text += ", persistent_workers=True"
        text += ", pin_memory=True" if self.pin_memory else ""
        if self.snapshot_every_n_steps is not None:
            text += f", snapshot_every_n_steps={self.snapshot_every_n_steps}"
        return text

    def replace(self, **changes) -> "LoaderConfig":
        return LoaderConfig(**{**asdict(self), **changes})

    def to_dict(self) -> dict:
        out = asdict(self)
        if out["snapshot_every_n_steps"] is None:  # a plain DataLoader's trials: as before
            del out["snapshot_every_n_steps"]
        return out


class FactoryError(ValueError):
    """The factory cannot be found or does not build a DataLoader; the message says why."""


def usable_cores() -> int:
    """Affinity and cgroup CPU quota (starvewatch/cpus.py): what the trials' workers may use."""
    from ..cpus import usable_cores as usable
    return usable()


def load_factory(spec: str):
    """`package.module:attribute` (or `path/to/file.py:attribute`) -> the object it names."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise FactoryError(f"{spec!r} is not module:factory (for example train:make_loader)")
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.exists(path):
            raise FactoryError(f"no file {path}")
        name = os.path.splitext(os.path.basename(path))[0]
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # workers started by spawn find the module by name
        module_spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())  # the CLI finds modules of the current directory
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise FactoryError(f"cannot import {module_name!r}: {exc}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise FactoryError(f"{module_name} has no attribute {attr!r}") from None
    return obj


def rebuild_kwargs(loader) -> dict:
    """The arguments that rebuild `loader` as a plain DataLoader, less the tuned ones."""
    from torch.utils.data import IterableDataset
    kwargs = {"dataset": loader.dataset, "collate_fn": loader.collate_fn, "timeout": loader.timeout,
              "multiprocessing_context": loader.multiprocessing_context, "generator": loader.generator}
    init = loader.worker_init_fn
    # A watched loader's worker_init_fn is starvewatch's timing wrapper: keep the user's own.
    kwargs["worker_init_fn"] = getattr(init, "user_fn", init) if type(init).__name__ == "WorkerInit" else init
    if not isinstance(loader.dataset, IterableDataset):
        if loader.batch_size is not None:
            kwargs.update(batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last)
        else:
            kwargs.update(batch_sampler=loader.batch_sampler)
    else:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    for optional in ("pin_memory_device", "in_order"):
        if hasattr(loader, optional):
            kwargs[optional] = getattr(loader, optional)
    return kwargs


def as_factory(obj):
    """A callable(**LoaderConfig.kwargs()) -> DataLoader from a factory or a DataLoader."""
    from torch.utils.data import DataLoader
    if isinstance(obj, DataLoader):
        base = rebuild_kwargs(obj)
        cls = DataLoader
        if isinstance(getattr(obj, "snapshot_every_n_steps", None), int):
            # torchdata's StatefulDataLoader: rebuilt as one, its snapshot interval kept unless tried
            cls = next(c for c in type(obj).__mro__ if not getattr(c, "__starvewatch_watched__", False))
            base["snapshot_every_n_steps"] = obj.snapshot_every_n_steps

        def rebuild(**tuned):
            return cls(**{**base, **tuned})
        rebuild.source = obj  # type: ignore[attr-defined]
        return rebuild
    if not callable(obj):
        raise FactoryError(f"{obj!r} is neither a DataLoader nor a callable that builds one")
    return obj


def build(factory, config: LoaderConfig):
    from torch.utils.data import DataLoader
    try:
        loader = factory(**config.kwargs())
    except TypeError as exc:
        raise FactoryError(f"the factory must accept the keyword arguments num_workers, prefetch_factor, "
                           f"persistent_workers and pin_memory (or **kwargs) and pass them to DataLoader: "
                           f"{exc}") from None
    if not isinstance(loader, DataLoader):
        raise FactoryError(f"the factory returned {type(loader).__name__}, not a DataLoader")
    got = {"num_workers": loader.num_workers, "persistent_workers": loader.persistent_workers}
    want = {"num_workers": config.num_workers, "persistent_workers": config.persistent_workers}
    if config.snapshot_every_n_steps is not None:
        got["snapshot_every_n_steps"] = getattr(loader, "snapshot_every_n_steps", None)
        want["snapshot_every_n_steps"] = config.snapshot_every_n_steps
    if got != want:
        raise FactoryError(f"the factory ignored the arguments it was given ({want}, got {got}): "
                           f"pass them on to DataLoader(...)")
    return loader


def current_config(loader) -> LoaderConfig:
    return LoaderConfig(loader.num_workers, loader.prefetch_factor if loader.num_workers else None,
                        bool(loader.persistent_workers), bool(loader.pin_memory))
