"""`starvewatch doctor`: what would stop starvewatch (or the training) from working, with fixes."""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def run_checks(directory: Path):
    """Yields (name, ok, detail, fix)."""
    try:
        import torch
        cuda = torch.cuda.is_available()
        yield ("torch", True, f"torch {torch.__version__}, CUDA {'available: ' + torch.cuda.get_device_name(0) if cuda else 'not available (CPU build or no GPU)'}", None)
    except ImportError:
        yield ("torch", False, "torch is not installed", "pip install torch (CPU: pip install torch==2.13.0)")
        cuda = False
    try:
        import pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            version = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
            yield ("NVML", True, f"{count} GPU(s), driver {version}", None)
        except pynvml.NVMLError as exc:
            yield ("NVML", not cuda, f"NVML unavailable: {exc}" + ("" if cuda else " (fine on a CPU machine)"),
                   "install the NVIDIA driver, or run where one is loaded, for GPU utilization samples")
    except ImportError:
        yield ("NVML", not cuda, "nvidia-ml-py is not installed: no GPU utilization samples",
               "pip install 'starvewatch[gpu]'")
    from .hooks import core, loader  # noqa: F401  (importing the loader chooses the core)
    if core.current() == "c":
        yield ("hot path", True, "the compiled core (starvewatch._ccore) measures each batch", None)
    else:
        why = core.why_not_c() or f"{core.ENV}=python"
        yield ("hot path", True, f"the pure-Python core measures each batch: {why}",
               None if core.c_available() else
               "optional: reinstall with a C compiler and the Python headers (gcc, python3-dev) for the "
               "compiled core, a few hundred ns less per batch")
    try:
        shm = shutil.disk_usage("/dev/shm")
        gib = shm.total / 2**30
        ok = shm.total >= 1 * 2**30
        yield ("/dev/shm", ok, f"{gib:.1f} GiB, {100 * shm.used / max(1, shm.total):.0f}% used",
               None if ok else "DataLoader workers pass batches through /dev/shm: give the container more "
                               "(docker run --shm-size=8g, or --ipc=host)")
    except OSError:
        yield ("/dev/shm", False, "missing", "mount a tmpfs on /dev/shm (docker --shm-size)")
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        writable = os.access(directory, os.W_OK)
    except OSError:
        writable = False
    yield ("data directory", writable, f"{directory} {'is writable' if writable else 'is not writable'}",
           None if writable else "set STARVEWATCH_DIR to a writable directory")
    from .defaults import DEFAULT_URL
    from .hooks.delivery.collector_link import probe
    from .hooks.delivery.transport import HttpTransport
    from .envvars import collector_url, flag, token
    url = os.environ.get("STARVEWATCH_URL") or DEFAULT_URL
    if url.strip().lower() in ("off", "none", "0", "false"):
        yield ("collector", True, "STARVEWATCH_URL=off: data stays in the spool", None)
        return
    if collector_url(url) is None:
        yield ("collector", False, f"STARVEWATCH_URL={url!r} is not an http(s) URL: data stays in the spool",
               "write STARVEWATCH_URL=http://HOST:PORT (or off)")
        return
    url = collector_url(url)
    transport = HttpTransport(url, token("STARVEWATCH_TOKEN"), timeout_s=3)
    found = probe(transport)
    transport.close()
    if found == "starvewatch":
        yield ("collector", True, f"a starvewatch collector answers at {url}", None)
    elif found == "unavailable":
        yield ("collector", False, f"{url} answers with a server error (a collector behind a proxy that is down?)",
               "check the collector's log; training keeps its records in the spool meanwhile")
    elif found == "other":
        yield ("collector", False, f"{url} answers but is not starvewatch",
               "free the port, or point STARVEWATCH_URL at another one (starvewatch serve --port N)")
    else:
        autostart = flag("STARVEWATCH_AUTOSTART", True)
        yield ("collector", True, f"none at {url}" + ("; training will start one automatically" if autostart
                                                       else "; auto-start is off, data goes to the spool"), None)
