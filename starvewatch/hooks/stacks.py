"""Python stacks of a hung process, without stopping it for long and without new dependencies.

A DataLoader worker registers `faulthandler` on a free real-time signal (never SIGUSR1/SIGUSR2,
which frameworks use, and never one the user installed a handler for) writing into its own
file under the run's directory. To read its stack, the sidecar (or, without one, the sampler
thread) sends that signal and reads what the file grew by: faulthandler writes from the signal
handler itself, so a worker blocked in C code (a lock, a read) answers too. For num_workers=0
the training process dumps its own threads (`dump_self`). Stdlib only; Linux and other Unixes
with real-time signals.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import time


def open_private(path, flags: int) -> int:
    """Owner-only, never through a symlink (a leaf module: private_files.open_private's rule)."""
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)


MAX_STACK_BYTES = 64 * 1024  # a dump of hundreds of threads is cut here


def _candidates() -> range:
    low, high = getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", 0)
    # glibc keeps the first real-time signals for itself; the top ones are popular with tools.
    return range(low + 6, high - 4) if low and high else range(0)


def register(path: str) -> int:
    """In a worker: dump all threads into `path` on a free real-time signal; 0 when none."""
    for signum in _candidates():
        try:
            if signal.getsignal(signum) != signal.SIG_DFL:
                continue  # the user's (or a framework's) handler: never replaced
            stream = os.fdopen(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab", buffering=0)
            faulthandler.register(signum, file=stream, all_threads=True, chain=False)
            _KEEP.append(stream)  # faulthandler writes to the fd: the file must stay open
            return signum
        except (OSError, ValueError, RuntimeError):
            return 0
    return 0


_KEEP: list = []


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def request(pid: int, signum: int, path: str, parent_pid: int | None = None,
            timeout_s: float = 1.0) -> str | None:
    """Ask worker `pid` for its stacks (its faulthandler signal `signum`, its file `path`).

    Only a child of `parent_pid` (when given) is signalled: a pid reused by another process
    must never receive a signal whose default action ends it. None when nothing came back."""
    if not signum or not pid or not os.path.exists(path):
        return None
    if parent_pid is not None and os.path.exists("/proc") and _parent_of(pid) != parent_pid:
        return None
    start = _size(path)
    try:
        os.kill(pid, signum)
    except OSError:
        return None
    deadline = time.monotonic() + timeout_s
    last = start
    while time.monotonic() < deadline:
        time.sleep(0.02)
        size = _size(path)
        if size > start and size == last:
            break  # grew, then stopped growing: the dump is complete
        last = size
    if _size(path) <= start:
        return None
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(MAX_STACK_BYTES).decode("utf-8", "replace")


def dump_self(path: str) -> str | None:
    """This process's threads, as faulthandler writes them (the training thread when the
    loader runs in it: num_workers=0, or a hang inside `iter()`)."""
    try:
        with os.fdopen(open_private(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC), "w+b") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.seek(0)
            return f.read(MAX_STACK_BYTES).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
