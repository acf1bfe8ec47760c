"""Wrote tests/data/main-schema-v3.db(.gz) and its summary with the code before sample folding:
    git archive <commit> starvewatch | tar -x -C /tmp/v3src
    PYTHONPATH=/tmp/v3src:$PWD python tests/data/make_main_schema_v3.py tests/data && gzip -9 -n tests/data/main-schema-v3.db
"""
import json
import pathlib
import shutil
import sqlite3
import sys
import tempfile

import starvewatch
assert starvewatch.__file__.startswith("/tmp/v3src"), starvewatch.__file__
from fastapi.testclient import TestClient
from starvewatch.monitor.web.app import create_app
from starvewatch.monitor.web.collector_settings import CollectorSettings
from starvewatch.monitor.storage.store import SCHEMA_VERSION
assert SCHEMA_VERSION == 3
from tests.test_collector_api import post
from tests.sample_payloads import sample_batch, T0_S
tmp = pathlib.Path(tempfile.mkdtemp())
settings = CollectorSettings(dir=tmp, dashboard=False, spool_scan_s=60, lost_after_s=10**6)
with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
    for i in range(3):
        for rank in (0, 1):
            assert post(client, sample_batch(rank, i + 1, T0_S + i * 3600, 3600, 30, run_id="old-run",
                                             status="finished" if i == 2 else "live", cores=2)).status_code == 200
    summary = client.get("/api/v1/runs/old-run/summary").json()
    memory = client.get("/api/v1/runs/old-run/workers/memory").json()
    store = client.app.state.store
    store._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)"); store._writer.execute("VACUUM")
out = pathlib.Path(sys.argv[1])
shutil.copy(tmp / "starvewatch.db", out / "main-schema-v3.db")
(out / "main-schema-v3.summary.json").write_text(json.dumps({"summary": summary}, indent=1))
db = sqlite3.connect(out / "main-schema-v3.db")
print(db.execute("select value from meta where key='schema_version'").fetchone(), db.execute("select count(*) from events").fetchone(), (out / "main-schema-v3.db").stat().st_size)
