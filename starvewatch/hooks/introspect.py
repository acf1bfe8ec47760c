"""Reads a DataLoader's settings once, at `watch()`; never touches the batches."""
from __future__ import annotations

import sys


def is_torch_dataloader(obj) -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        from torch.utils.data import DataLoader
    except Exception:
        return False
    return isinstance(obj, DataLoader)


def _start_method(loader) -> str | None:
    if loader.num_workers == 0:
        return None
    ctx = loader.multiprocessing_context
    if ctx is not None:
        return ctx.get_start_method() if hasattr(ctx, "get_start_method") else str(ctx)
    import multiprocessing
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()


PICKLE_CAP_BYTES = 1 << 30


class _Counter:
    """A file that counts what is written to it and keeps nothing; past the cap it stops the
    pickling (a dataset that large is reported as at least the cap)."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, data) -> int:
        self.n += len(data)
        if self.n > PICKLE_CAP_BYTES:
            raise OverflowError
        return len(data)


def pickled_bytes(obj) -> int | None:
    """The bytes a spawned worker receives for `obj` (pickled as multiprocessing does), counted
    without keeping them; None where it does not pickle (a worker would fail to start anyway)."""
    import pickle
    sink = _Counter()
    try:
        pickle.Pickler(sink, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except OverflowError:
        return PICKLE_CAP_BYTES
    except Exception:  # noqa: BLE001 - a dataset that does not pickle: nothing to report
        return None
    return sink.n


def _spawns(loader) -> bool:
    """Workers of this loader start as new interpreters (spawn, forkserver): with workers, its
    start method; without, the platform's default (macOS, Windows, Python 3.14's Linux)."""
    method = _start_method(loader)
    if method is None:
        import multiprocessing
        method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()
    return method in ("spawn", "forkserver")


def dataloader_config(loader) -> dict:
    """Every setting that the diagnosis may recommend changing, typed as torch takes it."""
    try:
        dataset_len = len(loader.dataset)
    except Exception:  # IterableDataset, or a dataset without __len__
        dataset_len = None
    config = {
        "num_workers": loader.num_workers,
        "batch_size": loader.batch_size,
        "pin_memory": bool(loader.pin_memory),
        "persistent_workers": bool(loader.persistent_workers),
        "prefetch_factor": loader.prefetch_factor if loader.num_workers > 0 else None,
        "timeout": loader.timeout,
        "drop_last": bool(loader.drop_last),
        "multiprocessing_context": _start_method(loader),
        "sampler": type(loader.sampler).__name__ if loader.sampler is not None else None,
        "batch_sampler": type(loader.batch_sampler).__name__ if loader.batch_sampler is not None else None,
        "dataset": type(loader.dataset).__name__,
        "dataset_len": dataset_len,
        "collate_fn": getattr(loader.collate_fn, "__name__", type(loader.collate_fn).__name__),
    }
    if hasattr(loader, "in_order"):  # torch >= 2.6
        config["in_order"] = bool(loader.in_order)
    if isinstance(getattr(loader, "snapshot_every_n_steps", None), int):  # torchdata's StatefulDataLoader
        config["snapshot_every_n_steps"] = loader.snapshot_every_n_steps
    config.update(shard_facts(loader.dataset))
    return config


def spawn_facts(loader) -> dict:
    """What each spawned worker unpickles, part of its start-up (the model's): read once per
    loader, when it is first watched (not at each re-creation), only where workers spawn."""
    return {"dataset_pickled_bytes": pickled_bytes(loader.dataset)} if _spawns(loader) else {}


def wrapped_loader(loader) -> tuple[dict | None, object | None]:
    """For a loader that is not a DataLoader but loads in workers: (its configuration, the torch
    DataLoader inside it, to give per-worker telemetry, or None). webdataset's `WebLoader`
    wraps a DataLoader (its pipeline's first stage); a `torchdata.nodes` pipeline loads in a
    `ParallelMapper`'s threads or processes (`num_workers`, `method`). (None, None) for any
    other iterable: the diagnosis then takes it for loading on the training thread."""
    # The classes it derives from: webdataset's with_length() makes a subclass in module "abc".
    modules = [c.__module__ or "" for c in type(loader).__mro__]
    try:
        if any(m.startswith("webdataset.") for m in modules):
            stages = getattr(loader, "pipeline", None) or []
            if stages and is_torch_dataloader(stages[0]):
                return {**dataloader_config(stages[0]), "wrapper": "WebLoader"}, stages[0]
        elif any(m.startswith("torchdata.nodes") for m in modules):
            mappers = []
            node, seen = getattr(loader, "root", None), 0
            while node is not None and seen < 100:  # the chain of sources, root first
                if type(node).__name__ == "ParallelMapper" and isinstance(getattr(node, "num_workers", None), int):
                    mappers.append(node)
                node, seen = getattr(node, "source", None), seen + 1
            if mappers:
                mapper = max(mappers, key=lambda m: m.num_workers)
                return {"num_workers": mapper.num_workers, "worker_method": getattr(mapper, "method", None),
                        "in_order": getattr(mapper, "in_order", None), "parallel_mappers": len(mappers),
                        "wrapper": "torchdata.nodes"}, None
    except Exception:  # another version's internals: taken as a plain iterable
        pass
    return None, None


def shard_facts(dataset) -> dict:
    """How many shards an IterableDataset splits among its readers (workers x ranks), where its
    library says: webdataset's URL list (the pipeline's first stage), Hugging Face `datasets`'
    `num_shards`. `dataset_shards` and `shards_resampled` (webdataset's `resampled=True`: each
    reader draws shards at random, so none runs out); {} when not known."""
    module = type(dataset).__module__ or ""
    try:
        if module.startswith("webdataset."):
            stages = getattr(dataset, "pipeline", None) or []
            source = stages[0] if stages else None
            if type(source).__name__ == "ResampledShards":
                return {"dataset_shards": None, "shards_resampled": True}
            urls = getattr(source, "urls", None)
            if isinstance(urls, (list, tuple)):
                return {"dataset_shards": len(urls), "shards_resampled": False}
        elif module.startswith("datasets.") and isinstance(getattr(dataset, "num_shards", None), int):
            return {"dataset_shards": dataset.num_shards, "shards_resampled": False}
    except Exception:  # another version's internals: nothing said rather than a wrong count
        pass
    return {}


def leading_dim(batch) -> int | None:
    """Samples in a batch when it is unambiguous: the leading dimension of its first tensor.
    None for anything that cannot be read (a shape without a length, an unknown or symbolic
    first dimension, a container whose access raises): the batch size is then not measured."""
    try:
        for _ in range(3):  # batch, (x, y), {"x": ...}: a few levels at most
            shape = getattr(batch, "shape", None)
            if shape is not None:
                return int(shape[0]) if len(shape) else None
            if isinstance(batch, (list, tuple)) and batch:
                batch = batch[0]
            elif isinstance(batch, dict) and batch:
                batch = next(iter(batch.values()))
            else:
                return None
    except Exception:  # what a user's batch type raises is not the loop's business
        return None
    return None
