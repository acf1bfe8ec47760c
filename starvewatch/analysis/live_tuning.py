"""Live tuning's decisions (issue 39): which loader configuration to run the next window with,
and whether a tried change is kept. Pure: the training process (hooks/live_tuner.py) feeds it
the loop's own step times per window and applies what it answers.

One change at a time, from the current configuration: more workers (0 -> 2, then doubling),
a deeper prefetch, persistent workers, pinned memory (with CUDA), out-of-order delivery (only
where the ranked advice proposes it), fewer workers (below). A loader re-iterated in short
epochs (a window holds two epochs or more, or the epochs' start-up is STARTUP_SHARE of the
window or more) gets its workers candidate paired with persistent workers ("N workers,
persistent" is one change): each window would otherwise pay the new workers' start-up and hide
their gain. Fewer workers (halving; straight to 0 where start-up dominates; 0 never for an
IterableDataset) is tried where the current workers' start-up dominates the window, or where
the bounds say the loop is not input-bound (`input_bound` False).

A trial that makes workers persistent is judged without its one-time start-up: its first
window's largest step's excess over the window's median step (the first batch's wait of its
first epoch) is taken out of the window's mean, since that start-up is paid once in the whole
run and must not be charged to every later epoch (a non-persistent configuration pays it
every epoch, and its windows keep it). Advice (recommendations of the summary's schema) goes
first where it names one of those settings. A change is kept when the loop's speed-up over
the current configuration is beyond noise: the low end of the interval the compare page and
verify-after-change compute (verification.speedup_interval, with its run-to-run floor) is
above 1; else it is reverted. The search stops when no candidate is left, then holds still.

Bounds: never more workers than usable cores when loading is CPU work (or not known to be
waiting); memory bounds the count through the advice model's own budget (rules.memory_budget,
with its reserve). An IterableDataset is tuned only N -> M, and only where the shard check
shows it shards by worker (0 -> N would duplicate every sample)."""
from __future__ import annotations

import math

from .throughput_model import Thresholds
from .loader_settings import tuned_part  # noqa: F401  (the tuner reads it from here)
from .verification import speedup_interval

SCHEMA = "starvewatch.live_tuning/1"  # not starvewatch.tuning/1: that is `starvewatch tune`'s document
MIN_WINDOW_STEPS = 16  # a window spans whole epochs until it holds this many steps
# ... or, in a long epoch of a map-style loader, is decided in its middle at this many steps
# (hooks/live_tuner.py: the old iterator delivers what it holds, the new one takes the rest)
MID_EPOCH_WINDOW_STEPS = 64
# The share of a window its epochs' start-up (the epoch-first steps' excess over the median
# step) takes from which the start-up dominates: persistent workers paired, fewer workers tried.
STARTUP_SHARE = 0.2
TUNED_KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "in_order")
# Advice parameters a live loader can take (batch_size changes the step: not tuned live).
_ADVISED = {"num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "in_order"}


def window_figures(durations_ns: list[int], samples_per_step: float | None,
                   epochs: int | None = None) -> dict | None:
    """A window's step time (mean over every step, start-up included; spread from the steady
    steps) in the shape verification.per_sample_ms reads; None without steps. `epochs`: how
    many epochs began in the window (their first steps hold the start-up); `startup` (not
    shipped in records) says how much of the window the start-up took: the excess over the
    median step of the `epochs` largest steps (one without the count), and of the largest."""
    if not durations_ns:
        return None
    n = len(durations_ns)
    mean_ms = sum(durations_ns) / n / 1e6
    steady = durations_ns[1:] if n > 2 else durations_ns
    m = sum(steady) / len(steady)
    sd_ms = math.sqrt(sum((d - m) ** 2 for d in steady) / max(1, len(steady) - 1)) / 1e6
    rate = (samples_per_step or 1.0) / (mean_ms / 1e3) if mean_ms > 0 else None
    ordered = sorted(durations_ns)
    median = ordered[n // 2]
    largest = ordered[-max(1, min(epochs or 1, n)):]
    excess_ms = sum(d - median for d in largest) / 1e6
    total_ms = sum(durations_ns) / 1e6
    return {"step_time": {"mean_ms": mean_ms, "sd_ms": sd_ms, "steps": n,
                          "samples_per_step": samples_per_step},
            "samples_per_s" if samples_per_step else "batches_per_s": rate,
            "startup": {"epochs": epochs, "excess_ms": excess_ms, "largest_ms": (ordered[-1] - median) / 1e6,
                        "share": excess_ms / total_ms if total_ms > 0 else 0.0}}


def without_first_startup(figures: dict) -> dict:
    """The figures of a window with its largest step's excess over the median (a persistent
    trial's one-time start-up) taken out of the mean: what every later epoch runs at."""
    st, up = figures["step_time"], figures.get("startup") or {}
    cut_ms = up.get("largest_ms") or 0.0
    mean_ms = st["mean_ms"] - cut_ms / st["steps"]
    if cut_ms <= 0 or mean_ms <= 0:
        return figures
    key = "samples_per_s" if st.get("samples_per_step") else "batches_per_s"
    out = dict(figures, step_time=dict(st, mean_ms=mean_ms), excluded_startup_ms=cut_ms)
    out[key] = (st.get("samples_per_step") or 1.0) / (mean_ms / 1e3)
    return out


def short_epochs(figures: dict | None) -> bool:
    """Re-iterated in short epochs: the window held two epochs or more, or their start-up took
    STARTUP_SHARE of it or more."""
    up = (figures or {}).get("startup") or {}
    return (up.get("epochs") or 0) >= 2 or startup_dominates(figures)


def startup_dominates(figures: dict | None) -> bool:
    up = (figures or {}).get("startup") or {}
    return (up.get("share") or 0.0) >= STARTUP_SHARE


class _BudgetFacts:
    """What rules.memory_budget reads of a loader, from the training process's own readings."""

    def __init__(self, name: str, config: dict, per_worker_bytes: int, system: dict) -> None:
        self.name = name
        self.config = config
        self.workers = config.get("num_workers") or 0
        self.active_workers = self.workers
        self.system = system
        self.worker_info = {"worker_mem_bytes_max": per_worker_bytes}

    def evidence(self, **extra) -> dict:
        return {"num_workers": self.workers, **extra}


def memory_workers(name: str, config: dict, per_worker_bytes: int | None, system: dict) -> int | None:
    """The most workers the advice model's memory budget allows (rules.memory_budget, its
    reserve), or None when it cannot say (no workers measured yet)."""
    from .rules import memory_budget
    if not per_worker_bytes or not config.get("num_workers"):
        return None
    props = memory_budget(_BudgetFacts(name, config, per_worker_bytes, system), Thresholds(), {})
    for p in props:
        if p.get("parameter") == "num_workers":
            return int(p["suggested"])
    return None


def bounds_for(cores: int, *, memory_most: int | None = None, loading_waits: bool = False,
               iterable: bool = False, shards_by_worker: bool = False, cuda: bool = False,
               input_bound: bool | None = None) -> dict:
    """The limits one loader is tuned within. Loading that waits (I/O, sleeps) is not held
    to the cores; without a memory reading it is held to 4 per core. `input_bound` False
    (the loop barely waits for this loader) lets fewer workers be tried; None: not known."""
    cores = max(1, int(cores))
    most = (memory_most if memory_most is not None else 4 * cores) if loading_waits else cores
    if memory_most is not None:
        most = min(most, memory_most)
    return {"max_workers": max(0, most), "cores": cores, "loading_waits": loading_waits,
            "iterable": iterable, "shards_by_worker": shards_by_worker, "cuda": cuda,
            "input_bound": input_bound}


def candidates(current: dict, bounds: dict, advice: list[dict] | None = None, *,
               short: bool = False, startup_bound: bool = False) -> list[dict]:
    """One-change configurations to try from `current`, best first. `short`: short epochs
    (more workers come persistent); `startup_bound`: the current workers' start-up dominates
    (persistent workers, then fewer workers, come first)."""
    cur = tuned_part(current)
    out: list[dict] = []
    workers, most = cur["num_workers"], bounds["max_workers"]

    def add(**change) -> None:
        new = dict(cur, **change)
        if new["num_workers"] and new["prefetch_factor"] is None:
            new["prefetch_factor"] = 2  # 0 -> N: torch's next iter() needs one
        if new != cur and new not in out and _allowed(cur, new, bounds):
            out.append(new)

    for rec in advice or []:
        if rec.get("parameter") in _ADVISED and rec.get("kind", "speedup") == "speedup":
            also = {k: v for k, v in (rec.get("also") or {}).items() if k in _ADVISED}
            add(**{**also, rec["parameter"]: rec["suggested"]})
    fewer = None
    if workers and (startup_bound or bounds.get("input_bound") is False):
        fewer = 0 if startup_bound and not bounds.get("iterable") else workers // 2
    if startup_bound and not cur["persistent_workers"]:
        add(persistent_workers=True)  # the start-up paid once, the workers kept
    if startup_bound and fewer is not None:
        add(**_fewer(fewer))
    more = 2 if workers == 0 else workers * 2
    if min(more, most) > workers:
        add(num_workers=min(more, most), **({"persistent_workers": True} if short else {}))
    if workers:
        if (cur["prefetch_factor"] or 2) < 4:
            add(prefetch_factor=4)
        if not cur["persistent_workers"]:
            add(persistent_workers=True)
    if fewer is not None:
        add(**_fewer(fewer))
    if bounds.get("cuda") and not cur["pin_memory"]:
        add(pin_memory=True)
    return out


def _fewer(workers: int) -> dict:
    """The fewer-workers change (0 workers: no worker-only settings, as torch requires)."""
    return {"num_workers": workers} if workers else \
        {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False}


def _allowed(cur: dict, new: dict, bounds: dict) -> bool:
    workers = new["num_workers"]
    if workers > max(bounds["max_workers"], cur["num_workers"]):
        return False
    if bounds.get("iterable") and workers != cur["num_workers"]:
        # Never 0 -> N (every worker would yield every sample), and N -> M only where the
        # shard check saw the workers read disjoint data.
        if not cur["num_workers"] or not workers or not bounds.get("shards_by_worker"):
            return False
    if new["in_order"] is False and not workers:
        return False
    return True


class TuningPlan:
    """The search for one loader: `config()` says what the next window runs with;
    `window_done(figures)` takes its measurement and answers the decision (a record)."""

    def __init__(self, start: dict, bounds: dict, advice: list[dict] | None = None) -> None:
        self.start = tuned_part(start)
        self.current = dict(self.start)
        self.bounds = bounds
        self.advice = advice or []
        self.best: dict | None = None  # the current configuration's figures
        self.start_figures: dict | None = None
        self.trying: dict | None = None
        self.tried: list[dict] = [dict(self.start)]
        self.done = False
        self.stop_reason: str | None = None
        self.window = 0
        self.short = False  # re-iterated in short epochs (seen in a window's figures)

    def config(self) -> dict:
        return dict(self.trying or self.current)

    def _next_candidate(self) -> dict | None:
        short = self.short or short_epochs(self.best)
        self.short = short  # kept once seen: the epochs' length does not change with the loader
        startup_bound = bool(self.current["num_workers"]) and not self.current["persistent_workers"] \
            and startup_dominates(self.best)
        for cand in candidates(self.current, self.bounds, self.advice, short=short, startup_bound=startup_bound):
            if cand not in self.tried:
                return cand
        return None

    def window_done(self, figures: dict | None) -> dict:
        """The decision after one window of the configuration `config()` gave."""
        self.window += 1
        if figures is not None and self.trying is not None and _makes_persistent(self.current, self.trying):
            figures = without_first_startup(figures)  # its one-time start-up: not every epoch's
        record = {"schema": SCHEMA, "window": self.window, "config": self.config(),
                  "figures": _rounded(_shipped(figures))}
        if figures is not None and figures.get("excluded_startup_ms"):
            record["excluded_startup_ms"] = round(figures["excluded_startup_ms"], 3)
        advised = [r.get("parameter") for r in self.advice if r.get("parameter") in _ADVISED]
        if advised:
            record["advice"] = advised
        if figures is None:
            record["decision"] = "no_steps"
            return record
        if self.trying is None:  # the current configuration's window (the first: the start)
            self.best = figures
            if self.start_figures is None:
                self.start_figures = figures
            record["decision"] = "measured"
        else:
            interval = speedup_interval(self.best, figures)
            record["interval"] = _rounded(interval)
            if interval is not None and interval["low"] > 1.0:
                self.current, self.best = self.trying, figures
                record["decision"] = "kept"
            else:
                record["decision"] = "slower_reverted" if interval and interval["high"] < 1.0 else "reverted"
            self.trying = None
        return self._advance(record)

    def _advance(self, record: dict) -> dict:
        nxt = None if self.done else self._next_candidate()
        if nxt is None:
            if not self.done:
                self.done, self.stop_reason = True, "no candidate left"
                record["stopped"] = self.stop_reason
        else:
            self.trying = nxt
            self.tried.append(nxt)
            record["next"] = nxt
        return record

    def abandon(self, reason: str) -> dict:
        """A change failed to apply (or tuning must stop): back to the last good configuration."""
        self.trying = None
        self.done, self.stop_reason = True, reason
        return {"schema": SCHEMA, "window": self.window, "config": dict(self.current),
                "decision": "disabled", "stopped": reason}

    def outcome(self) -> dict:
        """Start and final configurations with the measured gain (final over start)."""
        gain = speedup_interval(self.start_figures, self.best) \
            if self.start_figures is not None and self.best is not None and self.best is not self.start_figures else None
        return {"schema": SCHEMA, "start": dict(self.start), "final": dict(self.current),
                "windows": self.window, "done": self.done, "stopped": self.stop_reason,
                "gain": _rounded(gain)}


def _makes_persistent(current: dict, trying: dict) -> bool:
    return bool(trying["num_workers"] and trying["persistent_workers"]
                and not (current["num_workers"] and current["persistent_workers"]))


def _shipped(figures: dict | None) -> dict | None:
    """The figures as records carry them (TuningFigures: the start-up estimate stays here)."""
    if figures is None:
        return None
    return {k: v for k, v in figures.items() if k not in ("startup", "excluded_startup_ms")}


def _rounded(d):
    if isinstance(d, dict):
        return {k: _rounded(v) for k, v in d.items()}
    if isinstance(d, float):
        return round(d, 4)
    return d


def found_line(config: dict | None, outcome: dict, loader: str) -> str | None:
    """The line to copy with the found configuration (analysis/snippet.py), or None when
    tuning kept the start."""
    from .snippet import snippet
    start, final = outcome["start"], outcome["final"]
    recs = [{"loader": loader, "parameter": k, "suggested": final[k]} for k in TUNED_KEYS
            if final.get(k) != start.get(k)]
    return snippet(config, recs, loader) if recs else None


def outcome_text(outcome: dict) -> str:
    """One report line: start -> final and the measured gain."""
    start, final = outcome["start"], outcome["final"]
    changed = [f"{k} {start.get(k)!r} -> {final.get(k)!r}" for k in TUNED_KEYS
               if final.get(k) != start.get(k)
               and not (k == "prefetch_factor" and not start.get("num_workers") and final.get(k) == 2)]
    gain = outcome.get("gain")
    measured = (f": {gain['speedup']:.2f}x [{gain['low']:.2f}, {gain['high']:.2f}] {gain['basis']}"
                if gain else "")
    what = ", ".join(changed) if changed else "kept its configuration"
    off = f" (then off: {outcome['disabled']})" if outcome.get("disabled") else ""
    return f"tuned {outcome['loader']}: {what}{measured} over {outcome['windows']} windows{off}"



def with_live_tuning(summary: dict, records: list[dict], outcomes: list[dict]) -> dict:
    """Attach live tuning's section to a summary (`live_tuning`; `tuning` is `starvewatch
    tune`'s) and let what tuning measured on the loop replace the model's advice on the
    settings it searched: the model predicts from totals that mix every configuration tried,
    while the tuned loader already runs its found one. Protective advice and advice on other
    settings (batch size, transforms) stay. Returns the summary (changed in place)."""
    section = {"schema": SCHEMA, "records": list(records), "loaders": list(outcomes), "replaced": []}
    summary["live_tuning"] = section
    searched = {o.get("loader") for o in outcomes if not o.get("disabled")}
    keep = []
    for r in summary.get("recommendations") or []:
        if (r.get("loader") in searched and r.get("parameter") in TUNED_KEYS
                and r.get("kind", "speedup") != "protective"):
            section["replaced"].append(f"{r['loader']}: {r['parameter']}={r.get('suggested')!r}")
        else:
            keep.append(r)
    summary["recommendations"] = keep
    return summary
