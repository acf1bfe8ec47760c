"""The spool's file format, a contract between the training process, which writes it
(hooks/delivery/transport.py), and the collector, which imports it (monitor/storage/spool_import.py).

    <dir>/spool/<run_id>/<stream>/<seq, 12 digits>.json.gz
    <dir>/spool/<run_id>/<stream>/<seq, 12 digits>-<first record, 12 digits>.json.gz

Each file is one event batch (schema.EVENTS_SCHEMA), or one part of a batch split to fit the
collector's limits (starvewatch/batch_parts.py; the second name), as gzip'ed JSON, written
atomically (a temporary file, then a rename), so a reader never sees half a batch. Names sort
in delivery order. A file is read within the same bound as an HTTP body (limits.py).
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path

from .limits import MAX_DECOMPRESSED_BYTES

SUFFIX = ".json.gz"
GLOB = f"*/*/*{SUFFIX}"  # under <dir>/spool: every stream of every run


class SpoolFileError(ValueError):
    """The file's content is not a readable batch (torn, corrupt, too large, not JSON)."""


def file_name(seq: int, first: int | None = None) -> str:
    return f"{seq:012d}{SUFFIX}" if first is None else f"{seq:012d}-{first:012d}{SUFFIX}"


def seq_of(name: str) -> int | None:
    """The batch sequence number in a spool file's name; None for another file."""
    head = name[:12]
    return int(head) if name.endswith(SUFFIX) and head.isdigit() else None


def inflate(data: bytes, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """gzip data, inflated without ever holding more than `max_bytes` of output."""
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decoder.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise SpoolFileError(f"not valid gzip: {exc}") from None
    if len(out) > max_bytes or decoder.unconsumed_tail:
        raise SpoolFileError(f"inflates past the limit of {max_bytes} bytes")
    if not decoder.eof:
        raise SpoolFileError("gzip data is truncated")
    return out


def read_spool_file(path: Path, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> dict:
    """One batch; OSError when the file cannot be read now, SpoolFileError when its content
    is not a batch."""
    with open(path, "rb") as f:
        raw = f.read(max_bytes + 65536)  # gzip never grows data by more than a few bytes per block
        if f.read(1):
            raise SpoolFileError(f"over the limit of {max_bytes} bytes")
    text = inflate(raw, max_bytes)
    try:
        batch = json.loads(text)
    except RecursionError:
        raise SpoolFileError("JSON nested too deeply") from None
    except ValueError as exc:
        raise SpoolFileError(f"not JSON: {exc}") from None
    if not isinstance(batch, dict):
        raise SpoolFileError(f"a JSON {type(batch).__name__}, not a batch object")
    return batch
