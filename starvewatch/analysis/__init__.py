"""The analysis: the pure path from a run's totals to its summary, diagnosis, predictions,
verification, stragglers and compare. Shared by `finish()` in the training process and by
the collector's API, CLI, exports and dashboard. Holds no SQL and no web framework."""
