"""Tuning results stored with a run: API, diagnosis marked `measured`, exports, dashboard panel."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import starvewatch
from starvewatch.dashboard.tuning_panel import panel
from starvewatch.analysis.measured_tuning import expected_speedup, with_tuning
from starvewatch.tuning.remote import CollectorError
from tests.conftest import wait_until

TRAINING = r"""
import time, torch, starvewatch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 48
    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.zeros(4)

loader = starvewatch.watch(DataLoader(Slow(), batch_size=4, num_workers=0), name="train")
for _ in range(2):
    for batch in loader:
        time.sleep(0.010)
starvewatch.finish()
"""


class Slow(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.zeros(4)


def make_loader(**kwargs):
    return DataLoader(Slow(), batch_size=4, **kwargs)


def _train(c, name):
    env = dict(os.environ, STARVEWATCH_URL=c.url, STARVEWATCH_RUN_NAME=name)
    done = subprocess.run([sys.executable, "-c", TRAINING], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    runs = [r for r in c.get("/api/v1/runs")["runs"] if r["name"] == name]
    assert len(runs) == 1
    return runs[0]["id"]


def _post(c, run_id, document):
    return c.request("POST", f"/api/v1/runs/{run_id}/tuning", json.dumps(document).encode(),
                     {"Content-Type": "application/json"})


def test_tune_with_a_run_stores_the_results_with_it(collector, monkeypatch):
    c = collector()
    run_id = _train(c, "tune-run")
    summary = c.get(f"/api/v1/runs/{run_id}/summary")
    train = summary["loaders"][0]
    status, body = c.request("GET", f"/api/v1/runs/{run_id}/tuning")
    assert status == 404 and b"starvewatch tune" in body
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    result = starvewatch.tune(make_loader, budget_s=3, run_name="tune-run", out=False)
    # The consumption is the run's compute (and other loop time) per batch.
    expected = 1000 / (train["compute_ms"]["mean"] + train["other_ms_total"] / train["steps"])
    assert result.consumption_source == "run"
    assert result.consumption_batches_per_s == pytest.approx(expected)
    stored = c.get(f"/api/v1/runs/{run_id}/tuning")
    assert stored["schema"] == "starvewatch.tuning/1" and stored["loader"] == "train"
    assert [t["config"] for t in stored["trials"]] == [t.config.to_dict() for t in result.trials]
    assert stored["answer"]["config"] == result.config.to_dict()
    assert stored["current"] == {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False,
                                 "pin_memory": False}
    # The summary (API, exports) carries the results.
    summary = wait_until(lambda: c.get(f"/api/v1/runs/{run_id}/summary").get("tuning"), what="tuning in the summary")
    assert summary["answer"] == stored["answer"]


def test_tune_with_an_unknown_run_fails_before_measuring(collector, monkeypatch):
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    start = time.perf_counter()
    with pytest.raises(CollectorError, match="no run named 'nope'"):
        starvewatch.tune(make_loader, budget_s=30, run_name="nope", out=False)
    assert time.perf_counter() - start < 10


def _document(workers=3, rate=200.0, consumption=None):
    trials = [{"config": {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False,
                          "pin_memory": False}, "label": "num_workers=0", "status": "measured",
               "batches_per_s": 40.0, "samples_per_s": 160.0, "worker_uss_bytes": None, "cpu_pct": 5.0},
              {"config": {"num_workers": workers, "prefetch_factor": 2, "persistent_workers": True,
                          "pin_memory": False}, "label": f"num_workers={workers}, prefetch_factor=2, "
                                                         f"persistent_workers=True",
               "status": "measured", "batches_per_s": rate, "samples_per_s": 4 * rate,
               "worker_uss_bytes": 50 << 20, "cpu_pct": 30.0},
              {"config": {"num_workers": 64, "prefetch_factor": 2, "persistent_workers": False,
                          "pin_memory": False}, "label": "num_workers=64, prefetch_factor=2", "status": "skipped",
               "reason": "would need 9 GiB of RAM but 2 GiB is available"}]
    answer = {"config": trials[1]["config"], "label": trials[1]["label"], "batches_per_s": rate,
              "epoch_batches_per_s": rate, "rule": "the fewest workers within 10% of the best",
              "snippet": f"DataLoader(dataset, batch_size=4, num_workers={workers}, prefetch_factor=2, "
                         f"persistent_workers=True)", "worker_uss_bytes": 50 << 20}
    return {"schema": "starvewatch.tuning/1", "created_at": "2026-11-23T12:00:00Z", "host": "box", "cores": 2,
            "loader": "train", "budget_s": 60, "elapsed_s": 58.2, "consumption_batches_per_s": consumption,
            "consumption_margin": 1.2, "trials": trials, "answer": answer}


def test_stored_results_replace_the_model_and_are_marked_measured(collector):
    c = collector()
    run_id = _train(c, "measured-run")
    before = c.get(f"/api/v1/runs/{run_id}/summary")
    model = [r for r in before["recommendations"] if r["parameter"] == "num_workers"]
    assert model and not model[0].get("measured")  # the model's advice, before any tuning
    status, body = _post(c, run_id, _document(workers=3, rate=200.0))
    assert status == 200, body
    # Answers may be reused for 0.25 s while a run's data changes: poll.
    after = wait_until(lambda: (lambda s: s if s.get("tuning") else None)(c.get(f"/api/v1/runs/{run_id}/summary")),
                       what="the summary with the tuning")
    tuned = {r["parameter"]: r for r in after["recommendations"] if r["loader"] == "train"
             and r["parameter"] in ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")}
    assert set(tuned) == {"num_workers", "persistent_workers"}  # prefetch 2 is the default; pin unchanged
    assert all(r["measured"] is True for r in tuned.values())
    assert tuned["num_workers"]["suggested"] == 3 and tuned["num_workers"]["current"] == 0
    train = after["loaders"][0]
    now_ms, after_ms, gain = expected_speedup(train, 200.0)
    assert tuned["num_workers"]["expected_speedup"] == pytest.approx(round(gain, 3))
    assert tuned["num_workers"]["evidence"]["measured_batches_per_s"] == 200.0
    assert "measured by `starvewatch tune`" in tuned["num_workers"]["reason"]
    # Exports carry it: JSON (the summary), Markdown and HTML.
    status, md = c.request("GET", f"/api/v1/runs/{run_id}/export?format=md")
    assert status == 200
    md = md.decode()
    assert "## Measured tuning" in md and "would need 9 GiB of RAM" in md
    assert "num_workers=3, prefetch_factor=2, persistent_workers=True (answer)" in md
    assert "(measured by starvewatch tune)" in md
    status, page = c.request("GET", f"/api/v1/runs/{run_id}/export?format=html")
    assert status == 200 and b"Measured tuning" in page
    # A later tuning replaces the earlier one.
    assert _post(c, run_id, _document(workers=2, rate=150.0))[0] == 200
    wait_until(lambda: c.get(f"/api/v1/runs/{run_id}/tuning")["answer"]["config"]["num_workers"] == 2,
               what="the later tuning")


def test_tuning_api_rejects_bad_input_and_unknown_runs(collector):
    c = collector()
    run_id = _train(c, "api-run")
    assert _post(c, "no-such-run", _document())[0] == 404
    bad = _document()
    bad["trials"][0]["config"]["num_workers"] = -1
    status, body = _post(c, run_id, bad)
    assert status == 422 and b"num_workers" in body
    status, _ = c.request("POST", f"/api/v1/runs/{run_id}/tuning", b"not json", {"Content-Type": "application/json"})
    assert status == 422
    assert c.request("GET", f"/api/v1/runs/{run_id}/tuning")[0] == 404
    assert _post(c, run_id, _document())[0] == 200
    assert c.request("DELETE", f"/api/v1/runs/{run_id}")[0] == 200
    assert c.request("GET", f"/api/v1/runs/{run_id}/tuning")[0] == 404  # a deletion is never served stale


def _summary(config, recs):
    return {"loaders": [{"name": "train", "config": config, "steps": 100, "batches_per_s": 20.0,
                         "wait_ms": {"mean": 40.0}, "compute_ms": {"mean": 10.0}, "other_ms_total": 0.0}],
            "recommendations": recs}


def _model_rec(parameter, suggested, kind=None):
    rec = {"loader": "train", "parameter": parameter, "current": 0, "suggested": suggested, "reason": "model",
           "evidence": {}, "expected_speedup": 4.0}
    if kind:
        rec["kind"] = kind
    return rec


def test_with_tuning_keeps_protective_advice_and_other_loaders():
    recs = [_model_rec("num_workers", 6), _model_rec("prefetch_factor", 2, kind="protective"),
            {**_model_rec("num_workers", 2), "loader": "val"}]
    out = with_tuning(_summary({"num_workers": 0}, recs), _document(workers=3, rate=200.0))
    params = [(r["loader"], r["parameter"], r.get("measured", False)) for r in out["recommendations"]]
    assert ("train", "num_workers", False) not in params  # the model's 6 is gone
    assert ("train", "num_workers", True) in params and ("val", "num_workers", False) in params
    assert ("train", "prefetch_factor", False) in params  # protective advice stays
    assert ("train", "prefetch_factor", True) not in params  # torch's default comes with the workers
    assert out["tuning"]["replaced"] == ["num_workers=6"] and out["tuning"]["status"] == "recommended"
    # 50 ms steps with 40 ms waiting; the loader alone delivers 200/s (5 ms): steps of 10 ms.
    rec = next(r for r in out["recommendations"] if r.get("measured") and r["parameter"] == "num_workers")
    assert rec["expected_speedup"] == pytest.approx(5.0) and rec["kind"] == "speedup"


def test_with_tuning_when_the_current_configuration_is_the_answer():
    current = {"num_workers": 3, "prefetch_factor": 2, "persistent_workers": True, "pin_memory": False}
    out = with_tuning(_summary(current, [_model_rec("num_workers", 6)]), _document(workers=3))
    assert out["recommendations"] == [] and out["tuning"]["status"] == "current"


def test_fewer_workers_at_the_same_speed_is_protective():
    summary = _summary({"num_workers": 8, "prefetch_factor": 2, "persistent_workers": True}, [])
    summary["loaders"][0]["wait_ms"]["mean"] = 0.0  # not starved
    out = with_tuning(summary, _document(workers=3, rate=200.0))
    rec = out["recommendations"][0]
    assert rec["parameter"] == "num_workers" and rec["suggested"] == 3
    assert rec["kind"] == "protective" and rec["expected_speedup"] is None and rec["measured"] is True


def test_dashboard_panel_shows_trials_reasons_and_the_snippet():
    html = str(panel(_document(workers=3)))
    assert "num_workers=3, prefetch_factor=2, persistent_workers=True" in html
    assert "would need 9 GiB of RAM but 2 GiB is available" in html
    assert "DataLoader(dataset, batch_size=4, num_workers=3" in html
    assert "sw-tuned" in html
    assert "starvewatch tune module:make_loader --run NAME" in str(panel(None))
