"""The CPUs a process may use (stdlib only; a leaf shared by the hooks, the tuner and the
collector's diagnosis).

`os.cpu_count()` is the host's cores: inside an 8-CPU container on a 128-core host it says 128.
What a process can really run on is the smallest of
- its affinity set (`taskset`, SLURM's cpusets, `docker --cpuset-cpus`), and
- `ceil(quota / period)` of every CPU quota on its cgroup and the cgroup's ancestors
  (Kubernetes limits, `docker --cpus`): cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`,
  cgroup v2 `cpu.max` ("max 100000" or "200000 100000"),
and at least 1. Where such a quota applies, whether the CPUs are saturated is read from the
cgroup's own counters (`CgroupCpuMeter`: v1 `cpuacct.usage` and `cpu.stat`, v2 `cpu.stat`),
not from host-wide percentages, which an idle host keeps low while the container is throttled.

Every function takes `root` (a directory that stands for `/`), so a fixture tree can play a
cgroup v2 host; `pid` names the process ("self" by default).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field


@dataclass
class CpuLimit:
    host_cores: int                       # os.cpu_count(): the machine's
    affinity_cores: int | None            # len(sched_getaffinity(pid)); None where unknown
    quota_cores: float | None             # the tightest quota / period of the cgroup chain
    usable_cores: int                     # min(affinity, ceil(quota)), at least 1
    cgroup_version: int | None = None     # 1 or 2 where a quota was found
    quota_dir: str | None = None          # the cgroup directory whose quota is the tightest
    usage_files: dict = field(default_factory=dict)  # the counters CgroupCpuMeter reads

    def as_metadata(self) -> dict:
        return {"host_cores": self.host_cores, "usable_cores": self.usable_cores,
                "cpu_quota_cores": self.quota_cores, "cpu_affinity_cores": self.affinity_cores}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


def _mounts(root: str) -> list[tuple[str, str, str, set[str]]]:
    """(mount point, mount root, fstype, controllers) of every cgroup mount, from mountinfo."""
    text = _read(_under(root, "/proc/self/mountinfo")) or ""
    out = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        options = set(tail[2].split(","))
        mount_point = fields[4].replace("\\040", " ")
        out.append((_under(root, mount_point), fields[3], tail[0], options))
    return out


def _memberships(root: str, pid: str) -> list[tuple[str, set[str], str]]:
    """(hierarchy id, controllers, cgroup path) from /proc/<pid>/cgroup."""
    text = _read(_under(root, f"/proc/{pid}/cgroup")) or ""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[0], set(filter(None, parts[1].split(","))), parts[2]))
    return out


def _cgroup_dir(mount_point: str, mount_root: str, path: str) -> str | None:
    """The directory of cgroup `path` in a mount whose root is `mount_root` (a container sees
    its own cgroup as the root of the mount: its path then starts with the mount's root)."""
    if mount_root not in ("", "/"):
        if path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
            path = path[len(mount_root.rstrip("/")):]
        elif path.startswith("/.."):  # a cgroup namespace: paths relative to its own root
            return mount_point
    directory = os.path.join(mount_point, path.lstrip("/"))
    return directory if os.path.isdir(directory) else (mount_point if os.path.isdir(mount_point) else None)


def _chain(directory: str, mount_point: str):
    """The cgroup directory, then each ancestor up to the mount point."""
    directory, top = os.path.normpath(directory), os.path.normpath(mount_point)
    while True:
        yield directory
        if directory == top or len(directory) <= len(top):
            return
        directory = os.path.dirname(directory)


def _v1_quota(directory: str) -> float | None:
    quota, period = _read(os.path.join(directory, "cpu.cfs_quota_us")), _read(os.path.join(directory, "cpu.cfs_period_us"))
    try:
        quota_us, period_us = int(quota), int(period)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def _v2_quota(directory: str) -> float | None:
    parts = (_read(os.path.join(directory, "cpu.max")) or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota_us, period_us = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def _affinity(pid: str) -> int | None:
    try:
        return len(os.sched_getaffinity(0 if pid == "self" else int(pid))) or None
    except (AttributeError, OSError, ValueError):
        return None


def cpu_limit(pid: int | str = "self", root: str = "/", affinity_cores: int | None = None) -> CpuLimit:
    """What process `pid` may use: affinity, the tightest cgroup quota of its chain, and the
    files that count its CPU time. Never raises: unreadable parts are left out."""
    pid = str(pid)
    host = os.cpu_count() or 1
    affinity = affinity_cores if affinity_cores is not None else _affinity(pid)
    best: tuple[float, int, str, dict] | None = None
    try:
        mounts, memberships = _mounts(root), _memberships(root, pid)
        for hierarchy, controllers, path in memberships:
            if hierarchy == "0" and not controllers:  # cgroup v2: the unified hierarchy
                for d in _hierarchy_dirs(mounts, path, "cgroup2"):
                    quota = _v2_quota(d)
                    if quota is not None and (best is None or quota < best[0]):
                        best = (quota, 2, d, {"v2_stat": os.path.join(d, "cpu.stat")})
            elif "cpu" in controllers:
                for d in _hierarchy_dirs(mounts, path, "cgroup", "cpu"):
                    quota = _v1_quota(d)
                    if quota is not None and (best is None or quota < best[0]):
                        # The quota's own cgroup counts what it throttles; its usage is
                        # cpuacct's, in the same directory when both are mounted together.
                        usage = os.path.join(d, "cpuacct.usage")
                        best = (quota, 1, d, {"v1_stat": os.path.join(d, "cpu.stat"), "v1_usage": usage
                                              if os.path.exists(usage) else _v1_usage_file(mounts, memberships)})
    except Exception:  # an odd /proc or cgroupfs: the affinity alone
        best = None
    usable = affinity or host
    if best is not None:
        usable = min(usable, math.ceil(best[0] - 1e-9))
    return CpuLimit(host_cores=host, affinity_cores=affinity, quota_cores=best[0] if best else None,
                    usable_cores=max(1, usable), cgroup_version=best[1] if best else None,
                    quota_dir=best[2] if best else None, usage_files=best[3] if best else {})


def _hierarchy_dirs(mounts, path: str, fstype: str, controller: str | None = None):
    """The process's cgroup directory and its ancestors up to the mount point, in every mount of
    `fstype` (for v1, only the mounts holding `controller`): where a quota may be set."""
    for point, mount_root, mount_fstype, options in mounts:
        if mount_fstype != fstype or (controller is not None and controller not in options):
            continue
        directory = _cgroup_dir(point, mount_root, path)
        if directory is not None:
            yield from _chain(directory, point)


def _v1_usage_file(mounts, memberships) -> str | None:
    """cpuacct.usage of the process's cpuacct cgroup (cpu and cpuacct may be mounted apart)."""
    for _, controllers, path in memberships:
        if "cpuacct" in controllers:
            for point, mount_root, fstype, options in mounts:
                if fstype == "cgroup" and "cpuacct" in options:
                    directory = _cgroup_dir(point, mount_root, path)
                    if directory is not None:
                        return os.path.join(directory, "cpuacct.usage")
    return None


def usable_cores(pid: int | str = "self", root: str = "/") -> int:
    """The one answer to "how many CPUs may this process use" (at least 1)."""
    return cpu_limit(pid, root).usable_cores


def _stat(path: str | None) -> dict[str, int]:
    out = {}
    for line in (_read(path) or "").splitlines() if path else ():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            pass
    return out


class CgroupCpuMeter:
    """The cgroup's CPU use against its quota, between two calls: how much of the quota it
    used (100 = all of it) and in what share of the scheduler's periods it was throttled."""

    def __init__(self, limit: CpuLimit, clock=time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._last = self._read()

    def _read(self) -> tuple[float, int | None, int | None, int | None]:
        files = self.limit.usage_files
        usage_ns = periods = throttled = None
        if self.limit.cgroup_version == 2:
            stat = _stat(files.get("v2_stat"))
            usage_ns = stat["usage_usec"] * 1000 if "usage_usec" in stat else None
            periods, throttled = stat.get("nr_periods"), stat.get("nr_throttled")
        elif self.limit.cgroup_version == 1:
            raw = _read(files.get("v1_usage") or "") if files.get("v1_usage") else None
            try:
                usage_ns = int(raw) if raw is not None else None
            except ValueError:
                usage_ns = None
            stat = _stat(files.get("v1_stat"))
            periods, throttled = stat.get("nr_periods"), stat.get("nr_throttled")
        return self._clock(), usage_ns, periods, throttled

    def sample(self) -> dict:
        """{"cgroup_cpu_pct": ..., "cgroup_throttled_pct": ...} since the last call; a value
        is None when its counter is missing or no time (or no period) passed."""
        now = self._read()
        (t0, u0, p0, th0), (t1, u1, p1, th1) = self._last, now
        self._last = now
        quota = self.limit.quota_cores
        out = {"cgroup_cpu_pct": None, "cgroup_throttled_pct": None}
        if quota and u0 is not None and u1 is not None and t1 > t0:
            out["cgroup_cpu_pct"] = 100.0 * max(0, u1 - u0) / 1e9 / (t1 - t0) / quota
        if p0 is not None and p1 is not None and th0 is not None and th1 is not None and p1 > p0:
            out["cgroup_throttled_pct"] = 100.0 * max(0, th1 - th0) / (p1 - p0)
        return out
