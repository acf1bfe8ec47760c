"""The spool: a bounded directory of pending batches of one process stream (the format is
starvewatch/spool_format.py), replayed in order by `Delivery` (transport.py) and swept in by
the collector."""
from __future__ import annotations

import gzip
import logging
import os
from pathlib import Path

from ...logonce import RateLimitedLog
from .account import rejected_dir
from ...private_files import make_private_dirs, private_opener
from ...spool_format import SUFFIX, file_name, read_spool_file, seq_of

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
        self.set_aside_records = 0  # in files the sweep could not ingest and moved to rejected/
        # Which files were counted so, and their records: a file the replay was sending when the
        # sweep took it is acknowledged by the replay, and must not count twice (delivered()).
        self._vanished: dict[str, int] = {}
        self._index: dict[str, tuple[int, int]] | None = None  # file name -> (bytes, records)
        # Whether files may be waiting: kept in memory, so a healthy delivery never lists the
        # directory (each syscall on the shipper thread costs the training thread a GIL switch).
        # The collector can ingest the spool itself, so True is a hint that replay corrects.
        self._maybe_pending: bool | None = None
        # Delivered files that could not be removed (a read-only directory): never replayed or
        # counted again; their removal is tried again at each listing.
        self._delivered: set[str] = set()

    @property
    def maybe_pending(self) -> bool:
        if self._maybe_pending is None:
            files = self._files()
            self._maybe_pending = True if files is None else bool(files)
        return self._maybe_pending

    def _files(self) -> list[Path] | None:
        """The pending files, oldest first; None when the directory cannot be listed now (an
        I/O error): unknown is not empty, so nothing is counted as taken by the collector."""
        try:
            files = sorted(p for p in self.directory.iterdir() if p.name.endswith(SUFFIX))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            _spool_errors.error("list", "starvewatch: cannot list the spool at %s (%s); trying again later",
                                self.directory, exc)
            return None
        if self._delivered:
            delivered, self._delivered = self._delivered, set()
            for path in [p for p in files if p.name in delivered]:
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
                except OSError:
                    self._delivered.add(path.name)  # still there: tried again at the next listing
            files = [p for p in files if p.name not in delivered]
        return files

    def _known(self) -> dict[str, tuple[int, int]]:
        if self._index is None:
            self._index = {}
            files = self._files()
            if files is not None:
                self._reconcile(files)
        return self._index

    def _reconcile(self, files: list[Path]) -> None:
        """Files that vanished leave the index (the collector took them); files another
        process wrote (a sidecar before a take-over) join it, their records counted once."""
        index = self._index if self._index is not None else {}
        self._index = index
        names = {p.name for p in files}
        for name in [n for n in index if n not in names]:
            records = index.pop(name)[1]
            # The sweep sets a file it cannot ingest aside in rejected/: not stored, so not acknowledged.
            if os.path.exists(os.path.join(rejected_dir(self.directory), name)):
                self.set_aside_records += records
            else:
                self._count_vanished(name, records)
        for path in files:
            if path.name not in index:
                try:
                    index[path.name] = (path.stat().st_size, _records_in(read_spool_file(path)))
                except (OSError, ValueError):
                    continue

    def pending(self) -> list[Path]:
        """The files to replay, oldest first; [] when the directory cannot be listed now
        (the index and the hint stay as they were: replay tries again later)."""
        files = self._files()
        self._known()
        if files is None:
            self._maybe_pending = True
            return []
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

    def write(self, seq: int, body: bytes, records: int, first: int | None = None) -> None:
        """A batch, or the part of it starting at record `first` (spool_format.py). Raises
        OSError when the file cannot be written (a full or read-only disk)."""
        data = gzip.compress(body, compresslevel=1)
        self._make_room(len(data))
        final = self.directory / file_name(seq, first)
        tmp = final.with_name(final.name + ".tmp")
        try:
            try:
                f = open(tmp, "wb", opener=private_opener)  # owner-only (private_files.py)
            except FileNotFoundError:  # the first write, or the directory was removed (an import)
                make_private_dirs(self.directory)
                f = open(tmp, "wb", opener=private_opener)
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
        for path in self._files() or ():  # oldest first
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
        """Remove a file that was delivered; returns its records (0 when it was already gone).
        A file that cannot be removed (a read-only directory) is remembered as delivered: it
        is never replayed or counted again."""
        entry = self._known().pop(path.name, None)
        try:
            path.unlink()
        except FileNotFoundError:  # the collector's sweep took it
            pass
        except OSError as exc:
            self._delivered.add(path.name)
            _spool_errors.error("remove", "starvewatch: delivered spool file %s cannot be removed (%s); "
                                "it is not sent again", path, exc)
        return entry[1] if entry else 0

    def remove_batch(self, seq: int) -> int:
        """Remove every file of batch `seq` (the whole batch, or its parts); returns their records."""
        listed = [p.name for p in self._files() or ()]
        names = {file_name(seq)} | {name for name in [*self._known(), *listed] if seq_of(name) == seq}
        return sum(self.remove(self.directory / name) for name in sorted(names))

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
        if path.name not in self._known():
            self.vanished_records -= self._vanished.pop(path.name, 0)
        self.remove(path)

    def forget(self, path: Path) -> int:
        """A file moved elsewhere (rejected/): out of the index; returns its records."""
        entry = self._known().pop(path.name, None)
        return entry[1] if entry else 0


def _records_in(payload: dict) -> int:
    return len(payload.get("steps", {}).get("step", ()))
