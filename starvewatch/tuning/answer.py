"""The answer rule, the table and the ready-to-paste DataLoader(...) call.

With a consumption rate: the configuration with the fewest workers (then the least memory)
whose throughput covers the consumption with a 20% margin. Without one: the fewest workers
whose throughput is within 10% of the best measured.
"""
from __future__ import annotations

CONSUMPTION_MARGIN = 1.2   # throughput must cover consumption x this
WITHIN_BEST = 0.10         # without a consumption rate: within 10% of the best


def rate(trial) -> float:
    """What the training would see: steady throughput with each epoch's start counted."""
    return trial.epoch_batches_per_s() or 0.0


def memory_bytes(trial) -> float:
    """Workers' private memory plus the batches in flight (what the configuration holds)."""
    cfg = trial.config
    in_flight = cfg.num_workers * (cfg.prefetch_factor or 0) * (trial.batch_bytes or 0)
    return cfg.num_workers * (trial.worker_uss_bytes or 0) + in_flight


PERSISTENT_MIN_SAVING = 0.01  # persistent workers must save 1% of an epoch's time to be worth holding


def restart_s(trial) -> float | None:
    """What starting an epoch costs: spawning the workers, or resuming persistent ones."""
    return trial.restart_s if trial.config.persistent_workers else trial.startup_s


def _persistence(pick, trials: list):
    """persistent_workers only when it measurably pays: resuming the workers instead of
    spawning them saves at least 1% of an epoch. The steady throughput of the two is the
    same loader's; which one measured higher is noise."""
    if pick is None or not pick.config.num_workers:
        return pick
    on = next((t for t in trials if t.usable and t.config == pick.config.replace(persistent_workers=True)), None)
    off = next((t for t in trials if t.usable and t.config == pick.config.replace(persistent_workers=False)), None)
    if on is None or off is None or on.restart_s is None or not off.startup_s or not off.epoch_batches:
        return pick
    epoch_s = off.epoch_batches / off.batches_per_s
    return on if (off.startup_s - on.restart_s) / epoch_s >= PERSISTENT_MIN_SAVING else off


def choose(trials: list, consumption_batches_per_s: float | None):
    """(answer trial or None, one sentence saying why)."""
    pick, why = _choose(trials, consumption_batches_per_s)
    return _persistence(pick, trials), why


def _choose(trials: list, consumption_batches_per_s: float | None):
    usable = [t for t in trials if t.usable]
    if not usable:
        return None, "no configuration could be measured within the budget"
    best = max(usable, key=rate)
    key = lambda t: (t.config.num_workers, memory_bytes(t), -rate(t))  # noqa: E731
    if consumption_batches_per_s:
        needed = consumption_batches_per_s * CONSUMPTION_MARGIN
        covering = [t for t in usable if rate(t) >= needed]
        if covering:
            pick = min(covering, key=key)
            return pick, (f"the fewest workers (then least memory) delivering at least {needed:.1f} batches/s "
                          f"(consumption {consumption_batches_per_s:.1f} x {CONSUMPTION_MARGIN})")
        near = [t for t in usable if rate(t) >= (1 - WITHIN_BEST) * rate(best)]
        pick = min(near, key=key)
        return pick, (f"no configuration covers {needed:.1f} batches/s (consumption "
                      f"{consumption_batches_per_s:.1f} x {CONSUMPTION_MARGIN}); the best measured is "
                      f"{rate(best):.1f}: the fewest workers within {100 * WITHIN_BEST:.0f}% of it. The loop will "
                      f"still wait for data: make loading cheaper")
    near = [t for t in usable if rate(t) >= (1 - WITHIN_BEST) * rate(best)]
    pick = min(near, key=key)
    return pick, (f"the fewest workers within {100 * WITHIN_BEST:.0f}% of the best measured throughput "
                  f"({rate(best):.1f} batches/s, {best.config.label()})")


def _mib(n) -> str:
    return "n/a" if not n else f"{n / 2**20:.0f} MiB"


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{1000 * seconds:.0f}"


def _num(x, digits=1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def table(trials: list, answer=None) -> str:
    header = (f"  {'configuration':<58} {'batches/s':>10} {'samples/s':>10} {'start ms':>9} "
              f"{'worker mem':>10} {'CPU %':>6}  note")
    lines = [header]
    for t in trials:
        mark = "*" if t is answer else " "
        if t.status in ("skipped", "failed"):
            lines.append(f"{mark} {t.config.label():<58} {t.status}: {t.reason}")
            continue
        note = "" if t.status == "measured" else f"{t.status}: {t.reason}"
        if t.status == "measured" and t.spread is not None and t.spread > 0.1:
            note = f"unsteady ({100 * t.spread:.0f}% between halves)"
        if t.runs > 1:
            note = f"mean of {t.runs} runs" + (f"; {note}" if note else "")
        lines.append(f"{mark} {t.config.label():<58} {_num(t.batches_per_s):>10} {_num(t.samples_per_s):>10} "
                     f"{_ms(restart_s(t)):>9} {_mib(t.worker_uss_bytes):>10} {_num(t.cpu_pct, 0):>6}  "
                     f"{note}".rstrip())
    return "\n".join(lines)


def snippet(config, batch_size: int | None) -> str:
    parts = ["dataset"]
    if batch_size is not None:
        parts.append(f"batch_size={batch_size}")
    parts.append(f"num_workers={config.num_workers}")
    if config.num_workers:
        parts.append(f"prefetch_factor={config.prefetch_factor}")
        if config.persistent_workers:
            parts.append("persistent_workers=True")
    if config.pin_memory:
        parts.append("pin_memory=True")
    if config.snapshot_every_n_steps is not None:
        parts.append(f"snapshot_every_n_steps={config.snapshot_every_n_steps}")
        return f"StatefulDataLoader({', '.join(parts)})"
    return f"DataLoader({', '.join(parts)})"
