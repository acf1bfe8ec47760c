"""Stragglers across the ranks of a synchronous job: pure functions over per-window step sums.

In a job that synchronizes every step (DDP's gradient all-reduce), every rank takes the same
step time: the ranks that are early wait inside the collective, and without marks that wait
counts as their "compute". Whole-run fractions therefore cannot name the slow rank. Instead the
ranks are compared on windows of *aligned* step indices (the same loader, epoch and step on
every rank):

- **input straggler**: a rank whose mean input wait exceeds the median rank's by 10% of the
  step time or more (warning), 20% or more (critical);
- **compute straggler**: the same rule on compute, judged only where the compute before the
  collective is measured: every rank records a `forward` phase (the Lightning callback does,
  up to `on_before_backward`, where DDP's all-reduce begins; or `starvewatch.phase("forward")`),
  or marks its steps with `starvewatch.step()` so the collective's wait falls in `other_ms`. Unmarked compute
  includes the collective's wait, so the fastest rank would look slowest: not judged. A compute
  straggler also reaches the collective later: its wait + compute must exceed the median rank's
  by as much, which keeps a rank whose marked compute holds the collective from being named.

"The median rank" with an even number of ranks is the lower median (with two ranks: the faster
one), so the reference is always a real rank's measurement. A rank is named when the median of
its per-window excess over the windows crosses a threshold: one noisy window names no one, and
neither does a run with a single judged window, or a window of a few steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("input", "compute")


@dataclass(frozen=True)
class StragglerThresholds:
    warning_fraction: float = 0.10   # excess over the median rank, as a share of the step time
    critical_fraction: float = 0.20
    window_steps: int = 20           # aligned step indices per window
    min_window_fill: float = 0.9     # a window counts once every rank has this share of its steps
    marked_share: float = 0.9        # share of a window's steps with `other_ns` > 0: step() marks them
    min_window_steps: int = 5        # steps a window needs on every rank to be judged (not an epoch's last 2)
    min_windows: int = 2             # judged windows before a rank can be named


DEFAULT = StragglerThresholds()


@dataclass
class WindowSums:
    """One rank's sums over one window of aligned steps (what the SQL aggregation returns)."""
    steps: int
    wait_ns: int
    compute_ns: int
    other_ns: int
    marked_steps: int = 0   # steps whose `other_ns` > 0: the compute was marked with step()
    forward_steps: int = 0  # steps with a `forward` phase (a framework callback's, or phase())
    forward_ns: int = 0


@dataclass
class WindowVerdict:
    loader: str
    epoch: int
    step_ms: float
    compute_measured: bool
    # per rank: (input excess fraction, compute excess fraction or None)
    excess: dict[int, tuple[float, float | None]] = field(default_factory=dict)


def severity(excess_fraction: float | None, t: StragglerThresholds = DEFAULT) -> str | None:
    if excess_fraction is None:
        return None
    if excess_fraction >= t.critical_fraction:
        return "critical"
    if excess_fraction >= t.warning_fraction:
        return "warning"
    return None


def lower_median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def judge_window(loader: str, epoch: int, window: int, per_rank: dict[int, WindowSums],
                 t: StragglerThresholds = DEFAULT) -> WindowVerdict | None:
    """Compare the ranks on one window; None when fewer than two ranks have it (nearly) whole."""
    if len(per_rank) < 2:
        return None
    most = max(s.steps for s in per_rank.values())
    if most == 0 or any(s.steps < t.min_window_fill * most for s in per_rank.values()):
        return None  # a live run: some rank has not shipped this window yet
    if most < min(t.min_window_steps, t.window_steps):
        return None  # a few steps (an epoch's last ones) are too few to judge a rank by
    wait = {r: s.wait_ns / s.steps for r, s in per_rank.items()}
    compute = {r: s.compute_ns / s.steps for r, s in per_rank.items()}
    step = {r: (s.wait_ns + s.compute_ns + s.other_ns) / s.steps for r, s in per_rank.items()}
    step_ns = lower_median(list(step.values()))
    if step_ns <= 0:
        return None
    # The compute before the collective: the `forward` phase where every rank has one (the
    # Lightning callback marks it up to on_before_backward, where DDP's all-reduce starts),
    # else the step()-marked compute.
    if all(s.forward_steps >= t.marked_share * s.steps for s in per_rank.values()):
        compute = {r: s.forward_ns / s.forward_steps for r, s in per_rank.items()}
        measured = True
    else:
        measured = all(s.marked_steps >= t.marked_share * s.steps for s in per_rank.values())
    busy = {r: wait[r] + compute[r] for r in per_rank}
    wait_ref, compute_ref = lower_median(list(wait.values())), lower_median(list(compute.values()))
    busy_ref = lower_median(list(busy.values()))
    verdict = WindowVerdict(loader, epoch, step_ns / 1e6, measured)
    for rank in per_rank:
        compute_excess = None
        if measured:
            # A rank computing longer also reaches the collective later (wait + compute is
            # longer too). Where the marked compute still holds the collective (step() around a
            # DDP backward), the early ranks' compute is longer but they do not arrive later.
            compute_excess = min(compute[rank] - compute_ref, busy[rank] - busy_ref) / step_ns
        verdict.excess[rank] = ((wait[rank] - wait_ref) / step_ns, compute_excess)
    return verdict


def find_stragglers(windows: list[WindowVerdict], t: StragglerThresholds = DEFAULT) -> dict:
    """Name the straggling ranks over all windows: the median excess of each rank and kind."""
    by_key: dict[tuple[str, int, str], list[float]] = {}
    flagged: dict[tuple[str, int, str], dict[str, int]] = {}
    for w in windows:
        for rank, (input_excess, compute_excess) in w.excess.items():
            for kind, value in (("input", input_excess), ("compute", compute_excess)):
                if value is None:
                    continue
                key = (w.loader, rank, kind)
                by_key.setdefault(key, []).append(value)
                level = severity(value, t)
                if level:
                    counts = flagged.setdefault(key, {"warning": 0, "critical": 0})
                    counts[level] += 1
    found = []
    for (loader, rank, kind), values in by_key.items():
        typical = _median(values)
        level = severity(typical, t)
        if level is None or len(values) < t.min_windows:
            continue  # a run too short to tell a slow rank from a noisy moment names no one
        step_ms = _median([w.step_ms for w in windows if w.loader == loader])
        found.append({"rank": rank, "kind": kind, "severity": level, "loader": loader,
                      "excess_fraction": round(typical, 4), "excess_ms": round(typical * step_ms, 3),
                      "step_ms": round(step_ms, 3), "windows": len(values),
                      "windows_flagged": flagged.get((loader, rank, kind), {"warning": 0, "critical": 0}),
                      "cause": None})
    found.sort(key=lambda s: (-s["excess_fraction"], s["rank"]))
    loaders = sorted({w.loader for w in windows})
    per_rank: dict[str, dict[int, dict]] = {}
    for (loader, rank, kind), values in sorted(by_key.items()):
        entry = per_rank.setdefault(loader, {}).setdefault(rank, {"input_excess_fraction": None,
                                                                  "compute_excess_fraction": None})
        entry[f"{kind}_excess_fraction"] = round(_median(values), 4)
    return {
        "rule": {"warning_fraction": t.warning_fraction, "critical_fraction": t.critical_fraction,
                 "window_steps": t.window_steps},
        "windows": len(windows),
        "compute_measured": {name: any(w.compute_measured for w in windows if w.loader == name)
                             for name in loaders},
        "per_rank": per_rank,
        "stragglers": found,
    }


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def windows_from_rows(rows, t: StragglerThresholds = DEFAULT, forward_rows=()) -> list[WindowVerdict]:
    """Rows of (loader, epoch, window, rank, steps, wait_ns, compute_ns, other_ns, marked_steps),
    and of (loader, epoch, window, rank, steps, forward_ns) for `forward` phases, in any order,
    into judged windows ordered by loader, epoch and window."""
    forward = {tuple(r[:4]): (int(r[4]), int(r[5])) for r in forward_rows}
    grouped: dict[tuple[str, int, int], dict[int, WindowSums]] = {}
    for loader, epoch, window, rank, steps, wait, compute, other, marked in rows:
        f_steps, f_ns = forward.get((loader, epoch, window, rank), (0, 0))
        grouped.setdefault((loader, epoch, window), {})[rank] = WindowSums(
            int(steps), int(wait), int(compute), int(other), int(marked), f_steps, f_ns)
    out = []
    for (loader, epoch, window), per_rank in sorted(grouped.items()):
        verdict = judge_window(loader, epoch, window, per_rank, t)
        if verdict is not None:
            out.append(verdict)
    return out


def likely_cause(finding: dict, rank_summary: dict | None, rank_system: dict | None,
                 others_system: list[dict]) -> dict:
    """Why this rank is slow, from its own samples: its loader's diagnosis, workers, host."""
    system = rank_system or {}
    loader = finding["loader"]
    cause = {"host": system.get("host"), "cpu_pct_mean": system.get("cpu_pct_mean"),
             "iowait_pct_mean": system.get("iowait_pct_mean"),
             "others_cpu_pct_mean": _mean_of(others_system, "cpu_pct_mean")}
    workers = (system.get("loaders") or {}).get(loader)
    if workers:
        cause.update(workers_configured=workers.get("configured_workers"),
                     workers_alive_min=workers.get("alive_workers_min"),
                     worker_load_ms_mean=workers.get("worker_load_ms_mean"))
    if finding["kind"] == "input":
        factor = ((rank_summary or {}).get("verdict") or {}).get("limiting_factor")
        recs = [r for r in (rank_summary or {}).get("recommendations") or [] if r["loader"] == loader]
        cause["limiting_factor"] = factor
        if recs:
            cause["recommendation"] = {k: recs[0][k] for k in ("parameter", "current", "suggested", "reason")}
        text = f"rank {finding['rank']} waits {finding['excess_ms']:.1f} ms more per step for its {loader} data"
        if workers and workers.get("alive_workers_min") is not None and workers.get("configured_workers") \
                and workers["alive_workers_min"] < workers["configured_workers"]:
            text += f"; only {workers['alive_workers_min']} of its {workers['configured_workers']} workers stayed alive"
        elif recs:
            text += f": {recs[0]['reason']}"
        elif factor:
            text += f" ({factor.replace('_', ' ')})"
    else:
        text = (f"rank {finding['rank']} computes {finding['excess_ms']:.1f} ms longer per step before the "
                f"collective; the other ranks wait for it there")
        mine, theirs = cause["cpu_pct_mean"], cause["others_cpu_pct_mean"]
        if mine is not None and theirs is not None and mine > theirs + 10:
            text += f"; its host's CPU was {mine:.0f}% busy against {theirs:.0f}% on the others"
    cause["text"] = text
    return cause


def _mean_of(systems: list[dict], key: str) -> float | None:
    values = [s.get(key) for s in systems if s and s.get(key) is not None]
    return sum(values) / len(values) if values else None
