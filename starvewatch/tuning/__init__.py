"""`starvewatch tune`: measured what-if tuning of a DataLoader on this machine.

    result = starvewatch.tune(make_loader, budget_s=60)

Runs in the user's process (it builds the user's loaders), within a time budget, and shows
every number it measured. Imported lazily by `starvewatch.tune` and the CLI.
"""
from __future__ import annotations

import platform
import sys
import time
from dataclasses import dataclass, field

from .answer import CONSUMPTION_MARGIN, WITHIN_BEST, choose, rate, snippet, table
from .config import FactoryError, LoaderConfig, as_factory, current_config, load_factory, usable_cores
from .search import Tuner, TrialFailed
from .trial import TrialResult

TUNING_SCHEMA = "starvewatch.tuning/1"
__all__ = ["tune", "TuneResult", "LoaderConfig", "FactoryError", "TrialFailed", "TUNING_SCHEMA"]


@dataclass
class TuneResult:
    trials: list[TrialResult]
    answer: TrialResult | None
    rule: str
    budget_s: float
    elapsed_s: float
    consumption_batches_per_s: float | None
    consumption_source: str | None        # "given", "run" or None
    batch_size: int | None
    cores: int
    device: str | None
    current: LoaderConfig | None = None
    run_id: str | None = None
    loader: str | None = None
    notes: list[str] = field(default_factory=list)
    stored: bool | None = None              # with a run: whether the collector took the results

    @property
    def config(self) -> LoaderConfig | None:
        return self.answer.config if self.answer else None

    @property
    def kwargs(self) -> dict:
        """The answer as DataLoader keyword arguments."""
        return self.config.kwargs() if self.config else {}

    @property
    def snippet(self) -> str | None:
        return snippet(self.config, self.batch_size) if self.config else None

    def table(self) -> str:
        return table(self.trials, self.answer)

    def report(self) -> str:
        used = f"{self.elapsed_s:.1f} s of a {self.budget_s:g} s budget"
        lines = [f"starvewatch tune: {len(self.trials)} trials in {used} on {self.cores} usable cores"
                 + (f", {self.device}" if self.device else ""), "", self.table(), ""]
        if self.consumption_batches_per_s:
            source = {"run": f"compute per batch of run {self.run_id}", "given": "given"}[self.consumption_source]
            lines.append(f"consumption: {self.consumption_batches_per_s:.1f} batches/s ({source}); "
                         f"needed with a {CONSUMPTION_MARGIN - 1:.0%} margin: "
                         f"{self.consumption_batches_per_s * CONSUMPTION_MARGIN:.1f}")
        lines += self.notes
        if self.answer is None:
            lines.append(f"no answer: {self.rule}")
        else:
            lines += [f"answer (*): {self.rule}:", f"    {self.snippet}"]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The document stored with the run (GET /api/v1/runs/{id}/tuning)."""
        from datetime import datetime, timezone
        answer = None
        if self.answer is not None:
            a = self.answer
            answer = {"config": a.config.to_dict(), "label": a.config.label(), "kwargs": self.kwargs,
                      "snippet": self.snippet, "rule": self.rule, "batches_per_s": a.batches_per_s,
                      "samples_per_s": a.samples_per_s, "epoch_batches_per_s": rate(a),
                      "worker_uss_bytes": a.worker_uss_bytes, "cpu_pct": a.cpu_pct,
                      "covers_consumption": (rate(a) >= self.consumption_batches_per_s * CONSUMPTION_MARGIN
                                             if self.consumption_batches_per_s else None)}
        current = next((t for t in self.trials if self.current is not None and t.config == self.current), None)
        return {
            "schema": TUNING_SCHEMA,
            "created_at": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            "host": platform.node(), "cores": self.cores, "device": self.device,
            "loader": self.loader, "batch_size": self.batch_size,
            "budget_s": self.budget_s, "elapsed_s": self.elapsed_s,
            "consumption_batches_per_s": self.consumption_batches_per_s,
            "consumption_source": self.consumption_source,
            "consumption_margin": CONSUMPTION_MARGIN, "within_best": WITHIN_BEST,
            "current": self.current.to_dict() if self.current else None,
            "current_batches_per_s": rate(current) if current is not None and current.usable else None,
            "trials": [t.to_dict() for t in self.trials],
            "answer": answer,
            "notes": self.notes,
        }

    def __str__(self) -> str:
        return self.report()


def _cuda_device():
    try:
        import torch
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    except Exception:
        return None


def tune(factory, budget_s: float = 60, consumption_batches_per_s: float | None = None,
         run_name: str | None = None, *, loader: str | None = None, out=None, on_trial=None,
         checkpoint_every: int | None = None) -> TuneResult:
    """Measure DataLoader configurations on this machine and pick one.

    `factory` builds the DataLoader from keyword arguments (num_workers, prefetch_factor,
    persistent_workers, pin_memory), or is a DataLoader (rebuilt from its own arguments).
    With `consumption_batches_per_s` (or, when not given, the compute per batch of the newest
    run named `run_name`), the answer is the fewest workers covering it with a 20% margin;
    without, the fewest workers within 10% of the best. With `run_name` the results are stored
    with that run in the collector. `loader` names the run's loader (default: its first).
    Prints the table and the DataLoader(...) call to `out` (default stdout; False: silent);
    `on_trial(trial)` is called after each trial, its workers gone. For a torchdata
    StatefulDataLoader, `checkpoint_every` (steps between the loop's state_dict() calls; from
    the run when not given) is tried as its `snapshot_every_n_steps` against its own.
    """
    import warnings
    out = sys.stdout if out is None else out
    if isinstance(factory, str):
        factory = load_factory(factory)
    source = factory
    factory = as_factory(factory)
    current = None
    from torch.utils.data import DataLoader
    if isinstance(source, DataLoader):
        current = current_config(source)
    collector = run = None
    consumption_source = "given" if consumption_batches_per_s else None
    if run_name:
        (collector, run, loader, current, checkpoint_every, consumption_batches_per_s,
         consumption_source) = _from_watched_run(run_name, loader, current, checkpoint_every,
                                                 consumption_batches_per_s, consumption_source)
    cores, device = usable_cores(), _cuda_device()
    write = (lambda s: print(s, file=out, flush=True)) if out else (lambda s: None)
    write(f"starvewatch tune: measuring for up to {budget_s:g} s"
          + (f" (consumption {consumption_batches_per_s:.1f} batches/s)" if consumption_batches_per_s else ""))
    from ..progress import progress_bar
    started = time.perf_counter()
    ticks = max(1, int(budget_s * 10))
    with warnings.catch_warnings(), progress_bar(ticks, "tuning") as advance:
        # torch warns when workers outnumber cores; latency-bound loading is where that is right.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        shown = [0]

        def tick() -> None:
            due = min(ticks, int((time.perf_counter() - started) * 10))
            if due > shown[0]:
                advance(due - shown[0])
                shown[0] = due

        tuner = Tuner(factory, budget_s, consumption_batches_per_s, cores=cores, device=device,
                      current=current, log=write, tick=tick, on_trial=on_trial,
                      checkpoint_every=checkpoint_every)
        try:
            trials = tuner.run()
            if current is not None and tuner._find(current) is None and not tuner.out_of_budget:
                tuner.measure(current)  # the baseline, when time is left
        except BaseException:
            if collector is not None:
                collector.close()
            raise
    answer, rule = choose(trials, consumption_batches_per_s)
    sample = next((t for t in trials if t.samples_per_batch), None)
    batch_size = getattr(getattr(factory, "source", None), "batch_size", None) or (
        sample.samples_per_batch if sample else None)
    result = TuneResult(trials, answer, rule, budget_s, time.perf_counter() - started, consumption_batches_per_s,
                        consumption_source, batch_size, cores, str(device) if device else None, current,
                        run["id"] if run else None, loader)
    result.notes.extend(tuner.notes)
    if any(t.status == "skipped" for t in trials):
        result.notes.append("skipped trials would not fit in memory: the reason is in the table")
    write("")
    write(result.report())
    if collector is not None:
        _store_with_run(collector, run, result, write)
    return result


def _from_watched_run(run_name, loader, current, checkpoint_every, consumption_batches_per_s,
                      consumption_source):
    """What the run named `run_name` says of the loader being tuned: its configuration (the
    baseline), its checkpoint spacing and its consumption, where not given. Returns the open
    collector with them; closes it if the run or loader cannot be found."""
    from .remote import Collector, consumption_from, pick_loader
    collector = Collector()
    try:
        run = collector.find_run(run_name)
        run_summary = collector.summary(run["id"])
        part = pick_loader(run_summary, loader)
    except BaseException:
        collector.close()
        raise
    loader = part["name"]
    config = part.get("config") or {}
    if current is None and "num_workers" in config:
        current = LoaderConfig(config.get("num_workers") or 0, config.get("prefetch_factor"),
                               bool(config.get("persistent_workers")), bool(config.get("pin_memory")))
    if not checkpoint_every:  # the watched StatefulDataLoader's state_dict() spacing
        checkpoint_every = (((run_summary.get("system") or {}).get("loaders") or {})
                            .get(part["name"]) or {}).get("checkpoint_interval_steps")
    if not consumption_batches_per_s:
        consumption_batches_per_s = consumption_from(part)
        consumption_source = "run" if consumption_batches_per_s else None
    return (collector, run, loader, current, checkpoint_every, consumption_batches_per_s,
            consumption_source)


def _store_with_run(collector, run: dict, result: TuneResult, write) -> None:
    """Store the results with the watched run; a collector that refuses costs only the storing."""
    from .remote import CollectorError
    try:
        collector.store_tuning(run["id"], result.to_dict())
        result.stored = True
        write(f"stored with run {run['id']}: {collector.url}/runs/{run['id']}")
    except CollectorError as exc:  # the measurements are still worth having
        result.stored = False
        print(f"starvewatch tune: the results were not stored with run {run['id']}: {exc}", file=sys.stderr)
    finally:
        collector.close()
