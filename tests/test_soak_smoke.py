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
    # The RSS over time, summed up: the figures are the samples' own.
    samples, trend = result["rss"]["collector_bytes"], result["collector_rss"]
    assert trend["start_bytes"] == samples[0] and trend["end_bytes"] == samples[-1]
    assert trend["max_bytes"] == max(samples) and trend["plateau_bytes"] in samples[len(samples) // 2:]
    assert isinstance(trend["slope_second_half_bytes_per_h"], float)
    assert len(result["rss"]["load_1m"]) == len(samples) and len(result["load_average_end"]) == 3
    assert "0 lost, 0 doubled" in run.stdout


def test_the_soak_trend_tells_a_plateau_from_a_leak():
    import importlib.util
    spec = importlib.util.spec_from_file_location("soak", ROOT / "benchmarks" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    t = [5.0 * i for i in range(40)]  # 200 s
    mib = 2**20
    plateau = [100 * mib + min(i, 10) * 5 * mib for i in range(40)]  # +50 MiB in 50 s, then flat
    leak = [100 * mib + i * mib for i in range(40)]  # +1 MiB every 5 s: 720 MiB/h
    flat, growing = soak.rss_trend(t, plateau), soak.rss_trend(t, leak)
    assert flat["slope_second_half_bytes_per_h"] == 0.0 and flat["plateau_bytes"] == 150 * mib
    assert flat["slope_first_half_bytes_per_h"] > 100 * mib
    assert abs(growing["slope_second_half_bytes_per_h"] - 720 * mib) < 1e-3 * mib
    assert growing["start_bytes"] == 100 * mib and growing["end_bytes"] == growing["max_bytes"] == 139 * mib
