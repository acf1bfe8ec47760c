"""Loaders that are not DataLoaders but load in workers: webdataset's WebLoader (a DataLoader
inside) and a torchdata.nodes pipeline with a ParallelMapper. Starved, they get advice they can
take, never "batches are produced on the training thread, wrap the data in a DataLoader" (which
a plain iterable, loading on the training thread, still gets). Real libraries, real workers."""
from __future__ import annotations

import time

import torch
from torch.utils.data import default_collate

import starvewatch
from starvewatch.monitor.outputs.export import to_markdown
from tests.test_loaders import shards  # noqa: F401 (a fixture: 4 webdataset shards of 16 samples)

N = 64
BATCH = 2
ITEM_S = 0.004   # a sample's load: 8 ms a batch, against 1 ms of compute: the loop waits
COMPUTE_S = 0.001


def slow_sample(sample):
    time.sleep(ITEM_S)
    return sample


def run(loader, name: str) -> int:
    batches = 0
    for _ in starvewatch.watch(loader, name):
        time.sleep(COMPUTE_S)
        batches += 1
    return batches


def advice_of(summary, name: str) -> list[dict]:
    return [r for r in summary["recommendations"] if r["loader"] == name]


def wraps_in_a_dataloader(rec: dict) -> bool:
    return "wrap the data in a DataLoader" in rec["reason"] or "DataLoader(" in str(rec["suggested"])


def nodes_loader(workers: int):
    from torch.utils.data import SequentialSampler
    from torchdata import nodes
    node = nodes.SamplerWrapper(SequentialSampler(range(N)))
    node = nodes.ParallelMapper(node, map_fn=lambda i: slow_sample(torch.tensor([float(i)])),
                                num_workers=workers, method="thread")
    return nodes.Loader(nodes.Mapper(nodes.Batcher(node, batch_size=BATCH), default_collate))



def test_a_starved_plain_iterable_is_still_told_to_use_a_dataloader():
    batches = [torch.tensor([float(i)] * BATCH) for i in range(N // BATCH)]
    assert run((slow_sample(b) for b in batches), "plain") == N // BATCH
    summary = starvewatch.finish(quiet=True)
    assert summary["loaders"][0]["config"] is None
    assert any(wraps_in_a_dataloader(r) for r in advice_of(summary, "plain")), summary["recommendations"]


def test_a_starved_torchdata_nodes_pipeline_gets_parallel_mapper_advice_only():
    assert run(nodes_loader(1), "nodes") == N // BATCH
    summary = starvewatch.finish(quiet=True)
    [loader] = summary["loaders"]
    assert loader["verdict"] in ("moderate", "high")
    assert (loader["config"]["num_workers"], loader["config"]["worker_method"]) == (1, "thread")
    advice = advice_of(summary, "nodes")
    assert advice and not any(wraps_in_a_dataloader(r) for r in advice), advice
    # Only what a ParallelMapper takes: no prefetch_factor, persistent_workers, pin_memory.
    assert {r["parameter"] for r in advice} <= {None, "num_workers"}, advice
    more = [r for r in advice if r["parameter"] == "num_workers"]
    assert more and more[0]["suggested"] > 1
    assert f"ParallelMapper(source, map_fn, num_workers={more[0]['suggested']})" in to_markdown(summary)


def test_a_starved_webloader_gets_the_diagnosis_of_the_dataloader_inside(shards):
    import webdataset as wds
    loader = wds.WebLoader(wds.WebDataset(shards, shardshuffle=False).map(slow_sample).decode()
                           .to_tuple("cls").batched(BATCH), batch_size=None, num_workers=1)
    assert run(loader, "web") == N // BATCH
    summary = starvewatch.finish(quiet=True)
    [part] = summary["loaders"]
    assert part["verdict"] in ("moderate", "high") and part["config"]["num_workers"] == 1
    assert [w["batches"] for w in summary["system"]["loaders"]["web"]["workers"]] == [N // BATCH]
    advice = advice_of(summary, "web")
    assert advice and not any(wraps_in_a_dataloader(r) for r in advice), advice
    more = [r for r in advice if r["parameter"] == "num_workers"]
    assert more and more[0]["suggested"] > 1
    assert "WebLoader(dataset, " in to_markdown(summary)
