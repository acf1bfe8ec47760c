"""Issue 38 item 3: `starvewatch export RUN -f trace`, alone and merged into a real
torch.profiler trace (CPU): the wait slice of step k lies inside the profiler's
ProfilerStep#k, on its thread. The real CLI reads the run offline from the spool."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, Dataset

import starvewatch


class Slow(Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, i):
        time.sleep(0.002)
        return i


def cli(*args, env_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "STARVEWATCH_DIR": str(env_dir), "STARVEWATCH_URL": "off"}
    return subprocess.run([sys.executable, "-m", "starvewatch", "export", "latest", "-f", "trace",
                           "--spool", str(env_dir / "spool"), *args], env=env, capture_output=True, text=True, timeout=120)


def test_trace_alone_and_merged_into_a_profiler_trace(isolated_starvewatch, tmp_path):
    profiler_path = tmp_path / "profiler.json"
    loader = starvewatch.watch(DataLoader(Slow(), batch_size=4, num_workers=2), "train")
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=8, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(profiler_path))) as prof:
        for _ in loader:
            time.sleep(0.002)
            prof.step()
    starvewatch.finish()

    done = cli("-o", str(tmp_path / "alone.json"), env_dir=isolated_starvewatch)
    assert done.returncode == 0, done.stderr
    alone = json.loads((tmp_path / "alone.json").read_text())
    events = alone["traceEvents"]
    waits = [e for e in events if e.get("cat") == "starvewatch.wait"]
    assert len(waits) == 12 and len([e for e in events if e.get("cat") == "starvewatch.compute"]) == 12
    assert [e for e in events if e.get("cat") == "starvewatch.epoch"]
    fetch_tracks = {(e["pid"], e["tid"]) for e in events if e.get("cat") == "starvewatch.fetch"}
    assert len(fetch_tracks) == 2  # one track per worker
    assert len([e for e in events if e.get("cat") == "starvewatch.fetch"]) == 12
    assert alone["starvewatch"]["truncated"] is False
    [rank0] = alone["starvewatch"]["ranks"].values()
    assert rank0["pid"] == os.getpid()

    # A step range, then the merge.
    done = cli("--steps", "2:4", "-o", str(tmp_path / "range.json"), env_dir=isolated_starvewatch)
    assert done.returncode == 0, done.stderr
    ranged = json.loads((tmp_path / "range.json").read_text())
    assert sorted(e["args"]["step"] for e in ranged["traceEvents"] if e.get("cat") == "starvewatch.wait") == [2, 3, 4]

    done = cli("--merge", str(profiler_path), "-o", str(tmp_path / "merged.json"), env_dir=isolated_starvewatch)
    assert done.returncode == 0, done.stderr
    merged = json.loads((tmp_path / "merged.json").read_text())["traceEvents"]
    steps = {e["name"]: e for e in merged if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert len(steps) >= 8, sorted(steps)
    checked = 0
    for e in merged:
        if e.get("cat") != "starvewatch.wait":
            continue
        step = steps.get(f"ProfilerStep#{e['args']['step']}")
        if step is None:  # the warm-up step is not in the profiler's trace
            continue
        assert (e["pid"], e["tid"]) == (step["pid"], step["tid"])
        assert step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"], (e, step)
        checked += 1
    assert checked >= 8


def test_bad_ranges_and_bad_profiler_traces_are_one_line(isolated_starvewatch, tmp_path):
    for _ in starvewatch.watch(list(range(4)), "tiny"):
        pass
    starvewatch.finish()
    done = cli("--steps", "x", env_dir=isolated_starvewatch)
    assert done.returncode == 2 and "START:END" in done.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": 3}')
    done = cli("--merge", str(broken), env_dir=isolated_starvewatch)
    assert done.returncode == 1 and "cannot merge" in done.stderr and "Traceback" not in done.stderr
    done = cli("-o", str(tmp_path / "no-such-dir" / "t.json"), env_dir=isolated_starvewatch)
    assert done.returncode == 1 and "cannot write" in done.stderr and "Traceback" not in done.stderr


def test_the_collector_types_worker_records_and_keeps_them_once_per_batch(tmp_path):
    """Worker records and per-worker totals are typed and bounded at the door (422 with the
    field named), and a replayed batch does not store its worker records twice."""
    from tests.test_collector_api import batch, post
    from fastapi.testclient import TestClient
    from starvewatch.monitor.web.app import create_app
    from starvewatch.monitor.web.collector_settings import CollectorSettings

    settings = CollectorSettings(dir=tmp_path, dashboard=False, spool_scan_s=60)
    start = 1_700_000_000 * 10**9
    records = {"loader": ["train"] * 2, "worker": [0, 1], "idx": [0, 1], "wait_start_ns": [start] * 2,
               "got_ns": [start + 1] * 2, "fetch_start_ns": [start + 2] * 2,
               "collate_start_ns": [start + 3, 0], "collate_end_ns": [start + 4, 0], "done_ns": [start + 5] * 2}
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as c:
        good = batch(n=4)
        good["worker_batches"] = records
        good["loaders"][0]["totals"].update(worker_wait_ns=[5, 7], attributed_steps=4,
                                                  attributed_wait_ns=12, wait_fetch_ns=12)
        assert post(c, good).status_code == 200
        assert post(c, good).status_code == 200  # a replay
        for field, value in (("worker", [0, 600]), ("done_ns", [start]), ("got_ns", [-1, 0])):
            bad = batch(seq=2, n=4)
            bad["worker_batches"] = {**records, field: value}
            response = post(c, bad)
            assert response.status_code == 422 and field in response.text, (field, response.text)
        bad = batch(seq=3, n=4)
        bad["loaders"][0]["totals"]["worker_wait_ns"] = [1] * 513
        response = post(c, bad)
        assert response.status_code == 422 and "worker_wait_ns" in response.text
        trace = c.get("/api/v1/runs/run-a/export", params={"format": "trace"}).json()
        fetches = [e for e in trace["traceEvents"] if e.get("cat") == "starvewatch.fetch"]
        assert sorted(e["args"]["worker"] for e in fetches) == [0, 1]  # once, not twice
        assert len([e for e in trace["traceEvents"] if e.get("cat") == "starvewatch.collate"]) == 1
        summary = c.get("/api/v1/runs/run-a/summary").json()
        assert summary["loaders"][0]["attribution"]["workers"][1]["ms"] == 7e-6
        assert c.get("/api/v1/runs/run-a/export", params={"format": "trace", "steps": "a:b"}).status_code == 422
        # The run page's chart: a bar per stage and one per worker plus the main process.
        from starvewatch.dashboard import callbacks
        figure = callbacks.run_view(c.app.state.query, "run-a", None)["attribution"]
        stages, workers = figure.data
        assert list(workers.x) == ["worker 0", "worker 1", "main process"]
        assert dict(zip(stages.x, stages.y))["fetch"] == 1.0


def test_a_batch_a_worker_finished_before_the_loops_first_step_is_in_the_whole_runs_trace(tmp_path):
    """Workers forked inside iter() can finish batch 0 before the loop's clock for its first
    step begins (seen under load: 63 of 64 fetches in the trace). The whole run's trace has it,
    its time base before it; a window that starts at the first step leaves it out."""
    from tests.test_collector_api import batch, post
    from fastapi.testclient import TestClient
    from starvewatch.monitor.web.app import create_app
    from starvewatch.monitor.web.collector_settings import CollectorSettings

    start = 1_700_000_000 * 10**9  # the first step's start (tests.test_collector_api.batch)
    early, late = start - 2_000_000, start + 30_000_000
    records = {"loader": ["train"] * 2, "worker": [0, 1], "idx": [0, 1], "wait_start_ns": [early] * 2,
               "got_ns": [early, late], "fetch_start_ns": [early, late], "collate_start_ns": [0, 0],
               "collate_end_ns": [0, 0], "done_ns": [start - 1_000_000, late + 1_000_000]}
    settings = CollectorSettings(dir=tmp_path, dashboard=False, spool_scan_s=60)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as c:
        sent = batch(n=4)
        sent["worker_batches"] = records
        assert post(c, sent).status_code == 200
        whole = c.get("/api/v1/runs/run-a/export", params={"format": "trace"}).json()
        fetches = {e["args"]["batch"]: e["ts"] for e in whole["traceEvents"] if e.get("cat") == "starvewatch.fetch"}
        assert sorted(fetches) == [0, 1] and fetches[0] == 0.0  # the base: the earliest event
        assert whole["baseTimeNanoseconds"] == early
        windowed = c.get("/api/v1/runs/run-a/export", params={"format": "trace", "window": "0:1"}).json()
        assert [e["args"]["batch"] for e in windowed["traceEvents"] if e.get("cat") == "starvewatch.fetch"] == [1]
