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
from .loader_settings import setting_changed

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


def verify(previous: dict, current: dict) -> dict | None:
    prev_loaders = {l["name"]: l for l in previous.get("loaders", [])}
    results, changed = [], {}
    for loader in current.get("loaders", []):
        old = prev_loaders.get(loader["name"])
        if old is None:
            continue
        # Only settings whose effect changed: torch's implied defaults are no change.
        for key in sorted(set(old.get("config") or {}) | set(loader.get("config") or {})):
            a, b = (old.get("config") or {}).get(key), (loader.get("config") or {}).get(key)
            if setting_changed(old.get("config"), loader.get("config"), key):
                changed.setdefault(loader["name"], {})[key] = [a, b]
    if not changed:
        return None
    joint = {p["loader"]: p for p in previous.get("plans") or []}
    for rec in previous.get("recommendations", []):
        now = next((l for l in current["loaders"] if l["name"] == rec["loader"]), None)
        old = prev_loaders.get(rec["loader"])
        applied = now is not None and rec["parameter"] is not None and \
            (now.get("config") or {}).get(rec["parameter"]) == rec["suggested"]
        measured = speedup_interval(old, now) if now is not None and old is not None else None
        expected = rec.get("expected_speedup")
        plan = joint.get(rec["loader"])
        together = plan is not None and len(plan["changes"]) > 1 and rec["parameter"] in plan["changes"] and all(
            (now.get("config") or {}).get(k) == v for k, v in plan["changes"].items()) if now else False
        if together and rec.get("kind", "speedup") == "speedup":
            expected = plan["expected_speedup"]  # one measured gain: judged against the joint prediction
        status = judge(expected, measured) if applied else "not_applied"
        results.append({"loader": rec["loader"], "parameter": rec["parameter"], "suggested": rec["suggested"],
                        "kind": rec.get("kind", "speedup"), "applied": applied,
                        "expected_speedup": rec.get("expected_speedup"),
                        "judged_against": expected if applied else None,
                        "measured_speedup": round(measured["speedup"], 3) if measured else None,
                        "interval": [round(measured["low"], 3), round(measured["high"], 3)] if measured else None,
                        "basis": measured["basis"] if measured else None,
                        "wait_fraction_before": old.get("input_wait_fraction") if old else None,
                        "wait_fraction_after": now.get("input_wait_fraction") if now else None,
                        "status": status})
    # Changes applied to one loader in the same run share one measured speed-up: say so.
    for r in results:
        r["applied_together"] = [f"{o['parameter']}={o['suggested']!r}" for o in results
                                 if o is not r and o["applied"] and r["applied"] and o["loader"] == r["loader"]]
    # A prediction judged on another host than it was made on: the host figures that moved.
    return {"previous_run": previous["run"]["id"], "changed": changed, "results": results,
            "host_moved": moved(previous, current)}


def joint_changes_note(verification: dict | None) -> list[str]:
    """One sentence per loader whose applied changes share one measured speed-up."""
    groups: dict[str, list[str]] = {}
    for r in (verification or {}).get("results", []):
        if r["applied"] and r.get("applied_together"):
            groups.setdefault(r["loader"], []).append(f"{r['parameter']}={r['suggested']!r}")
    return [f"{loader}: {', '.join(changes)} were applied together; the measured speed-up is theirs "
            f"jointly, judged against their joint prediction." for loader, changes in groups.items()]
