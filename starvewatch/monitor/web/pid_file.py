"""The collector's pid file: written and removed by the app's lifespan (app.py), read by
`starvewatch stop` (server.py)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .collector_settings import CollectorSettings

PID_FILE = "collector.json"


def pid_file(directory: Path) -> Path:
    return Path(directory) / PID_FILE


def write_pid_file(settings: CollectorSettings, autostarted: bool) -> Path:
    path = pid_file(settings.dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": os.getpid(), "url": settings.url, "host": settings.host,
                                "port": settings.port, "autostarted": autostarted,
                                "started_at": time.time()}))
    return path


def remove_pid_file(settings: CollectorSettings) -> None:
    path = pid_file(settings.dir)
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass
