"""The hot path's two cores (issue 29): the compiled fast path (starvewatch/_ccore.c) and the
pure-Python one record exactly the same steps; the core is chosen at import, forced with
STARVEWATCH_CORE, shown in the run's metadata and by `starvewatch doctor`, and a missing or
broken extension means the Python core, never a failed import."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter_ns

import pytest

import starvewatch
from starvewatch.hooks import core, loader
from starvewatch.hooks.delivery.transport import MemoryTransport

REPO = Path(__file__).resolve().parent.parent
STEP_COLUMNS = ("loader", "epoch", "step", "start_ns", "wait_ns", "compute_ns", "other_ns", "batch_size")


def test_the_compiled_core_is_built_in_this_checkout_and_is_the_default():
    """CI and the dev install compile it (`pip install -e .`): a build that silently lost it
    would test the Python core twice."""
    assert core.c_available(), core.why_not_c()
    out = subprocess.run([sys.executable, "-c", "from starvewatch.hooks import core, loader; print(core.current())"],
                         env={k: v for k, v in os.environ.items() if k != core.ENV}, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "c"
    assert type(loader.FastWatchedIterator.__dict__["__next__"]).__name__ == "method_descriptor"
    assert type(loader.FastGpuWatchedIterator.__dict__["__next__"]).__name__ == "method_descriptor"


class SharedClock:
    """One deterministic clock for both paths: hooks/loader.py's `_now` and the extension's
    reads (set_clock), counting who read it."""

    def __init__(self) -> None:
        # A second behind the real clock, never ahead of it: the shipper's cycle takes only the
        # steps closed by its horizon, a real perf_counter_ns() read (shipper.py _take), so
        # reads from the future were carried and never shipped. A fixed start of 10**12 was
        # the future for the first 1,000 s after the machine booted (a full suite begun right
        # after boot lost steps here). Rows are compared from each run's first start, so the
        # two runs need not start at the same reading. (A run reads ~2,400 times: 2.4 ms.)
        self._ticks = itertools.count(max(perf_counter_ns() - 10**9, 0), 997)
        self.python_reads = 0
        self.c_reads = 0

    def python(self) -> int:
        self.python_reads += 1
        return next(self._ticks)

    def compiled(self) -> int:
        self.c_reads += 1
        return next(self._ticks)


def _rows(transport) -> list[tuple]:
    """The shipped steps, their starts from the run's first (the wall clock's offset at init
    differs between two runs; the clock reads do not)."""
    rows = []
    for payload in transport.payloads:
        steps = payload.get("steps")
        if steps:
            rows.extend(zip(*(steps[c] for c in STEP_COLUMNS)))
    first = rows[0][3] if rows else 0
    return [row[:3] + (row[3] - first,) + row[4:] for row in rows]


@contextmanager
def _one_clock(core_name: str, monkeypatch):
    """Run on `core_name` with both cores reading one SharedClock (yielded); the compiled core's
    clock is given back at the end."""
    from starvewatch import _ccore
    clock = SharedClock()
    core.use(core_name)
    monkeypatch.setattr(loader, "_now", clock.python)
    _ccore.set_clock(clock.compiled)
    try:
        yield clock
    finally:
        _ccore.set_clock(None)


def _shipper_cycles_by_hand(session) -> None:
    """The shipper cycles at known points (not on its timer), so that both runs take the fast
    path at the same steps: after a general-path step it resumes once the shipper has taken the
    segment before. The sampler thread is stopped too: on its timer (twice a second, whenever
    the busy machine lets it run) it arms a CPU probe (samplers.py), which sends the current
    iterator's next step to the general path: at a different step in each run, or in one run
    only, so the runs' paths (and the fast-step counts) differed."""
    session.shipper._stop_requested.set()
    session.shipper._wake.set()
    session.shipper.join(60)
    assert not session.shipper.is_alive()
    for sampler in session.samplers:
        sampler.stop()  # its last tick runs now, before any loader is watched: nothing to probe
        sampler.join(60)
        assert not sampler.is_alive()


def _a_training_with(core_name: str, monkeypatch) -> tuple[list[tuple], SharedClock, dict]:
    """Three epochs with every kind of step on one clock: fast-path runs, step() and phase()
    blocks (the general path and back), a nested validation loop, a break, the end."""
    with _one_clock(core_name, monkeypatch) as clock:
        transport = MemoryTransport()
        session = starvewatch.init("same-clock", transport=transport)
        _shipper_cycles_by_hand(session)
        train = starvewatch.watch(list(range(400)), name="train")
        val = starvewatch.watch([[0, 1], [2, 3]] * 5, name="val")
        for epoch in range(3):
            for i, _ in enumerate(train):
                if i % 97 == 13:
                    with starvewatch.step():
                        pass
                if i % 151 == 7:
                    with starvewatch.phase("forward"):
                        pass
                if i == 250:
                    for _ in val:  # validation inside a training step
                        pass
                if i % 10 == 0:
                    session.shipper.cycle()
                if epoch == 1 and i == 333:
                    break
        session.shipper.cycle()  # the last epoch's end
        session.shipper = type(session.shipper)(session, session.shipper.pipeline)  # fresh, not started
        summary = starvewatch.finish()
    return _rows(transport), clock, summary["loaders"]


def test_both_cores_fed_the_same_clock_record_exactly_the_same_steps(monkeypatch):
    rows_python, clock_python, loaders_python = _a_training_with("python", monkeypatch)
    rows_c, clock_c, loaders_c = _a_training_with("c", monkeypatch)
    # Each core really ran its own fast path: the compiled one read most of the clock.
    assert clock_python.c_reads == 0 and clock_python.python_reads > 2000
    assert clock_c.c_reads > 2000 and clock_c.python_reads < clock_c.c_reads / 5
    assert clock_c.c_reads + clock_c.python_reads == clock_python.python_reads  # the same reads
    assert len(rows_python) == 400 + 334 + 400 + 3 * 10
    assert rows_c == rows_python
    assert [(l["name"], l["steps"], l["dropped_records"]) for l in loaders_c] == \
        [(l["name"], l["steps"], l["dropped_records"]) for l in loaders_python]


def test_the_compiled_fast_path_reads_the_same_clock_as_perf_counter_ns():
    from starvewatch import _ccore
    for _ in range(1000):
        before = perf_counter_ns()
        reading = _ccore.clock_ns()
        assert before <= reading <= perf_counter_ns()


@pytest.mark.parametrize("hot_path_core", ["python", "c"], indirect=True)
def test_an_exception_and_the_end_leave_the_compiled_fast_path_as_the_python_one_does(hot_path_core):
    """A loader that fails mid-epoch: the exception reaches the loop unchanged, the epoch
    goes on being measured after it, and the exhausted epoch ends (StopIteration)."""
    def flaky():
        for i in range(300):
            if i == 200:
                raise KeyError("bad sample")
            yield i

    transport = MemoryTransport()
    starvewatch.init("flaky", transport=transport)
    watched = starvewatch.watch(flaky(), name="train")
    seen = []
    with pytest.raises(KeyError, match="bad sample"):
        for x in watched:
            seen.append(x)
    assert seen == list(range(200))
    assert list(watched) == []  # a generator that raised is exhausted: StopIteration at once
    summary = starvewatch.finish()
    assert summary["loaders"][0]["steps"] == 200
    assert [r[2] for r in _rows(transport) if r[1] == 0] == list(range(200))


@pytest.mark.parametrize("value, expected, says", [
    ("python", "python", ""),
    ("C", "c", ""),
    (" c ", "c", ""),
    ("", "c", ""),
    ("rust", "c", "STARVEWATCH_CORE='rust' is neither 'python' nor 'c': using the c core"),
])
def test_starvewatch_core_forces_either_and_a_bad_value_says_so_once_and_runs_the_default(value, expected, says):
    code = ("import starvewatch\nfrom starvewatch.hooks import core\nprint(core.current())\n"
            "s = starvewatch.init('core-meta')\nprint(s.metadata()['core'])\nstarvewatch.finish(quiet=True)\n")
    env = dict(os.environ, STARVEWATCH_CORE=value, STARVEWATCH_QUIET="0", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [expected, expected]  # chosen, and in the run's metadata
    lines = [line for line in out.stderr.splitlines() if "STARVEWATCH_CORE" in line]
    assert lines == ([f"starvewatch: {says}"] if says else [])


def test_doctor_shows_the_core(tmp_path):
    for value, shown in (("c", "ok hot path: the compiled core"), ("python", "ok hot path: the pure-Python core")):
        env = dict(os.environ, STARVEWATCH_CORE=value, PYTHONPATH=str(REPO), STARVEWATCH_URL="off")
        out = subprocess.run([sys.executable, "-m", "starvewatch", "doctor", "--dir", str(tmp_path)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert shown in out.stdout, out.stdout + out.stderr


def test_a_broken_extension_means_the_python_core_and_training_goes_on(tmp_path):
    """An extension file that cannot load (a wrong build, a truncated copy): import works,
    the Python core runs, the run is measured; forcing c says why not."""
    package = tmp_path / "starvewatch"
    subprocess.run(["cp", "-r", str(REPO / "starvewatch"), str(package)], check=True)
    for built in package.glob("_ccore*"):
        built.unlink()
    import sysconfig
    (package / f"_ccore{sysconfig.get_config_var('EXT_SUFFIX')}").write_bytes(b"not an ELF file")
    code = ("import starvewatch\nfrom starvewatch.hooks import core\n"
            "print(core.current())\nstarvewatch.init('broken')\n"
            "print(sum(1 for _ in starvewatch.watch(range(1000))))\n"
            "print(starvewatch.finish(quiet=True)['loaders'][0]['steps'])\n")
    for forced, said in ((None, False), ("c", True)):
        env = dict(os.environ, PYTHONPATH=str(tmp_path), STARVEWATCH_QUIET="0")
        env.pop(core.ENV, None)
        if forced:
            env[core.ENV] = forced
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["python", "1000", "1000"]
        warned = [line for line in out.stderr.splitlines() if "STARVEWATCH_CORE=c but" in line]
        assert len(warned) == (1 if said else 0), out.stderr
        if said:
            assert "the compiled extension failed to load (ImportError" in warned[0]


def test_use_refuses_an_unknown_core():
    with pytest.raises(ValueError, match="core must be one of"):
        core.use("fortran")



def test_the_compiled_segment_reads_behave_as_the_list_the_shipper_slices():
    """_ccore.Times holds a segment's reads as int64: every operation the loader and the
    shipper use on a segment's list gives what the list gives."""
    import bisect

    from starvewatch import _ccore
    reads = [10**15 + 3 * i for i in range(41)] + [2**62]
    times, mirror = _ccore.Times(reads[:2]), reads[:2]
    for value in reads[2:]:
        times.append(value)
        mirror.append(value)
    assert len(times) == len(mirror) == 42
    for i in (0, 1, 17, 41, -1, -2, -42):
        assert times[i] == mirror[i]
    for sl in (slice(0, 9), slice(3, 30, 2), slice(2, None, 2), slice(None, None, -3), slice(40, 99), slice(5, 5)):
        assert times[sl] == mirror[sl] and type(times[sl]) is list
    for t in (0, reads[0], reads[5] + 1, reads[-1], 2**63 - 1):
        assert bisect.bisect_right(times, t, 0, len(times)) == bisect.bisect_right(mirror, t, 0, len(mirror))
    assert list(times) == mirror
    with pytest.raises(IndexError):
        times[42]
    with pytest.raises(IndexError):
        times[-43]
    with pytest.raises(TypeError):
        times["0"]
    with pytest.raises(OverflowError):
        times.append(2**63)  # no read can be that large; it is refused, not wrapped
    assert len(times) == 42


def test_switching_cores_in_the_middle_of_an_epoch_loses_no_step():
    """A segment begun by one core goes on under the other (a list under the compiled core,
    Times under the Python one): every step arrives once, in order."""
    transport = MemoryTransport()
    starvewatch.init("switch", transport=transport)
    seen = 0
    for i, _ in enumerate(starvewatch.watch(range(3000), name="train")):
        if i % 500 == 250:
            core.use("python" if core.current() == "c" else "c")
        seen += 1
    summary = starvewatch.finish()
    assert seen == 3000 and summary["loaders"][0]["steps"] == 3000
    assert [r[2] for r in _rows(transport)] == list(range(3000))


def test_a_free_threaded_build_or_another_implementation_runs_the_python_core(monkeypatch):
    """The fast path relies on the GIL (the shipper slices what the training thread appends):
    without one, or off CPython, the compiled core is never loaded."""
    import sysconfig
    real = sysconfig.get_config_var
    monkeypatch.setattr(sysconfig, "get_config_var", lambda name: 1 if name == "Py_GIL_DISABLED" else real(name))
    assert core._load_c(loader.WatchedIterator) == (
        None, "a free-threaded build runs the Python core (the fast path relies on the GIL)")
    monkeypatch.undo()
    monkeypatch.setattr(sys.implementation, "name", "pypy")
    assert core._load_c(loader.WatchedIterator) == (None, "pypy runs the Python core")
    monkeypatch.undo()
    compiled, why = core._load_c(loader.WatchedIterator)
    assert compiled is not None and why == ""


# A loader whose settings give no batch size (a list of batches): each batch's leading dimension
# is read (hooks/introspect.py's leading_dim), on the fast path too. Runs of one size, a last
# short batch, sizes that alternate every batch, a batch with nothing batch-shaped in it.
PROBED_SIZES = [8] * 150 + [5] + [8] * 100 + [3, 4] * 10 + [8] * 120 + [None] + [8] * 60 + [2]


def _probed_batches():
    import torch
    batches = []
    for i, size in enumerate(PROBED_SIZES):
        if size is None:
            batches.append("no shape here")
        elif i % 3 == 0:
            batches.append((torch.zeros(size, 2), torch.zeros(size)))  # (x, y)
        elif i % 3 == 1:
            batches.append({"x": torch.zeros(size, 2)})
        else:
            batches.append(torch.zeros(size, 2))
    return batches


def _a_probed_training_with(core_name: str, monkeypatch) -> tuple[list[tuple], SharedClock, int]:
    batches = _probed_batches()
    with _one_clock(core_name, monkeypatch) as clock:
        transport = MemoryTransport()
        session = starvewatch.init("same-clock-probe", transport=transport)
        _shipper_cycles_by_hand(session)
        fast_steps = 0
        iterator = iter(starvewatch.watch(batches, name="train"))
        for i, _ in enumerate(iterator):
            fast_steps += type(iterator) is loader.FastWatchedIterator
            if i % 10 == 0:
                session.shipper.cycle()
        session.shipper.cycle()
        del iterator
        session.shipper = type(session.shipper)(session, session.shipper.pipeline)
        summary = starvewatch.finish()
    assert summary["loaders"][0]["steps"] == len(PROBED_SIZES)
    return _rows(transport), clock, fast_steps


def test_both_cores_read_each_batchs_size_on_the_fast_path_and_record_the_same_steps(monkeypatch):
    """The batch-size probe of a loader without a configured batch size runs per batch: on the
    fast path of both cores (not the general path every batch), with the same records."""
    rows_python, clock_python, fast_python = _a_probed_training_with("python", monkeypatch)
    rows_c, clock_c, fast_c = _a_probed_training_with("c", monkeypatch)
    assert [row[STEP_COLUMNS.index("batch_size")] for row in rows_python] == PROBED_SIZES
    assert rows_c == rows_python
    # runs of one size stay on the fast path (each change costs a step on the general path;
    # sizes that alternate every batch stay there)
    assert fast_c == fast_python and len(PROBED_SIZES) - 40 <= fast_c < len(PROBED_SIZES)
    assert clock_python.c_reads == 0
    assert clock_c.c_reads > 2 * (len(PROBED_SIZES) - 60) and clock_c.python_reads < 120
    assert clock_c.c_reads + clock_c.python_reads == clock_python.python_reads


def _a_cuda_training_with(core_name: str, monkeypatch, items=None) -> tuple[list[tuple], SharedClock, int]:
    """The CUDA-event countdown path (FastGpuWatchedIterator) on one clock: a stand-in GPU
    whose events are recorded on one step in 4 (seeded gaps: the same steps in both runs)."""
    from starvewatch.hooks import cuda
    from tests.test_measurement import FakeGpu
    gpu = FakeGpu()
    with _one_clock(core_name, monkeypatch) as clock:
        transport = MemoryTransport()
        session = starvewatch.init("same-clock-cuda", transport=transport)
        session._gpu_timer = cuda.CudaEventTimer(gpu.event, every=4, seed=7)
        fast_gpu_steps = 0
        iterator = iter(starvewatch.watch(list(range(300)) if items is None else items, name="train"))
        for i, _ in enumerate(iterator):
            fast_gpu_steps += type(iterator) is loader.FastGpuWatchedIterator
            gpu.launch(0.00001)
            if i % 50 == 25:
                with starvewatch.step():
                    pass
        del iterator
        summary = starvewatch.finish()
    assert summary["loaders"][0]["steps"] == (300 if items is None else len(items))
    return _rows(transport), clock, fast_gpu_steps


def test_both_cores_fed_the_same_clock_record_the_same_cuda_path_steps(monkeypatch):
    rows_python, clock_python, fast_python = _a_cuda_training_with("python", monkeypatch)
    rows_c, clock_c, fast_c = _a_cuda_training_with("c", monkeypatch)
    assert fast_python == fast_c and 150 < fast_c < 270  # ~3 steps in 4 between measured ones
    assert clock_python.c_reads == 0
    # the compiled CUDA path read the clock for the steps it ran (a countdown that runs out
    # goes to the general path, in Python, as in the Python core)
    assert clock_c.c_reads >= 250 and clock_c.python_reads <= clock_python.python_reads - 250
    assert clock_c.c_reads + clock_c.python_reads == clock_python.python_reads
    assert len(rows_python) == 300
    assert rows_c == rows_python


def test_both_cores_read_each_batchs_size_on_the_cuda_path_and_record_the_same_steps(monkeypatch):
    rows_python, clock_python, fast_python = _a_cuda_training_with("python", monkeypatch, _probed_batches())
    rows_c, clock_c, fast_c = _a_cuda_training_with("c", monkeypatch, _probed_batches())
    assert [row[STEP_COLUMNS.index("batch_size")] for row in rows_python] == PROBED_SIZES
    assert rows_c == rows_python
    assert fast_python == fast_c and len(PROBED_SIZES) // 2 < fast_c < len(PROBED_SIZES) * 9 // 10
    assert clock_c.c_reads >= len(PROBED_SIZES) // 2
    assert clock_c.c_reads + clock_c.python_reads == clock_python.python_reads


@pytest.mark.parametrize("hot_path_core", ["python", "c"], indirect=True)
def test_an_exception_on_the_cuda_path_reaches_the_loop_and_every_step_is_kept(hot_path_core):
    from starvewatch.hooks import cuda
    from tests.test_measurement import FakeGpu

    def flaky():
        for i in range(300):
            if i == 200:
                raise KeyError("bad sample")
            yield i

    gpu = FakeGpu()
    transport = MemoryTransport()
    session = starvewatch.init("flaky-cuda", transport=transport)
    session._gpu_timer = cuda.CudaEventTimer(gpu.event, every=4, seed=3)
    seen, classes = [], []
    iterator = iter(starvewatch.watch(flaky(), name="train"))
    with pytest.raises(KeyError, match="bad sample"):
        for x in iterator:
            classes.append(type(iterator))
            seen.append(x)
    assert seen == list(range(200))
    # the failing call ran on the CUDA fast path (seed 3: no measured step there)
    assert classes[-1] is loader.FastGpuWatchedIterator and session._gpu_timer._countdown > 1
    assert type(iterator) is loader.WatchedIterator and iterator.waiting_since() is None
    del iterator
    summary = starvewatch.finish()
    assert summary["loaders"][0]["steps"] == 200
    assert [r[2] for r in _rows(transport)] == list(range(200))


class _Shaped:
    def __init__(self, shape) -> None:
        self.shape = shape


class _ShapeRaises:
    @property
    def shape(self):
        raise ValueError("no shape today")


class _Pair(tuple):  # a namedtuple-like subclass
    pass


class _ListOfOther(list):
    def __getitem__(self, i):
        return _Shaped((5, 1))


class _DictOfOther(dict):
    def values(self):
        return [_Shaped((6,))]


def _odd_batches() -> list:
    """Batches that hooks/introspect.py's leading_dim reads in every way it can (or cannot)."""
    import numpy as np
    import torch
    return [
        _Shaped((3, 2)), _Shaped(()), _Shaped(5), _Shaped((2.9,)), _Shaped(("x",)), _Shaped(None),
        _ShapeRaises(), _Pair((torch.zeros(4, 1), 0)), _ListOfOther([1]), _DictOfOther(a=1), [], {}, (),
        "text", np.zeros((7, 3)), [[torch.zeros(9)]], [[[torch.zeros(9)]]], {"x": (torch.zeros(11, 2),)},
    ]


@pytest.mark.parametrize("hot_path_core", ["python", "c"], indirect=True)
def test_the_fast_paths_batch_size_probe_reads_every_odd_batch_as_leading_dim_does(hot_path_core):
    """Each odd batch comes on the fast path (after a run of batches of 8): the compiled probe
    must give what the Python function gives, for what it reads and for what it cannot."""
    import torch

    from starvewatch.hooks.introspect import leading_dim
    batches = [torch.zeros(8, 2)] * 4
    for odd in _odd_batches():
        batches += [odd] + [torch.zeros(8, 2)] * 4
    expected = [leading_dim(b) for b in batches]
    assert {3, 2, 4, 5, 6, 7, 9, 11, None} <= set(expected)  # the batches do try every branch
    transport = MemoryTransport()
    session = starvewatch.init("odd-batches", transport=transport)
    # The shipper cycles after every batch (not on its timer): the fast path is entered again
    # after a change as soon as the segment before was taken. (No sampler: its CPU probe would
    # send a batch to the general path.)
    _shipper_cycles_by_hand(session)
    iterator = iter(starvewatch.watch(batches, name="train"))
    odd_on_fast_path = 0
    for i, _ in enumerate(iterator):
        # the iterator's class at the batch before an odd one: the path that takes the odd one
        if i % 5 == 3 and i + 1 < len(batches):
            odd_on_fast_path += type(iterator) is loader.FastWatchedIterator
        session.shipper.cycle()
    del iterator
    session.shipper.cycle()  # the epoch's end
    session.shipper = type(session.shipper)(session, session.shipper.pipeline)  # fresh, not started
    starvewatch.finish()
    assert [row[STEP_COLUMNS.index("batch_size")] for row in _rows(transport)] == expected
    assert odd_on_fast_path == len(_odd_batches())
