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

import errno
import json
import os
import stat
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


class NotRegularFile(OSError):
    """A spool entry that is not a regular file (a FIFO, a device, a symlink): never opened for
    reading, which could block the sweep forever (a FIFO has no writer)."""


def read_spool_file(path: Path, max_bytes: int = MAX_DECOMPRESSED_BYTES, text_problem=None) -> dict:
    """One batch; OSError when the file cannot be read now (NotRegularFile: never), and
    SpoolFileError when its content is not a batch. `text_problem(text)`: a reason to refuse
    the inflated text before it is parsed (the collector's count of JSON values, as for HTTP)."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer returns at once instead of waiting.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(f"{path} is a symbolic link") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        raw = f.read(max_bytes + 65536)  # gzip never grows data by more than a few bytes per block
        if f.read(1):
            raise SpoolFileError(f"over the limit of {max_bytes} bytes")
    text = inflate(raw, max_bytes)
    problem = text_problem(text) if text_problem is not None else None
    if problem is not None:
        raise SpoolFileError(problem)
    try:
        batch = json.loads(text)
    except RecursionError:
        raise SpoolFileError("JSON nested too deeply") from None
    except ValueError as exc:
        raise SpoolFileError(f"not JSON: {exc}") from None
    if not isinstance(batch, dict):
        raise SpoolFileError(f"a JSON {type(batch).__name__}, not a batch object")
    return batch
