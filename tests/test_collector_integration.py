"""The collector as users run it: a real uvicorn process, real SQLite, real training loops."""
import gzip
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import starvewatch
from tests.conftest import free_port, wait_until


class Sleepy(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.tensor([float(i)])


def _compare_summaries(local: dict, remote: dict) -> None:
    assert remote["schema"] == local["schema"] == "starvewatch.summary/2"
    assert set(remote) >= set(local)
    assert remote["run"] == local["run"]
    assert len(remote["loaders"]) == len(local["loaders"])
    for a, b in zip(local["loaders"], remote["loaders"]):
        assert set(a) == set(b)
        for key in ("name", "steps", "epochs", "verdict", "dropped_records", "config"):
            assert a[key] == b[key], key
        for key in ("input_wait_fraction", "batches_per_s", "samples_per_s"):
            assert b[key] == pytest.approx(a[key], abs=1e-6), key
        assert b["wait_ms"] == pytest.approx(a["wait_ms"], rel=1e-9)
        assert b["compute_ms"] == pytest.approx(a["compute_ms"], rel=1e-9)
    for key in ("input_bound", "limiting_factor"):
        assert remote["verdict"][key] == local["verdict"][key]
    assert remote["verdict"]["input_wait_fraction"] == pytest.approx(local["verdict"]["input_wait_fraction"], abs=1e-6)
    assert [r["parameter"] for r in remote["recommendations"]] == [r["parameter"] for r in local["recommendations"]]


def test_watched_training_reaches_the_collector_and_summaries_agree(collector, monkeypatch):
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    train = starvewatch.watch(DataLoader(Sleepy(), batch_size=4, num_workers=2), name="train")
    val = starvewatch.watch(DataLoader(Sleepy(), batch_size=8), name="val")
    for _ in range(3):
        for _ in train:
            time.sleep(0.002)
        for _ in val:
            pass
    local = starvewatch.finish()
    remote = c.get(f"/api/v1/runs/{local['run']['id']}/summary")
    _compare_summaries(local, remote)
    runs = c.get("/api/v1/runs")["runs"]
    assert [(r["id"], r["status"], r["steps"]) for r in runs] == [(local["run"]["id"], "finished", 72)]
    detail = c.get(f"/api/v1/runs/{local['run']['id']}")
    assert detail["loaders"][0]["config"]["num_workers"] == 2
    assert detail["run"]["torch"] == torch.__version__
    page = c.get(f"/api/v1/runs/{local['run']['id']}/steps?limit=50")
    assert len(page["steps"]) == 50 and page["next_after"] is not None
    rest = c.get(f"/api/v1/runs/{local['run']['id']}/steps?limit=1000&after={page['next_after']}")
    assert len(rest["steps"]) == 22 and rest["next_after"] is None
    metrics = c.request("GET", "/metrics")[1].decode()
    assert f'starvewatch_steps{{loader="train",name="{local["run"]["name"]}",run="{local["run"]["id"]}"}} 48.0' in metrics


_LONG_RUN = """
import json, os, sys, time, starvewatch
loader = starvewatch.watch(range(int(sys.argv[1])), name="train")
for i in loader:
    time.sleep(0.002)
    if i == 50:
        open(sys.argv[2], "w").write("midway")
summary = starvewatch.finish()
print(json.dumps({"run_id": summary["run"]["id"], "delivery": summary["delivery"]}))
"""


def test_collector_killed_and_restarted_mid_run_loses_and_duplicates_nothing(collector, tmp_path):
    c = collector()
    marker = tmp_path / "midway"
    env = dict(os.environ, STARVEWATCH_URL=c.url, STARVEWATCH_RUN_NAME="resilient", STARVEWATCH_QUIET="0")
    steps = 1500
    proc = subprocess.Popen([sys.executable, "-c", _LONG_RUN, str(steps), str(marker)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(marker.exists, what="the run to be midway")
        c.kill()  # SIGKILL: no goodbye
        down_at = time.monotonic()
        wait_until(lambda: time.monotonic() - down_at > 1.0 or proc.poll() is not None, what="downtime")
        c.start()  # same port, same database
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    run_id, account = result["run_id"], result["delivery"]
    # Each record acknowledged or still in the spool at exit; none dropped.
    assert account["acknowledged"] + account["spooled"] == steps and account["dropped"] == {}, account
    said = [line for line in err.splitlines() if line.startswith("starvewatch: warning:")]
    assert len([line for line in said if "does not answer" in line]) == 1, err  # said once
    assert not [line for line in said if "dropped" in line], err
    # Whatever was still spooled at exit is swept in by the collector (start-up or sweep).
    def complete():
        summary = c.get(f"/api/v1/runs/{run_id}/summary")
        return summary if summary["loaders"] and summary["loaders"][0]["steps"] == steps else None
    summary = wait_until(complete, timeout_s=30, what="every step at the collector")
    seen, after = [], 0
    while after is not None:
        page = c.get(f"/api/v1/runs/{run_id}/steps?limit=1000&after={after}")
        seen.extend((s["epoch"], s["step"]) for s in page["steps"])
        after = page["next_after"]
    assert len(seen) == len(set(seen)) == steps
    assert sorted(seen) == [(0, i) for i in range(steps)]
    assert summary["run"]["status"] == "finished"


def test_bad_payloads_get_4xx_and_the_server_stays_healthy(collector):
    c = collector()
    good = {"schema": "starvewatch.events/1", "run_id": "r1", "stream": "s1", "seq": 1,
            "loaders": [{"name": "train", "totals": {"steps": 1, "epochs": 1, "wait_ns": 5, "compute_ns": 5}}],
            "steps": {"loader": ["train"], "epoch": [0], "step": [0], "start_ns": [1], "wait_ns": [5],
                      "compute_ns": [5], "other_ns": [0], "batch_size": [None], "gpu_idle_ns": [None]}}
    json_headers = {"Content-Type": "application/json"}

    def post(payload, headers=json_headers, raw=None):
        body = raw if raw is not None else json.dumps(payload).encode()
        return c.request("POST", "/api/v1/ingest", body, headers)

    cases = {
        "nan": (dict(good, steps=dict(good["steps"], wait_ns=[float("nan")])), 422, "steps.wait_ns"),
        "negative": (dict(good, steps=dict(good["steps"], compute_ns=[-3])), 422, "steps.compute_ns"),
        "schema": (dict(good, schema="starvewatch.events/99"), 422, "schema"),
        "columns": (dict(good, steps=dict(good["steps"], step=[0, 1])), 422, "differ in length"),
    }
    for name, (payload, expected, field) in cases.items():
        body = json.dumps(payload).encode()  # json writes nan as the literal NaN, as numpy users do
        status, text = post(None, raw=body)
        assert status == expected, (name, status, text)
        assert field.encode() in json.loads(text)["detail"].encode(), (name, text)
    assert b"NaN" in json.dumps(cases["nan"][0]).encode()
    status, text = post(None, raw=b'{"schema": "starvewatch.events/1", "run_id": "r", "stream": "s", "seq": 1, '
                                  b'"steps": {"wait_ns": [Infinity]}}')
    assert status == 422
    status, text = post(None, raw=b"not json at all")
    assert status == 422
    status, text = post(good, headers={"Content-Type": "text/plain"})
    assert status == 415 and b"application/json" in text
    # (a body over the compressed limit: tests/test_bounded_requests.py)
    bomb = gzip.compress(b" " * (40 * 1024 * 1024))
    status, text = post(None, raw=bomb, headers={**json_headers, "Content-Encoding": "gzip"})
    assert status == 413 and b"decompressed" in text
    status, text = post(None, raw=b"\x1f\x8bnot gzip", headers={**json_headers, "Content-Encoding": "gzip"})
    assert status == 400
    assert c.request("GET", "/api/v1/runs/nope/summary")[0] == 404
    assert c.request("GET", "/api/v1/runs/nope")[0] == 404
    assert c.request("DELETE", "/api/v1/runs/nope")[0] == 404
    assert post(good)[0] == 200
    assert json.loads(post(good)[1])["duplicate"] is True  # same stream and seq: ignored
    assert c.healthy()
    # The replay changed nothing: one step, counted once, stored once.
    summary = c.get("/api/v1/runs/r1/summary")
    assert [(l["name"], l["steps"]) for l in summary["loaders"]] == [("train", 1)]
    assert len(c.get("/api/v1/runs/r1/steps")["steps"]) == 1
    assert [r["id"] for r in c.get("/api/v1/runs")["runs"]] == ["r1"]
    assert c.request("DELETE", "/api/v1/runs/r1")[0] == 200
    assert c.get("/api/v1/runs")["runs"] == []


def test_non_loopback_bind_with_a_weak_token_refuses_to_start(isolated_starvewatch):
    # Without any token, one is made and printed once (tests/test_secrets.py); a weak one given
    # is refused.
    out = subprocess.run([sys.executable, "-m", "starvewatch", "serve", "--host", "0.0.0.0",
                          "--port", str(free_port())], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "STARVEWATCH_TOKEN": "a"})
    assert out.returncode == 2
    assert "at least 16 characters" in out.stderr and "Traceback" not in out.stderr


def test_token_is_required_on_every_route(collector, monkeypatch):
    c = collector(token="s3cret-token")
    import urllib.request
    for path in ("/api/v1/runs", "/metrics", "/", "/healthz"):
        try:
            urllib.request.urlopen(c.url + path, timeout=10)
            raise AssertionError(f"{path} answered without a token")
        except urllib.error.HTTPError as err:
            err.close()
            assert err.code == 401
    wrong = urllib.request.Request(c.url + "/api/v1/runs", headers={"Authorization": "Bearer nope"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(wrong, timeout=10)
    assert info.value.code == 401
    info.value.close()
    assert c.get("/api/v1/runs") == {"runs": []}
    # A browser logs in once with ?token= and gets a cookie.
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=10)
    conn.request("GET", "/api/v1/runs?token=s3cret-token")
    resp = conn.getresponse()
    assert resp.status == 303 and f"starvewatch_session_{c.port}=" in resp.getheader("set-cookie")
    conn.close()
    # The hooks send the token.
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    monkeypatch.setenv("STARVEWATCH_TOKEN", "s3cret-token")
    list(starvewatch.watch(range(30)))
    run_id = starvewatch.finish()["run"]["id"]
    assert c.get(f"/api/v1/runs/{run_id}/summary")["loaders"][0]["steps"] == 30


def test_offline_run_appears_when_a_collector_starts(collector, isolated_starvewatch):
    list(starvewatch.watch(range(40)))  # STARVEWATCH_URL=off: everything goes to the spool
    run_id = starvewatch.finish()["run"]["id"]
    assert list((isolated_starvewatch / "spool").glob("*/*/*.json.gz"))
    c = collector()
    assert c.get(f"/api/v1/runs/{run_id}/summary")["loaders"][0]["steps"] == 40
    assert not list((isolated_starvewatch / "spool").glob("*/*/*.json.gz"))


def test_import_command_takes_a_spool_from_elsewhere(tmp_path, monkeypatch):
    other = tmp_path / "elsewhere"
    monkeypatch.setenv("STARVEWATCH_DIR", str(other))
    list(starvewatch.watch(range(25)))
    run_id = starvewatch.finish()["run"]["id"]
    target = tmp_path / "here"
    out = subprocess.run([sys.executable, "-m", "starvewatch", "import", str(other), "--dir", str(target)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "imported" in out.stdout
    from starvewatch.monitor.storage.query import Query
    from starvewatch.monitor.storage.store import Store
    store = Store(target / "starvewatch.db")
    assert Query(store).summary(run_id)["loaders"][0]["steps"] == 25
    store.close()
    out = subprocess.run([sys.executable, "-m", "starvewatch", "import", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "not a directory" in out.stderr and "Traceback" not in out.stderr


def test_auto_start_and_stop(isolated_starvewatch, monkeypatch):
    port = free_port()
    monkeypatch.setenv("STARVEWATCH_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("STARVEWATCH_AUTOSTART", "1")
    monkeypatch.setenv("STARVEWATCH_QUIET", "0")
    pid_file = isolated_starvewatch / "collector.json"
    try:
        t0 = time.perf_counter()
        watched = starvewatch.watch(range(100))
        assert time.perf_counter() - t0 < 0.05  # the probe and the start never block watch()
        for _ in watched:
            pass
        session = starvewatch.hooks.session.current_session()
        wait_until(lambda: session.dashboard_url, timeout_s=30, what="the auto-started collector")
        run_id = starvewatch.finish(quiet=True)["run"]["id"]
        info = json.loads(pid_file.read_text())
        assert info["autostarted"] is True and info["port"] == port
        from tests.conftest import Collector
        c = Collector(isolated_starvewatch, port=port)
        assert c.get(f"/api/v1/runs/{run_id}/summary")["loaders"][0]["steps"] == 100
        out = subprocess.run([sys.executable, "-m", "starvewatch", "stop"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        with pytest.raises(OSError):
            import urllib.request
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        if pid_file.exists():  # the test failed before `stop`: never leave the server behind
            try:
                os.kill(json.loads(pid_file.read_text())["pid"], 9)
            except ProcessLookupError:
                pass
    assert not pid_file.exists()


def test_samples_workers_and_stalls_are_readable_and_status_shows_stalled(collector, monkeypatch):
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    monkeypatch.setenv("STARVEWATCH_STALL_MIN_S", "0.3")
    session = starvewatch.init("stall-run")
    seen = {}

    def source():
        for i in range(25):
            yield i
        # While the loop waits for this batch, the collector must show the run as stalled.
        seen["status"] = wait_until(
            lambda: next((r["status"] for r in c.get("/api/v1/runs")["runs"] if r["status"] == "stalled"), None),
            timeout_s=30, what="status stalled")
        yield 25

    loader = starvewatch.watch(DataLoader(Sleepy(), batch_size=8, num_workers=2), name="train")
    for _ in loader:
        pass
    assert list(starvewatch.watch(source(), name="stream")) == list(range(26))
    run_id = session.run_id
    wait_until(lambda: c.get("/api/v1/runs")["runs"][0]["status"] == "live", what="the stall to end")
    summary = starvewatch.finish()
    assert seen["status"] == "stalled"
    remote = c.get(f"/api/v1/runs/{run_id}/summary")
    assert [s["loader"] for s in remote["stalls"]] == ["stream"] and remote["stalls"][0]["ended_ns"]
    assert remote["system"] == summary["system"]  # same samples, same overview on both sides
    host = c.get(f"/api/v1/runs/{run_id}/events/samples")["events"]
    assert host and host[0]["kind"] == "host" and "shm_used_bytes" in host[0]
    workers = c.get(f"/api/v1/runs/{run_id}/events/workers")["events"]
    assert workers and workers[-1]["loader"] == "train" and len(workers[-1]["workers"]) == 2
    assert c.request("GET", f"/api/v1/runs/{run_id}/events/bogus")[0] == 404
