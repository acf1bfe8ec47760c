"""Issue 24, item 7: the CPUs this process may use (starvewatch/cpus.py). cgroup v1 for real (a
child cgroup with a CPU quota, a child process moved into it, removed after), cgroup v2 from a
fixture directory tree (this machine's v2 hierarchy has no cpu controller), affinity for real;
and the diagnosis reads usable cores and, inside a quota, the cgroup's counters."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from starvewatch.cpus import CgroupCpuMeter, cpu_limit, usable_cores
from tests.conftest import wait_until
from tests.test_diagnosis import loader, run, system


def _v1_mount(controller: str) -> Path:
    """Where cgroup v1 mounts `controller` on this machine (read from mountinfo)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        tail = right.split()
        if tail and tail[0] == "cgroup" and controller in tail[2].split(","):
            return Path(left.split()[4])
    raise AssertionError(f"no cgroup v1 {controller} controller mounted here: {Path('/proc/self/mountinfo').read_text()}")


CHILD = textwrap.dedent("""
    import json, sys, time
    from starvewatch.cpus import CgroupCpuMeter, cpu_limit
    sys.stdin.readline()  # moved into the cgroup by now
    limit = cpu_limit()
    stat = limit.usage_files["v1_stat"]
    meter = CgroupCpuMeter(limit)
    def throttled():
        return int(open(stat).read().split("nr_throttled ")[1].split()[0])
    before = throttled()  # starting Python under a tenth of a CPU may have been throttled already
    deadline = time.monotonic() + 60
    # Spin (more than the quota allows) until the kernel has throttled the cgroup again.
    while time.monotonic() < deadline and throttled() == before:
        sum(range(10000))
    print(json.dumps({"limit": limit.as_metadata(), "version": limit.cgroup_version,
                      "quota_dir": limit.quota_dir, "usage": meter.sample()}))
""")


def test_a_v1_cpu_quota_on_an_ancestor_cgroup_limits_a_child_process():
    cpu, cpuacct = _v1_mount("cpu"), _v1_mount("cpuacct")
    name = f"starvewatch-test-{os.getpid()}"
    outer, inner, acct = cpu / name, cpu / name / "inner", cpuacct / name
    made = []
    child = None
    try:
        for directory in (outer, inner, acct):
            directory.mkdir()
            made.append(directory)
        (outer / "cpu.cfs_period_us").write_text("100000")
        # A tenth of a CPU, on the parent of the child's cgroup: small enough that a spinning
        # child is throttled even on a busy machine.
        (outer / "cpu.cfs_quota_us").write_text("10000")
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        (inner / "cgroup.procs").write_text(str(child.pid))
        (acct / "cgroup.procs").write_text(str(child.pid))
        assert f"{name}/inner" in Path(f"/proc/{child.pid}/cgroup").read_text()
        # Read from outside, as the sidecar reads the training process:
        seen = cpu_limit(child.pid)
        assert seen.quota_cores == 0.1 and seen.usable_cores == 1 and seen.cgroup_version == 1
        out, err = child.communicate("go\n", timeout=60)
        assert child.returncode == 0, err[-2000:]
        got = json.loads(out)
        assert got["limit"]["usable_cores"] == 1 and got["limit"]["cpu_quota_cores"] == 0.1
        assert got["limit"]["host_cores"] == os.cpu_count() and got["version"] == 1
        assert got["quota_dir"] == str(outer)
        assert got["usage"]["cgroup_throttled_pct"] > 0, got  # throttled in some of its periods
        assert 0 < got["usage"]["cgroup_cpu_pct"] <= 150, got  # of the tenth of a CPU it may use
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(10)
        for directory in reversed(made):
            wait_until(lambda d=directory: not (d / "cgroup.procs").read_text().strip(), timeout_s=10,
                       what=f"{directory} empty")
            directory.rmdir()
    assert not outer.exists() and not acct.exists()
    assert usable_cores() == len(os.sched_getaffinity(0))  # this process: no quota here


def _v2_tree(root: Path, mount_root: str = "/", cgroup: str = "/kubepods/pod1/ctr",
             quotas: dict | None = None) -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(
        "22 1 8:1 / / rw,relatime - ext4 /dev/vda rw\n"
        f"35 22 0:30 {mount_root} /sys/fs/cgroup rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n")
    (root / "proc/self/cgroup").write_text(f"0::{cgroup}\n")
    base = root / "sys/fs/cgroup"
    (base / cgroup.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for relative, value in (quotas or {}).items():
        directory = base / relative
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.max").write_text(value + "\n")
    return base


def test_v2_the_tightest_quota_of_the_chain_rounded_up(tmp_path):
    base = _v2_tree(tmp_path, quotas={"": "max 100000", "kubepods": "max 100000",
                                      "kubepods/pod1": "250000 100000", "kubepods/pod1/ctr": "max 100000"})
    limit = cpu_limit(root=str(tmp_path), affinity_cores=8)
    assert (limit.quota_cores, limit.usable_cores, limit.cgroup_version) == (2.5, 3, 2)
    assert limit.quota_dir == str(base / "kubepods/pod1")
    assert cpu_limit(root=str(tmp_path), affinity_cores=2).usable_cores == 2  # affinity is tighter
    # A deeper, tighter quota wins; quota under one CPU is still one usable core.
    (base / "kubepods/pod1/ctr/cpu.max").write_text("20000 100000\n")
    assert cpu_limit(root=str(tmp_path), affinity_cores=8).usable_cores == 1


def test_v2_inside_a_cgroup_namespace_and_with_no_quota(tmp_path):
    # A container sees its own cgroup as the mount's root and "/" as its path.
    _v2_tree(tmp_path / "ns", mount_root="/kubepods/pod1/ctr", cgroup="/", quotas={"": "300000 100000"})
    assert cpu_limit(root=str(tmp_path / "ns"), affinity_cores=64).usable_cores == 3
    _v2_tree(tmp_path / "free", quotas={"kubepods/pod1/ctr": "max 100000"})
    free = cpu_limit(root=str(tmp_path / "free"), affinity_cores=6)
    assert (free.quota_cores, free.usable_cores) == (None, 6)
    # Unreadable or odd files: the affinity alone, never an exception.
    _v2_tree(tmp_path / "odd", quotas={"kubepods/pod1/ctr": "lots 0"})
    assert cpu_limit(root=str(tmp_path / "odd"), affinity_cores=4).usable_cores == 4
    assert cpu_limit(root=str(tmp_path / "nothing"), affinity_cores=4).usable_cores == 4


def test_v2_saturation_is_read_from_the_cgroups_counters(tmp_path):
    base = _v2_tree(tmp_path, quotas={"kubepods/pod1": "200000 100000"})
    stat = base / "kubepods/pod1/cpu.stat"
    stat.write_text("usage_usec 1000000\nnr_periods 100\nnr_throttled 10\nthrottled_usec 5\n")
    now = [10.0]
    meter = CgroupCpuMeter(cpu_limit(root=str(tmp_path), affinity_cores=8), clock=lambda: now[0])
    # 0.5 s later: 0.95 s of CPU used (95% of 2 CPUs x 0.5 s), throttled in 30 of 50 periods.
    stat.write_text("usage_usec 1950000\nnr_periods 150\nnr_throttled 40\nthrottled_usec 9\n")
    now[0] = 10.5
    got = meter.sample()
    assert got["cgroup_cpu_pct"] == pytest.approx(95.0) and got["cgroup_throttled_pct"] == pytest.approx(60.0)


CHILD_AFFINITY = textwrap.dedent("""
    import os, sys
    from starvewatch.cpus import cpu_limit
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(cpu_limit().usable_cores, flush=True)
    sys.stdin.readline()
""")


def test_affinity_limits_the_usable_cores_read_in_and_outside_the_process():
    child = subprocess.Popen([sys.executable, "-c", CHILD_AFFINITY], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "1"
        outside = cpu_limit(child.pid)
        assert (outside.affinity_cores, outside.usable_cores, outside.host_cores) == (1, 1, os.cpu_count())
    finally:
        child.communicate("done\n", timeout=30)


def test_the_diagnosis_uses_usable_cores_and_the_quotas_counters():
    """A 128-core host nearly idle (3% busy) around a 2-CPU quota used to the full: the workers
    are capped by the 2 usable cores, because the cgroup (not the host) is saturated."""
    def advice(**extra):
        summary = run(loader(wait_ms=20, compute_ms=10, workers=0),
                      system_info=system(cpu_count=128, cpu_pct_mean=3.0, **extra))
        [rec] = [r for r in summary["recommendations"] if r["parameter"] == "num_workers"]
        return rec
    boxed = advice(usable_cores=2, cgroup_cpu_pct_mean=98.0, cgroup_throttled_pct_mean=5.0)
    assert (boxed["suggested"], boxed["evidence"]["cores"]) == (2, 2), boxed
    assert "capped at 2 by 2 usable cores" in boxed["reason"]
    throttled = advice(usable_cores=2, cgroup_cpu_pct_mean=60.0, cgroup_throttled_pct_mean=80.0)
    assert throttled["suggested"] == 2 and "capped" in throttled["reason"]
    idle_quota = advice(usable_cores=2, cgroup_cpu_pct_mean=10.0, cgroup_throttled_pct_mean=0.0)
    assert idle_quota["suggested"] == 3 and "capped" not in idle_quota["reason"]
    host = advice()  # older hooks: the host's count
    assert host["evidence"]["cores"] == 128 and host["suggested"] == 3
