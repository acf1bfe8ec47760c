"""Silence and regression on the stored records of two real runs (issue 34 items 3-4), not on
constructed figures and without timing anything here: tests/data/cpu-hog-pair.db.gz is the
collector database `python -m benchmarks.scenarios.cpu_hog_pair --cpus 1` wrote on the 2-core
host (2026-12-01 20:04 UTC, load average 6.5 from other engineers' jobs): a CPU-bound Pillow
pipeline with a CPU-bound step (30 ms), held to one CPU beside a CPU hog, at num_workers=0
(8.95 batches/s) and then, same run name, num_workers=2 (5.74 batches/s: the workers took
the core the step needed, compute per batch 71 -> 141 ms). The collector's query layer reads
them back as it would serve them."""
import gzip
import shutil
from pathlib import Path

import pytest

from starvewatch.analysis.compare import comparison
from starvewatch.monitor.storage.sources import LocalSource
from tests.test_the_answer import _surfaces

PAIR = Path(__file__).parent / "data" / "cpu-hog-pair.db.gz"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(runs list, [summary of the num_workers=0 run, summary of the num_workers=2 run])."""
    db = tmp_path_factory.mktemp("pair") / "starvewatch.db"
    with gzip.open(PAIR) as packed, open(db, "wb") as out:
        shutil.copyfileobj(packed, out)
    source = LocalSource.offline(db=db)
    runs = sorted(source.list_runs(), key=lambda r: r["started_at"])
    return runs, [source.summary(r["id"]) for r in runs]


def test_the_records_are_the_two_real_runs(pair):
    runs, (first, second) = pair
    assert len(runs) == 2 and runs[0]["name"] == runs[1]["name"] == "pillow-under-cpu-hog"
    assert [s["loaders"][0]["config"]["num_workers"] for s in (first, second)] == [0, 2]
    assert first["system"]["usable_cores"] == 1 and first["system"]["cpu_count"] == 2
    assert first["loaders"][0]["steps"] == second["loaders"][0]["steps"] == 32


def test_an_input_bound_run_with_nothing_to_recommend_says_why_in_measured_numbers(pair):
    _, (first, _) = pair
    assert first["verdict"]["input_bound"] in ("moderate", "high")
    assert not [r for r in first["recommendations"] if r["kind"] == "speedup"]
    reason = first["no_recommendation_reason"]
    assert reason.startswith("Nothing to change in the DataLoader settings: the host's CPU was 100% busy, "
                             "other processes used 0.6 of the 1 core this process may use, this process 42%")
    assert "What would help instead: lighter or precomputed transforms" in reason
    assert first["regression"] is None  # the first run of its name
    for surface, text in _surfaces(first).items():
        if surface != "kpis":
            assert "other processes used 0.6 of the 1 core this process may use" in text, surface
            assert "not starved" not in text, surface


def test_the_slower_run_is_reported_slower_with_its_cause_on_every_surface(pair):
    runs, (first, second) = pair
    slower = second["regression"]
    assert slower["previous_run"] == runs[0]["id"]
    assert slower["speedup"] == pytest.approx(0.64, abs=0.01) and slower["interval"][1] < 1.0
    assert slower["cause"] == "compute per batch rose 2.0x (71 → 141 ms): the new workers compete with the training " \
                              "step for 1 core"
    assert second["answer"]["regression"] == slower["sentence"]
    for surface, text in _surfaces(second).items():
        if surface != "kpis":
            assert "36% slower than the previous run" in text and "compute per batch rose 2.0x" in text, surface
    # the runs list (its listed rates, noise floor only) and the compare page say the same drop
    assert runs[0]["regression"] is None and runs[1]["regression"]["speedup"] == pytest.approx(0.64, abs=0.01)
    assert comparison(first, second)["regression"]["sentence"] == slower["sentence"]
    # and the slower run's advice is to go back: fewer workers, as protection
    assert [(r["parameter"], r["suggested"], r["kind"]) for r in second["recommendations"]] == \
        [("num_workers", 1, "protective")]
