"""The spool's file format, a contract between the training process, which writes it
(hooks/delivery/transport.py), and the collector, which imports it (monitor/spool_import.py).

    <dir>/spool/<run_id>/<stream>/<seq, 12 digits>.json.gz

Each file is one event batch (schema.EVENTS_SCHEMA) as gzip'ed JSON, written atomically
(a temporary file, then a rename), so a reader never sees half a batch.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

SUFFIX = ".json.gz"
GLOB = f"*/*/*{SUFFIX}"  # under <dir>/spool: every stream of every run


def file_name(seq: int) -> str:
    return f"{seq:012d}{SUFFIX}"


def read_spool_file(path: Path) -> dict:
    with open(path, "rb") as f:
        return json.loads(gzip.decompress(f.read()))
