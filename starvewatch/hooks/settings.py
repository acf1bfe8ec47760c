"""Settings of the training-process side, read once from the environment at `init()`."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..defaults import DEFAULT_URL, OFF_VALUES, default_dir
from ..envvars import collector_url, flag, limit_bytes, number, token


def _notebook_idle_s(default: float = 600.0) -> float:
    """STARVEWATCH_NOTEBOOK_IDLE_S: seconds, 0 or off for never; a typo keeps the default
    (with envvars' one line, as every number setting)."""
    raw = os.environ.get("STARVEWATCH_NOTEBOOK_IDLE_S")
    if raw is not None and raw.strip().lower() in {"off", "never", "false", "no"}:
        return 0.0
    return number("STARVEWATCH_NOTEBOOK_IDLE_S", default, minimum=0.0, above_minimum=False)


@dataclass
class HookSettings:
    dir: Path
    url: str | None            # None: spool only
    url_is_default: bool       # only the default (or a loopback URL) may be auto-started
    token: str | None
    autostart: bool
    disabled: bool
    ship_interval_s: float = 0.5
    buffer_capacity: int = 1_000_000
    max_batch_records: int = 20_000
    spool_max_bytes: int = 256 * 1024 * 1024
    flush_timeout_s: float = 2.0
    host_interval_s: float = 0.5
    gpu_interval_s: float = 1.0
    worker_memory_interval_s: float = 5.0  # USS/PSS of DataLoader workers (reads smaps)
    stall_min_s: float = 10.0
    stall_median_factor: float = 20.0
    # A first batch (worker start-up, a dataset opening its files) is judged against this
    # allowance, or twice the slowest earlier first batch, not the steady-state rule; 0: six
    # times stall_min_s (60 s by default).
    stall_startup_s: float = 0.0
    quiet: bool = False
    gpu_event_every: int = 4      # CUDA events on one step in this many, on average (hooks/cuda.py)
    shm_limit_bytes: int = 0      # a container's /dev/shm limit (0: the tmpfs's own size)
    sidecar: bool = True          # system sampling in a separate process (see hooks/delivery/sidecar.py)
    notebook_idle_s: float = 600.0  # a notebook's run ends after this long without a step or a cell
    tune: bool = False            # live tuning of watched DataLoaders (hooks/live_tuner.py)

    @classmethod
    def from_env(cls, *, url: str | None = None, dir: str | os.PathLike | None = None) -> "HookSettings":
        raw_url = url if url is not None else os.environ.get("STARVEWATCH_URL")
        url_is_default = raw_url is None
        if raw_url is None:
            raw_url = DEFAULT_URL
        # A malformed URL (bar `host:port`) is None: spool only, never an auto-started collector.
        resolved = None if raw_url.strip().lower() in OFF_VALUES else collector_url(raw_url)
        return cls(
            dir=Path(dir) if dir is not None else default_dir(),
            url=resolved,
            url_is_default=url_is_default,
            token=token("STARVEWATCH_TOKEN"),
            autostart=flag("STARVEWATCH_AUTOSTART", True),
            disabled=flag("STARVEWATCH_DISABLED", False),
            quiet=flag("STARVEWATCH_QUIET", False),
            sidecar=flag("STARVEWATCH_SIDECAR", True),
            ship_interval_s=number("STARVEWATCH_SHIP_INTERVAL_S", 0.5),
            host_interval_s=number("STARVEWATCH_HOST_INTERVAL_S", 0.5),
            gpu_interval_s=number("STARVEWATCH_GPU_INTERVAL_S", 1.0),
            worker_memory_interval_s=number("STARVEWATCH_WORKER_MEMORY_INTERVAL_S", 5.0),
            stall_min_s=number("STARVEWATCH_STALL_MIN_S", 10.0),
            gpu_event_every=number("STARVEWATCH_GPU_EVENT_EVERY", 4, minimum=1, above_minimum=False, integer=True),
            stall_median_factor=number("STARVEWATCH_STALL_FACTOR", 20.0),
            stall_startup_s=number("STARVEWATCH_STALL_STARTUP_S", 0.0),
            shm_limit_bytes=limit_bytes("STARVEWATCH_SHM_LIMIT_BYTES"),
            notebook_idle_s=_notebook_idle_s(),
            tune=flag("STARVEWATCH_TUNE", False),
        )
