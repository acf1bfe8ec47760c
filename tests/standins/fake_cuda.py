"""A torch.cuda.Event stand-in with the host-side cost profile of the real one, for measuring
what CUDA events cost the training thread on a machine without a GPU.

`torch.cuda.Event.record()` (torch 2.x, torch/cuda/streams.py) with no stream does, in Python:
`torch.cuda.current_stream()` -> `_lazy_init()`, `_get_device_index(None, optional=True)` (a few
isinstance checks, `torch.jit.is_scripting()`), a `Stream.__new__(stream_id=, device_index=,
device_type=)` -> then the C++ `record(stream)`, which calls the driver (cudaEventRecord).
`StandInEvent` runs Python code of the same shape, and spends `driver_ns` (busy, like a driver
call) where the driver would be called; `query()` and `elapsed_time()` (called on the shipper
thread, not the training thread) likewise. `calls` counts the driver calls, so a benchmark
reports the Python-level time measured and the driver calls counted, separately."""
from __future__ import annotations

import time


class _Stream:
    def __new__(cls, device=None, priority=0, **kwargs):
        if device is None or ("stream_id" in kwargs and "device_index" in kwargs):
            obj = super().__new__(cls)
            obj.__dict__.update(kwargs, priority=priority)
            return obj
        raise RuntimeError("stand-in streams are built from their ids")


class _Device:  # torch.cuda.device: only its type is checked on this path
    pass


class StandInCuda:
    """One stand-in 'GPU': its events, their driver-call count and cost."""

    def __init__(self, driver_ns: int = 0) -> None:
        self.driver_ns = driver_ns
        self.calls = {"record": 0, "query": 0, "elapsed_time": 0}
        self._initialized = True

    def _driver(self, name: str) -> None:
        self.calls[name] += 1
        if self.driver_ns:
            end = time.perf_counter_ns() + self.driver_ns
            while time.perf_counter_ns() < end:
                pass

    # torch.cuda's Python-level helpers, same shape
    def _lazy_init(self) -> None:
        if self._initialized:
            return

    def _get_device_index(self, device, optional=False, allow_cpu=False) -> int:
        if isinstance(device, int):
            return device
        if isinstance(device, str):
            raise TypeError("stand-in: no device strings")
        if isinstance(device, _Device):
            return 0
        if not _is_scripting():
            if isinstance(device, _Device):
                return 0
        return 0 if optional else -1

    def current_stream(self, device=None):
        self._lazy_init()
        streamdata = (0, self._get_device_index(device, optional=True), 1)
        return _Stream(stream_id=streamdata[0], device_index=streamdata[1], device_type=streamdata[2])

    def event(self) -> "StandInEvent":
        return StandInEvent(self)


def _is_scripting() -> bool:
    return False


class StandInEvent:
    __slots__ = ("cuda", "at")

    def __init__(self, cuda: StandInCuda) -> None:
        self.cuda = cuda
        self.at = None

    def record(self, stream=None) -> None:
        if stream is None:
            stream = self.cuda.current_stream()
        self.cuda._driver("record")
        self.at = time.perf_counter_ns()  # an idle GPU: the event completes at once

    def query(self) -> bool:
        self.cuda._driver("query")
        return self.at is not None

    def elapsed_time(self, end: "StandInEvent") -> float:
        self.cuda._driver("elapsed_time")
        return (end.at - self.at) / 1e6
