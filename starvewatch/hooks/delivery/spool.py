"""The spool: a bounded directory of pending batches of one process stream (the format is
starvewatch/spool_format.py), replayed in order by `Delivery` (transport.py) and swept in by
the collector."""
from __future__ import annotations

import gzip
import logging
import os
from pathlib import Path

from ...logonce import RateLimitedLog
from ...spool_format import SUFFIX, file_name, read_spool_file

_spool_errors = RateLimitedLog(logging.getLogger("starvewatch.delivery"))


class Spool:
    """A bounded directory of pending batches for one process stream.

    It keeps an index of its files (bytes, records) so that its bound and the account's
    `spooled` figure stay true when the collector's sweep ingests and deletes files: a file
    that vanished was taken by the collector."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.dropped_payloads = 0
        self.dropped_records = 0
        self.vanished_records = 0  # in files the collector's sweep took: acknowledged
        # Which files were counted so, and their records: a file the replay was sending when the
        # sweep took it is acknowledged by the replay, and must not count twice (delivered()).
        self._vanished: dict[str, int] = {}
        self._index: dict[str, tuple[int, int]] | None = None  # file name -> (bytes, records)
        # Whether files may be waiting: kept in memory, so a healthy delivery never lists the
        # directory (each syscall on the shipper thread costs the training thread a GIL switch).
        # The collector can ingest the spool itself, so True is a hint that replay corrects.
        self._maybe_pending: bool | None = None

    @property
    def maybe_pending(self) -> bool:
        if self._maybe_pending is None:
            self._maybe_pending = bool(self._files())
        return self._maybe_pending

    def _files(self) -> list[Path]:
        try:
            return sorted(p for p in self.directory.iterdir() if p.name.endswith(SUFFIX))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError:
            return []

    def _known(self) -> dict[str, tuple[int, int]]:
        if self._index is None:
            self._index = {}
            self._reconcile(self._files())
        return self._index

    def _reconcile(self, files: list[Path]) -> None:
        """Files that vanished leave the index (the collector took them); files another
        process wrote (a sidecar before a take-over) join it, their records counted once."""
        index = self._index if self._index is not None else {}
        self._index = index
        names = {p.name for p in files}
        for name in [n for n in index if n not in names]:
            self._count_vanished(name, index.pop(name)[1])
        for path in files:
            if path.name not in index:
                try:
                    index[path.name] = (path.stat().st_size, _records_in(read_spool_file(path)))
                except (OSError, ValueError):
                    continue

    def pending(self) -> list[Path]:
        files = self._files()
        self._known()
        self._reconcile(files)
        self._maybe_pending = bool(files)
        return files

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self._known().values())

    @property
    def records(self) -> int:
        """Step records in the spool's files now (the account's `spooled`)."""
        if self._index is None and not self.maybe_pending:
            return 0
        if self._maybe_pending:
            self.pending()  # the sweep may have taken some
        return sum(records for _, records in self._known().values())

    def write(self, seq: int, body: bytes, records: int) -> None:
        """Raises OSError when the file cannot be written (a full or read-only disk)."""
        data = gzip.compress(body, compresslevel=1)
        self._make_room(len(data))
        final = self.directory / file_name(seq)
        tmp = final.with_suffix(".tmp")
        try:
            try:
                f = open(tmp, "wb")
            except FileNotFoundError:  # the first write, or the directory was removed (an import)
                self.directory.mkdir(parents=True, exist_ok=True)
                f = open(tmp, "wb")
            with f:
                f.write(data)
            os.replace(tmp, final)  # atomic: a reader never sees half a batch
        except OSError:
            try:
                tmp.unlink()  # a partial file on a full disk would hold space for nothing
            except OSError:
                pass
            raise
        self._known()[final.name] = (len(data), records)
        self._maybe_pending = True

    def _make_room(self, incoming: int) -> None:
        index = self._known()
        if self.bytes + incoming <= self.max_bytes:
            return
        self.pending()  # the collector's sweep may have made room already
        for path in self._files():  # oldest first
            if self.bytes + incoming <= self.max_bytes:
                break
            size, records = index.get(path.name, (0, 0))
            try:
                path.unlink()
            except FileNotFoundError:  # swept meanwhile: the collector has it
                self._count_vanished(path.name, records)
                index.pop(path.name, None)
                continue
            except OSError as exc:
                _spool_errors.error("make-room", "starvewatch: spool file %s cannot be removed to make room "
                                    "(%s); the spool may outgrow its limit", path, exc)
                continue
            index.pop(path.name, None)
            self.dropped_payloads += 1
            self.dropped_records += records

    def remove(self, path: Path) -> int:
        """Remove a file that was delivered; returns its records (0 when it was already gone)."""
        entry = self._known().pop(path.name, None)
        try:
            path.unlink()
        except OSError:  # already gone (the collector's sweep), or a read-only directory
            pass
        return entry[1] if entry else 0

    def _count_vanished(self, name: str, records: int) -> None:
        self.vanished_records += records
        if len(self._vanished) >= 10_000:  # only the latest matter: a replay settles at once
            self._vanished.clear()
        self._vanished[name] = records

    def delivered(self, path: Path) -> None:
        """The replay sent this file and the collector acknowledged it (the caller counts its
        records as acknowledged): it leaves the spool. When the collector's sweep took the file
        meanwhile and a reconcile counted it as vanished, that count is taken back, so the
        records are acknowledged once."""
        if self._known().pop(path.name, None) is None:
            self.vanished_records -= self._vanished.pop(path.name, 0)
        try:
            path.unlink()
        except OSError:  # already gone (the collector's sweep), or a read-only directory
            pass

    def forget(self, path: Path) -> int:
        """A file moved elsewhere (rejected/): out of the index; returns its records."""
        entry = self._known().pop(path.name, None)
        return entry[1] if entry else 0


def _records_in(payload: dict) -> int:
    return len(payload.get("steps", {}).get("step", ()))
