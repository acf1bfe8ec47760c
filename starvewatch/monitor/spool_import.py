"""Ingest spool directories: runs that were offline, or whose collector was down at exit."""
from __future__ import annotations

import logging
from pathlib import Path

from pydantic import ValidationError

from ..spool_format import GLOB, read_spool_file
from .models import EventBatch

log = logging.getLogger("starvewatch.collector")


class SpoolImporter:
    def __init__(self, store, root: Path, *, delete: bool = True) -> None:
        self.store = store
        self.root = Path(root)
        self.delete = delete
        self.imported_batches = 0
        self.rejected_files: list[str] = []

    def files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        # <run>/<stream>/<seq>.json.gz; sorted so each stream replays in sequence order
        return sorted(self.root.glob(GLOB))

    def scan(self, progress=None) -> int:
        """Import every spooled batch (duplicates are ignored by sequence number)."""
        count = 0
        for path in self.files():
            try:
                batch = EventBatch.model_validate(read_spool_file(path))
            except FileNotFoundError:
                continue  # the producing process replayed it meanwhile
            except (OSError, ValueError, ValidationError) as exc:
                self._reject(path, exc)
                continue
            if self.store.ingest(batch):
                count += 1
            if self.delete:
                path.unlink(missing_ok=True)
                _remove_empty(path.parent)
            if progress is not None:
                progress(path)
        self.imported_batches += count
        return count

    def _reject(self, path: Path, exc: Exception) -> None:
        """A file that cannot be read is set aside, not retried forever and not deleted."""
        target = path.with_name(path.name + ".rejected")
        try:
            path.rename(target)
        except OSError:
            pass
        self.rejected_files.append(str(target))
        log.warning("spool file %s rejected: %s", path, exc)


def _remove_empty(directory: Path) -> None:
    for d in (directory, directory.parent):
        try:
            d.rmdir()
        except OSError:
            return
