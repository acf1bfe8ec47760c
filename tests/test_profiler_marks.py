"""Issue 38 item 4: the PyTorch profiler sees the data loading of a watched plain iterable,
as it sees a DataLoader's; nothing is wrapped while no profiler records. A real
torch.profiler session on CPU."""
from __future__ import annotations

import re

import torch
from torch.profiler import ProfilerActivity, profile

import starvewatch
from starvewatch.hooks.profiler_marks import ANNOTATION_REGEX, Profiled


def loading_events(prof) -> list[str]:
    return [e.name for e in prof.events() if e.name.startswith("enumerate(")]


def test_each_next_of_a_watched_iterable_is_a_profiler_event_only_while_one_records():
    batches = [torch.ones(4) for _ in range(12)]
    watched = starvewatch.watch(batches, "plain")
    # No profiler: the epoch's iterator takes its batches straight from the list's iterator.
    it = iter(watched)
    assert type(it._it) is not Profiled
    first = [next(it) for _ in range(4)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert type(it._it) is Profiled  # switched when the profiler started, mid-epoch
        rest = [(b * 2).sum() for b in it]  # 8 steps, then the next() that ends the epoch
    assert len(first) == 4 and len(rest) == 8
    names = loading_events(prof)
    assert names == ["enumerate(list)#plain.__next__"] * 9, names
    assert all(re.match(ANNOTATION_REGEX, n) for n in names)
    # After the profiler: a new epoch is not wrapped, and a profiler started later sees only its own steps.
    it = iter(watched)
    assert type(it._it) is not Profiled
    assert sum(1 for _ in it) == 12
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step, _ in enumerate(watched):
            if step == 2:
                break
    assert loading_events(prof) == ["enumerate(list)#plain.__next__"] * 3


def test_torch_s_own_dataloader_event_matches_the_same_regex():
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in starvewatch.watch(loader, "dl"):
            pass
    names = loading_events(prof)
    assert names and all(re.match(ANNOTATION_REGEX, n) for n in names), names
    assert not any("#dl." in n for n in names)  # a DataLoader keeps torch's own, not a second one
