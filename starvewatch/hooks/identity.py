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

from ..cpus import cpu_limit
from ..ids import id_problem, safe_id, safe_name
from ..limits import MAX_HOST_CHARS
from ..redact import redact_argv
from .core import current as current_core


log = logging.getLogger("starvewatch.hooks")


def default_run_name() -> str:
    env = os.environ.get("STARVEWATCH_RUN_NAME")
    if env:
        return safe_name(env)
    notebook = notebook_default_name()
    if notebook is not None:
        return notebook
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv and sys.argv[0] else "")
    stem = Path(path).stem if path else ""
    return stem or "run"


def notebook_default_name() -> str | None:
    """In a Jupyter kernel, the notebook's name (or `notebook`): never `ipykernel_launcher`."""
    if "IPython" in sys.modules:  # (a script never imports hooks/notebook.py)
        from .notebook import kernel_shell, notebook_run_name
        shell = kernel_shell()
        if shell is not None:
            return safe_name(notebook_run_name(shell))
    launcher = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    return "notebook" if launcher == "ipykernel_launcher" else None


def rank_info() -> dict:
    def _int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default
    # LOCAL_WORLD_SIZE (torchrun): the ranks sharing this host's cores, for the diagnosis.
    info = {"rank": _int("RANK", 0), "world_size": _int("WORLD_SIZE", 1),
            "local_rank": _int("LOCAL_RANK", 0), "local_world_size": _int("LOCAL_WORLD_SIZE", 0) or None}
    if os.environ.get("TORCHELASTIC_RESTART_COUNT") is not None:
        # An elastic restart stays in the job's run: which attempt this process belongs to.
        info["restart_count"] = _int("TORCHELASTIC_RESTART_COUNT", 0)
    return info


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
    if os.environ.get("TORCHELASTIC_RESTART_COUNT") is not None:  # a torchrun (elastic agent) worker
        job = _torchrun_job_run_id(name)
        if job is not None:
            return job
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    shared = None
    if elastic and elastic.lower() != "none":
        shared = f"elastic:{elastic}"
    elif os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        shared = f"master:{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        # Launchers other than torchrun (srun, mpirun): the job's own id keeps two jobs apart.
        for job_var in ("SLURM_JOB_ID", "SLURM_STEP_ID", "OMPI_MCA_ess_base_jobid", "PBS_JOBID", "LSB_JOBID"):
            if os.environ.get(job_var):
                shared += f":{job_var}={os.environ[job_var]}"
    if shared is not None:
        shared += f":{name}"
        return safe_id(name, hashlib.sha1(shared.encode()).hexdigest()[:12], prefix_chars=40)
    return _fresh_run_id(name)


def _fresh_run_id(name: str) -> str:
    return safe_id(name, f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}", prefix_chars=40)


AGENT_STORE_TIMEOUT_S = 5.0
RUN_ID_KEY = "starvewatch/run_id/"


def _torchrun_job_run_id(name: str) -> str | None:
    """One torchrun job, one run id, agreed before the first batch (it names the spool's
    directory); a new invocation with the same master address and port gets a new one, and an
    elastic restart keeps the job's (TORCHELASTIC_RESTART_COUNT is marked in the metadata).

    - Across hosts: the agent's store (TORCHELASTIC_USE_AGENT_STORE=True, at MASTER_ADDR:
      MASTER_PORT, the one torch.distributed's env:// init joins). It lives as long as the
      agent of group rank 0, restarts included (static and c10d rendezvous keep it), so the
      first worker to ask sets a fresh id there (compare-and-set) and every other worker of
      the job, on any host, reads it.
    - Without that store, on one host (GROUP_WORLD_SIZE 1): the agent process itself, the
      workers' parent: its pid and start time (a new torchrun is a new process).
    None where neither applies (several hosts without the agent store)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").strip().lower() == "true":
        agreed = _agree_in_agent_store(name)
        if agreed is not None:
            return agreed
    if os.environ.get("GROUP_WORLD_SIZE", "1").strip() == "1":
        agent = _agent_identity()
        if agent is not None:
            digest = hashlib.sha1(f"agent:{socket.gethostname()}:{agent}:{name}".encode()).hexdigest()[:12]
            return safe_id(name, digest, prefix_chars=40)
    return None


def _agree_in_agent_store(name: str) -> str | None:
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    try:
        from datetime import timedelta

        from torch.distributed import TCPStore
        store = TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=AGENT_STORE_TIMEOUT_S))
        key = RUN_ID_KEY + hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        agreed = store.compare_set(key, "", _fresh_run_id(name)).decode("utf-8")
    except Exception as exc:  # no torch.distributed, the store gone or unreachable
        log.warning("starvewatch: the torchrun agent's store at %s:%s did not answer (%s: %s); "
                    "the run id comes from the job's environment", addr, port, type(exc).__name__, exc)
        return None
    return agreed if id_problem(agreed) is None else None


def _agent_identity() -> str | None:
    """The parent process (torchrun's agent): pid and start time in clock ticks since boot."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/stat", "rb") as f:
            started = f.read().rsplit(b")", 1)[1].split()[19].decode()  # field 22, starttime
    except (OSError, IndexError):
        return None
    return f"{ppid}:{started}"


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
        "id": run_id, "name": name, "host": socket.gethostname()[:MAX_HOST_CHARS], "pid": os.getpid(),
        "argv": redact_argv(list(sys.argv)), "python": platform.python_version(),
        # os.uname, not platform.platform(): that one runs `uname -p` in a subprocess, whose
        # pipe a DataLoader worker forked at the same moment can hold open forever.
        "platform": f"{os.uname().sysname}-{os.uname().release}-{os.uname().machine}",
        "cpu_count": os.cpu_count(),
        # Host cores beside the CPUs this process may use (affinity, cgroup quota).
        **cpu_limit().as_metadata(),
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
