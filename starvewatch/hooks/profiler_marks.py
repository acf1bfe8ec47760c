"""The PyTorch profiler sees data loading of loaders that are not DataLoaders.

torch records a DataLoader's `next()` as `enumerate(DataLoader)#<iterator class>.__next__`;
a wrapped iterable (a list, a generator, a WebLoader, a torchdata pipeline) is an unnamed gap in
the trace. While a torch.profiler session records (between Kineto's start_trace and
stop_trace), the epochs of watched iterables take their batches through `Profiled`, which
wraps each `next()` in a `record_function` named `enumerate(<loader's class>)#<name>.__next__`
(the name as watched). The switch happens when the profiler starts and stops: the epoch
iterator's inner iterator is swapped, so no batch checks whether a profiler runs, and without a
profiler nothing changes. Holistic Trace Analysis finds both kinds by the regex
`ANNOTATION_REGEX`.
"""
from __future__ import annotations

import threading
import weakref

ANNOTATION_REGEX = r"^enumerate\(.+\)#.+\.__next__$"

_LOCK = threading.Lock()
_recording = 0  # torch.profiler sessions recording now
_epochs: "weakref.WeakSet" = weakref.WeakSet()  # watched iterables' epoch iterators
_installed = False


def event_name(obj, name: str) -> str:
    return f"enumerate({type(obj).__name__})#{name}.__next__"


class Profiled:
    """An inner iterator whose next() is a profiler event."""

    __slots__ = ("inner", "name", "record_function")

    def __init__(self, inner, name: str) -> None:
        from torch.autograd.profiler import record_function
        self.inner, self.name, self.record_function = inner, name, record_function

    def __iter__(self):
        return self

    def __next__(self):
        with self.record_function(self.name):
            return next(self.inner)


def track(epoch, obj, name: str) -> None:
    """A new epoch of a watched iterable (once per epoch): profiled now if a profiler
    records, and found by the next start otherwise."""
    if not _installed:
        _install()
    epoch._sw_profile_name = event_name(obj, name)
    with _LOCK:
        _epochs.add(epoch)
        if _recording:
            _wrap(epoch)


def _wrap(epoch) -> None:
    inner = epoch._it
    if inner is not None and type(inner) is not Profiled:
        try:
            epoch._it = Profiled(inner, epoch._sw_profile_name)
        except ImportError:  # no torch: no profiler either
            pass


def _unwrap(epoch) -> None:
    inner = epoch._it
    if type(inner) is Profiled:
        epoch._it = inner.inner


def started() -> None:
    global _recording
    with _LOCK:
        _recording += 1
        if _recording == 1:
            for epoch in list(_epochs):
                _wrap(epoch)


def stopped() -> None:
    global _recording
    with _LOCK:
        _recording = max(0, _recording - 1)
        if not _recording:
            for epoch in list(_epochs):
                _unwrap(epoch)


def _install() -> None:
    """Hook torch.profiler's trace start and stop, once, if torch is already imported (the
    hooks never import torch themselves)."""
    global _installed
    import sys
    if "torch" not in sys.modules:
        return
    with _LOCK:
        if _installed:
            return
        _installed = True
    try:
        from torch.autograd import _profiler_enabled
        from torch.profiler.profiler import _KinetoProfile
    except Exception:  # another torch layout: the profiler sees no marks of ours
        return
    global _recording
    if _profiler_enabled():  # a session began before the first watched epoch: its stop counts
        _recording += 1
    start, stop = _KinetoProfile.start_trace, _KinetoProfile.stop_trace

    def start_trace(self, *args, **kwargs):
        result = start(self, *args, **kwargs)
        started()
        return result

    def stop_trace(self, *args, **kwargs):
        stopped()
        return stop(self, *args, **kwargs)

    _KinetoProfile.start_trace, _KinetoProfile.stop_trace = start_trace, stop_trace
