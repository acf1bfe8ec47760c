"""Issue 24, item 5: any name. A run or script name in any script keeps its text as the run's
name; the id made from it is ASCII (ids.safe_id, the one function that makes ids), so the
collector never refuses a batch for its name."""
import csv
import io
import os
import subprocess
import sys
import textwrap

import pytest

from starvewatch.ids import ID_PATTERN, id_problem, safe_id, url_segment
from starvewatch.hooks.identity import run_id_for

UNICODE_NAMES = ["entraînement", "训练", "обучение", "naïve café", "🚀 run", "a/b\\c", "...", "Ελληνικά-1"]


@pytest.mark.parametrize("name", UNICODE_NAMES)
def test_run_ids_from_any_name_are_valid_ascii_ids(name, monkeypatch):
    single = run_id_for(name)
    assert id_problem(single) is None and single.isascii(), single
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    shared = run_id_for(name)
    assert id_problem(shared) is None and shared.isascii() and shared == run_id_for(name), shared


def test_accents_fold_to_letters_and_different_names_stay_apart():
    assert safe_id("entraînement").startswith("entrainement-")
    assert safe_id("entraînement") != safe_id("entrainement") == "entrainement"
    assert safe_id("训练") != safe_id("обучение")  # nothing of either survives: the hash parts
    assert run_id_for("entraînement").startswith("entrainement-")
    assert safe_id("x" * 300, "tail", prefix_chars=40) == "x" * 40 + "-tail"
    assert id_problem(safe_id("é" * 300, "t" * 200)) is None  # even a long tail stays an id


SCRIPT = """
import starvewatch, torch
from torch.utils.data import DataLoader, TensorDataset

loader = starvewatch.watch(DataLoader(TensorDataset(torch.arange(40.0)), batch_size=2), name="données")
for (x,) in loader:
    x.sum()
from starvewatch.hooks.session import current_session
run_id = current_session().run_id
starvewatch.finish()
print("RUN", run_id)
"""


def test_a_script_named_with_accents_is_stored_under_its_name(collector, tmp_path):
    c = collector()
    script = tmp_path / "entraînement.py"
    script.write_text(textwrap.dedent(SCRIPT), encoding="utf-8")
    env = {**os.environ, "STARVEWATCH_URL": c.url, "STARVEWATCH_DIR": str(tmp_path / "client")}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_id] = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("RUN ")]
    assert id_problem(run_id) is None and run_id.startswith("entrainement-"), run_id
    [run] = c.get("/api/v1/runs")["runs"]
    assert (run["id"], run["name"]) == (run_id, "entraînement")
    status, body = c.request("GET", f"/api/v1/runs/{url_segment(run_id)}/export?format=csv")
    assert status == 200
    rows = list(csv.DictReader(io.StringIO(body.decode("utf-8"))))
    assert len(rows) == 20 and {r["loader"] for r in rows} == {"données"}, rows[:2]
    rejected = tmp_path / "client" / "rejected"
    assert not rejected.exists() or not any(rejected.rglob("*")), list(rejected.rglob("*"))
