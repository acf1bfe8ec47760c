"""A process's resident memory as the kernel counts it (/proc/<pid>/status), for the benchmarks and
the tests that bound memory. VmHWM is the process's own peak: a spike between two readings counts
too, and unlike getrusage's ru_maxrss it does not start from the peak of the parent that forked it."""
from __future__ import annotations


def status_kib(pid: int | str = "self") -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak), in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    if "VmHWM" not in out:
        raise RuntimeError(f"no VmHWM in /proc/{pid}/status")
    return out


def peak_rss_bytes(pid: int | str = "self") -> int:
    return status_kib(pid)["VmHWM"] * 1024
