"""Files and directories only their owner can read (stdlib only; shared by the hooks and the
collector): spooled batches, the database and its WAL, rejected files hold training data and
command lines, which other users of a shared machine have no business reading."""
from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_opener(path, flags: int) -> int:
    """For open(..., opener=private_opener): a file created owner-only (an existing one keeps
    its mode)."""
    return os.open(path, flags, FILE_MODE)


def make_private_dirs(path: Path) -> None:
    """`mkdir -p` with every directory it creates owner-only (existing ones are left as they are)."""
    path = Path(path)
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:  # made meanwhile by another process
            pass


def open_private(path, flags: int) -> int:
    """os.open for a file of ours: never through a symlink (a planted link would make us write
    another user's file), created owner-only, `O_EXCL` where the caller creates it anew."""
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
