"""Named quantities as words and units: now shared with the reports (starvewatch/quantities.py),
so the run's HTML report reads its evidence and configuration as the dashboard does."""
from ..quantities import FIRST, LABELS, SUFFIXES, human_bytes, label, rows, unit_of, value  # noqa: F401
