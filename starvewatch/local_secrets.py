"""The user's own secrets for the collector on this machine (issue 36 item 2), in the user's
private directory (`~/.starvewatch`, or STARVEWATCH_PRIVATE_DIR; 0700, each file 0600; stdlib
only: the hooks, the CLI and the collector import it). One place per user, whatever
STARVEWATCH_DIR each process uses, so training and a collector with other data directories
still recognise each other:

- `collector-key`: proves a collector on loopback is *yours* before training sends it a token
  or a record. Training sends a random challenge to /healthz; the collector answers
  HMAC-SHA256(key, challenge). Whoever squats the port first cannot read the key, so gets no
  record and no token. The key is not a token: a collector that keeps tokens only as digests
  (the team collector) proves itself the same way.
- `local-token`: the per-user token a loopback collector without --token also accepts, for a
  client it cannot tell apart by its uid (guard.py; no /proc, another network namespace). The
  hooks and the CLI send it to a loopback collector only after the proof above.

Files are opened without following symlinks and created exclusively; one readable or writable
by others, or owned by someone else, is refused with a message.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

KEY_FILE = "collector-key"
TOKEN_FILE = "local-token"
CHALLENGE_PREFIX = b"starvewatch-collector-proof:"
MAX_CHALLENGE_CHARS = 128


def private_dir() -> Path:
    raw = os.environ.get("STARVEWATCH_PRIVATE_DIR")
    return Path(raw) if raw else Path.home() / ".starvewatch"


class UnsafeSecret(Exception):
    """A secret file (or its directory) others could read or replace."""


def check_private_dir(directory: Path) -> None:
    """An existing directory must be the user's and writable by nobody else."""
    st = os.stat(directory, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeSecret(f"{directory} is not a directory (a symlink?): starvewatch keeps private files there")
    if st.st_uid != os.geteuid():
        raise UnsafeSecret(f"{directory} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): "
                           f"set STARVEWATCH_DIR to a directory of your own")
    if st.st_mode & 0o022:
        raise UnsafeSecret(f"{directory} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): "
                           f"chmod 700 it, or set STARVEWATCH_DIR to a directory of your own")


def check_private_file(path: Path, fd: int) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise UnsafeSecret(f"{path} must be a regular file of yours that only you can read "
                           f"(mode {stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}): chmod 600 it")


def _read_or_make(directory: Path, name: str, make: bool) -> str | None:
    directory = Path(directory)
    path = directory / name
    if make:
        from .private_files import make_private_dirs
        make_private_dirs(directory)
    if not directory.exists():
        return None
    check_private_dir(directory)
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if not make:
            return None
        value = secrets.token_urlsafe(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:  # made meanwhile by another process: read that one
            return _read_or_make(directory, name, False)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        return value
    except OSError as exc:  # ELOOP: a symlink where the file should be
        raise UnsafeSecret(f"cannot open {path} safely: {exc}") from None
    with os.fdopen(fd, "r") as f:
        check_private_file(path, f.fileno())
        value = f.read(4096).strip()
    return value or None


def collector_key(directory: Path, make: bool = False) -> str | None:
    return _read_or_make(directory, KEY_FILE, make)


def local_token(directory: Path, make: bool = False) -> str | None:
    return _read_or_make(directory, TOKEN_FILE, make)


def new_challenge() -> str:
    return secrets.token_hex(16)


def proof(key: str, challenge: str) -> str:
    """The collector's answer. Not bound to its port, so a proxy of the user's own in front of
    it works; another user cannot relay challenges to it either way (a loopback collector
    answers only its own user, guard.py)."""
    return hmac.new(key.encode(), CHALLENGE_PREFIX + challenge.encode(), hashlib.sha256).hexdigest()


def proof_ok(key: str, challenge: str, answer) -> bool:
    return isinstance(answer, str) and hmac.compare_digest(proof(key, challenge).encode(), answer.encode()[:200])
