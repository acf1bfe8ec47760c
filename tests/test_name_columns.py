"""A batch's columns of names (the step records' loaders, the phases' loaders and names) are
checked and cleaned once per distinct name (issue 41: one by one they were half of the
collector's work on a 20,000-step batch), with the same rules as every other name."""
import csv
import io
import json
import time

import pytest
from pydantic import ValidationError

from starvewatch.monitor.web.wire_models import EventBatch
from tests.test_security import JSON, call

N = 20_000


def batch(run_id: str, loaders: list[str], phases=()) -> dict:
    now = time.time_ns()
    return {"schema": "starvewatch.events/1", "run_id": run_id, "stream": f"{run_id}-s", "seq": 1,
            "loaders": [{"name": "train", "totals": {"steps": N}}],
            "steps": {"loader": loaders, "epoch": [0] * N, "step": list(range(N)),
                      "start_ns": [now - (N - i) * 1000 for i in range(N)], "wait_ns": [5] * N,
                      "compute_ns": [7] * N, "other_ns": [0] * N, "batch_size": [1] * N,
                      "gpu_idle_ns": [None] * N},
            "phases": list(phases)}


def test_a_column_of_names_is_stored_cleaned_record_by_record(collector):
    c = collector()
    # Two loaders interleaved, one name with a zero-width space and a right-to-left override.
    loaders = ["train" if i % 3 else "va\u200bl\u202e" for i in range(N)]
    status, _, body = call(c, "POST", "/api/v1/ingest", JSON, json.dumps(batch("names", loaders)).encode())
    assert status == 200, body
    _, _, export = call(c, "GET", "/api/v1/runs/names/export?format=csv")
    rows = list(csv.DictReader(io.StringIO(export.decode())))
    assert len(rows) == N
    # each record keeps its own loader, cleaned as a single name would be
    assert [r["loader"] for r in sorted(rows, key=lambda r: int(r["step"]))] == \
        ["train" if i % 3 else "va l" for i in range(N)]


def test_an_invalid_name_in_a_column_refuses_the_batch_as_invalid_naming_it(collector):
    """422 (invalid: set aside by the sender), not 413 (which asks it to split a batch that no
    split can make valid), and nothing of it stored."""
    c = collector()
    loaders = ["train"] * (N - 1) + ["x" * 201]
    status, _, body = call(c, "POST", "/api/v1/ingest", JSON, json.dumps(batch("too-long", loaders)).encode())
    assert status == 422, body
    assert b"xxxxxxxx" in body and b"at most 200" in body
    assert call(c, "GET", "/api/v1/runs/too-long")[0] == 404


def test_phase_names_are_checked_and_cleaned_once_each():
    phases = [["train", 0, k, "forward\u200b" if k % 2 else "backward", 10] for k in range(1000)]
    parsed = EventBatch.model_validate(batch("phases", ["train"] * N, phases))
    assert {p[3] for p in parsed.phases} == {"forward", "backward"}
    assert [p[2] for p in parsed.phases] == list(range(1000))
    with pytest.raises(ValidationError, match="yyyy.*at most 200"):
        EventBatch.model_validate(batch("phases", ["train"] * N, phases + [["train", 0, 0, "y" * 201, 1]]))
    with pytest.raises(ValidationError, match="valid string"):
        EventBatch.model_validate(batch("phases", ["train"] * N, [["train", 0, 0, 5, 1]]))
