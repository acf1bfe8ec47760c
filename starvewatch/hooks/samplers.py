"""System samplers (host, DataLoader workers, NVML) on their own daemon thread."""
from __future__ import annotations


def start_samplers(session) -> None:
    """Filled in by the samplers feature; the step timing works without it."""
    return None
