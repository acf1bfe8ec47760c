"""The collector's limits on one event batch: a contract between the training process, which
keeps every batch it sends or spools within them (hooks/delivery/transport.py, splitting a
batch by record range, starvewatch/batch_parts.py), and the collector, which refuses more
(monitor/web/wire_models.py, monitor/web/app.py) and splits an older spool file that holds more
(monitor/storage/spool_import.py). A leaf module: both sides import it, it imports nothing.

`STARVEWATCH_MAX_BATCH_RECORDS` lowers (never raises) the per-list step limit, and the other
lists' limits with it, on both sides: tests and benchmarks use it to outrun delivery in
seconds. Set it for the collector and the training processes alike.
"""
from __future__ import annotations

import os

MAX_BODY_BYTES = 4 * 1024 * 1024            # a request body as sent (gzip)
MAX_DECOMPRESSED_BYTES = 32 * 1024 * 1024   # the body (or a spool file) once inflated

_STEPS = 50_000


def _lowered(default: int) -> int:
    raw = os.environ.get("STARVEWATCH_MAX_BATCH_RECORDS", "")
    try:
        value = int(raw)
    except ValueError:
        return default
    return default if value < 1 else min(default, value)


MAX_STEP_RECORDS = _lowered(_STEPS)
_SCALE = MAX_STEP_RECORDS / _STEPS

# Records per list of one batch. Phases are per step (a few named phases each); the event
# lists are small in a healthy run (a few per shipping interval) but grow with a backlog.
MAX_LIST_RECORDS = {
    "steps": MAX_STEP_RECORDS,
    "phases": MAX_STEP_RECORDS * 8,
    "samples": max(1, int(10_000 * _SCALE)),
    "workers": max(1, int(10_000 * _SCALE)),
    "stalls": max(1, int(1_000 * _SCALE)),
}

# ---- per run (issue 36 item 3): what one run may hold, whatever it sends ------------------------
# The hooks keep within them (hooks/loader.py names at most MAX_LOADERS_PER_RUN loaders, then
# records the rest under OVERFLOW_LOADER; hooks/samplers.py sends a quarter of
# MAX_STALL_ROWS_PER_RANK stall events per process; identity.py cuts the hostname); the collector
# refuses more with a 422 that names the bound (monitor/storage/run_bounds.py). docs/security.md lists them.
MAX_LOADERS_PER_BATCH = 1000        # loader records of one batch
MAX_LOADERS_PER_RUN = 256           # distinct loader names of one run (over all its ranks)
OVERFLOW_LOADER = "other loaders"   # where the hooks record loaders past that
MAX_RANKS_PER_RUN = 16_384          # ranks of one run (the team collector aims at 4,096)
MAX_HOST_CHARS = 255                # a hostname (DNS: 253)
MAX_TUNINGS_PER_RUN = 100           # `starvewatch tune` documents kept per run
# A stall is sent again when its worker's state or its stack arrives (a few events each).
MAX_STALL_ROWS_PER_RANK = 4000
