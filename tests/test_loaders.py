"""Issue 25, item 1: the loaders people train with at scale, watched as a user would watch them.

For each library (real, installed from the `test` extra): the watched loader yields the same
batches as the same loader unwatched, every batch is one step, the input-wait fraction is
within 0.02 of what this test measures around its own loop, and the library's own API
(checkpointing and resuming, `len`, attributes) works through the watched object. The
libraries and what starvewatch reads from each are listed in docs/loaders.md."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from time import perf_counter_ns

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import starvewatch

PROGRAMS = Path(__file__).parent / "programs"
N = 64           # samples
BATCH = 4        # 16 batches an epoch
ITEM_S = 0.001   # load time of one sample (slept, in the workers where there are workers)
COMPUTE_S = 0.002  # the loop's "training step"
TOLERANCE = 0.02   # input-wait fraction against the loop's own measure


# ---- what every test uses -------------------------------------------------------------------
def plain(batch):
    """A batch as nested Python values, to compare batches of any structure."""
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, dict):
        return {key: plain(value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [plain(value) for value in batch]
    return batch


def timed_epoch(loader) -> tuple[list, float]:
    """One epoch of a loop that times itself: its batches and its own input-wait fraction
    (time in next(), including the StopIteration at the end, over the loop's time)."""
    batches, wait_ns, compute_ns = [], 0, 0
    t = perf_counter_ns()
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            wait_ns += perf_counter_ns() - t
            break
        t1 = perf_counter_ns()
        wait_ns += t1 - t
        batches.append(plain(batch))
        time.sleep(COMPUTE_S)
        t = perf_counter_ns()
        compute_ns += t - t1
    del it
    return batches, wait_ns / (wait_ns + compute_ns)


def loaders_of(summary) -> dict:
    return {loader["name"]: loader for loader in summary["loaders"]}


def assert_measured(summary, name: str, batches: list, truth: float) -> dict:
    loader = loaders_of(summary)[name]
    assert loader["steps"] == len(batches), loader  # every batch one step
    assert loader["input_wait_fraction"] == pytest.approx(truth, abs=TOLERANCE), (name, truth)
    return loader


def worker_batches(summary, name: str) -> list[int]:
    return [w["batches"] for w in summary["system"]["loaders"][name]["workers"]]


def finding_kinds(summary, name: str) -> list[str]:
    return [f["kind"] for f in summary["findings"] if f.get("loader") == name]


class SlowNumbers(Dataset):
    """Sample i is tensor([i]); each costs ITEM_S to load."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        time.sleep(ITEM_S)
        return torch.tensor([float(i)])


def slow_sample(sample):
    time.sleep(ITEM_S)
    return sample


def slow_collate(samples):
    time.sleep(ITEM_S * len(samples))
    return default_collate(samples)


# ---- torchdata: StatefulDataLoader ----------------------------------------------------------
def _stateful(**kwargs):
    from torchdata.stateful_dataloader import StatefulDataLoader
    return StatefulDataLoader(SlowNumbers(), batch_size=BATCH, num_workers=2, **kwargs)


def test_stateful_dataloader_is_measured_and_checkpoints_and_resumes_through_watch():
    from torchdata.stateful_dataloader import StatefulDataLoader
    expected = [plain(b) for b in _stateful()]
    watched = starvewatch.watch(_stateful(), "train")
    assert isinstance(watched, StatefulDataLoader) and len(watched) == N // BATCH
    assert watched.snapshot_every_n_steps == 1  # its own attributes, as they were
    batches, truth = timed_epoch(watched)
    assert batches == expected

    # Checkpoint mid-epoch through the watched loader; resume a new (watched) one from it.
    first = starvewatch.watch(_stateful(), "checkpointed")
    it = iter(first)
    head = [plain(next(it)) for _ in range(5)]
    state = first.state_dict()
    del it
    resumed = _stateful()
    resumed.load_state_dict(state)
    tail = [plain(b) for b in starvewatch.watch(resumed, "resumed")]
    assert head + tail == expected

    summary = starvewatch.finish()
    loader = assert_measured(summary, "train", batches, truth)
    assert loaders_of(summary)["checkpointed"]["steps"] == 5
    assert loaders_of(summary)["resumed"]["steps"] == len(expected) - 5
    assert loader["config"]["num_workers"] == 2 and loader["config"]["dataset"] == "SlowNumbers"
    assert worker_batches(summary, "train") == [8, 8]  # per-worker telemetry in its own worker loop
    assert finding_kinds(summary, "train") == []


def test_stateful_dataloader_checkpointed_in_one_process_resumes_in_another(tmp_path):
    """A watched loader's state_dict() saved by a training process that then exits; a new
    process resumes from the file where the first stopped."""
    expected = [plain(b) for b in _stateful()]
    path = tmp_path / "loader.pt"
    done = subprocess.run([sys.executable, str(PROGRAMS / "stateful_checkpoint.py"), str(path), "6"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["watched_type"] == "StatefulDataLoader" and first["steps"] == 6
    loader = _stateful()
    loader.load_state_dict(torch.load(path))
    tail = [plain(b) for b in starvewatch.watch(loader, "resumed")]
    assert first["batches"] + tail == expected
    assert loaders_of(starvewatch.finish())["resumed"]["steps"] == len(expected) - 6


# ---- torchdata.nodes ------------------------------------------------------------------------
def _nodes_loader():
    from torchdata import nodes
    from torch.utils.data import SequentialSampler
    node = nodes.SamplerWrapper(SequentialSampler(range(N)))
    node = nodes.ParallelMapper(node, map_fn=lambda i: slow_sample(torch.tensor([float(i)])),
                                num_workers=2, method="thread")
    node = nodes.Mapper(nodes.Batcher(node, batch_size=BATCH), default_collate)
    return nodes.Loader(node)


def test_torchdata_nodes_loader_is_measured_and_its_state_dict_resumes():
    expected = [plain(b) for b in _nodes_loader()]
    watched = starvewatch.watch(_nodes_loader(), "train")
    batches, truth = timed_epoch(watched)
    assert batches == expected and len(batches) == N // BATCH

    first = starvewatch.watch(_nodes_loader(), "checkpointed")
    it = iter(first)
    head = [plain(next(it)) for _ in range(5)]
    state = first.state_dict()  # the Loader's own method, through the watched object
    resumed = _nodes_loader()
    resumed.load_state_dict(state)
    tail = [plain(b) for b in starvewatch.watch(resumed, "resumed")]
    assert head + tail == expected

    summary = starvewatch.finish()
    loader = assert_measured(summary, "train", batches, truth)
    # Not a DataLoader: its ParallelMapper's settings are read (docs/loaders.md)
    assert (loader["config"]["num_workers"], loader["config"]["worker_method"]) == (2, "thread")
    assert loader["config"]["wrapper"] == "torchdata.nodes"
    assert loaders_of(summary)["resumed"]["steps"] == len(expected) - 5


# ---- webdataset -----------------------------------------------------------------------------
@pytest.fixture
def shards(tmp_path) -> list[str]:
    """4 tar shards of 16 samples each; sample n has the class label n."""
    import webdataset as wds
    urls = []
    for shard in range(4):
        path = tmp_path / f"shard-{shard}.tar"
        with wds.TarWriter(str(path)) as sink:
            for i in range(16):
                n = shard * 16 + i
                sink.write({"__key__": f"{n:05d}", "cls": n})
        urls.append(str(path))
    return urls


def _webdataset(urls, **kwargs):
    import webdataset as wds
    return wds.WebDataset(urls, shardshuffle=False, **kwargs).map(slow_sample).decode().to_tuple("cls")


def test_webdataset_in_a_dataloader_is_measured_and_unsharded_workers_are_found(shards):
    expected = [plain(b) for b in DataLoader(_webdataset(shards), batch_size=BATCH, num_workers=2)]
    watched = starvewatch.watch(DataLoader(_webdataset(shards), batch_size=BATCH, num_workers=2), "train")
    batches, truth = timed_epoch(watched)
    assert batches == expected and len(batches) == N // BATCH
    # Without webdataset's worker splitter every worker reads every shard: found.
    copies = starvewatch.watch(DataLoader(_webdataset(shards, workersplitter=None), batch_size=BATCH,
                                          num_workers=2), "copies")
    assert sum(1 for _ in copies) == 2 * N // BATCH

    summary = starvewatch.finish()
    loader = assert_measured(summary, "train", batches, truth)
    assert loader["config"]["dataset"] == "WebDataset" and loader["config"]["num_workers"] == 2
    assert worker_batches(summary, "train") == [8, 8]
    assert finding_kinds(summary, "train") == []
    assert "duplicated_shards" in finding_kinds(summary, "copies")


def test_webloader_is_measured_and_keeps_its_length_and_fluent_interface(shards):
    import webdataset as wds

    def make():
        loader = wds.WebLoader(_webdataset(shards).batched(BATCH), batch_size=None, num_workers=2)
        return loader.with_length(N // BATCH, silent=True)

    expected = [plain(b) for b in make()]
    watched = starvewatch.watch(make(), "train")
    assert len(watched) == 16 and isinstance(watched.pipeline[0], DataLoader)  # its own attributes
    batches, truth = timed_epoch(watched)
    assert batches == expected and len(batches) == N // BATCH
    summary = starvewatch.finish()
    loader = assert_measured(summary, "train", batches, truth)
    # The DataLoader inside it: its settings read, its workers given per-worker telemetry.
    assert loader["config"]["wrapper"] == "WebLoader" and loader["config"]["num_workers"] == 2
    assert loader["config"]["dataset"] == "WebDataset" and loader["config"]["dataset_shards"] == 4
    assert worker_batches(summary, "train") == [8, 8]


# ---- Hugging Face datasets ------------------------------------------------------------------
def test_hf_map_style_dataset_with_torch_format_is_measured():
    import datasets
    dataset = datasets.Dataset.from_dict({"x": list(range(N))}).with_format("torch")

    def make():
        return DataLoader(dataset, batch_size=BATCH, num_workers=2, collate_fn=slow_collate)

    expected = [plain(b) for b in make()]
    watched = starvewatch.watch(make(), "train")
    assert len(watched) == N // BATCH and watched.dataset is dataset and watched.dataset.format["type"] == "torch"
    batches, truth = timed_epoch(watched)
    assert batches == expected and batches[1] == {"x": [4, 5, 6, 7]}
    summary = starvewatch.finish()
    loader = assert_measured(summary, "train", batches, truth)
    assert (loader["config"]["dataset"], loader["config"]["dataset_len"]) == ("Dataset", N)
    assert loader["config"]["collate_fn"] == "slow_collate"
    assert worker_batches(summary, "train") == [8, 8]


def test_hf_streaming_dataset_from_local_files_is_measured(tmp_path):
    import datasets
    files = []
    for shard in range(4):
        path = tmp_path / f"part-{shard}.jsonl"
        path.write_text("".join(json.dumps({"x": shard * 16 + i}) + "\n" for i in range(16)))
        files.append(str(path))

    def make():
        stream = datasets.load_dataset("json", data_files=files, split="train", streaming=True,
                                       cache_dir=str(tmp_path / "cache"))
        return DataLoader(stream.map(slow_sample).with_format("torch"), batch_size=BATCH, num_workers=2)

    expected = [plain(b) for b in make()]
    watched = starvewatch.watch(make(), "train")
    assert watched.dataset.num_shards == 4
    batches, truth = timed_epoch(watched)
    assert batches == expected and len(batches) == N // BATCH
    summary = starvewatch.finish()
    loader = assert_measured(summary, "train", batches, truth)
    assert loader["config"]["dataset"] == "IterableDataset"
    assert worker_batches(summary, "train") == [8, 8]  # 2 shards each
    assert finding_kinds(summary, "train") == []


# ---- LitData --------------------------------------------------------------------------------
# litdata declares torchvision, which fails to import against this CPU torch; litdata itself
# imports it only for image and video serializers. .ci/run installs litdata without it.
_OPTIMIZE = """
import sys, torch, litdata
def sample(i):
    return {"index": i, "x": torch.tensor([float(i)])}
if __name__ == "__main__":
    litdata.optimize(fn=sample, inputs=list(range(int(sys.argv[2]))), output_dir=sys.argv[1],
                     chunk_bytes="64KB", num_workers=1, start_method="fork")
"""


def test_litdata_streaming_dataloader_is_measured_and_resumes(tmp_path):
    import litdata
    # optimize() sets the process's multiprocessing start method: in a process of its own.
    done = subprocess.run([sys.executable, "-c", _OPTIMIZE, str(tmp_path / "optimized"), str(N)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

    def make():
        dataset = litdata.StreamingDataset(str(tmp_path / "optimized"), transform=slow_sample)
        return litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=2)

    expected = [plain(b) for b in make()]
    watched = starvewatch.watch(make(), "train")
    assert isinstance(watched, litdata.StreamingDataLoader) and len(watched) == N // BATCH
    batches, truth = timed_epoch(watched)
    assert batches == expected and len(batches) == N // BATCH
    assert sorted(i for b in batches for i in b["index"]) == list(range(N))

    first = starvewatch.watch(make(), "checkpointed")
    it = iter(first)
    head = [plain(next(it)) for _ in range(6)]
    state = first.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    tail = [plain(b) for b in starvewatch.watch(resumed, "resumed")]
    assert head + tail == expected

    summary = starvewatch.finish()
    loader = assert_measured(summary, "train", batches, truth)
    assert loader["config"]["dataset"] == "StreamingDataset" and loader["config"]["num_workers"] == 2
    assert worker_batches(summary, "train") == [8, 8]
    assert finding_kinds(summary, "train") == []
