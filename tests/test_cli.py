"""Every command through its entry point, against real data (a spool, a database, a collector)."""
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import starvewatch
from tests.conftest import free_port


def cli(*args, env_extra=None, timeout=120):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "starvewatch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def offline_runs(isolated_starvewatch, monkeypatch):
    """Two runs of the same name in the spool, the second with a changed loader config."""
    import time

    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 96

        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.zeros(2)

    ids = []
    for workers in (0, 1):
        starvewatch.init("cli-run")
        for _ in starvewatch.watch(DataLoader(Slow(), batch_size=4, num_workers=workers)):
            time.sleep(0.004)
        ids.append(starvewatch.finish()["run"]["id"])
    # No collector answers here: the CLI falls back to the offline data in STARVEWATCH_DIR.
    monkeypatch.setenv("STARVEWATCH_URL", f"http://127.0.0.1:{free_port()}")
    return ids


def test_help_has_examples_and_no_command_is_a_usage_error():
    out = cli("--help")
    assert out.returncode == 0 and "examples:" in out.stdout and "starvewatch export latest" in out.stdout
    assert cli().returncode == 2


def test_runs_list_show_and_delete(offline_runs):
    out = cli("runs")
    assert out.returncode == 0, out.stderr
    assert all(run_id in out.stdout for run_id in offline_runs) and "finished" in out.stdout
    show = cli("runs", "show", "latest")
    assert show.returncode == 0 and offline_runs[1] in show.stdout and "waited for data" in show.stdout
    unknown = cli("runs", "show", "no-such-run")
    assert unknown.returncode == 1 and "unknown run" in unknown.stderr and "Traceback" not in unknown.stderr
    assert cli("runs", "delete").returncode == 2


def test_export_json_matches_the_schema(offline_runs):
    out = cli("export", offline_runs[0], "--format", "json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["schema"] == "starvewatch.summary/2"
    assert set(summary) >= {"run", "loaders", "verdict", "stalls", "recommendations"}
    assert set(summary["run"]) >= {"id", "name", "started_at", "ended_at", "status", "host", "rank", "world_size"}
    loader = summary["loaders"][0]
    assert set(loader) >= {"name", "config", "steps", "epochs", "input_wait_fraction", "verdict", "wait_ms",
                           "compute_ms", "batches_per_s", "samples_per_s", "dropped_records"}
    assert set(loader["wait_ms"]) == {"mean", "p50", "p95", "p99", "max"}
    assert set(summary["verdict"]) >= {"input_bound", "input_wait_fraction", "gpu_idle_fraction",
                                       "limiting_factor", "speedup_at_stake"}
    assert summary["recommendations"][0]["parameter"] == "num_workers"
    assert isinstance(summary["recommendations"][0]["suggested"], int)


def test_export_csv_rows_match_steps(offline_runs, tmp_path):
    target = tmp_path / "steps.csv"
    out = cli("export", "latest", "-f", "csv", "-o", str(target))
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    summary = json.loads(cli("export", "latest", "-f", "json").stdout)
    assert len(rows) + summary["loaders"][0]["dropped_records"] == summary["loaders"][0]["steps"] == 24
    assert {r["run"] for r in rows} == {offline_runs[1]}
    assert sorted(int(r["step"]) for r in rows) == list(range(24))
    assert all(float(r["wait_ms"]) >= 0 and float(r["compute_ms"]) > 3 for r in rows)


def test_export_markdown_and_spool_option(offline_runs, isolated_starvewatch):
    out = cli("export", offline_runs[0], "-f", "md", "--spool", str(isolated_starvewatch / "spool"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("# starvewatch report: cli-run")
    assert "num_workers=" in out.stdout and "DataLoader(dataset, " in out.stdout
    missing = cli("export", "latest", "--spool", str(isolated_starvewatch / "nope"))
    assert missing.returncode == 1 and "not a directory" in missing.stderr


def test_compare_shows_deltas_and_the_verdict(offline_runs, tmp_path):
    out = cli("compare", *offline_runs)
    assert out.returncode == 0, out.stderr
    assert "batches/s" in out.stdout and "num_workers=" in out.stdout
    # Changes read as a percent change with the ratio to three significant digits.
    row = next(line for line in out.stdout.splitlines() if line.startswith("| train | wait p95 (ms) |"))
    assert re.fullmatch(r"\| train \| wait p95 \(ms\) \| [\d.,]+ \| [\d.,]+ \| [+-][\d.,]+% \([\d.e+-]+x\) \|", row), row
    assert "| train | **num_workers** | `0` | `1` |" in out.stdout  # the configuration diff
    # The first run (8 ms of loading against 4 ms of compute) was told num_workers=3 (2 when a
    # saturated host caps it at the cores); the second used 1, so the suggestion was not
    # applied, whatever its speed-up.
    row = next(line for line in out.stdout.splitlines() if line.startswith("| train | `num_workers="))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[1].strip("`").split("=")[1]) >= 2, row
    assert cells[2] == "no" and cells[3] == "not applied", row

    as_json = cli("compare", *offline_runs, "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    comp = json.loads(as_json.stdout)
    assert comp["schema"] == "starvewatch.compare/1" and [comp["before"]["id"], comp["after"]["id"]] == offline_runs
    assert comp["pairs"] == [{"before": "train", "after": "train", "by": "name"}]
    # num_workers=1 also brings the settings only workers have (prefetch_factor, the start method)
    # at torch's defaults: those are no change the user made.
    assert [r["setting"] for r in comp["config"] if r["changed"]] == ["num_workers"]

    report = tmp_path / "compare.html"
    as_html = cli("compare", *offline_runs, "-f", "html", "-o", str(report))
    assert as_html.returncode == 0 and f"wrote {report}" in as_html.stderr and as_html.stdout == ""
    page = report.read_text()
    assert page.startswith("<!doctype html>") and "<script src=" not in page and "id='verify-table'" in page
    unwritable = cli("compare", *offline_runs, "-f", "html", "-o", str(tmp_path / "no" / "such" / "dir.html"))
    assert unwritable.returncode == 1 and "cannot write" in unwritable.stderr and "Traceback" not in unwritable.stderr
    assert cli("compare", *offline_runs, "--format", "pdf").returncode == 2


def test_unreachable_collector_without_offline_data_is_a_clear_error(isolated_starvewatch, monkeypatch):
    monkeypatch.setenv("STARVEWATCH_URL", f"http://127.0.0.1:{free_port()}")
    out = cli("runs")
    assert out.returncode == 1 and "no starvewatch collector answers" in out.stderr
    assert "Traceback" not in out.stderr


def test_doctor_reports_each_check(isolated_starvewatch, monkeypatch):
    monkeypatch.setenv("STARVEWATCH_URL", f"http://127.0.0.1:{free_port()}")
    out = cli("doctor")
    # On this machine the one check that can fail is /dev/shm (no GPU: NVML's absence is fine,
    # the data directory is writable, no collector is fine: training starts one or spools).
    shm_ok = shutil.disk_usage("/dev/shm").total >= 2**30
    assert out.returncode == (0 if shm_ok else 3), out.stdout
    for name in ("torch", "NVML", "/dev/shm", "data directory", "collector"):
        assert name in out.stdout
    assert out.stdout.count("!! ") == (0 if shm_ok else 1)


def test_doctor_finds_an_unwritable_data_directory(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("STARVEWATCH_URL", f"http://127.0.0.1:{free_port()}")
    out = cli("doctor", env_extra={"STARVEWATCH_DIR": str(blocker / "sw")})
    assert out.returncode == 3, out.stdout
    assert f"!! data directory: {blocker / 'sw'} is not writable" in out.stdout
    assert "fix: set STARVEWATCH_DIR to a writable directory" in out.stdout


def test_commands_against_a_running_collector(collector, monkeypatch):
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    list(starvewatch.watch(range(40)))
    run_id = starvewatch.finish()["run"]["id"]
    listed = cli("runs")
    assert listed.returncode == 0 and run_id in listed.stdout
    exported = json.loads(cli("export", run_id[:12], "-f", "json").stdout)
    assert exported["run"]["id"] == run_id
    assert cli("runs", "delete", run_id, "--yes").returncode == 0
    assert c.get("/api/v1/runs")["runs"] == []


def test_demo_quick_runs_both_configurations_and_compares():
    out = cli("demo", "--quick", env_extra={"STARVEWATCH_QUIET": "0"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[1/2] starved configuration" in out.stdout and "[2/2] recommended configuration" in out.stdout
    assert "| train | batches/s |" in out.stdout and "num_workers=" in out.stdout
    assert "Input-bound: the loop waited for data" in out.stderr  # the end-of-run report of the starved run
    # Offline (no collector): the command that compares them; with one, the compare page (below).
    assert re.search(r"compare before and after: starvewatch compare demo-\S+ demo-\S+", out.stdout)


def test_demo_points_at_the_compare_page_of_its_two_runs():
    from starvewatch.demo import compare_hint
    assert compare_hint("demo-1", "demo 2", "http://127.0.0.1:8412") == \
        "compare before and after: http://127.0.0.1:8412/compare?a=demo-1&b=demo%202"


def test_demo_says_the_collector_started_for_it_keeps_running(tmp_path):
    import json as _json
    from starvewatch.demo import background_note
    assert background_note("http://127.0.0.1:8412", tmp_path) is None  # no pid file: none was started here
    (tmp_path / "collector.json").write_text(_json.dumps({"pid": 1, "autostarted": False}))
    assert background_note("http://127.0.0.1:8412", tmp_path) is None  # `starvewatch serve`: the user's own
    (tmp_path / "collector.json").write_text(_json.dumps({"pid": 1, "autostarted": True}))
    note = background_note("http://127.0.0.1:8412", tmp_path)
    assert "keeps running in the background" in note and "http://127.0.0.1:8412" in note
    assert "an hour" in note and "`starvewatch stop`" in note
    assert background_note(None, tmp_path) is None  # offline: no collector at all


@pytest.mark.parametrize("option, bad", [
    ("--otlp-interval", "0"), ("--otlp-interval", "-5"), ("--otlp-interval", "nan"), ("--otlp-interval", "inf"),
    ("--tensorboard-interval", "0"), ("--tensorboard-interval", "-1"), ("--tensorboard-interval", "NaN"),
    ("--idle-exit", "-1"), ("--idle-exit", "nan"), ("--idle-exit", "inf"), ("--idle-exit", "soon")])
def test_serve_refuses_intervals_that_would_spin_or_never_come(option, bad, capsys, monkeypatch):
    """Through the console script's entry point (starvewatch.cli:main): a usage error (exit 2)
    naming the option, before anything starts; `--tensorboard-interval 0` would spin a core."""
    from starvewatch import cli as entry
    monkeypatch.setattr(entry, "cmd_serve", lambda args: pytest.fail(f"serve started with {option} {bad}"))
    with pytest.raises(SystemExit) as exit_:
        entry.main(["serve", "--port", "1", option, bad])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and option in err and "Traceback" not in err, err


def test_serve_keeps_idle_exit_zero_as_never_and_takes_good_intervals(monkeypatch):
    from starvewatch import cli as entry
    seen = []
    monkeypatch.setattr(entry, "cmd_serve", lambda args: seen.append(args) or 0)
    assert entry.main(["serve", "--idle-exit", "0", "--otlp-interval", "0.5", "--tensorboard-interval", "2"]) == 0
    assert (seen[0].idle_exit, seen[0].otlp_interval, seen[0].tensorboard_interval) == (0.0, 0.5, 2.0)


def test_a_refused_interval_exits_2_from_the_command_line():
    out = cli("serve", "--port", str(free_port()), "--tensorboard-interval", "0")
    assert out.returncode == 2 and "--tensorboard-interval" in out.stderr and "Traceback" not in out.stderr, out
