"""A watched loader iterates exactly like the original and keeps every attribute."""
import gc
import subprocess
import sys
import threading
import weakref

import pytest
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

import starvewatch
from tests.conftest import shipped_steps


class EpochSampler(Sampler):
    def __init__(self, n):
        self.n = n
        self.epoch = None

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        # The order depends on the epoch, as a DistributedSampler's shuffle does.
        shift = (self.epoch or 0) % self.n
        return iter([*range(shift, self.n), *range(shift)])

    def __len__(self):
        return self.n


def test_import_loads_no_heavy_module():
    code = ("import sys, starvewatch; heavy = [m for m in ('torch', 'fastapi', 'dash', 'plotly', "
            "'pynvml', 'psutil', 'orjson', 'pydantic', 'uvicorn') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_watched_dataloader_is_the_same_dataloader(memory_run):
    ds = TensorDataset(torch.arange(10.0))
    sampler = EpochSampler(10)
    loader = DataLoader(ds, batch_size=3, sampler=sampler)
    loader.custom_attribute = "kept"
    watched = starvewatch.watch(loader)
    assert isinstance(watched, DataLoader)
    assert watched.dataset is ds and watched.sampler is sampler and watched.batch_size == 3
    assert len(watched) == 4 and watched.custom_attribute == "kept"
    assert starvewatch.watch(watched) is watched  # watching twice changes nothing
    assert [b[0].tolist() for b in watched] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0], [9.0]]
    # set_epoch through the watched loader reaches the sampler, and the next epoch follows it.
    watched.sampler.set_epoch(3)
    assert sampler.epoch == 3
    batches = [b[0].tolist() for b in watched]
    assert batches == [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0], [9.0, 0.0, 1.0], [2.0]]
    assert [b[0].tolist() for b in watched] == batches  # every iter() is a new epoch, same sampler


def test_copies_rebuilds_and_pickles_of_a_watched_loader(memory_run):
    """Lightning rebuilds a loader from its type (to add a DistributedSampler), libraries copy
    and deepcopy loaders, and spawn pickles them: none of it may break or lose steps."""
    import copy
    import pickle
    ds = TensorDataset(torch.arange(10.0))
    watched = starvewatch.watch(DataLoader(ds, batch_size=2))
    rebuilt = type(watched)(ds, batch_size=5)  # like Lightning's type(loader)(**kwargs)
    copies = [copy.copy(watched), copy.deepcopy(watched), rebuilt]
    assert all(starvewatch.watch(c) is c for c in copies)  # still watched: the same loader
    assert [len(list(c)) for c in copies] == [5, 5, 2]
    plain = pickle.loads(pickle.dumps(watched))  # another process gets the loader as it was
    assert type(plain) is DataLoader and [b[0].tolist() for b in plain][-1] == [8.0, 9.0]
    items = starvewatch.watch([1, 2, 3], name="items")
    assert pickle.loads(pickle.dumps(items)) == [1, 2, 3]
    assert list(copy.deepcopy(items)) == [1, 2, 3]
    loaders = {l["name"]: l for l in starvewatch.finish()["loaders"]}
    assert (loaders["train"]["steps"], loaders["train"]["epochs"]) == (12, 3)
    assert (loaders["items"]["steps"], loaders["items"]["epochs"]) == (3, 1)


def test_subclass_of_dataloader_stays_its_class(memory_run):
    class MyLoader(DataLoader):
        def extra(self):
            return "mine"

    watched = starvewatch.watch(MyLoader(TensorDataset(torch.arange(4.0)), batch_size=2))
    assert isinstance(watched, MyLoader) and watched.extra() == "mine"
    assert len(list(watched)) == 2


def test_default_names_and_summary_per_loader(memory_run):
    a = starvewatch.watch([1, 2, 3])
    b = starvewatch.watch(range(5))
    c = starvewatch.watch(iter([7, 8]))
    assert (list(a), list(b), list(c)) == ([1, 2, 3], list(range(5)), [7, 8])
    summary = starvewatch.finish()
    assert [(l["name"], l["steps"]) for l in summary["loaders"]] == [
        ("train", 3), ("b", 5), ("c", 2)]  # the variables they are assigned to
    assert summary["schema"] == "starvewatch.summary/2"


def test_break_exception_and_stopiteration_behave_as_without(memory_run):
    session, transport = memory_run
    watched = starvewatch.watch(list(range(10)), name="l")
    for i in watched:
        if i == 3:
            break
    with pytest.raises(ValueError, match="boom"):
        for i in watched:
            if i == 2:
                raise ValueError("boom")
    it = iter(watched)
    assert [next(it) for _ in range(10)] == list(range(10))
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    summary = starvewatch.finish()
    # 4 steps before the break, 3 before the exception, 10 in the full epoch
    assert summary["loaders"][0]["steps"] == 17
    assert summary["loaders"][0]["epochs"] == 3
    assert len(shipped_steps(transport)) == 17


def test_exception_from_the_loader_propagates(memory_run):
    def broken():
        yield 1
        raise RuntimeError("worker died")

    watched = starvewatch.watch(broken())
    with pytest.raises(RuntimeError, match="worker died"):
        for _ in watched:
            pass
    assert starvewatch.finish()["loaders"][0]["steps"] == 1


def test_next_on_a_watched_iterator_and_while_true_loses_nothing(memory_run):
    session, transport = memory_run
    gen = starvewatch.watch((i * i for i in range(100)), name="stream")
    got = [next(gen) for _ in range(5)]
    assert got == [0, 1, 4, 9, 16]
    summary = starvewatch.finish()  # the 5th batch is still open: it is a step too
    assert summary["loaders"][0]["steps"] == 5
    assert next(gen) == 25  # the loop may go on after finish(), unmeasured


def test_no_reference_to_batches_or_finished_iterators(memory_run):
    class Batch:
        pass

    refs = []

    def produce():
        for _ in range(5):
            b = Batch()
            refs.append(weakref.ref(b))
            yield b

    class Source:
        def __iter__(self):
            inner = produce()
            refs.append(weakref.ref(inner))
            return inner

    watched = starvewatch.watch(Source())

    def train():  # loop variables die with the frame, as in a real training function
        for _ in watched:
            pass
        for _ in watched:
            break

    train()
    gc.collect()
    assert len(refs) == 2 + 5 + 1  # two inner iterators, six batches
    assert all(r() is None for r in refs), "a batch or a finished iterator is still referenced"


def test_disabled_is_a_pass_through_without_threads(monkeypatch):
    # finish() returns the last run's summary; this process ran others before this test.
    monkeypatch.setattr("starvewatch.hooks.session._LAST_SUMMARY", None)
    monkeypatch.setenv("STARVEWATCH_DISABLED", "1")
    before = {t.name for t in threading.enumerate()}
    data = [1, 2, 3]
    assert starvewatch.watch(data) is data
    loader = DataLoader(TensorDataset(torch.arange(4.0)))
    assert starvewatch.watch(loader) is loader and type(loader) is DataLoader
    assert {t.name for t in threading.enumerate()} == before
    assert starvewatch.finish() is None  # nothing was started: finish is harmless, reports nothing
    assert {t.name for t in threading.enumerate()} == before


def test_watch_after_finish_starts_a_new_run():
    loader = starvewatch.watch(DataLoader(TensorDataset(torch.arange(4.0)), batch_size=1))
    list(loader)
    first = starvewatch.finish()
    list(loader)  # a watched loader iterated after finish() joins the next run
    list(loader)
    second = starvewatch.finish()
    assert first["run"]["id"] != second["run"]["id"]
    assert first["loaders"][0]["steps"] == 4
    assert second["loaders"][0]["steps"] == 8 and second["loaders"][0]["epochs"] == 2


def test_watch_rejects_non_iterables():
    with pytest.raises(TypeError, match="needs an iterable"):
        starvewatch.watch(42)


def test_batch_size_from_loader_or_leading_dimension(memory_run):
    session, transport = memory_run
    loader = starvewatch.watch(DataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=4))
    pairs = starvewatch.watch([(torch.zeros(5, 3), torch.zeros(5)), (torch.zeros(2, 3), torch.zeros(2))],
                              name="pairs")
    ints = starvewatch.watch([1, 2], name="ints")
    for it in (loader, pairs, ints):
        list(it)
    summary = starvewatch.finish()
    sizes = {}
    for p in transport.payloads:
        for name, bs in zip(p["steps"]["loader"], p["steps"]["batch_size"]):
            sizes.setdefault(name, []).append(bs)
    assert sizes == {"train": [4, 4, 4], "pairs": [5, 2], "ints": [None, None]}
    by_name = {l["name"]: l for l in summary["loaders"]}
    assert by_name["ints"]["samples_per_s"] is None and by_name["pairs"]["samples_per_s"] > 0


def test_full_buffer_drops_and_counts_but_totals_stay_exact(memory_run):
    session, transport = memory_run
    session.shipper._stop_requested.set()  # keep the shipper from draining: buffer fills
    session.shipper._wake.set()
    session.shipper.join(5)
    watched = starvewatch.watch(range(100))
    state = session.loaders["train"]
    state.capacity = 30
    list(watched)
    session.shipper = type(session.shipper)(session, session.shipper.pipeline)  # fresh, not started
    summary = starvewatch.finish()
    loader = summary["loaders"][0]
    assert loader["steps"] == 100
    # Held while nothing drains (at most twice the capacity): step 0's record; a fast-path
    # segment as long as the buffer's room then (29 steps, 58 clock reads, the last step still
    # open when it ends); general-path records up to the capacity (28 beside those two).
    shipped = shipped_steps(transport)
    assert len(shipped) == 1 + 28 + 28 and loader["dropped_records"] == 100 - len(shipped)
    assert [r[2] for r in shipped] == list(range(57))  # steps 0..56 kept, in order; later ones dropped


def test_a_segment_ended_before_the_shipper_took_it_does_not_hold_the_loop_on_the_general_path(memory_run):
    """The sampler's CPU probe (or the shipper's rotation) ends a segment whose last steps the
    shipper has not taken yet: the next batch starts a new segment at once, again and again,
    while the buffer has room for the reads of every segment not taken yet."""
    from starvewatch.hooks import loader as hot_path
    session, transport = memory_run
    session.shipper._stop_requested.set()  # this test runs the cycles itself, at known points
    session.shipper._wake.set()
    session.shipper.join(5)
    iterator = iter(starvewatch.watch(range(400), name="train"))
    paths = []  # after each batch: is the next one on the fast path?
    for i, _ in enumerate(iterator):
        paths.append(type(iterator) is hot_path.FastWatchedIterator)
        if i in (100, 200, 300):
            iterator.probe_cpu()  # as the sampler thread does: one step on the general path
        if i == 250:
            session.shipper.cycle()
    # each probed step started a new segment at once, though the shipper had taken nothing
    assert all(paths[5:]) and len(session.segments) >= 2
    del iterator
    session.shipper.cycle()
    session.shipper = type(session.shipper)(session, session.shipper.pipeline)  # fresh, not started
    summary = starvewatch.finish()
    assert [s for _, _, s in shipped_steps(transport)] == list(range(400))
    assert summary["loaders"][0]["steps"] == 400 and summary["loaders"][0]["dropped_records"] == 0


@pytest.mark.parametrize("rewatch", [False, True])
def test_epochs_before_the_shipper_took_them_share_one_buffer_of_room(memory_run, rewatch):
    """Issue 42: every epoch's first segment got the buffer's whole room again, whatever the
    segments of the epochs before still held untaken (each is one item of the buffer), so a
    loop iterated (or watched) again faster than the shipper cycles held a buffer's worth of
    steps per epoch. The room is now shared: the untaken reads stay within twice the capacity
    (two per step) and the rest goes to the general path, which counts what the full buffer
    drops; every step is shipped or counted."""
    session, transport = memory_run
    session.shipper._stop_requested.set()  # no cycle until the loops are over
    session.shipper._wake.set()
    session.shipper.join(5)
    capacity = 100
    session.settings.buffer_capacity = capacity
    data = list(range(80))
    watched = starvewatch.watch(data, name="train")
    for _ in range(5):
        for _ in (starvewatch.watch(data, name="train") if rewatch else watched):
            pass
        untaken = sum(len(s.times) - 2 * s.taken for s in session.buffer if type(s).__name__ == "Segment")
        assert untaken <= 2 * capacity, untaken  # before: 160 more reads each epoch
        assert len(session.buffer) <= capacity + 5  # (the epochs' end marks)
    session.shipper = type(session.shipper)(session, session.shipper.pipeline)  # fresh, not started
    summary = starvewatch.finish()
    loader = summary["loaders"][0]
    dropped = summary["delivery"]["dropped"]
    assert loader["steps"] == 400 and set(dropped) <= {"buffer_full"}
    assert loader["dropped_records"] == dropped.get("buffer_full", 0) > 0
    assert len(shipped_steps(transport)) == summary["delivery"]["acknowledged"] == 400 - loader["dropped_records"]


def test_fast_path_segments_rotate_and_every_step_arrives_once_in_order(memory_run, monkeypatch):
    """The fast path appends clock reads to a segment's list; the shipper ends a long segment
    (the next batch starts a new one), and step() in between moves the loop to the general path
    and back: every step arrives once, in order, and the durations add up exactly."""
    from starvewatch.hooks import loader as hot_path
    from starvewatch.hooks.delivery import shipper as shipper_module
    session, transport = memory_run
    session.shipper._stop_requested.set()  # this test runs the cycles itself, at known points
    session.shipper._wake.set()
    session.shipper.join(5)
    monkeypatch.setattr(shipper_module, "SEGMENT_ROTATE_READS", 64)
    watched = starvewatch.watch(range(5000), name="train")
    longest, segments, marked = 0, set(), 0
    for i, _ in enumerate(watched):
        it = hot_path.ACTIVE.stack()[-1]()  # this thread's innermost epoch
        if it._segment is not None:
            segments.add(it._segment.base)  # each segment starts at its own step
            longest = max(longest, len(it._times))
        if i % 700 == 350:
            with starvewatch.step():  # the general path for this step, then the fast path again
                marked += 1
        if i % 100 == 99:
            session.shipper.cycle()
    assert marked == 7 and len(segments) > 40  # rotated about every 64 reads, not one long list
    assert longest <= 64 + 2 * 100  # at most one cycle's reads past the threshold
    session.shipper = type(session.shipper)(session, session.shipper.pipeline)  # fresh, not started
    summary = starvewatch.finish()
    assert [s for _, _, s in shipped_steps(transport)] == list(range(5000))
    loader = summary["loaders"][0]
    assert loader["steps"] == 5000 and loader["dropped_records"] == 0
    # Each step ends where the next one begins, across segment ends and general-path steps:
    # start + wait + compute + other of step k is the start of step k + 1 (step 0's wait also
    # holds the epoch's start-up, before its start).
    cols = {k: [v for p in transport.payloads if p.get("steps") for v in p["steps"][k]]
            for k in ("start_ns", "wait_ns", "compute_ns", "other_ns")}
    ends = [sum(v) for v in zip(cols["start_ns"], cols["wait_ns"], cols["compute_ns"], cols["other_ns"])]
    assert ends[1:-1] == cols["start_ns"][2:]
