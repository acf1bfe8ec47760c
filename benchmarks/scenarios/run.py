"""Acceptance benchmark of the diagnosis: known scenarios, expected answers, measured fixes.

    python -m benchmarks.scenarios.run [--only NAME ...] [--merge] [--docs] [--hog CORES]

Per scenario (benchmarks/scenarios/cases.py), against expectations written down beforehand:
- the verdict band, the limiting factor, and the top recommendation's loader, parameter and
  value range (and the protective advice and the finding the scenario must get, if any);
- every recommended configuration constructs a DataLoader;
- each speed-up recommendation applied alone, and each loader's full set (the engine's plan),
  is measured on the whole loop (best of 3 runs each, alternating with 3 runs of the scenario
  as is) and must hold (issue 35): measured >= 1.0x and >= its promise / 1.25; a set of
  protective changes must keep the throughput (1.0x within 25%). Advice that is not a
  DataLoader argument is measured on the scenario's "fixed" dataset; `build_once` builds the
  loader once, with persistent workers. What-ifs no one advised are judged by their
  prediction (within 25%). Where the advice is "no change", the usual changes (2 or 4
  persistent workers) are measured too and none may reach 1.2x.
- `--hog CORES` runs every scenario beside processes keeping CORES cores busy (a scenario's
  own `hog_cores` applies in any run); results go to scenarios-hog.json and .md.
- an idle_workers finding's resharding (the scenario's `resharded` dataset: the same data in
  as many shards as readers) is measured against its `expected_speedup_resharded` the same way,
  and the resharded loader, diagnosed in its turn, must not be flagged (a healthy sharding).

Writes benchmarks/results/scenarios.json (rows with `name`, `ok` and every figure, the time
and the 1-minute load average before and after each scenario, plus date, machine and torch
version) and scenarios.md; a partial run (--only) writes them only with --merge, which replaces
those rows (and adds new ones) in the last full run's results, each row keeping its own time.
--docs copies the table into the docs site's diagnosis page (docs/diagnosis.md, where the
README's scenario table moved).
Exit status 1 when any scenario is off.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("STARVEWATCH_URL", "off")
os.environ.setdefault("STARVEWATCH_AUTOSTART", "0")
os.environ.setdefault("STARVEWATCH_QUIET", "1")
os.environ.setdefault("STARVEWATCH_DIR", tempfile.mkdtemp(prefix="starvewatch-scenarios-"))
warnings.filterwarnings("ignore", message="This DataLoader will create")
warnings.filterwarnings("ignore", message=".*pin_memory.*")

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_NAME = "scenarios"  # scenarios-hog with --hog
TOLERANCE = 0.25
REPEATS = 3
BEGIN, END = "<!-- scenarios:begin -->", "<!-- scenarios:end -->"


def _loader(spec, config: dict | None, dataset=None):
    """The scenario's loader: its DataLoader with `config`, or its plain generator."""
    from torch.utils.data import DataLoader
    dataset = dataset if dataset is not None else spec.dataset()
    if config is None:  # a plain iterable: batches made on the training thread
        import torch
        size = spec.kwargs.get("batch_size") or 1
        return (torch.stack([dataset[j] for j in range(i, min(i + size, len(dataset)))])
                for i in range(0, len(dataset), size))
    kwargs = {k: v for k, v in config.items() if not k.startswith("_")}  # (_built_once: the harness's)
    if spec.batch_sampler is not None:
        kwargs.pop("batch_size", None)
        kwargs["batch_sampler"] = spec.batch_sampler(dataset)
    if not kwargs.get("num_workers"):
        kwargs.pop("worker_init_fn", None)
    return (spec.loader_class or DataLoader)(dataset, **kwargs)


def _rebuilt(spec, config: dict | None) -> bool:
    """A loader built anew every epoch (the scenario's pattern), unless the advice built it once."""
    return spec.rebuilt and not (config or {}).get("_built_once")


def _train(scenario, configs: dict, datasets: dict, watch: bool) -> dict[str, float]:
    """Run every epoch; wall seconds spent per loader."""
    import starvewatch

    from benchmarks.scenarios.cases import spin
    spent = dict.fromkeys(scenario.loaders, 0.0)
    loaders = {}
    # One dataset object per loader for the whole run: a loader rebuilt every epoch is rebuilt
    # over the same dataset (the identity rule: call site plus dataset).
    datasets = {name: datasets.get(name) if datasets.get(name) is not None else
                (spec.dataset() if spec.rebuilt else None) for name, spec in scenario.loaders.items()}
    for name, spec in scenario.loaders.items():
        if (not spec.plain or configs[name] is not None) and not _rebuilt(spec, configs[name]):
            loaders[name] = _loader(spec, configs[name], datasets.get(name))
            if watch:
                loaders[name] = starvewatch.watch(loaders[name], name=name)
    for _ in range(scenario.epochs):
        for name, spec in scenario.loaders.items():
            loader = loaders.get(name)
            if loader is None and _rebuilt(spec, configs[name]):  # a new DataLoader every epoch
                loader = _loader(spec, configs[name], datasets[name])
                loader = starvewatch.watch(loader) if watch else loader  # unnamed: the identity rule names it
            elif loader is None:  # generators are used up after one pass: a fresh one per epoch
                loader = _loader(spec, None, datasets.get(name))
                loader = starvewatch.watch(loader, name=name) if watch else loader
            t0 = time.perf_counter()
            for batch in loader:
                cost = spec.compute_s(batch.shape[0] if batch.dim() > 1 else 1) \
                    if callable(spec.compute_s) else spec.compute_s
                if spec.compute_on_cpu:
                    spin(cost)
                else:
                    time.sleep(cost)
            spent[name] += time.perf_counter() - t0
    del loaders
    return spent


def _with_env(env: dict):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return saved


def _restore(saved: dict) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _scenario_env(scenario) -> dict:
    env = dict(scenario.env())
    if env.get("STARVEWATCH_TEST_FAKE_NVML") == "self":  # the sidecar loads the NVML stand-in
        env["STARVEWATCH_TEST_FAKE_NVML"] = str(os.getpid())
        standins = str(ROOT / "tests" / "standins")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (standins, os.environ.get("PYTHONPATH")) if p)
    return env


def _in_range(value, low, high) -> bool:
    if isinstance(low, bool) or isinstance(value, bool):
        return value is low
    return isinstance(value, int) and low <= value <= high


def _top_ok(scenario, top) -> bool:
    want = scenario.expect_top
    if want is None:
        return top is None
    if top is None or top["loader"] != want[0] or top["parameter"] != want[1]:
        return False
    if want[1] is None:
        return isinstance(top["suggested"], str) and top["suggested"].startswith(want[2])
    return _in_range(top["suggested"], want[2], want[3])


def _protective_ok(scenario, recs) -> bool | None:
    want = scenario.expect_protective
    if want is None:
        return None
    return any(r["kind"] == "protective" and r["loader"] == want[0] and r["parameter"] == want[1]
               and _in_range(r["suggested"], want[2], want[3]) for r in recs)


def _finding_ok(scenario, summary) -> bool | None:
    """The finding the scenario must produce; a stall must name the worker and its stack."""
    want = scenario.expect_finding
    if want is None:
        return None
    loader, kind = want
    if kind == "stall":
        return any(s.get("loader") == loader and s.get("stack") and (s.get("worker") is not None
                                                                     or s.get("stack_of") == "main")
                   for s in summary["stalls"])
    return any(f["loader"] == loader and f["kind"] == kind for f in summary["findings"])


def copied_loader(spec, config: dict, recs: list[dict], name: str):
    """The DataLoader the user gets by copying the line starvewatch shows (export.snippet): the
    whole call evaluated as written, or, where it lists only the arguments to change, the
    scenario's own call with those arguments. None when the loader has no line to copy."""
    from torch.utils.data import DataLoader

    from starvewatch.monitor.outputs.export import is_call, snippet
    code = snippet(config, recs, name)
    if code is None:
        return None
    dataset = spec.dataset()
    if is_call(code):
        return eval(code, {"DataLoader": DataLoader, "dataset": dataset})  # noqa: S307 - our own line
    changes = eval(f"dict({code})", {})  # noqa: S307 - our own line: keyword arguments only
    return _loader(spec, {**spec.kwargs, **changes}, dataset)


def _constructs(scenario, summary) -> bool:
    """Every line to copy builds a DataLoader that yields a batch (with the scenario's batching)."""
    for part in summary["loaders"]:
        spec = scenario.loaders[part["name"]]
        if part["config"] is None:
            continue
        try:
            loader = copied_loader(spec, part["config"], summary["recommendations"], part["name"])
            if loader is not None:
                next(iter(loader))
        except Exception as exc:  # noqa: BLE001 - reported as a failed check
            print(f"  {part['name']}: {exc!r}", file=sys.stderr)
            return False
    return True


def _variant(scenario, base: dict, rec: dict | None, plan: dict | None, reshard: dict | None = None):
    """(configs, datasets) with one recommendation applied, one loader's plan, or an
    idle_workers finding's resharding (the same data in as many shards as readers)."""
    configs = {name: (dict(c) if c is not None else None) for name, c in base.items()}
    datasets = {}
    if reshard is not None:
        spec = scenario.loaders[reshard["loader"]]
        if spec.resharded is None:
            raise ValueError(f"{scenario.name}: no resharded variant of {reshard['loader']!r}")
        datasets[reshard["loader"]] = spec.resharded(reshard["detail"]["readers"])
        return configs, datasets
    if plan is not None:
        configs[plan["loader"]] = {**(configs[plan["loader"]] or {}), **plan["config"]}
        _built_once_if_persistent(scenario, configs, plan["loader"])
        return configs, datasets
    spec = scenario.loaders[rec["loader"]]
    if rec["parameter"] is not None:
        configs[rec["loader"]][rec["parameter"]] = rec["suggested"]
        configs[rec["loader"]].update(rec.get("also") or {})  # what goes with it (persistent_workers)
        _built_once_if_persistent(scenario, configs, rec["loader"])
    elif rec["suggested"] == "build_once":  # built once, before the epoch loop, with persistent workers
        configs[rec["loader"]].update(persistent_workers=True, _built_once=True)
    elif spec.plain:  # wrapped in a DataLoader with the workers advised
        configs[rec["loader"]] = {"batch_size": spec.kwargs.get("batch_size"),
                                  "num_workers": rec["evidence"]["workers_needed"]}
    elif spec.fixed is not None:
        datasets[rec["loader"]] = spec.fixed()
        configs[rec["loader"]].update(spec.fixed_kwargs or {})
    else:
        raise ValueError(f"{scenario.name}: no fixed variant for {rec['suggested']!r}")
    return configs, datasets


def _built_once_if_persistent(scenario, configs: dict, loader: str) -> None:
    """Workers advised with persistent_workers=True for a loader rebuilt every epoch: the advice
    says to build it once (more_workers' reason), as the user would."""
    if scenario.loaders[loader].rebuilt and (configs[loader] or {}).get("persistent_workers"):
        configs[loader]["_built_once"] = True


class _DiagnosisInputs:
    """Keeps what finish() gave the diagnosis (summary, loader data, system, run), so the
    scenario's what-ifs are predicted by the same model over the same facts."""

    def __init__(self) -> None:
        self.args = None

    def __enter__(self):
        from starvewatch.analysis import diagnosis
        self.module, self.original = diagnosis, diagnosis.diagnose

        def diagnose(summary, loaders, *, system=None, previous=None, run=None, **kwargs):
            self.args = (summary, list(loaders), system, run)
            return self.original(summary, loaders, system=system, previous=previous, run=run, **kwargs)
        diagnosis.diagnose = diagnose
        return self

    def __exit__(self, *exc) -> None:
        self.module.diagnose = self.original

    def predict(self, loader: str, change: dict) -> tuple[float, list | None]:
        """(speed-up, range or None) the model predicts for `loader` with `change` applied."""
        from starvewatch.analysis.throughput_model import DEFAULT, LoaderFacts, speedup, speedup_range
        summary, loaders, system, run = self.args
        part = next(p for p in summary["loaders"] if p["name"] == loader)
        data = next(d for d in loaders if d.name == loader)
        facts = LoaderFacts(part, data, system or {}, run, DEFAULT)
        config = {**facts.config, **change}
        ends = speedup_range(facts, config)
        return round(speedup(facts, config), 3), [round(e, 3) for e in ends] if ends else None


def _holds(measured: float, promised: float | None) -> bool:
    """Issue 35's rule for advice: the change measured on the whole loop is no slower (>= 1.0x)
    and within 25% of its promise from below (>= promise / 1.25); protective advice (no promise)
    keeps the throughput within 25%."""
    if not promised:
        return abs(measured - 1.0) <= TOLERANCE
    return measured >= 1.0 and measured >= promised / (1 + TOLERANCE)


def _measure(scenario, base, base_s, label, expected, loader, rec=None, plan=None, reshard=None,
             expected_range=None, advice=True) -> dict:
    try:
        configs, datasets = _variant(scenario, base, rec, plan, reshard)
    except ValueError as exc:  # advice the scenario cannot apply: unmeasured, and so a failure
        return {"change": label, "loader": loader, "predicted": expected, "measured": None,
                "error": str(exc), "ok": False}
    # Alternate the scenario as is and the variant, so a busy spell of the host hits both.
    befores, afters = [], []
    for _ in range(REPEATS):
        befores.append(_train(scenario, base, {}, watch=False)[loader])
        afters.append(_train(scenario, configs, datasets, watch=False)[loader])
    before, after = min(befores + [base_s[loader]]), min(afters)
    measured = before / after
    target = expected if expected else 1.0  # protective: the throughput is kept
    within = abs(measured - target) <= TOLERANCE * target
    # Advice is judged by what it does to the loop (_holds); a what-if no one advised, by how
    # close its prediction came.
    ok = _holds(measured, expected) if advice else within
    return {"change": label, "loader": loader, "predicted": expected, "measured": round(measured, 3),
            "within_25pct": within, "advice": advice,
            **({"predicted_range": expected_range} if expected_range else {}),
            "seconds_before": round(before, 3), "seconds_after": round(after, 3), "ok": ok,
            "load_average": _load_average()}


def _load_average() -> list[float] | None:
    """The host's 1, 5 and 15-minute load averages as a measurement ends (a busy host skews it)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


HOG_CORES = 0.0  # --hog: every scenario beside a CPU hog of this many cores


def start_hog(cores: float):
    """Processes that keep `cores` cores busy (whole ones, then a part) until the returned stop."""
    import math
    import multiprocessing

    from benchmarks.scenarios.cases import hog
    if cores <= 0:
        return lambda: None
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    count = math.ceil(cores)
    procs = [ctx.Process(target=hog, args=(stop, min(1.0, cores - i)), daemon=True) for i in range(count)]
    for proc in procs:
        proc.start()

    def halt():
        stop.set()
        for proc in procs:
            proc.join(5)
    return halt


def run_scenario(scenario) -> dict:
    # Set-up outside the watched run (its CPU and I/O are not the scenario's), undone at the end.
    undo = scenario.prepare() if scenario.prepare is not None else None
    hog = max(scenario.hog_cores, HOG_CORES)
    halt = start_hog(hog)  # the diagnosed run and every measurement run beside it
    try:
        row = _run_scenario(scenario)
        row["hog_cores"] = hog
        return row
    finally:
        halt()
        if undo is not None:
            undo()


def _run_scenario(scenario) -> dict:
    import starvewatch
    saved = _with_env(_scenario_env(scenario))
    try:
        base = {name: (None if spec.plain else dict(spec.kwargs)) for name, spec in scenario.loaders.items()}
        with _DiagnosisInputs() as inputs:
            starvewatch.init(scenario.name)
            first = _train(scenario, base, {}, watch=True)
            summary = starvewatch.finish(quiet=True)
    finally:
        _restore(saved)
    recs = summary["recommendations"]
    # The top change is the first speed-up, as the dashboard and the report show it; protective
    # advice is checked on its own (expect_protective).
    top = next((r for r in recs if r["kind"] == "speedup"), None)
    got = {"verdict": summary["verdict"]["input_bound"], "limiting_factor": summary["verdict"]["limiting_factor"],
           "top": {k: top[k] for k in ("loader", "parameter", "suggested", "current", "kind")} if top else None}
    checks = {"verdict": got["verdict"] == scenario.expect_verdict,
              "limiting_factor": got["limiting_factor"] == scenario.expect_factor,
              "top": _top_ok(scenario, top), "constructs": _constructs(scenario, summary)}
    for check, result in (("protective", _protective_ok(scenario, recs)), ("finding", _finding_ok(scenario, summary))):
        if result is not None:
            checks[check] = result
    base_s = first  # the diagnosed run; each measurement below alternates more runs of both
    measurements = []
    speedups = [r for r in recs if r["kind"] == "speedup"]
    for r in speedups:
        label = f"{r['parameter']}={r['suggested']!r}" if r["parameter"] else str(r["suggested"])
        measurements.append(_measure(scenario, base, base_s, label, r["expected_speedup"], r["loader"], rec=r,
                                     expected_range=r.get("expected_speedup_range")))
    for plan in summary.get("plans") or []:
        alone = [m for m in measurements if m["loader"] == plan["loader"]]
        if alone and any(r["kind"] == "speedup" and r["loader"] == plan["loader"] and plan["changes"] ==
                         {r["parameter"]: r["suggested"], **(r.get("also") or {})} for r in speedups):
            continue  # the full set is that one change (with what goes with it), measured above
        joint = plan["expected_speedup"] if any(r["kind"] == "speedup" and r["loader"] == plan["loader"]
                                                and r["parameter"] in plan["changes"] for r in recs) else None
        label = "full set: " + ", ".join(f"{k}={v!r}" for k, v in plan["changes"].items())
        measurements.append(_measure(scenario, base, base_s, label, joint, plan["loader"], plan=plan,
                                     expected_range=plan.get("expected_speedup_range") if joint else None))
    for loader, change in scenario.what_ifs:  # changes the advice did not pick, predicted all the same
        if any(r["loader"] == loader and {r["parameter"]: r["suggested"]} == change for r in speedups):
            continue  # the advice itself, measured above
        expected, ends = inputs.predict(loader, change)
        label = "what-if: " + ", ".join(f"{k}={v!r}" for k, v in change.items())
        measurements.append(_measure(scenario, base, base_s, label, expected, loader,
                                     plan={"loader": loader, "config": change}, expected_range=ends, advice=False))
    # An idle_workers finding's resharding: measured against its prediction like any advice.
    for finding in summary["findings"]:
        predicted = finding["detail"].get("expected_speedup_resharded") if finding["kind"] == "idle_workers" else None
        if predicted is not None:
            label = f"reshard into {finding['detail']['readers']} shards"
            measurements.append(_measure(scenario, base, base_s, label, predicted, finding["loader"],
                                         reshard=finding))
            # The resharded loader is the healthy sharding: diagnosed, it must not be flagged.
            _, datasets = _variant(scenario, base, None, None, finding)
            starvewatch.init(f"{scenario.name}-resharded")
            _train(scenario, base, datasets, watch=True)
            resharded = starvewatch.finish(quiet=True)
            checks["resharded_not_flagged"] = not any(f["kind"] == "idle_workers" for f in resharded["findings"])
    if not speedups:  # "no change": only where no usual change measures >= 1.2x
        from benchmarks.scenarios.cases import USUAL_CHANGES
        usual = []
        for loader, spec in scenario.loaders.items():
            current = base[loader]
            if current is None or spec.plain:
                continue
            for change in USUAL_CHANGES:
                if (current.get("num_workers") or 0) >= change["num_workers"]:
                    continue
                m = _measure(scenario, base, base_s, "usual: " + ", ".join(f"{k}={v!r}" for k, v in change.items()),
                             None, loader, plan={"loader": loader, "config": change}, advice=False)
                m["ok"] = m["measured"] is not None and m["measured"] < 1.2
                usual.append(m)
        measurements += usual
        checks["no_change_holds"] = all(m["ok"] for m in usual)
    checks["measured"] = bool(measurements) or scenario.expect_top is None and not recs
    checks["advice_holds"] = all(m["ok"] for m in measurements)
    return {"name": scenario.name, "rule": scenario.rule, "description": scenario.description,
            "simulated": scenario.simulated, "ok": all(checks.values()), "checks": checks,
            "expected": {"verdict": scenario.expect_verdict, "limiting_factor": scenario.expect_factor,
                         "top": scenario.expect_top, "protective": scenario.expect_protective,
                         "finding": scenario.expect_finding},
            "findings": [f["title"] for f in summary["findings"]]
            + [f"stall on {s.get('loader')}: worker {s.get('worker')}" for s in summary["stalls"] if s.get("stack")],
            "got": got, "recommendations": [{k: r.get(k) for k in ("loader", "parameter", "current", "suggested",
                                                                  "kind", "expected_speedup")} for r in recs],
            "measurements": measurements, "seconds_as_is": {k: round(v, 3) for k, v in base_s.items()}}


def _fmt_rec(r, verdict: str, finding=None) -> str:
    if r is None:
        if verdict == "not":
            return "none (healthy)"
        # A starved run whose answer is a finding's fix (idle_workers: reshard), as expected.
        return f"none: the {finding[1]} finding's fix" if finding and finding[1] != "stall" else "**none**"
    what = f"{r['parameter']}={r['suggested']!r} (was {r['current']!r})" if r["parameter"] else str(r["suggested"])
    return f"{r['loader']}: {what}"


def markdown(report: dict) -> str:
    rows = report["rows"]
    lines = [f"Measured {report['date'][:10]} on {report['machine']} (torch {report['torch']}), best of "
             f"{REPEATS} runs each" + (f", beside a CPU hog of {report['hog_cores']:g} cores" if report.get("hog_cores") else "")
             + "; advice fails when it measures under 1.0x or under its promise / 1.25 (a what-if: more than "
             "25% from its prediction; \"no change\": a usual change measuring 1.2x or more).", "",
             "| scenario | rule | verdict, limiting factor | top recommendation | change measured | predicted | "
             "measured | ok |", "|---|---|---|---|---|---:|---:|---|"]
    for r in rows:
        first = True
        for m in r["measurements"] or [None]:
            pred = f"{m['predicted']:.2f}x" if m and m["predicted"] else ("1.00x (kept)" if m else "—")
            if m and m.get("predicted_range"):
                pred += " ({:.2f}–{:.2f}x)".format(*m["predicted_range"])
            meas = f"{m['measured']:.2f}x" if m and m["measured"] is not None else ("not applicable" if m else "—")
            name = r["name"] + (" (simulated: " + r["simulated"] + ")" if r["simulated"] else "")
            lead = (f"| {name} | {r['rule']} | {r['got']['verdict']}, {r['got']['limiting_factor']} | "
                    f"{_fmt_rec(r['got']['top'], r['got']['verdict'], r['expected'].get('finding'))} |") if first else "| | | | |"
            mark = ("yes" if r["ok"] else "**NO**") if first else ("" if not m or m["ok"] else "**off**")
            lines.append(f"{lead} {m['change'] if m else 'nothing to measure'} | {pred} | {meas} | {mark} |")
            first = False
    passed = sum(1 for r in rows if r["ok"])
    off = [r["name"] for r in rows if not r["ok"]]
    lines += ["", f"{passed} of {len(rows)} scenarios as expected" + (f"; off: {', '.join(off)}" if off else "") + "."]
    apart = [r for r in rows if r.get("measured_apart")]
    if apart:  # rows merged in from a partial run (--merge)
        lines += ["", "Measured apart from that run: " + ", ".join(
            f"{r['name']} ({r['measured_at'][:16].replace('T', ' ')} UTC)" for r in apart) + "."]
    loads = [r for r in rows if r.get("load_average")]
    if loads:  # a shared host: how busy it was while each scenario ran
        lines += ["", "Load average (1 min) before and after: " + ", ".join(
            f"{r['name']} {r['load_average'][0]:.1f}–{r['load_average'][1]:.1f}" for r in loads) + "."]
    return "\n".join(lines) + "\n"


def _write_docs(table: str) -> None:
    from benchmarks.results_io import write_readme_section
    write_readme_section(BEGIN, END, table, ROOT / "docs" / "diagnosis.md")


def _merged(partial: dict, order: list[str]) -> dict:
    """The last full run's results with the partial run's rows in place of (or beside) its own,
    in the order of SCENARIOS; the header (date, machine) stays the full run's."""
    full = json.loads((RESULTS / f"{RESULTS_NAME}.json").read_text())
    rows = {r["name"]: r for r in full["rows"]}
    rows.update({r["name"]: r for r in partial["rows"]})
    return {**full, "rows": sorted(rows.values(), key=lambda r: order.index(r["name"]) if r["name"] in order
                                   else len(order))}


def main() -> int:
    import torch

    from benchmarks.scenarios.cases import SCENARIOS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="scenario names")
    parser.add_argument("--merge", action="store_true",
                        help="with --only: replace those rows in the last full run's results")
    parser.add_argument("--docs", "--readme", action="store_true",
                        help="copy the table into docs/diagnosis.md (--readme: its former name)")
    parser.add_argument("--hog", type=float, default=0.0,
                        help="run every scenario beside a CPU hog of this many cores (results: scenarios-hog.*)")
    args = parser.parse_args()
    global HOG_CORES, RESULTS_NAME, BEGIN, END
    if args.hog > 0:
        HOG_CORES, RESULTS_NAME = args.hog, "scenarios-hog"
        BEGIN, END = "<!-- scenarios-hog:begin -->", "<!-- scenarios-hog:end -->"
    unknown = set(args.only or ()) - {s.name for s in SCENARIOS}
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    rows = []
    started = datetime.now(timezone.utc)  # the run's date: a run that passes midnight is still one run
    for scenario in SCENARIOS:
        if args.only and scenario.name not in args.only:
            continue
        t0 = time.perf_counter()
        load_before = os.getloadavg()[0]
        row = run_scenario(scenario)
        row["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        if args.only:  # a partial run's rows, merged into a full run's results (--merge), say so
            row["measured_apart"] = True
        row["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        rows.append(row)
        print(f"{row['name']}: ok={row['ok']} {row['checks']} got={row['got']} "
              f"measured={[(m['change'], m['predicted'], m['measured']) for m in row['measurements']]} "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    report = {"date": started.isoformat(timespec="seconds"), "hog_cores": HOG_CORES,
              "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
                         f"{platform.system()} {platform.release()}",
              "torch": torch.__version__, "python": platform.python_version(), "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.only and args.merge:
        report = _merged(report, [s.name for s in SCENARIOS])
    table = markdown(report)
    if not args.only or args.merge:  # a partial run alone does not overwrite the full results
        (RESULTS / f"{RESULTS_NAME}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (RESULTS / f"{RESULTS_NAME}.md").write_text(markdown(report))
        if args.docs:
            _write_docs(markdown(report))
    print(table)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
