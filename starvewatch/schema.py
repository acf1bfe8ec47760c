"""The contracts between the parts: wire events, step records and the run summary.

Version them deliberately: add fields freely, never rename or drop a documented one.
"""
from __future__ import annotations

# /2: `input_wait_fraction`, `speedup_at_stake` and `step_time` are relative to the loop's
# wall time per step (wait + compute + the time outside step() blocks); /1 left that time out
# of the step when step() marked it. A /1 summary is still read (analysis/summary.py upgrade).
SUMMARY_SCHEMA = "starvewatch.summary/2"
OLD_SUMMARY_SCHEMAS = ("starvewatch.summary/1",)
EVENTS_SCHEMA = "starvewatch.events/1"
# Two runs compared (analysis/compare.py, `starvewatch compare --format json`): before, after,
# pairs, unpaired, metrics, config, verification.
COMPARE_SCHEMA = "starvewatch.compare/1"

# Columns of a step record, in wire order. Units are suffixes; times are integers in ns,
# `start_ns` is wall-clock (Unix epoch) ns of the next() call that returned the batch.
STEP_COLUMNS = (
    "loader", "epoch", "step", "start_ns", "wait_ns", "compute_ns", "other_ns",
    "batch_size", "gpu_idle_ns",
)

# Bands of the TensorFlow profiler's input-pipeline analyzer.
MODERATE_FRACTION = 0.05
HIGH_FRACTION = 0.20
MIN_STEPS_FOR_VERDICT = 20
# A loop this short says nothing however many steps it had (`for _ in watch(range(30))`).
MIN_SECONDS_FOR_VERDICT = 0.1
BAND_ORDER = ("insufficient_data", "not", "moderate", "high")


def band(input_wait_fraction: float | None, steps: int, wall_s: float | None = None) -> str:
    """The input-bound band of one loader's whole-run fraction (or the run's): too few steps,
    or too little loop time where it is known, is insufficient data."""
    if steps < MIN_STEPS_FOR_VERDICT or input_wait_fraction is None or \
            (wall_s is not None and wall_s < MIN_SECONDS_FOR_VERDICT):
        return "insufficient_data"
    if input_wait_fraction >= HIGH_FRACTION:
        return "high"
    if input_wait_fraction >= MODERATE_FRACTION:
        return "moderate"
    return "not"


def worst_band(bands: list[str]) -> str:
    """The run's band is its worst loader's; a run with no data is insufficient_data."""
    if not bands:
        return "insufficient_data"
    measured = [b for b in bands if b != "insufficient_data"]
    if not measured:
        return "insufficient_data"
    return max(measured, key=BAND_ORDER.index)
