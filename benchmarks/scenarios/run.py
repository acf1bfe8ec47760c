"""Acceptance benchmark of the diagnosis: known scenarios, expected verdicts, measured fixes.

    python -m benchmarks.scenarios.run [--only NAME ...]

For each scenario: run it, check the verdict, limiting factor and top recommendation written
down before running; then apply the recommendations to the DataLoader arguments, run again,
and compare the measured speedup of the recommended loader with `expected_speedup`
(must be within 25%). Prints a Markdown table for the README.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import warnings

os.environ.setdefault("STARVEWATCH_URL", "off")
os.environ.setdefault("STARVEWATCH_AUTOSTART", "0")
os.environ.setdefault("STARVEWATCH_QUIET", "1")
os.environ.setdefault("STARVEWATCH_DIR", tempfile.mkdtemp(prefix="starvewatch-scenarios-"))
warnings.filterwarnings("ignore", message="This DataLoader will create")


def run_scenario(scenario) -> dict:
    import starvewatch
    from starvewatch.hooks import samplers
    from starvewatch.monitor.diagnosis import applied_config

    extra = scenario.env.get("shm_limit_extra_bytes")
    samplers.SHM_LIMIT_BYTES = (shutil.disk_usage("/dev/shm").used + extra) if extra else 0
    base_configs = {name: dict(kwargs) for name, (_, kwargs) in scenario.loaders.items()}
    starvewatch.init(scenario.name)
    before_s = scenario.run(base_configs)
    before = starvewatch.finish(quiet=True)
    recs = before["recommendations"]
    top = recs[0] if recs else None
    got = (before["verdict"]["input_bound"], before["verdict"]["limiting_factor"],
           (top["loader"], top["parameter"]) if top else None)
    expected = (scenario.expect_verdict, scenario.expect_factor, scenario.expect_top)
    row = {"name": scenario.name, "description": scenario.description, "expected": expected, "got": got,
           "match": got == expected, "top": top, "predicted": top["expected_speedup"] if top else None,
           "measured": None, "within_25pct": None, "applied": None}
    if top and top["parameter"] is not None:
        configs = {}
        for name, kwargs in base_configs.items():
            summary_cfg = next(l["config"] for l in before["loaders"] if l["name"] == name)
            new = applied_config(summary_cfg, recs, name)
            configs[name] = {**kwargs, **new}
            if not configs[name].get("num_workers"):
                configs[name].pop("worker_init_fn", None)
        row["applied"] = {name: {k: v for k, v in cfg.items() if base_configs[name].get(k) != v}
                          for name, cfg in configs.items()}
        starvewatch.init(scenario.name)
        after_s = scenario.run(configs)
        starvewatch.finish(quiet=True)
        loader = top["loader"]
        row["measured"] = before_s[loader] / after_s[loader]
        if row["predicted"]:
            row["within_25pct"] = abs(row["measured"] - row["predicted"]) <= 0.25 * row["predicted"]
    samplers.SHM_LIMIT_BYTES = 0
    return row


def _fmt_top(top) -> str:
    if top is None:
        return "none (healthy)"
    if top["parameter"] is None:
        return f"{top['loader']}: {top['suggested']}"
    return f"{top['loader']}: {top['parameter']}={top['suggested']!r} (was {top['current']!r})"


def main() -> int:
    from benchmarks.scenarios.cases import SCENARIOS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="scenario names")
    args = parser.parse_args()
    rows = []
    for scenario in SCENARIOS:
        if args.only and scenario.name not in args.only:
            continue
        row = run_scenario(scenario)
        rows.append(row)
        print(f"{row['name']}: got {row['got']} expected {row['expected']} match={row['match']} "
              f"predicted={row['predicted']} measured={row['measured'] and round(row['measured'], 2)} "
              f"applied={row['applied']}", file=sys.stderr, flush=True)
    print("| scenario | verdict, limiting factor | top recommendation | predicted | measured | ok |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        pred = f"{r['predicted']:.2f}x" if r["predicted"] else "n/a"
        meas = f"{r['measured']:.2f}x" if r["measured"] else "n/a"
        ok = r["match"] and r["within_25pct"] is not False
        print(f"| {r['name']} | {r['got'][0]}, {r['got'][1]} | {_fmt_top(r['top'])} | {pred} | {meas} | "
              f"{'yes' if ok else 'NO'} |")
    failed = [r["name"] for r in rows if not r["match"] or r["within_25pct"] is False]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} scenarios as expected" +
          (f"; off: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
