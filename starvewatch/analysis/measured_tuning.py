"""`starvewatch tune` results stored with a run: their schema, how they replace the diagnosis's
model for the loader they measured, and their place in the reports.

The diagnosis predicts a loader's throughput from a model (load / workers vs compute). When
the user has measured the loader on the machine with `starvewatch tune --run NAME`, the
measurement wins: the model's recommendations for the tuned DataLoader arguments are replaced
by the measured answer, marked `measured: True`, with the expected speedup computed from the
measured throughput. One pure function, `with_tuning`, called by the query layer.
"""
from __future__ import annotations

import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

# What a view reads is typed (strings bounded, numbers finite); the rest is kept as inert text.
Short = Annotated[str, Field(max_length=200)]
Text = Annotated[str, Field(max_length=20_000)]
Finite = Annotated[float, Field(ge=-1e300, le=1e300)]
TUNED_PARAMETERS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
MIN_GAIN = 1.02  # as the diagnosis: a predicted gain under 2% is no speedup


class Inert(BaseModel):
    """Typed fields as declared; any other field that is an object (or a list holding one) is
    kept as its JSON text, so no stored value becomes a component or markup in a view."""
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    @model_validator(mode="after")
    def inert_extras(self):
        extra = self.__pydantic_extra__ or {}
        for name, value in extra.items():
            if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)):
                extra[name] = json.dumps(value)
        return self


class TunedConfig(Inert):
    num_workers: int = Field(ge=0, le=1024)
    prefetch_factor: int | None = Field(None, ge=1, le=1024)
    persistent_workers: bool = False
    pin_memory: bool = False


class TuningTrial(Inert):
    config: TunedConfig
    status: str = Field(pattern="^(measured|cut_short|skipped|failed)$")
    label: Short | None = None
    reason: Text | None = None
    batches_per_s: Finite | None = None
    samples_per_s: Finite | None = None
    epoch_batches_per_s: Finite | None = None
    worker_uss_bytes: int | None = None
    cpu_pct: Finite | None = None


class TuningAnswer(Inert):
    config: TunedConfig
    label: Short | None = None
    batches_per_s: Finite | None = None
    samples_per_s: Finite | None = None
    epoch_batches_per_s: Finite | None = None
    worker_uss_bytes: int | None = None
    cpu_pct: Finite | None = None
    covers_consumption: bool | None = None
    rule: Text = ""
    snippet: Text | None = None


class TuningDocument(Inert):
    """What `starvewatch tune` posts (schema starvewatch.tuning/1); unknown fields are kept
    (as text when they are objects)."""
    trials: list[TuningTrial] = Field(max_length=1000)
    answer: TuningAnswer | None = None
    loader: Short | None = None
    consumption_batches_per_s: Finite | None = Field(None, gt=0)
    # Read by the run page, the exports and the diagnosis (tuning/__init__.py sends them).
    schema_: Short | None = Field(None, alias="schema")
    created_at: Short | None = None
    host: Short | None = None
    cores: int | None = Field(None, ge=0, le=2**31)
    device: Short | None = None
    batch_size: int | None = Field(None, ge=0, le=2**53)
    budget_s: Finite | None = None
    elapsed_s: Finite | None = None
    consumption_source: Short | None = None
    consumption_margin: Finite | None = Field(None, gt=0)
    within_best: Finite | None = None
    current: TunedConfig | None = None
    current_batches_per_s: Finite | None = None
    notes: list[Text] | None = Field(None, max_length=100)


def normalized(config: dict | None) -> dict:
    """The tuned arguments with torch's defaults filled in (no prefetch without workers)."""
    config = config or {}
    workers = int(config.get("num_workers") or 0)
    return {"num_workers": workers,
            "prefetch_factor": (config.get("prefetch_factor") or 2) if workers else None,
            "persistent_workers": bool(config.get("persistent_workers")) and workers > 0,
            "pin_memory": bool(config.get("pin_memory"))}


def expected_speedup(part: dict, measured_batches_per_s: float) -> tuple[float, float, float] | None:
    """(step ms now, step ms after, speedup): the loop's non-waiting time per step stays; the
    loader, measured alone, delivers a batch every 1000 / measured ms, overlapped with it."""
    now_bps = part.get("batches_per_s")
    wait = (part.get("wait_ms") or {}).get("mean")
    if not now_bps or wait is None or measured_batches_per_s <= 0:
        return None
    now_ms = 1000.0 / now_bps
    busy_ms = max(0.0, now_ms - wait)
    after_ms = max(busy_ms, 1000.0 / measured_batches_per_s)
    return now_ms, after_ms, now_ms / after_ms


def with_tuning(summary: dict, tuning: dict | None) -> dict:
    """Attach stored tuning results to a summary and let them replace the model's advice for
    the loader they measured. Returns the summary (changed in place)."""
    if not tuning:
        return summary
    info = {**tuning, "status": "no_answer", "replaced": []}
    summary["tuning"] = info
    answer = tuning.get("answer") or None
    loaders = summary.get("loaders") or []
    name = tuning.get("loader")
    part = next((l for l in loaders if l["name"] == name), None) if name else (loaders[0] if loaders else None)
    if answer is None or part is None:
        return summary
    info["loader"] = part["name"]
    measured = answer.get("epoch_batches_per_s") or answer.get("batches_per_s")
    current, suggested = normalized(part.get("config")), normalized(answer["config"])
    keep, replaced = [], []
    for r in summary.get("recommendations") or []:
        model_advice = (r.get("loader") == part["name"] and r.get("parameter") in TUNED_PARAMETERS
                        and r.get("kind", "speedup") != "protective")
        (replaced if model_advice else keep).append(r)
    info["replaced"] = [f"{r['parameter']}={r['suggested']!r}" for r in replaced]
    changes = [(p, current[p], suggested[p]) for p in TUNED_PARAMETERS if current[p] != suggested[p]
               # torch's default queue depth comes with the workers: no advice of its own
               and not (p == "prefetch_factor" and current[p] is None and suggested[p] == 2)]
    info["status"] = "recommended" if changes else "current"
    if changes and measured:
        keep.extend(_measured_recs(part, tuning, answer, measured, changes, replaced))
    keep.sort(key=lambda r: -(r.get("expected_speedup") or 0))
    summary["recommendations"] = keep
    return summary


def _measured_recs(part, tuning, answer, measured, changes, replaced) -> list[dict]:
    consumption = tuning.get("consumption_batches_per_s")
    margin = tuning.get("consumption_margin") or 1.2
    gain = expected_speedup(part, measured)
    evidence = {"measured_batches_per_s": round(measured, 2),
                "current_measured_batches_per_s": _round(tuning.get("current_batches_per_s")),
                "consumption_batches_per_s": _round(consumption),
                "run_batches_per_s": _round(part.get("batches_per_s")),
                "wait_ms_mean": _round((part.get("wait_ms") or {}).get("mean")),
                "compute_ms_mean": _round((part.get("compute_ms") or {}).get("mean")),
                "step_ms_now": _round(gain[0]) if gain else None,
                "step_ms_after": _round(gain[1]) if gain else None,
                "worker_uss_bytes": answer.get("worker_uss_bytes"),
                "trials": len(tuning.get("trials") or []), "tuning_budget_s": tuning.get("budget_s"),
                "tuned_at": tuning.get("created_at")}
    label = answer.get("label") or ", ".join(f"{p}={v!r}" for p, _, v in changes)
    reason = (f"measured by `starvewatch tune` on {tuning.get('host') or 'this machine'}: {label} delivers "
              f"{measured:.1f} batches/s without training")
    if consumption and measured >= consumption * margin:
        reason += f", covering the loop's {consumption:.1f} batches/s with a {margin - 1:.0%} margin"
    if replaced:
        model = ", ".join(f"{r['parameter']}={r['suggested']!r}" for r in replaced)
        reason += f"; replaces the model's estimate ({model})"
    speedup = gain[2] if gain else None
    together = [f"{p}={v!r}" for p, _, v in changes]
    out = []
    for parameter, old, new in changes:
        rec = {"loader": part["name"], "parameter": parameter, "current": old, "suggested": new,
               "reason": reason, "evidence": {**evidence, "applied_together": [c for c in together
                                                                                 if not c.startswith(parameter + "=")]},
               "measured": True}
        if speedup is not None and speedup >= MIN_GAIN:
            rec.update(kind="speedup", expected_speedup=round(speedup, 3))
        else:
            rec.update(kind="protective", expected_speedup=None,
                       risk=("the measured configuration keeps the throughput the loop needs with "
                             "fewer resources (workers, memory)" if new != old else "none"))
        out.append(rec)
    return out


def _round(x, digits: int = 3):
    return None if x is None else round(x, digits)
