"""Verify after change: was each earlier recommendation applied, and did it pay off?

Judged by samples/s (a batch-size change is not refuted by construction): the per-sample step
time before and after, each a mean with its spread from the step-time histograms that
`finish()` and the collector share, so both give the same answer. The interval adds a floor
for run-to-run variation that the spread within one run does not show (a busy host, another
job's I/O); the verdict is confirmed, refuted or inconclusive, with the interval shown.
"""
from __future__ import annotations

import math

from .host_moves import moved
from .loader_settings import setting_changed, tuned_part

Z_95 = 1.96
RUN_TO_RUN_NOISE = 0.04   # relative: two runs of one configuration differ by this much (1 sd)
KEEPS_THROUGHPUT = 0.9    # protective advice is confirmed when it keeps 90% of the throughput


def per_sample_ms(loader: dict) -> tuple[float, float, str] | None:
    """(mean, standard error) of one loader's step time per sample, and the basis."""
    st = loader.get("step_time") or {}
    mean, sd, steps = st.get("mean_ms"), st.get("sd_ms"), st.get("steps") or 0
    if not mean or steps < 2:
        return None
    per_step = st.get("samples_per_step")
    basis = "samples/s" if per_step else "batches/s"
    scale = per_step or 1.0
    se = (sd or 0.0) / math.sqrt(steps)
    return mean / scale, se / scale, basis


def speedup_interval(old: dict, new: dict) -> dict | None:
    """Measured speed-up (old per-sample time / new) with a 95% interval."""
    a, b = per_sample_ms(old), per_sample_ms(new)
    if a is None or b is None:  # a summary without step times: its rates, with the noise floor only
        key = "samples_per_s" if old.get("samples_per_s") and new.get("samples_per_s") else "batches_per_s"
        if not old.get(key) or not new.get(key):
            return None
        a, b = (1 / old[key], 0.0, key.replace("_per_s", "/s")), (1 / new[key], 0.0, key.replace("_per_s", "/s"))
    ratio = a[0] / b[0]
    basis = "samples/s" if a[2] == b[2] == "samples/s" else "batches/s"
    rel = math.sqrt((a[1] / a[0]) ** 2 + (b[1] / b[0]) ** 2 + 2 * RUN_TO_RUN_NOISE ** 2)
    # Capped: step times as noisy as a hand-made batch can make them would overflow exp(); an
    # interval of e^50 either way already says "no evidence".
    spread = math.exp(min(Z_95 * rel, 50.0))
    return {"speedup": ratio, "low": ratio / spread, "high": ratio * spread, "basis": basis}


def judge(expected: float | None, measured: dict | None) -> str:
    """A speed-up is confirmed when it is significant (interval above 1) and at least half the
    predicted gain is within reach (interval reaches it); refuted when the interval lies below
    that; inconclusive otherwise. Protective advice (no gain claimed) is confirmed when it
    keeps the throughput, refuted when it clearly lost some."""
    if measured is None:
        return "inconclusive"
    low, high = measured["low"], measured["high"]
    if not expected:
        if low >= KEEPS_THROUGHPUT:
            return "confirmed"
        return "refuted" if high < KEEPS_THROUGHPUT else "inconclusive"
    target = 1 + 0.5 * (expected - 1)
    if high < target:
        return "refuted"
    return "confirmed" if low > 1 else "inconclusive"


def tuned_outcomes(summary: dict) -> dict[str, dict]:
    """Each live-tuned loader's outcome (the summary's `live_tuning` section,
    `starvewatch.live_tuning/1`: start, final, gain), by loader name; {} for a run not tuned live."""
    tuning = summary.get("live_tuning") or {}
    return {o["loader"]: o for o in tuning.get("loaders") or []
            if isinstance(o, dict) and o.get("loader") and "start" in o and "final" in o}


def pooled_windows(summary: dict, loader: str, config: dict) -> dict | None:
    """The step-time figures (verification.per_sample_ms's shape) of the tuning windows of
    `loader` that ran `config`, pooled over their steps; None when no window ran it."""
    parts = [r["figures"]["step_time"] for r in (summary.get("live_tuning") or {}).get("records") or []
             if r.get("loader") == loader and r.get("config") == config
             and ((r.get("figures") or {}).get("step_time") or {}).get("steps")]
    if not parts:
        return None
    n = sum(p["steps"] for p in parts)
    mean = sum(p["mean_ms"] * p["steps"] for p in parts) / n
    # Within- and between-window spread: a window of another load counts as noise.
    ss = sum((p["steps"] - 1) * (p.get("sd_ms") or 0.0) ** 2 + p["steps"] * (p["mean_ms"] - mean) ** 2 for p in parts)
    per_step = parts[0].get("samples_per_step")
    rate = (per_step or 1.0) / (mean / 1e3) if mean > 0 else None
    return {"step_time": {"mean_ms": mean, "sd_ms": math.sqrt(ss / max(1, n - 1)), "steps": n,
                          "samples_per_step": per_step},
            "samples_per_s" if per_step else "batches_per_s": rate, "windows": len(parts)}


def _tuned_config(loader: dict, outcome: dict | None, which: str = "final") -> dict:
    """A loader's configuration as it ran at the end of tuning (its own where not tuned)."""
    config = dict(loader.get("config") or {})
    if outcome is not None:  # only what tuning moved: the rest as the loader recorded it
        config.update({k: outcome[which].get(k) for k in _tuning_change(outcome)})
    return config


def _tuning_change(outcome: dict) -> dict:
    return {k: [outcome["start"].get(k), v] for k, v in outcome["final"].items() if outcome["start"].get(k) != v}


def change_label(result: dict) -> str:
    """The change a verify result is about: `num_workers=2`, or a tuning's `tuned: num_workers
    0 -> 2, prefetch_factor 2 -> 4`."""
    if result.get("kind") == "tuning":
        return "tuned: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in (result.get("change") or {}).items())
    if result.get("kind") == "reproduces":
        return "tuned configuration, untuned"
    return f"{result['parameter']}={result['suggested']!r}"


def _tuning_result(loader: str, outcome: dict, current: dict) -> dict:
    """A tuned run's own change judged inside it: its final windows against its start windows
    (one run, one load), confirmed when faster beyond noise, refuted when it ended slower."""
    measured = speedup_interval(pooled_windows(current, loader, outcome["start"]) or {},
                                pooled_windows(current, loader, outcome["final"]) or {})
    status = "inconclusive" if measured is None else "confirmed" if measured["low"] > 1 else \
        "refuted" if measured["high"] < 1 else "inconclusive"
    return {"loader": loader, "parameter": None, "suggested": outcome["final"], "kind": "tuning",
            "change": _tuning_change(outcome), "applied": True, "expected_speedup": None,
            "judged_against": None, "measured_against": "start windows",
            **_measured_fields(measured), "status": status}


def _measured_fields(measured: dict | None) -> dict:
    return {"measured_speedup": round(measured["speedup"], 3) if measured else None,
            "interval": [round(measured["low"], 3), round(measured["high"], 3)] if measured else None,
            "basis": measured["basis"] if measured else None}


def _figures_of(summary: dict, loader: dict, outcome: dict | None, which: str = "final") -> dict:
    """What a loader's throughput is judged by: a tuned loader's windows of the `which`
    configuration (its run-wide figures mix every trial), else the loader summary itself."""
    if outcome is not None:
        pooled = pooled_windows(summary, loader["name"], outcome[which])
        if pooled is not None:
            return dict(loader, **pooled)
    return loader


def verify(previous: dict, current: dict) -> dict | None:
    """Long: one pass over the earlier run's recommendations, plus the live-tuned cases.

    A loader tuned live in the current run: the change verified is its tuning's start ->
    final (not the run-vs-run configuration diff), judged by its final windows against its
    start windows; an earlier recommendation counts as applied where the final configuration
    took it, measured against the start windows where the start was the earlier run's
    configuration (same run, same load), else against the earlier run. A loader tuned in the
    earlier run: its final configuration and final windows are what the current run is
    compared with; a current run with that configuration, untuned, is a `reproduces` result."""
    prev_loaders = {l["name"]: l for l in previous.get("loaders", [])}
    tuned_now, tuned_before = tuned_outcomes(current), tuned_outcomes(previous)
    results, changed, extra = [], {}, []
    for loader in current.get("loaders", []):
        name = loader["name"]
        if name in tuned_now:
            if _tuning_change(tuned_now[name]):
                changed[name] = _tuning_change(tuned_now[name])
                extra.append(_tuning_result(name, tuned_now[name], current))
            continue
        old = prev_loaders.get(name)
        if old is None:
            continue
        old_config = _tuned_config(old, tuned_before.get(name))
        # Only settings whose effect changed: torch's implied defaults are no change.
        for key in sorted(set(old_config) | set(loader.get("config") or {})):
            a, b = old_config.get(key), (loader.get("config") or {}).get(key)
            if setting_changed(old_config, loader.get("config"), key):
                changed.setdefault(name, {})[key] = [a, b]
        if name in tuned_before and name not in changed:
            measured = speedup_interval(_figures_of(previous, old, tuned_before[name]), loader)
            extra.append({"loader": name, "parameter": None, "suggested": tuned_before[name]["final"],
                          "kind": "reproduces", "applied": True, "expected_speedup": None, "judged_against": None,
                          "measured_against": "earlier run's final windows", **_measured_fields(measured),
                          # reproduced within noise: not slower beyond the interval
                          "status": "inconclusive" if measured is None else
                          "confirmed" if measured["high"] >= 1 else "refuted"})
    if not changed and not extra:
        return None
    joint = {p["loader"]: p for p in previous.get("plans") or []}
    for rec in previous.get("recommendations", []):
        now = next((l for l in current["loaders"] if l["name"] == rec["loader"]), None)
        old = prev_loaders.get(rec["loader"])
        outcome = tuned_now.get(rec["loader"])
        now_config = _tuned_config(now, outcome) if now is not None else {}
        applied = now is not None and rec["parameter"] is not None and now_config.get(rec["parameter"]) == rec["suggested"]
        against = "earlier run"
        if now is not None and old is not None:
            before = _figures_of(previous, old, tuned_before.get(rec["loader"]))
            after = _figures_of(current, now, outcome)
            if outcome is not None and tuned_part(_tuned_config(old, tuned_before.get(rec["loader"]))) == outcome["start"]:
                start = pooled_windows(current, now["name"], outcome["start"])
                if start is not None:  # the tuned run started where the earlier one ran: same run, same load
                    before, against = start, "start windows"
            measured = speedup_interval(before, after)
        else:
            measured = None
        expected = rec.get("expected_speedup")
        plan = joint.get(rec["loader"])
        together = plan is not None and len(plan["changes"]) > 1 and rec["parameter"] in plan["changes"] and all(
            now_config.get(k) == v for k, v in plan["changes"].items()) if now else False
        if together and rec.get("kind", "speedup") == "speedup":
            expected = plan["expected_speedup"]  # one measured gain: judged against the joint prediction
        status = judge(expected, measured) if applied else "not_applied"
        results.append({"loader": rec["loader"], "parameter": rec["parameter"], "suggested": rec["suggested"],
                        "kind": rec.get("kind", "speedup"), "applied": applied,
                        "expected_speedup": rec.get("expected_speedup"),
                        "judged_against": expected if applied else None,
                        **_measured_fields(measured),
                        "wait_fraction_before": old.get("input_wait_fraction") if old else None,
                        "wait_fraction_after": now.get("input_wait_fraction") if now else None,
                        "status": status})
        if outcome is not None:
            results[-1]["measured_against"] = against
    # Changes applied to one loader in the same run share one measured speed-up: say so.
    for r in results:
        r["applied_together"] = [f"{o['parameter']}={o['suggested']!r}" for o in results
                                 if o is not r and o["applied"] and r["applied"] and o["loader"] == r["loader"]]
    # A prediction judged on another host than it was made on: the host figures that moved.
    return {"previous_run": previous["run"]["id"], "changed": changed, "results": extra + results,
            "host_moved": moved(previous, current)}


def joint_changes_note(verification: dict | None) -> list[str]:
    """One sentence per loader whose applied changes share one measured speed-up."""
    groups: dict[str, list[str]] = {}
    for r in (verification or {}).get("results", []):
        if r["applied"] and r.get("applied_together"):
            groups.setdefault(r["loader"], []).append(f"{r['parameter']}={r['suggested']!r}")
    return [f"{loader}: {', '.join(changes)} were applied together; the measured speed-up is theirs "
            f"jointly, judged against their joint prediction." for loader, changes in groups.items()]
