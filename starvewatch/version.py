"""The package version, in a leaf module: the collector and the CLI read it without importing
the package's __init__ (which imports the training-process side)."""
from __future__ import annotations

__version__ = "0.1.0"
