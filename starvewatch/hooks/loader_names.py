"""A meaningful name for a loader watched without one (issue 34): read once, at `watch()`
time, from its call site and its dataset, so the same script names the same loader the same
way on every run (compare and verify-after-change pair loaders by name).

In order: the variable the watched loader is assigned to (`val_loader = watch(...)`), the
variable passed to `watch()` (`for b in watch(val_loader)`), the dataset's class, the loader's
class. A name a run already uses gets `-2`, `-3` ... (hooks/session.py)."""
from __future__ import annotations

import linecache
import re

from ..ids import safe_name

_ASSIGNED = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=]+)?=\s*[\w.]*\bwatch\(")
_PASSED = re.compile(r"\bwatch\(\s*([A-Za-z_][A-Za-z0-9_.]*)\s*[,)]")
# Names that say nothing about the loader.
_BLAND = {"loader", "dataloader", "data_loader", "dl", "it", "x", "self", "data", "iterable", "watched"}


def _call_line(frame) -> str:
    try:
        return linecache.getline(frame.f_code.co_filename, frame.f_lineno) or ""
    except Exception:  # a frame from exec() or a zip import: no source to read
        return ""


def name_hints(frame, loader) -> tuple[str, ...]:
    """Candidate names, best first (each a safe name; none when nothing can be read)."""
    out = []
    line = _call_line(frame) if frame is not None else ""
    for pattern in (_ASSIGNED, _PASSED):
        m = pattern.search(line)
        if m:
            word = m.group(1).rsplit(".", 1)[-1]
            if word.lower() not in _BLAND:
                out.append(word)
    dataset = getattr(loader, "dataset", None)
    if dataset is not None:
        out.append(type(dataset).__name__)
    out.append(type(loader).__name__)
    return tuple(safe_name(h, "loader") for h in out if h and h not in ("list", "range", "generator"))

