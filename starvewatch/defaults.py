"""Defaults both sides agree on: where the collector listens and where the data lives.

A leaf module: the training process (hooks/) and the collector (monitor/) both import it,
neither imports the other.
"""
from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8412
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
# STARVEWATCH_URL=off keeps everything in the local spool (no network at all).
OFF_VALUES = {"off", "none", "0", "false", ""}


def default_dir() -> Path:
    return Path(os.environ.get("STARVEWATCH_DIR") or Path.home() / ".starvewatch")
