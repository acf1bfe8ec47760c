"""One CSV export, whichever way it is asked for: `starvewatch export -f csv` against a running
collector, the collector's API and the offline export (--db) write the same bytes, rolled-up
spans (storage budget, monitor/budget/retention.py) as their marked buckets."""
import csv
import io
import os
import re
import subprocess
import sys

import pytest

from starvewatch.monitor.budget import retention
from tests.test_collector_api import batch, post
from tests.test_storage_budget import app_client
from tests.summary_v1 import as_old

LOADER = "tràin, \"a\""  # a comma, quotes and a two-byte character: quoted cells
STEPS = 12 * 1000


def folded_database(directory):
    """A finished one-rank run of 12,000 steps (one waits 400 ms), its oldest steps folded into
    rollups, in the database a collector started on `directory` opens."""
    with app_client(directory) as client:
        for i in range(12):
            payload = batch(seq=i + 1, n=1000, step0=i * 1000, status="finished" if i == 11 else "live")
            payload["steps"]["loader"] = [LOADER] * 1000
            payload["loaders"][0]["name"] = LOADER
            if i == 0:
                payload["steps"]["wait_ns"][7] = 400_000_000
            assert post(client, payload).status_code == 200
        store = client.app.state.store
        store.retention.raw_window_steps = 2000
        store.retention.max_bytes = retention.file_bytes(store.path) // 3
        assert store.retention.enforce_now()["steps"] > 0
        return store.path


def cli_bytes(*args, url):
    env = dict(os.environ, STARVEWATCH_URL=url)
    done = subprocess.run([sys.executable, "-m", "starvewatch", *args], capture_output=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout, done.stderr.decode()


def test_cli_export_against_a_running_collector_equals_the_api_csv_with_marked_buckets(
        collector, isolated_starvewatch, tmp_path):
    db_path = folded_database(isolated_starvewatch)
    c = collector()
    status, api_csv = c.request("GET", "/api/v1/runs/run-a/export?format=csv")
    assert status == 200

    printed, _ = cli_bytes("export", "run-a", "-f", "csv", url=c.url)
    out_file = tmp_path / "run.csv"
    _, said = cli_bytes("export", "run-a", "-f", "csv", "-o", str(out_file), url=c.url)
    # Offline: the database read into a private copy (no collector asked).
    offline, _ = cli_bytes("export", "run-a", "-f", "csv", "--db", str(db_path), url="http://127.0.0.1:9")
    assert printed == api_csv
    assert out_file.read_bytes() == api_csv
    assert offline == api_csv

    rows = list(csv.DictReader(io.StringIO(api_csv.decode("utf-8"), newline="")))
    assert re.search(rf"\({len(rows)} rows\)", said), said
    kinds = {row["kind"] for row in rows}
    assert kinds == {"bucket", "exemplar", "step"}
    assert {row["loader"] for row in rows} == {LOADER}
    buckets = [row for row in rows if row["kind"] == "bucket"]
    steps = [row for row in rows if row["kind"] == "step"]
    assert all(row["step"] == "" and row["bucket_s"] == "1" and int(row["bucket_steps"]) > 0 for row in buckets)
    assert sum(int(row["bucket_steps"]) for row in buckets) + len(steps) == STEPS
    assert ("7", "400.0") in {(row["step"], row["wait_ms"]) for row in rows if row["kind"] == "exemplar"}


def test_an_unknown_run_is_a_clear_error_not_a_traceback(collector, isolated_starvewatch):
    """A run deleted between resolving its id and streaming its CSV."""
    from starvewatch.monitor.storage.sources import RemoteSource, SourceError
    c = collector()
    source = RemoteSource(c.url)
    try:
        with pytest.raises(SourceError, match=r"unknown run .*starvewatch runs"):
            next(iter(source.csv_chunks("no-such-run")))
    finally:
        source.close()


def test_chunks_split_anywhere_are_written_whole_and_rows_counted_by_a_csv_reader():
    """The collector's chunks arrive as the network cuts them: inside a character, inside a
    quoted cell that holds a line break."""
    from starvewatch.monitor.outputs.export import write_csv_chunks
    text = 'run,loader\r\nr,"a\r\nb"\r\nr,tràin\r\nr,"x,""y"""\r\n'
    data = text.encode()
    for cut in range(1, len(data)):
        out = io.StringIO(newline="")
        assert write_csv_chunks([data[:cut], data[cut:]], out) == 3
        assert out.getvalue() == text
    out = io.StringIO(newline="")
    assert write_csv_chunks([data[i:i + 1] for i in range(len(data))], out) == 3 and out.getvalue() == text
    assert write_csv_chunks([], io.StringIO()) == 0


def test_offline_export_of_a_database_from_the_previous_version(tmp_path):
    """The offline export reads a private copy of the database: the copy gets every migration
    the collector would run (it once got only the storage budget's, and failed on a missing
    table)."""
    import json
    import shutil
    from pathlib import Path
    db = tmp_path / "old.db"
    data = Path(__file__).parent / "data"
    shutil.copy(data / "main-schema-v1.db", db)
    pristine = db.read_bytes()
    old_summary = json.loads((data / "main-schema-v1.summary.json").read_text())["summary"]
    printed, _ = cli_bytes("export", "old-run", "-f", "csv", "--db", str(db), url="http://127.0.0.1:9")
    rows = list(csv.DictReader(io.StringIO(printed.decode("utf-8"), newline="")))
    assert len(rows) == 6000 and {row["kind"] for row in rows} == {"step"}
    summary = json.loads(cli_bytes("export", "old-run", "-f", "json", "--db", str(db), url="http://127.0.0.1:9")[0])
    summary, expected = as_old(summary, old_summary)  # every field the old summary had
    assert summary["loaders"] == expected["loaders"] and summary["verdict"] == expected["verdict"]
    report, _ = cli_bytes("export", "old-run", "-f", "html", "--db", str(db), url="http://127.0.0.1:9")
    assert b"wait vs compute per step" in report
    assert db.read_bytes() == pristine  # the user's file is left as it was
