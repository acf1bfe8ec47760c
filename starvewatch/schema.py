"""The contracts between the parts: wire events, step records and the run summary.

Version them deliberately: add fields freely, never rename or drop a documented one.
"""
from __future__ import annotations

SUMMARY_SCHEMA = "starvewatch.summary/1"
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
BAND_ORDER = ("insufficient_data", "not", "moderate", "high")


def band(input_wait_fraction: float | None, steps: int) -> str:
    """The input-bound band of one loader's whole-run fraction."""
    if steps < MIN_STEPS_FOR_VERDICT or input_wait_fraction is None:
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
