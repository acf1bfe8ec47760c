"""The one module that talks to NVML (nvidia-ml-py, import name `pynvml`).

Initialised lazily, on the sampler thread. Every query returns None on failure instead of
raising: no driver, no GPU, or a field this GPU does not support gives null fields and one log
line per kind of failure, never an exception into the training process.
"""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("starvewatch.nvml")

_lock = threading.Lock()
_state = {"initialized": False, "failed": False, "handles": None}
_logged: set[str] = set()


def _log_once(key: str, message: str, level: int = logging.WARNING) -> None:
    if key not in _logged:
        _logged.add(key)
        log.log(level, message)


def _nvml():
    try:
        import pynvml
    except ImportError:
        _log_once("import", "starvewatch: nvidia-ml-py is not installed; GPU samples are off "
                            "(pip install 'starvewatch[gpu]')", logging.INFO)
        return None
    return pynvml


def init() -> bool:
    with _lock:
        if _state["initialized"]:
            return True
        if _state["failed"]:
            return False
        pynvml = _nvml()
        if pynvml is None:
            _state["failed"] = True
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            _state["failed"] = True
            # No driver or no library is a CPU machine, not a problem worth a warning.
            absent = isinstance(exc, (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded))
            _log_once("init", f"starvewatch: NVML unavailable ({exc}); GPU samples are off",
                      logging.INFO if absent else logging.WARNING)
            return False
        _state["initialized"] = True
        return True


def shutdown() -> None:
    with _lock:
        if _state["initialized"]:
            pynvml = _nvml()
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
        _state.update(initialized=False, failed=False, handles=None)


def _call(name: str, fn, *args):
    import pynvml
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        _log_once(name, f"starvewatch: NVML {name} failed ({exc}); that field is null")
        return None


def _visible_indices(count: int) -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return list(range(count))
    out = []
    for part in visible.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < count:
            out.append(int(part))
    return out or list(range(count))  # UUIDs or MIG names: fall back to every device


def devices(pid: int | None = None) -> list:
    """(index, handle) of the GPUs process `pid` (default: this one) uses, else the visible ones."""
    if not init():
        return []
    import pynvml
    if _state["handles"] is None:
        count = _call("device count", pynvml.nvmlDeviceGetCount) or 0
        handles = [(i, _call("handle", pynvml.nvmlDeviceGetHandleByIndex, i)) for i in range(count)]
        handles = [(i, h) for i, h in handles if h is not None]
        pid = pid or os.getpid()
        mine = [(i, h) for i, h in handles
                if any(p.pid == pid for p in (_call("processes", pynvml.nvmlDeviceGetComputeRunningProcesses, h) or []))]
        if mine:
            _state["handles"] = mine  # settled: this process has a context on these
        else:
            visible = set(_visible_indices(count))
            return [(i, h) for i, h in handles if i in visible]
    return _state["handles"]


def sample(pid: int | None = None) -> list[dict]:
    """One reading per device, in the units the names say; `process_mem_bytes` is process
    `pid`'s (default: this one; the sidecar passes the training process)."""
    import pynvml
    out = []
    pid = pid or os.getpid()
    for index, handle in devices(pid):
        util = _call("utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)
        mem = _call("memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
        power_mw = _call("power", pynvml.nvmlDeviceGetPowerUsage, handle)
        rx_kb = _call("pcie rx", pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        tx_kb = _call("pcie tx", pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        procs = _call("processes", pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        own = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
        name = _call("name", pynvml.nvmlDeviceGetName, handle)
        out.append({
            "index": index,
            "name": name.decode() if isinstance(name, bytes) else name,
            "gpu_util_pct": util.gpu if util is not None else None,
            "mem_util_pct": util.memory if util is not None else None,
            "mem_used_bytes": mem.used if mem is not None else None,
            "mem_total_bytes": mem.total if mem is not None else None,
            "power_w": power_mw / 1000 if power_mw is not None else None,
            "sm_clock_mhz": _call("sm clock", pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
            "temperature_c": _call("temperature", pynvml.nvmlDeviceGetTemperature, handle,
                                   pynvml.NVML_TEMPERATURE_GPU),
            "pcie_rx_bytes_per_s": rx_kb * 1024 if rx_kb is not None else None,
            "pcie_tx_bytes_per_s": tx_kb * 1024 if tx_kb is not None else None,
            "process_mem_bytes": sum(own) if own else None,
        })
    return out
