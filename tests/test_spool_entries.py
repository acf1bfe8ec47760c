"""Spool entries the sweep must not trust (issue 36 item 6): a FIFO named like a spool file
once blocked `serve` and `import` forever, and a 29 KB spool file inflated to 800 MiB while it
was parsed (the JSON bound of HTTP bodies did not apply). Now an entry that is not a regular
file is skipped and counted, and a spool file is held to the same count of JSON values."""
import gzip
import os
import subprocess
import sys

from tests.test_collector_api import batch


def _spool_file(root, run_id, stream, seq, data: bytes):
    path = root / "spool" / run_id / stream / f"{seq:012d}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_fifo_is_skipped_and_a_value_bomb_refused_by_import(tmp_path):
    import json
    root = tmp_path / "sw"
    good = _spool_file(root, "good-run", "s0", 1, gzip.compress(json.dumps(batch(run_id="good-run")).encode()))
    fifo = good.parent.parent.parent / "fifo-run" / "s0" / f"{1:012d}.json.gz"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    # 10 million `{}`: ~30 MB of text (within the inflated limit) from a ~30 KB file.
    bomb = gzip.compress(b"[" + b"{}," * 10_000_000 + b"{}]", 9)
    assert len(bomb) < 100_000
    _spool_file(root, "bomb-run", "s0", 1, bomb)
    out = subprocess.run([sys.executable, "-m", "starvewatch", "import", str(root / "spool"),
                          "--db", str(tmp_path / "x.db")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "imported 1 new batches" in out.stdout, out.stdout
    assert "1 entries that are not regular files skipped" in out.stdout, out.stdout
    assert "1 unreadable files set aside" in out.stdout, out.stdout
    reason = next((root / "rejected" / "bomb-run").rglob("*.reason")).read_text()
    assert "JSON values" in reason, reason
    assert fifo.exists()  # skipped, left where it is
