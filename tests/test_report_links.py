"""The end-of-run report links the compare page when the collector holds an earlier run of the
same name (real collector, real runs)."""
import time

import starvewatch
from starvewatch.hooks.delivery.collector_link import previous_run
from starvewatch.hooks.session import current_session
from tests.conftest import free_port, wait_until


def _run(name: str, steps: int = 50) -> dict:
    starvewatch.init(name)
    for _ in starvewatch.watch(range(steps)):
        time.sleep(0.004)  # 0.2 s of loop: enough for a verdict (schema.MIN_SECONDS_FOR_VERDICT)
    session = current_session()
    wait_until(lambda: session.dashboard_url, timeout_s=30, what="the run to find the collector")
    return starvewatch.finish()


def test_report_links_the_comparison_with_the_previous_run_of_the_same_name(collector, monkeypatch, capsys):
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    monkeypatch.setenv("STARVEWATCH_QUIET", "0")
    first = _run("linked")["run"]["id"]
    assert "compare with the previous run" not in capsys.readouterr().err
    _run("linked-extra")  # found by the search for "linked", but another name
    assert "compare with the previous run" not in capsys.readouterr().err
    second = _run("linked")["run"]["id"]
    report = capsys.readouterr().err
    assert f"compare with the previous run of linked: {c.url}/compare?a={first}&b={second}" in report
    status, _ = c.request("GET", f"/compare?a={first}&b={second}")
    assert status == 200
    # A run too short for a verdict is no baseline: the next run compares with the one before.
    _run("linked", steps=5)
    capsys.readouterr()
    fourth = _run("linked")["run"]["id"]
    assert f"compare with the previous run of linked: {c.url}/compare?a={second}&b={fourth}" in capsys.readouterr().err


def test_no_link_when_the_collector_does_not_answer():
    started = time.monotonic()
    run = {"id": "x-1", "name": "x", "started_at": "2026-01-01T00:00:00Z"}
    assert previous_run(f"http://127.0.0.1:{free_port()}", None, run, timeout_s=1.0) is None
    assert time.monotonic() - started < 5


def test_report_names_advice_without_a_parameter_and_protective_advice_as_such():
    from starvewatch.hooks.report import format_report
    summary = {"run": {"name": "r", "id": "r-1"}, "loaders": [],
               "verdict": {"input_bound": "high", "input_wait_fraction": 0.4},
               "recommendations": [
                   {"loader": "train", "parameter": None, "suggested": "lighter_batches", "current": None,
                    "expected_speedup": 1.08, "reason": "the main process rebuilds batches"},
                   {"loader": "train", "parameter": "prefetch_factor", "suggested": 2, "current": 8,
                    "expected_speedup": None, "kind": "protective", "risk": "a Bus error when /dev/shm fills",
                    "reason": "memory allows 2"}]}
    lines = format_report(summary).splitlines()
    assert "  -> train: lighter batches (expected 1.08x): the main process rebuilds batches" in lines
    assert ("  -> train: prefetch_factor=2 (now 8) (protective: no speed-up; a Bus error when /dev/shm fills): "
            "memory allows 2") in lines
    assert not any("None=" in line for line in lines)
