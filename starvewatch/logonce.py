"""Errors that a loop must survive, said once where the user sees them (stdlib only; shared
by the hooks and the collector).

A sweep that fails every 5 s for the same reason would fill a log; saying nothing hides a full
disk. `RateLimitedLog` says the first failure of each kind at once and then at most one line
per interval, with the count of those it held back.
"""
from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 300.0, clock=time.monotonic) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def error(self, key: str, message: str, *args, level: int = logging.WARNING) -> bool:
        """Log `message % args` unless `key` was logged less than `interval_s` ago; True when
        a line was written."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._last[key] = now
            held = self._held.pop(key, 0)
        if held:
            message += f" ({held} more like this since the last report)"
        self.logger.log(level, message, *args)
        return True
