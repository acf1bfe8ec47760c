"""The soak benchmark, for a few seconds: it runs, and nothing is lost or doubled."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_soak_smoke_loses_and_doubles_nothing(tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--seconds", "3",
                          "--clients", "3", "--sample-s", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    producers = result["producers"]
    assert sorted(p["kind"] for p in producers.values()) == ["http client"] * 3 + ["training"] * 2
    # Every producer did real work, and the collector stored each record exactly once.
    assert all(p["run"] > 500 for p in producers.values()), producers
    assert {run_id: p["stored"] for run_id, p in producers.items()} == \
        {run_id: p["run"] for run_id, p in producers.items()}
    assert result["records_lost"] == result["records_doubled"] == 0
    assert result["page_s"]["polls"] >= 2 and result["page_s"]["errors"] == []
    assert len(result["rss"]["collector_bytes"]) >= 3 and min(result["rss"]["collector_bytes"]) > 0
    assert "0 lost, 0 doubled" in run.stdout
