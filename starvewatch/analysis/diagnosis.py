"""Diagnosis: the limiting factor and concrete DataLoader recommendations, with the evidence
and the predicted speed-up. Pure functions over a summary, its loaders and the system overview.

The rules live in `rules.py` (one function each, listed in `RULES`); the one model behind
every prediction lives in `model.py`. This module runs the rules, keeps one answer per
(loader, setting), predicts each speed-up and the joint one of each loader's full set of
changes (one model run over the changed configuration), and builds the configuration to apply.
"""
from __future__ import annotations

from dataclasses import asdict

from .host_moves import host_figures
from .throughput_model import DEFAULT, LoaderFacts, Thresholds, speedup, speedup_range
from .rules import RULES
from .sentences import build as build_answer
from .regression import regression
from .verification import joint_changes_note, verify

__all__ = ["DEFAULT", "Thresholds", "diagnose", "applied_config", "verify", "joint_changes_note",
           "thresholds_dict", "LIMITING_FACTORS", "DATALOADER_ARGS"]

LIMITING_FACTORS = ("input_bound_cpu", "input_bound_io", "input_bound_main", "epoch_startup", "host_bound",
                    "compute_bound")
DATALOADER_ARGS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "in_order")
VALIDATION_NAMES = ("val", "valid", "validation", "eval", "test", "dev")


def _limiting_factor(f: LoaderFacts, t: Thresholds) -> str:
    total_wait = f.wait * f.steps
    startup = f.respawn * f.epochs + f.epoch_end_wait * f.epochs
    if f.workers and not f.config.get("persistent_workers") and total_wait > 0 \
            and startup / total_wait >= t.startup_share and f.respawn >= t.startup_min_ms:
        return "epoch_startup"
    if f.main_bound:  # the training process's own share of each batch, not worker loading
        return "input_bound_main"
    return "input_bound_cpu" if f.cpu_busy else "input_bound_io"


def _reconcile(proposals: list[dict]) -> list[dict]:
    """One answer per (loader, setting): the speed-up's value within every protective bound
    (num_workers, prefetch_factor are upper bounds); a bound that does not bind is not shown."""
    out, groups = [], {}
    for p in proposals:
        if p["parameter"] in ("num_workers", "prefetch_factor"):
            groups.setdefault((p["loader"], p["parameter"]), []).append(p)
        else:
            out.append(p)
    for group in groups.values():
        wanted = next((p for p in group if p["kind"] == "speedup"), None)
        bounds = sorted((p for p in group if p["kind"] == "protective"), key=lambda p: p["suggested"])
        current = group[0]["current"]
        if wanted is not None and (not bounds or wanted["suggested"] <= bounds[0]["suggested"]):
            out.append(wanted)
        elif bounds and wanted is not None and bounds[0]["suggested"] > (current or 0):
            tight = bounds[0]  # the speed-up, cut down to what the bound allows
            out.append({**wanted, "suggested": tight["suggested"],
                        "reason": f"{wanted['reason']}; {tight['reason']}",
                        "evidence": {**tight["evidence"], **wanted["evidence"]}})
        elif bounds and current is not None and bounds[0]["suggested"] < current:
            out.append(bounds[0])
    return out


def applied_config(config: dict | None, recs: list[dict], loader: str) -> dict:
    """The DataLoader keyword arguments after applying a loader's recommendations (the same
    for the engine's joint prediction, the export snippet and the demo). A loader with a custom
    batch_sampler keeps it: batch_size is left out (torch rejects both together)."""
    out = {k: v for k, v in (config or {}).items() if k in DATALOADER_ARGS}
    for r in recs:
        if r["loader"] == loader and r["parameter"] in DATALOADER_ARGS:
            out[r["parameter"]] = r["suggested"]
            out.update(r.get("also") or {})
    if custom_batch_sampler(config):
        out.pop("batch_size", None)
    if not out.get("num_workers"):
        out.pop("prefetch_factor", None)
        out["persistent_workers"] = False
    elif out.get("prefetch_factor") is None:
        out.pop("prefetch_factor", None)
    return out


def custom_batch_sampler(config: dict | None) -> bool:
    """torch sets batch_size=None when a batch_sampler is given (and for batch_size=None, when
    it builds none): a batch_sampler name with no batch_size is the user's own."""
    config = config or {}
    return config.get("batch_size") is None and config.get("batch_sampler") not in (None, "NoneType")


def _without_idle_workers(proposals: list[dict], summary: dict) -> list[dict]:
    """Workers idle for lack of shards (findings.idle_workers): more workers would find no
    shard either, so no proposal adds workers to that loader (its finding says what to do)."""
    starved_of_shards = {f["loader"] for f in summary.get("findings") or []
                         if f.get("kind") == "idle_workers" and f["detail"].get("cause") == "too_few_shards"}
    if not starved_of_shards:
        return proposals

    def adds_workers(p: dict) -> bool:
        now = p.get("current") if p.get("parameter") == "num_workers" else None
        wanted = p["suggested"] if p.get("parameter") == "num_workers" else (p.get("what_if") or {}).get("num_workers")
        return isinstance(wanted, int) and wanted > (now or 0) and p.get("kind") == "speedup"

    return [p for p in proposals if not (p["loader"] in starved_of_shards and adds_workers(p))]


# What a torchdata.nodes ParallelMapper takes of the DataLoader arguments the rules propose.
NODES_PARAMETERS = (None, "num_workers")


def _applicable(proposals: list[dict], summary: dict) -> list[dict]:
    """A torchdata.nodes pipeline (config["wrapper"]) has no prefetch_factor, persistent_workers
    or pin_memory of a DataLoader's: only advice that it can take is kept."""
    nodes = {l["name"] for l in summary.get("loaders") or []
             if (l.get("config") or {}).get("wrapper") == "torchdata.nodes"}
    return [p for p in proposals if p["loader"] not in nodes or p.get("parameter") in NODES_PARAMETERS]


def _active_workers(summary: dict) -> dict[str, int]:
    """Per loader, the workers that can work where findings.idle_workers named idle ones within
    the ranks. Not where ranks differ (`idle_ranks`: a rank far short of the others): its count
    is that rank's, and the loader's figures are every rank's."""
    return {f["loader"]: f["detail"]["active_workers"] for f in summary.get("findings") or []
            if f.get("kind") == "idle_workers" and not f["detail"].get("idle_ranks")
            and (f["detail"].get("active_workers") or 0) >= 1}


def _predict_resharding(summary: dict, facts: dict[str, LoaderFacts]) -> None:
    """For workers idle for lack of shards: the speed-up of resharding (every configured worker
    serving), from the active workers' measured load time (the idle ones measured none)."""
    for finding in summary.get("findings") or []:
        if finding.get("kind") != "idle_workers" or finding["detail"].get("cause") != "too_few_shards":
            continue
        f = facts.get(finding["loader"])
        if f is not None and f.workers and f.worker_load:
            gain = round(speedup(f, f.config, {"resharded": True}), 3)
            finding["detail"]["expected_speedup_resharded"] = gain
            finding["fix"] += (f" Expected from resharding: {gain:.2f}x (all {f.workers} workers serving at the "
                               f"{f.load:.1f} ms a batch the serving one{'s' if f.active_workers > 1 else ''} "
                               f"measured).")


def _predict(recs: list[dict], facts: dict[str, LoaderFacts], t: Thresholds) -> list[dict]:
    """Each speed-up alone, through the model over the changed configuration; under the
    minimum gain it is dropped. Protective advice claims no gain."""
    out = []
    for r in recs:
        f = facts[r["loader"]]
        if r["kind"] == "protective":
            r["expected_speedup"] = None
        else:
            config = dict(f.config)
            what_if = dict(r["what_if"] or {})
            if r["parameter"] is not None:
                config[r["parameter"]] = r["suggested"]
            elif "num_workers" in what_if:
                config["num_workers"] = what_if.pop("num_workers")
            config.update(r.get("also") or {})  # what goes with it (persistent_workers=True)
            gain = speedup(f, config, what_if)
            if gain < t.min_gain:
                continue
            r["expected_speedup"] = round(gain, 3)
            _add_range(r, speedup_range(f, config, what_if, t))
        out.append(r)
    return out


def _plans(recs: list[dict], facts: dict[str, LoaderFacts]) -> list[dict]:
    """Per loader with DataLoader changes: the configuration to apply and its joint speed-up."""
    plans = []
    for name, f in facts.items():
        mine = [r for r in recs if r["loader"] == name and r["parameter"] in DATALOADER_ARGS]
        if not mine:
            continue
        # a loader rebuilt every epoch: the plan's workers are built once (more_workers says so)
        what_if = {"built_once": True} if any((r.get("also") or {}).get("persistent_workers") for r in mine) \
            and f.rebuilt else None
        kwargs = applied_config(f.config, mine, name)
        plans.append({"loader": name, "config": kwargs,
                      "changes": {k: v for r in mine for k, v in {r["parameter"]: r["suggested"],
                                                                     **(r.get("also") or {})}.items()},
                      "expected_speedup": round(speedup(f, {**f.config, **kwargs}, what_if), 3)})
        _add_range(plans[-1], speedup_range(f, {**f.config, **kwargs}, what_if))
    return plans


def _add_range(prediction: dict, ends: tuple[float, float] | None) -> None:
    """`expected_speedup_range` [low, high] beside the point, where the uncertainty is large."""
    if ends is not None:
        prediction["expected_speedup_range"] = [round(ends[0], 3), round(ends[1], 3)]


def diagnose(summary: dict, loaders, *, system=None, previous=None, run=None,
             thresholds: Thresholds = DEFAULT) -> None:
    """Fill `verdict.limiting_factor`, `recommendations`, `plans` and `verification`."""
    t = thresholds
    by_name = {d.name: d for d in loaders}
    system = system or {}
    active = _active_workers(summary)
    facts = [LoaderFacts(part, by_name[part["name"]], system, run, t, active.get(part["name"]))
             for part in summary["loaders"] if part["name"] in by_name and part["steps"] > 0]
    ctx = {"cuda": summary["verdict"].get("gpu_idle_fraction") is not None or bool(system.get("gpu_samples"))}
    starved = [f for f in facts if f.part["verdict"] in ("moderate", "high")]
    gpu_util = system.get("gpu_util_mean")
    host_bound = not starved and bool(facts) and summary["verdict"]["input_bound"] != "insufficient_data" \
        and gpu_util is not None and gpu_util < t.gpu_underused_pct
    proposals: list[dict] = []
    for f in facts:
        for rule in RULES:
            if rule.when == "any" or (rule.when == "starved" and f in starved) or \
                    (rule.when == "host_bound" and host_bound and f is facts[0]):
                proposals.extend(rule.propose(f, t, ctx))
    proposals = _applicable(_without_idle_workers(proposals, summary), summary)
    recs = _predict(_reconcile(proposals), {f.name: f for f in facts}, t)
    for f in facts:
        if f.name.lower() in VALIDATION_NAMES or (len(facts) > 1 and f is not facts[0] and f in starved):
            for r in recs:
                if r["loader"] == f.name and r["parameter"] == "num_workers":
                    r["reason"] += "; validation loaders can use their own settings, apart from the training loader's"
    # The training loader decides the limiting factor (answer.py names the others beside it);
    # where it is not starved but the run's wait is another loader's, that loader's.
    run_band = summary["verdict"]["input_bound"]
    train = next((f for f in facts if f.name == summary["verdict"].get("training_loader")), None)
    if run_band in ("moderate", "high") and starved:
        worst = train if train in starved else max(starved, key=lambda f: f.part["input_wait_fraction"] or 0)
        summary["verdict"]["limiting_factor"] = _limiting_factor(worst, t) if worst.workers is not None \
            else "input_bound_io"
    elif facts and run_band != "insufficient_data":
        summary["verdict"]["limiting_factor"] = "host_bound" if host_bound else "compute_bound"
    # Speed-ups first, by gain; protective advice after them, shown apart.
    recs.sort(key=lambda r: (r["kind"] != "speedup", -(r["expected_speedup"] or 0)))
    for r in recs:
        r.pop("what_if", None)
        r["measured"] = False
        if r["kind"] == "speedup":
            r.pop("risk", None)
    summary["recommendations"] = recs
    summary["plans"] = _plans(recs, {f.name: f for f in facts})
    _predict_resharding(summary, {f.name: f for f in facts})
    # The host figures the training loader's prediction rests on: compare and verify say which
    # moved where two runs' advice differs (analysis/host_moves.py).
    summary["host"] = host_figures(train or (facts[0] if facts else None), system)
    summary["verification"] = verify(previous, summary) if previous else None
    summary["regression"] = regression(previous, summary) if previous else None
    build_answer(summary, {f.name: f for f in facts})


def thresholds_dict(t: Thresholds = DEFAULT) -> dict:
    return asdict(t)
