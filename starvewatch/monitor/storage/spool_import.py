"""Ingest spool directories: runs that were offline, or whose collector was down at exit.

A file is read within the same bound as an HTTP body (spool_format.py), split when it holds
more than the collector's limits (an older training process wrote it; batch_parts.py), and
stored record range by record range, so a file that the training process replays too is stored
once. A file that cannot be ingested, for any reason, is set aside in `rejected/` with a
`.reason` file beside it and counted in its run's account (Store.note_rejected_file): the sweep
goes on, and `serve` always starts.
"""
from __future__ import annotations

import logging
from pathlib import Path

from ...batch_parts import split
from ...ids import id_problem
from ...limits import MAX_LIST_RECORDS
from ...logonce import RateLimitedLog
from ...spool_format import GLOB, NotRegularFile, read_spool_file
from ..web.json_bounds import json_values_problem
from ..web.wire_models import EventBatch
from .open_store import database_errors

log = logging.getLogger("starvewatch.collector")
_busy = RateLimitedLog(log)
REJECTED_PATHS_KEPT = 100  # SpoolImporter.rejected_files: the latest paths only


class SpoolImporter:
    def __init__(self, store, root: Path, *, delete: bool = True, set_aside: bool = True) -> None:
        self.store = store
        self.root = Path(root)
        self.delete = delete
        self.set_aside = set_aside  # False: a read-only view (sources.offline) moves nothing
        # A long-lived collector's sweep may reject files for months: the run's account in the
        # database counts and lists them (Store.note_rejected_file); here only how many, and
        # the latest few paths (what `starvewatch import` prints).
        self.rejected_count = 0
        self.rejected_files: list[str] = []
        self._skip: set[Path] = set()  # rejected but could not be moved: said once, not retried
        self.not_files = 0  # entries that are not regular files (a FIFO): skipped, counted

    @property
    def rejected_root(self) -> Path:
        """<dir>/rejected beside <dir>/spool, as the training process's own rejects."""
        return self.root.parent / "rejected"

    def files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        # <run>/<stream>/<seq>[-<first>].json.gz; sorted so each stream replays in sequence order
        found = set(self.root.glob(GLOB))
        self._skip &= found  # a skipped file its producer removed since is forgotten
        return sorted(found - self._skip)

    def scan(self, progress=None) -> int:
        """Import every spooled batch (records already stored are not stored again)."""
        count = 0
        for path in self.files():
            payload = None
            try:
                payload = read_spool_file(path, text_problem=json_values_problem)
                batches = [EventBatch.model_validate(part) for part in split(payload, MAX_LIST_RECORDS)]
                stored = False
                for batch in batches:
                    stored = self.store.ingest(batch) or stored
            except NotRegularFile as exc:  # a FIFO named like a spool file: never read, never waited on
                self._skip.add(path)
                self.not_files += 1
                log.warning("spool entry skipped: %s", exc)
                continue
            except FileNotFoundError:
                continue  # the producing process replayed it meanwhile
            except database_errors() as exc:  # the database is busy or full: the file is fine, try it again later
                _busy.error(f"ingest:{type(exc).__name__}", "spool file %s not ingested now (%s); "
                            "trying again at the next sweep", path, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - whatever the content does, the sweep goes on
                self._reject(path, exc, payload)
                continue
            count += stored
            if self.delete:
                path.unlink(missing_ok=True)
                _remove_empty(path.parent)
            if progress is not None:
                progress(path)
        return count

    def _reject(self, path: Path, exc: Exception, payload) -> None:
        """Set the file aside (rejected/<run>/<stream>/, with its reason), count it in its
        run's account, and never retry it."""
        reason = f"{type(exc).__name__}: {exc}"[:500]
        stream_dir = path.parent
        run_id, stream = stream_dir.parent.name, stream_dir.name
        target = self.rejected_root / run_id / stream / path.name
        moved = False
        try:
            if not self.set_aside:
                raise PermissionError("a read-only view of the spool")
            target.parent.mkdir(parents=True, exist_ok=True)
            path.rename(target)
            moved = True
        except OSError as move_error:  # read-only spool: it stays, and is skipped while this importer runs
            if not path.exists():
                return  # its producer replayed and removed it meanwhile
            self._skip.add(path)
            log.warning("spool file %s rejected (%s) and cannot be set aside: %s", path, reason, move_error)
            target = path
        if moved:
            try:
                target.with_name(target.name + ".reason").write_text(reason + "\n")
            except OSError:
                pass
            _remove_empty(stream_dir)
            log.warning("spool file %s rejected (set aside in %s): %s", path, target.parent, reason)
        self.rejected_count += 1
        self.rejected_files.append(str(target))
        del self.rejected_files[:-REJECTED_PATHS_KEPT]
        records = None
        if isinstance(payload, dict):
            steps = payload.get("steps")
            if isinstance(steps, dict) and isinstance(steps.get("step"), list):
                records = len(steps["step"])
        if id_problem(run_id) is None and id_problem(stream) is None:
            try:
                self.store.note_rejected_file(run_id, stream, str(target), reason, records)
            except (*database_errors(), ValueError) as store_error:
                log.warning("spool file %s rejected, and its run's account not updated: %s", path, store_error)


def _remove_empty(directory: Path) -> None:
    for d in (directory, directory.parent):
        try:
            d.rmdir()
        except OSError:
            return
