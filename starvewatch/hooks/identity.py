"""Who this run and this process are: run id, rank, and the metadata shown beside the run."""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import secrets
import socket
import sys
import time
from pathlib import Path

from ..ids import id_problem, safe_id, safe_name
from ..redact import redact_argv
from .core import current as current_core


log = logging.getLogger("starvewatch.hooks")


def default_run_name() -> str:
    env = os.environ.get("STARVEWATCH_RUN_NAME")
    if env:
        return safe_name(env)
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv and sys.argv[0] else "")
    stem = Path(path).stem if path else ""
    return stem or "run"


def rank_info() -> dict:
    def _int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default
    # LOCAL_WORLD_SIZE (torchrun): the ranks sharing this host's cores, for the diagnosis.
    return {"rank": _int("RANK", 0), "world_size": _int("WORLD_SIZE", 1),
            "local_rank": _int("LOCAL_RANK", 0), "local_world_size": _int("LOCAL_WORLD_SIZE", 0) or None}


def run_id_for(name: str) -> str:
    """One id for every process of a distributed job, a fresh one for a single process."""
    explicit = os.environ.get("STARVEWATCH_RUN_ID")
    if explicit:
        # It becomes a directory of the spool: `../../x` must not write outside it.
        run_id = safe_id(explicit)
        if run_id != explicit:
            log.warning("starvewatch: STARVEWATCH_RUN_ID %r is not a valid id (%s); using %r",
                        explicit[:80], id_problem(explicit), run_id)
        return run_id
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40].strip("-.") or "run"
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    shared = None
    if elastic and elastic.lower() != "none":
        shared = f"elastic:{elastic}"
    elif os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        shared = f"master:{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    if shared is not None:
        shared += f":{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}:{name}"
        return f"{safe}-{hashlib.sha1(shared.encode()).hexdigest()[:12]}"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _total_ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
        return st.f_frsize * st.f_blocks
    except OSError:
        return None


def run_metadata(name: str, run_id: str) -> dict:
    """Gathered on the daemon thread: nothing here may initialise CUDA by itself."""
    meta = {
        "id": run_id, "name": name, "host": socket.gethostname(), "pid": os.getpid(),
        "argv": redact_argv(list(sys.argv)), "python": platform.python_version(),
        # os.uname, not platform.platform(): that one runs `uname -p` in a subprocess, whose
        # pipe a DataLoader worker forked at the same moment can hold open forever.
        "platform": f"{os.uname().sysname}-{os.uname().release}-{os.uname().machine}",
        "cpu_count": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_total_bytes": _total_ram_bytes(), "shm_total_bytes": _shm_bytes(),
        "torch": None, "cuda_devices": [], **rank_info(),
        "core": current_core(),  # the hot path's implementation: "c" (compiled) or "python"
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        meta["torch"] = getattr(torch, "__version__", None)
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                meta["cuda_devices"] = [torch.cuda.get_device_name(i)
                                        for i in range(torch.cuda.device_count())]
        except Exception:  # a broken CUDA install must not break the run
            pass
    return meta
