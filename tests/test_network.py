"""Several machines: ranks on another host ship to one collector over the network, with the token.

Two network namespaces joined by a veth pair stand in for two machines: the collector binds its
namespace's address with a token; a two-rank torchrun job runs in the other namespace. The test
creates the namespaces, sends traffic only to the addresses it created (and loopback inside the
namespaces), stops every process by PID and removes the namespaces.
"""
import os
import random
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.store import Store

from .conftest import free_port, wait_until

PROGRAM = Path(__file__).parent / "programs" / "ddp_train.py"


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Namespaces `collector` and `trainer` with 10.R.S.1 and 10.R.S.2 on a veth pair."""
    if os.geteuid() != 0:
        raise AssertionError("this test creates network namespaces: run it as root (CI does)")
    tag = f"sw{os.getpid() % 10000}{secrets.token_hex(2)}"
    a, b = f"{tag}a", f"{tag}b"
    subnet = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
    created = []
    try:
        for ns in (a, b):
            ip("netns", "add", ns)
            created.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", f"{tag}va", "netns", a, "type", "veth", "peer", "name", f"{tag}vb", "netns", b)
        ip("-n", a, "addr", "add", f"{subnet}.1/30", "dev", f"{tag}va")
        ip("-n", b, "addr", "add", f"{subnet}.2/30", "dev", f"{tag}vb")
        ip("-n", a, "link", "set", f"{tag}va", "up")
        ip("-n", b, "link", "set", f"{tag}vb", "up")
        yield {"collector_ns": a, "trainer_ns": b, "collector_addr": f"{subnet}.1"}
    finally:
        for ns in created:  # deleting a namespace removes its end of the veth pair, and the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not any(ns in left for ns in created), left


def test_ranks_on_another_host_ship_to_one_collector_with_the_token(two_hosts, tmp_path):
    token = secrets.token_urlsafe(16)
    port = free_port()
    addr = two_hosts["collector_addr"]
    url = f"http://{addr}:{port}"
    collector_dir, trainer_dir = tmp_path / "collector", tmp_path / "trainer"  # no shared spool
    collector_dir.mkdir()
    env = {**os.environ, "STARVEWATCH_TOKEN": token}
    log = open(tmp_path / "collector.log", "wb")
    # `ip netns exec` execs the command: this PID is the collector's.
    proc = subprocess.Popen(["ip", "netns", "exec", two_hosts["collector_ns"], sys.executable, "-m", "starvewatch",
                             "serve", "--host", addr, "--port", str(port), "--dir", str(collector_dir)],
                            env=env, stdout=log, stderr=log)
    store = None
    try:
        def probe(with_token: bool) -> str:
            # An HTTP request from the trainer's namespace (the other "machine").
            header = f"{{'Authorization': 'Bearer {token}'}}" if with_token else "{}"
            code = ("import urllib.request, urllib.error\n"
                    f"req = urllib.request.Request('{url}/healthz', headers={header})\n"
                    "try:\n    print(urllib.request.urlopen(req, timeout=5).status)\n"
                    "except urllib.error.HTTPError as e:\n    print(e.code)\n"
                    "except OSError as e:\n    print('down')\n")
            out = subprocess.run(["ip", "netns", "exec", two_hosts["trainer_ns"], sys.executable, "-c", code],
                                 capture_output=True, text=True, timeout=30)
            return out.stdout.strip()

        assert proc.poll() is None
        wait_until(lambda: proc.poll() is not None or probe(True) == "200", timeout_s=30, what="the collector")
        assert proc.poll() is None, (tmp_path / "collector.log").read_text()
        assert probe(False) == "401"  # beyond loopback, every route needs the token

        train_env = {**os.environ, "STARVEWATCH_URL": url, "STARVEWATCH_TOKEN": token,
                     "STARVEWATCH_DIR": str(trainer_dir), "STARVEWATCH_RUN_NAME": "two-hosts",
                     "SW_SLOW": "load", "SW_STEPS": "40", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        done = subprocess.run(["ip", "netns", "exec", two_hosts["trainer_ns"], sys.executable, "-m",
                               "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                               "--master-port", str(free_port()), str(PROGRAM)],
                              env=train_env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

        store = Store(collector_dir / "starvewatch.db")
        query = Query(store)

        def finished_run():
            runs = [r for r in query.list_runs() if r["name"] == "two-hosts" and r["status"] == "finished"]
            return runs[0] if runs else None
        run = wait_until(finished_run, timeout_s=30, what="the run in the collector")
        assert run["ranks"] == 2 and run["steps"] == 80
        found = query.stragglers(run["id"])
        assert [(s["rank"], s["kind"]) for s in found["stragglers"]] == [(1, "input")]
        # Delivered over the network: nothing waits in the trainer's spool.
        spooled = [p for p in (trainer_dir / "spool").rglob("*.json.gz")] if (trainer_dir / "spool").exists() else []
        assert spooled == []
    finally:
        if store is not None:
            store.close()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()
