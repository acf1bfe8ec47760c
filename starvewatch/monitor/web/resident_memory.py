"""The collector process's resident memory, kept bounded where the C allocators would not.

Measured under the soak (docs/reliability.md, "The collector's resident memory"): the growth
was not Python objects (their count, and the bytes malloc counts as in use, stay flat) but memory
glibc's malloc keeps after it is freed. Starlette runs every sync route and each ingest in
anyio's worker threads (up to 40), which exit after 10 s idle and are replaced; glibc gives new
threads arenas of their own, up to 8 per core, and freed chunks stay resident in each arena. The
RSS then grew with the number of arenas in use (16 on 2 cores; on a larger host up to one per
thread), not with the data. So:
- `limit_arenas()`, once before the server starts its threads: at most ARENAS malloc arenas;
- `give_back()`, from the collector's background thread every few seconds: malloc_trim(0) hands
  the arenas' free pages back to the kernel (about 1 ms).
Both are glibc's (Linux); elsewhere they do nothing and say so by returning False.

SQLite's own memory is bounded in store.py (SQLITE_SOFT_HEAP_BYTES, the readers' page cache).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

ARENAS = 2          # malloc arenas: the GIL serialises most allocations, so more buy little
M_ARENA_MAX = -8    # mallopt's parameter number (glibc malloc.h)
TRIM_EVERY_S = 10.0  # how often the background thread calls give_back()

_libc = None


def _glibc():
    """glibc's handle, or None (musl, macOS, Windows: no mallopt/malloc_trim to call)."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name)
            lib.mallopt, lib.malloc_trim  # noqa: B018 - both or neither
        except (OSError, AttributeError, TypeError):
            lib = False
        _libc = lib
    return _libc or None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """At most `arenas` malloc arenas from now on (MALLOC_ARENA_MAX, which the environment may
    still set lower or higher: a value given there wins)."""
    libc = _glibc()
    if libc is None or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas))


def give_back() -> bool:
    """Return the malloc arenas' free pages to the kernel (they stay reserved, not resident)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
