"""Diagnosis: limiting factor and concrete recommendations (filled in by the diagnosis engine)."""
from __future__ import annotations


def diagnose(summary: dict, loaders, *, system=None, previous=None) -> None:
    return None
