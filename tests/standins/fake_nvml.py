"""An NVML stand-in: nvidia-ml-py's own functions patched with what an 80 GB GPU reports, in
NVML's units. Used in the test process (monkeypatch) and in the sidecar process (through
sitecustomize.py, since a patch in one process does not reach another)."""
import types

import pynvml

POWER_MW = 312_456


def patches(pid: int, calls: dict) -> dict:
    handle = object()

    def power(h):
        calls["power"] = calls.get("power", 0) + 1
        return POWER_MW

    return {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: handle,
        "nvmlDeviceGetName": lambda h: "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=37, memory=12),
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(total=85_899_345_920, used=21_474_836_480,
                                                                   free=64_424_509_440),
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetClockInfo": lambda h, kind: 1980 if kind == pynvml.NVML_CLOCK_SM else 2619,
        "nvmlDeviceGetTemperature": lambda h, sensor: 54,
        "nvmlDeviceGetPcieThroughput": lambda h, counter: 1_500_000 if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES else 20_000,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=4_294_967_296),
            types.SimpleNamespace(pid=1, usedGpuMemory=None)],
    }
