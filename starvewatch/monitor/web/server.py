"""Running the collector: uvicorn in the foreground, and stopping it (through its pid file,
pid_file.py)."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from .pid_file import PID_FILE, pid_file
from .collector_settings import CollectorSettings


def serve(settings: CollectorSettings, *, autostarted: bool = False, ui=None) -> None:
    """Run in the foreground. The pid file is written and removed by the app's lifespan, so it
    goes away even though uvicorn re-raises SIGTERM after its graceful shutdown. `ui` mounts
    pages on the app (create_app's `ui`): the caller composes the UI, the collector knows none."""
    import uvicorn

    from .app import create_app

    from .connections import bounded_protocol, quiet_refusals
    from .resident_memory import limit_arenas

    limit_arenas()  # before uvicorn and the thread pool start: monitor/web/resident_memory.py says why
    settings.pid_file_autostarted = autostarted
    _log_to_stderr()
    # What the collector creates (database, WAL, rejected spool files, directories) is the
    # user's alone: training data and command lines are not for other users of the machine.
    os.umask(0o077)
    app = create_app(settings, ui=ui)
    quiet_refusals()
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=5,
                            http=bounded_protocol(settings),
                            h11_max_incomplete_event_size=settings.max_header_bytes,
                            timeout_keep_alive=settings.keep_alive_timeout_s,
                            ssl_certfile=settings.ssl_certfile, ssl_keyfile=settings.ssl_keyfile)
    uvicorn.Server(config).run()


def _log_to_stderr() -> None:
    """The collector's own warnings (a rejected spool file, a failing sweep) on its stderr, which
    is its log file when it was started for you."""
    import logging
    import sys
    logger = logging.getLogger("starvewatch")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def _recorded(directory: Path) -> dict | None:
    try:
        info = json.loads(pid_file(directory).read_text())
        info["pid"] = int(info["pid"])
        return info
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_starvewatch(pid: int) -> bool:
    if not Path("/proc/self").exists():  # no /proc here: trust the pid file if the pid lives
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            pass
        return True
    try:
        return b"starvewatch" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def running_collector(directory: Path) -> dict | None:
    """The pid file's record ({pid, url, host, port, ...}) when its collector still runs."""
    info = _recorded(directory)
    return info if info is not None and _is_starvewatch(info["pid"]) else None


def stop(directory: Path, timeout_s: float = 10.0) -> tuple[bool, str]:
    """Stop the collector recorded in `directory`'s pid file (one started for you)."""
    path = pid_file(directory)
    info = _recorded(directory)
    if info is None:
        return False, f"no collector was started from {directory} (no {PID_FILE})"
    pid = info["pid"]
    if not _is_starvewatch(pid):
        path.unlink(missing_ok=True)
        return False, f"the collector (pid {pid}) had already exited"
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        path.unlink(missing_ok=True)
        return False, f"the collector (pid {pid}) had already exited"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True, f"stopped the collector at {info.get('url')} (pid {pid})"
        time.sleep(0.1)
    return False, f"the collector (pid {pid}) did not exit within {timeout_s:.0f} s"
