"""A bad spool file never stops the collector (issue 27 item 3), and an older oversized one is
split, not refused (issue 26 item 1): whatever a file holds, it is set aside in rejected/ with
its reason and counted in its run's account, the sweep goes on to the next file, `serve`
starts, and `import` inflates within the same bound as an HTTP body."""
import gzip
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.spool_import import SpoolImporter
from starvewatch.monitor.storage.store import Store
from tests.conftest import wait_until


def batch(run_id: str, stream: str, seq: int, n: int, first_step: int = 0) -> dict:
    return {"schema": "starvewatch.events/1", "run_id": run_id, "stream": stream, "seq": seq,
            "loaders": [{"name": "train", "totals": {"steps": first_step + n, "epochs": 1}}],
            "steps": {"loader": ["train"] * n, "epoch": [0] * n, "step": list(range(first_step, first_step + n)),
                      "start_ns": [10**18 + i * 10**6 for i in range(first_step, first_step + n)],
                      "wait_ns": [1000] * n, "compute_ns": [2000] * n, "other_ns": [0] * n,
                      "batch_size": [8] * n, "gpu_idle_ns": [None] * n}}


def write(spool, run_id, stream, seq, data: bytes):
    path = spool / run_id / stream / f"{seq:012d}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def truncated_gzip() -> bytes:
    return gzip.compress(json.dumps(batch("bad", "s", 1, 50)).encode())[:-30]


def corrupt_deflate() -> bytes:
    data = bytearray(gzip.compress(json.dumps(batch("bad", "s", 1, 500)).encode()))
    data[40:60] = b"\xff" * 20  # the deflate stream, past the 10-byte gzip header
    return bytes(data)


def deeply_nested() -> bytes:
    return gzip.compress(b'{"schema": "starvewatch.events/1", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")


def bomb() -> bytes:
    """256 MiB of zeros in about 255 KB: over the 32 MiB an HTTP body may inflate to."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"0" * (1 << 20)
    return b"".join([compressor.compress(chunk) for _ in range(256)] + [compressor.flush()])


BAD = {"truncated gzip": truncated_gzip, "corrupt deflate": corrupt_deflate, "deep JSON": deeply_nested}


def steps_of(store, run_id) -> list[int]:
    return sorted(row[3] for rows in store.step_rows(run_id) for row in rows)


@pytest.mark.parametrize("kind", list(BAD))
def test_a_bad_file_is_set_aside_counted_and_the_next_file_imported(kind, tmp_path):
    spool = tmp_path / "spool"
    content = BAD[kind]()
    bad = write(spool, "bad-run", "s", 1, content)
    write(spool, "good-run", "s", 1, gzip.compress(json.dumps(batch("good-run", "s", 1, 30)).encode()))
    store = Store(tmp_path / "db.sqlite")
    importer = SpoolImporter(store, spool)
    assert importer.scan() == 1  # the valid file after it
    assert steps_of(store, "good-run") == list(range(30))
    assert not bad.exists()
    kept = tmp_path / "rejected" / "bad-run" / "s" / bad.name
    assert kept.read_bytes() == content  # set aside as it was, for a bug report
    reason = (kept.parent / (bad.name + ".reason")).read_text()
    assert reason.strip()
    # Counted in its run's account, shown with the run.
    account = Query(store).summary("bad-run")["delivery"]
    assert [f["file"] for f in account["rejected_files"]] == [str(kept)]
    assert importer.scan() == 0 and importer.rejected_files == [str(kept)]  # not met again
    store.close()


def test_serve_starts_over_bad_files_and_a_running_sweep_goes_on(collector, isolated_starvewatch):
    spool = isolated_starvewatch / "spool"
    for i, make in enumerate(BAD.values(), start=1):
        write(spool, "bad-run", f"s{i}", 1, make())
    write(spool, "good-run", "s", 1, gzip.compress(json.dumps(batch("good-run", "s", 1, 20)).encode()))
    c = collector()
    assert c.get("/api/v1/runs/good-run/summary")["loaders"][0]["steps"] == 20
    detail = c.get("/api/v1/runs/bad-run")
    assert len(detail["delivery"]["rejected_files"]) == 3
    # While it runs: another bad file, then a valid one; the sweep (every 5 s) takes the valid one.
    write(spool, "bad-run", "s9", 1, truncated_gzip())
    write(spool, "later-run", "later", 1, gzip.compress(json.dumps(batch("later-run", "later", 1, 7)).encode()))
    wait_until(lambda: c.request("GET", "/api/v1/runs/later-run/summary")[0] == 200, timeout_s=30,
               what="the valid file after a bad one to be swept in")
    assert c.get("/api/v1/runs/later-run/summary")["loaders"][0]["steps"] == 7
    wait_until(lambda: len(c.get("/api/v1/runs/bad-run")["delivery"]["rejected_files"]) == 4, timeout_s=30,
               what="the fourth bad file counted")
    assert c.proc.poll() is None


IMPORT_PEAK = r"""
import sys
from starvewatch.cli import main
code = main(sys.argv[1:])
# VmHWM, this process's own peak RSS, not getrusage's ru_maxrss: Linux carries the parent's peak
# RSS into a child it forks (or vforks, as subprocess does) and execs, so under a pytest process
# grown past 220 MiB by earlier tests ru_maxrss read that process's peak, not the import's.
with open("/proc/self/status") as status:
    print("peak_rss_kib", next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")))
sys.exit(code)
"""


def import_peak_mib(source: Path, here: Path) -> tuple[float, str]:
    """`starvewatch import source --dir here` in a fresh interpreter: its peak RSS, and its stdout."""
    out = subprocess.run([sys.executable, "-c", IMPORT_PEAK, "import", str(source), "--dir", str(here)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.stdout, out.stderr)
    return int(out.stdout.split("peak_rss_kib")[1]) / 1024, out.stdout


def test_import_inflates_within_the_http_bound_and_goes_on(tmp_path):
    from starvewatch.limits import MAX_DECOMPRESSED_BYTES
    good = gzip.compress(json.dumps(batch("good-run", "s", 1, 12)).encode())
    # The baseline: the same command over the valid file alone (the interpreter, its imports, SQLite).
    baseline = tmp_path / "baseline" / "spool"
    write(baseline, "good-run", "s", 1, good)
    baseline_mib, _ = import_peak_mib(baseline.parent, tmp_path / "baseline-here")
    source = tmp_path / "elsewhere" / "spool"
    write(source, "bomb-run", "s", 1, bomb())  # listed first: the bomb is read before the valid file
    write(source, "good-run", "s", 1, good)
    peak_mib, stdout = import_peak_mib(source.parent, tmp_path / "here")
    assert "imported 1 new batches" in stdout and "1 unreadable files set aside" in stdout, stdout
    # Within the bound, the bomb costs the 32 MiB it may inflate to, and once more while CPython
    # joins zlib's output blocks into one bytes (about 52 MiB measured); inflating it whole would
    # cost 256 MiB at least.
    bound_mib = 3 * MAX_DECOMPRESSED_BYTES / 2**20
    assert peak_mib - baseline_mib < bound_mib, (peak_mib, baseline_mib)
    store = Store(tmp_path / "here" / "starvewatch.db")
    assert steps_of(store, "good-run") == list(range(12))
    assert "inflates past the limit" in store.rejected_files("bomb-run")[0]["reason"]
    store.close()


def test_an_older_oversized_spool_file_is_split_not_rejected(tmp_path):
    """Hooks before the limits were shared wrote batches of any size; the collector refused
    more than 50,000 records per list and renamed the file `.rejected`, telling no one."""
    from starvewatch.limits import MAX_STEP_RECORDS
    n = MAX_STEP_RECORDS + 10_001
    spool = tmp_path / "spool"
    write(spool, "big-run", "s", 1, gzip.compress(json.dumps(batch("big-run", "s", 1, n)).encode(), 1))
    store = Store(tmp_path / "db.sqlite")
    importer = SpoolImporter(store, spool)
    assert importer.scan() == 1 and importer.rejected_files == []
    assert steps_of(store, "big-run") == list(range(n))
    assert Query(store).summary("big-run")["loaders"][0]["steps"] == n
    store.close()


# ---- fuzzed spool files (the hypothesis profile of tests/test_fuzz_api.py: STARVEWATCH_FUZZ) ----
import os  # noqa: E402

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_PROFILE = os.environ.get("STARVEWATCH_FUZZ", "fast")
_EXAMPLES = int(os.environ.get("STARVEWATCH_FUZZ_EXAMPLES") or {"fast": 25, "long": 1000}[_PROFILE])
_FUZZ = settings(max_examples=_EXAMPLES, deadline=None, database=None, derandomize=_PROFILE == "fast",
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                                  max_size=5), max_leaves=30)


def _mangled(draw_batch: dict, how: str, data) -> bytes:
    raw = json.dumps(draw_batch).encode()
    if how == "cut":
        packed = gzip.compress(raw)
        return packed[:data.draw(st.integers(0, len(packed) - 1))]
    if how == "flip":
        packed = bytearray(gzip.compress(raw))
        at = data.draw(st.integers(10, len(packed) - 1))
        packed[at] ^= data.draw(st.integers(1, 255))
        return bytes(packed)
    if how == "field":
        broken = dict(draw_batch)
        broken[data.draw(st.sampled_from(["steps", "seq", "run", "samples", "part", "loaders", "phases"]))] = \
            data.draw(_json)
        return gzip.compress(json.dumps(broken).encode())
    return gzip.compress(json.dumps(data.draw(_json)).encode())


@_FUZZ
@given(data=st.data())
def test_whatever_a_spool_file_holds_the_sweep_goes_on(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fuzz-spool")
    spool = tmp / "spool"
    how = data.draw(st.sampled_from(["cut", "flip", "field", "any"]))
    bad = write(spool, "fuzz-run", "a", 1, _mangled(batch("fuzz-run", "a", 1, 40), how, data))
    write(spool, "fuzz-run", "b", 1, gzip.compress(json.dumps(batch("fuzz-run", "b", 1, 9)).encode()))
    store = Store(tmp / "db.sqlite")
    importer = SpoolImporter(store, spool)
    importer.scan()  # never raises
    try:
        assert not bad.exists()  # imported, or set aside with its reason
        if importer.rejected_files:
            kept = Path(importer.rejected_files[0])
            assert kept.exists() and kept.with_name(kept.name + ".reason").exists()
            assert len(store.rejected_files("fuzz-run")) == 1
        stored = steps_of(store, "fuzz-run")
        # The valid file is imported; the other adds its 40 steps or none (refused, or a field
        # replaced by an empty but valid value).
        assert len(stored) == 9 if importer.rejected_files else len(stored) in (9, 49)
        assert set(range(9)) <= set(stored)
    finally:
        store.close()


def test_a_running_process_counts_its_file_set_aside_by_the_sweep_as_dropped(tmp_path):
    """`acknowledged` means stored: a spooled file the collector's sweep took but could not
    ingest is not acknowledged by the process that wrote it; the run's account counts it once."""
    from starvewatch.hooks.delivery.transport import Delivery, Spool
    directory = tmp_path / "spool" / "mixed-run" / "w1"
    offline = Delivery(None, Spool(directory, 2**24))
    good = batch("mixed-run", "w1", 1, 30)
    bad = dict(batch("mixed-run", "w1", 2, 20, first_step=30), phases=[["train", 0, 1, "load", -5]])  # invalid
    good["delivery"] = {"acknowledged": 0, "spooled": 0, "dropped": {}}
    offline.deliver(good)
    offline.deliver(bad)
    assert offline.account() == {"acknowledged": 0, "spooled": 50, "dropped": {}}
    store = Store(tmp_path / "db.sqlite")
    importer = SpoolImporter(store, tmp_path / "spool")
    assert importer.scan() == 1 and len(importer.rejected_files) == 1
    assert offline.account() == {"acknowledged": 30, "spooled": 0, "dropped": {"unreadable_spool": 20}}
    account = Query(store).summary("mixed-run")["delivery"]
    assert account["dropped"] == {"unreadable_spool": 20} and len(account["rejected_files"]) == 1
    store.close()


def test_an_offline_view_of_a_spool_moves_nothing(tmp_path):
    from starvewatch.monitor.storage.sources import LocalSource
    spool = tmp_path / "spool"
    content = truncated_gzip()
    bad = write(spool, "bad-run", "s", 1, content)
    write(spool, "good-run", "g", 1, gzip.compress(json.dumps(batch("good-run", "g", 1, 5)).encode()))
    source = LocalSource.offline(spool=spool)
    assert source.store.loader_data("good-run")[0].totals.steps == 5
    assert bad.read_bytes() == content and not (tmp_path / "rejected").exists()


def test_the_run_page_banner_shows_files_set_aside():
    from starvewatch.dashboard import views
    files = [{"stream": "s", "file": "/d/rejected/r/s/000000000001.json.gz", "reason": "SpoolFileError: truncated",
              "records": None}]
    only_files = views.delivery_banner({"delivery": {"acknowledged": 5, "spooled": 0, "dropped": {},
                                                     "rejected_files": files}})
    assert "1 spool file of this run could not be read" in only_files.children
    assert "000000000001.json.gz: SpoolFileError: truncated" in only_files.children
    with_drops = views.delivery_banner({"delivery": {"acknowledged": 5, "spooled": 0,
                                                     "dropped": {"unreadable_spool": 20},
                                                     "rejected_files": files * 2}})
    assert "dropped 20 step records" in with_drops.children
    assert with_drops.children.endswith("2 spool files set aside as unreadable.")
