"""The sidecar process samples the host, the workers and the GPUs for the training process."""
import os
import signal
import subprocess
import sys
import textwrap

import psutil

import starvewatch
from tests.conftest import wait_until


def _host_samples(session):
    return [e for s in session.samplers for k, e in s.history if k == "samples" and e["kind"] == "host"]


def _sidecar(session):
    return wait_until(lambda: session.samplers[0].link, what="the sidecar to start")


def test_the_sidecar_samples_the_training_process_not_itself(memory_run):
    session, transport = memory_run
    list(starvewatch.watch(range(3)))
    link = _sidecar(session)
    assert link.proc.pid != os.getpid() and psutil.Process(link.proc.pid).ppid() == os.getpid()
    wait_until(lambda: _host_samples(session), what="a host sample")
    before = _host_samples(session)[-1]["process_rss_bytes"]
    ballast = bytearray(300 * 2**20)  # touched: resident
    ballast[::4096] = b"x" * len(ballast[::4096])
    wait_until(lambda: _host_samples(session)[-1]["process_rss_bytes"] > before + 250 * 2**20,
               what="this process's RSS growth in the sidecar's samples")
    del ballast
    starvewatch.finish()
    assert link.proc.poll() is not None  # finish() let it exit and reaped it


def test_a_dead_sidecar_falls_back_to_sampling_in_process(memory_run):
    session, transport = memory_run
    list(starvewatch.watch(range(3)))
    link = _sidecar(session)
    wait_until(lambda: _host_samples(session), what="a first host sample")
    os.kill(link.proc.pid, signal.SIGKILL)
    wait_until(lambda: session.samplers[0].link is None, what="the sampler to notice")
    count = len(_host_samples(session))
    wait_until(lambda: len(_host_samples(session)) >= count + 2, what="host samples taken in-process")
    assert any("sidecar exited" in e for e in session.shipper.errors)
    summary = starvewatch.finish()
    assert summary["system"]["host_samples"] >= count + 2


def test_sidecar_off_samples_in_process(monkeypatch):
    monkeypatch.setenv("STARVEWATCH_SIDECAR", "0")
    from starvewatch.hooks.transport import MemoryTransport
    session = starvewatch.init("no-sidecar", transport=MemoryTransport())
    children = psutil.Process().children()
    list(starvewatch.watch(range(3)))
    wait_until(lambda: _host_samples(session), what="a host sample")
    assert session.samplers[0].link is None
    assert psutil.Process().children() == children


def test_the_sidecar_exits_when_the_training_process_is_killed(tmp_path):
    script = textwrap.dedent("""
        import sys, time, starvewatch
        from starvewatch.hooks.session import current_session
        for _ in starvewatch.watch(range(3)):
            pass
        session = current_session()
        while session.samplers[0].link is None:
            time.sleep(0.01)
        print(session.samplers[0].link.proc.pid, flush=True)
        time.sleep(60)
    """)
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as proc:
        try:
            sidecar = psutil.Process(int(proc.stdout.readline()))
            proc.kill()
            proc.wait(10)
            sidecar.wait(10)  # raises psutil.TimeoutExpired if it outlives its training process
            assert not sidecar.is_running()
        finally:
            proc.kill()
