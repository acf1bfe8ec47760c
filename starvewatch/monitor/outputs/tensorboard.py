"""TensorBoard: per-run scalars written by the collector (`starvewatch serve --tensorboard DIR`),
not by the training process. One event file directory per run (DIR/<run id>/), tags such as
`input_wait_fraction/train` and `rank1/input_wait_fraction/train`, the step being the loader's
steps so far. Optional (`pip install 'starvewatch[tensorboard]'`); imported only when asked for."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from ...ids import safe_id
from ...logonce import RateLimitedLog
from .metrics import fleet_metrics

_errors = RateLimitedLog(logging.getLogger("starvewatch.collector"))


def _tb():
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as exc:
        raise ImportError("--tensorboard needs the tensorboard package, which is not installed: "
                          "pip install 'starvewatch[tensorboard]'") from exc
    return Event, Summary, EventFileWriter


_tb()

SCALARS = {  # metric -> tag prefix
    "starvewatch_input_wait_fraction": "input_wait_fraction",
    "starvewatch_batches_per_second": "batches_per_second",
    "starvewatch_wait_p95_seconds": "wait_p95_seconds",
    "starvewatch_rank_input_wait_fraction": "input_wait_fraction",
    "starvewatch_rank_batches_per_second": "batches_per_second",
    "starvewatch_verdict_level": "verdict_level",
    "starvewatch_stalls": "stalls",
    "starvewatch_gpu_utilization_ratio": "gpu_utilization_ratio",
}


def tag_of(sample) -> str | None:
    prefix = SCALARS.get(sample.name)
    if prefix is None:
        return None
    rank = f"rank{sample.labels['rank']}/" if "rank" in sample.labels else ""
    loader = f"/{sample.labels['loader']}" if "loader" in sample.labels else ""
    return f"{rank}{prefix}{loader}"


class TensorBoardWriter:
    """Every `interval_s`, one scalar per run and tag whose step count moved since the last write."""

    def __init__(self, get_query, settings, directory, interval_s: float = 5.0) -> None:
        self._Event, self._Summary, self._Writer = _tb()
        self._get_query = get_query
        self._settings = settings
        self.directory = Path(directory)
        self.interval_s = interval_s
        self._writers: dict[str, object] = {}
        self._last: dict[tuple[str, str], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="starvewatch-tensorboard")

    def start(self) -> "TensorBoardWriter":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write_logged()

    def _write_logged(self) -> None:
        """One write; a failure (a full disk, a query error) is said once per kind and per 5
        minutes, and the writes go on: it must not take the collector down, nor stay silent."""
        try:
            self.write_once()
        except Exception as exc:  # noqa: BLE001 - logged, never swallowed
            _errors.error(f"tensorboard:{type(exc).__name__}", "TensorBoard scalars to %s not written: %s: %s",
                          self.directory, type(exc).__name__, exc)

    def write_once(self) -> int:
        query = self._get_query()
        if query is None:
            return 0
        import time
        samples = fleet_metrics(query, self._settings)
        steps = {(s.labels["run"], s.labels["loader"]): int(s.value) for s in samples
                 if s.name == "starvewatch_steps"}
        run_steps = {}
        for (run, _loader), n in steps.items():
            run_steps[run] = max(run_steps.get(run, 0), n)
        written = 0
        per_run: dict[str, list] = {}
        for s in samples:
            tag = tag_of(s)
            if tag is None:
                continue
            run = s.labels["run"]
            step = steps.get((run, s.labels.get("loader")), run_steps.get(run, 0))
            if self._last.get((run, tag)) == step:
                continue  # nothing new for this scalar
            self._last[(run, tag)] = step
            per_run.setdefault(run, []).append((tag, step, s.value))
        self._close_gone({s.labels["run"] for s in samples})
        now = time.time()
        for run, values in per_run.items():
            writer = self._writers.get(run)
            if writer is None:
                # A stored run id is valid already; safe_id keeps it so, whatever reaches here.
                writer = self._writers[run] = self._Writer(str(self.directory / safe_id(run)))
            for tag, step, value in values:
                summary = self._Summary(value=[self._Summary.Value(tag=tag, simple_value=value)])
                writer.add_event(self._Event(wall_time=now, step=step, summary=summary))
                written += 1
            writer.flush()
        return written

    def _close_gone(self, exported: set[str]) -> None:
        """Close the event file of each run no longer exported (finished longer than
        metrics_finished_keep_s, or deleted) and forget its last steps: each open writer holds a
        thread and a file, and a collector serving runs for months must not keep them all. A run
        exported again later gets a new event file in the same directory, which TensorBoard reads
        with the others."""
        for run in [r for r in self._writers if r not in exported]:
            writer = self._writers.pop(run)
            try:
                writer.close()
            except Exception as exc:  # noqa: BLE001 - logged: the other runs' files still close
                _errors.error(f"tensorboard-close:{type(exc).__name__}", "TensorBoard file in %s not closed: %s",
                              self.directory, exc)
        if any(run not in exported for run, _tag in self._last):
            self._last = {key: step for key, step in self._last.items() if key[0] in exported}

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._write_logged()  # the runs' last values
        for writer in self._writers.values():
            try:
                writer.close()
            except Exception as exc:  # noqa: BLE001 - logged: the other runs' files still close
                _errors.error(f"tensorboard-close:{type(exc).__name__}", "TensorBoard file in %s not closed: %s",
                              self.directory, exc)
