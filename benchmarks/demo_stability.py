"""Is the demo's verdict stable? Runs `starvewatch demo` N times and verifies its main change.

    python -m benchmarks.demo_stability [--runs 10] [--quick]

The main change is the starved run's top speed-up recommendation; after the recommended run,
verify-after-change must call it *confirmed* every time (an always-inconclusive verdict would
be stable and useless). Writes benchmarks/results/demo_stability.json. Exit status 1 otherwise.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("STARVEWATCH_URL", "off")
os.environ.setdefault("STARVEWATCH_AUTOSTART", "0")
os.environ.setdefault("STARVEWATCH_QUIET", "1")
os.environ.setdefault("STARVEWATCH_DIR", tempfile.mkdtemp(prefix="starvewatch-demo-stability-"))

RESULTS = Path(__file__).resolve().parent / "results"


def one_run(quick: bool) -> dict:
    from starvewatch.demo import run_demo
    from starvewatch.analysis.diagnosis import verify

    before, after = run_demo(quick=quick, out=io.StringIO())
    main = next((r for r in before["recommendations"] if r["kind"] == "speedup"), None)
    if after is None or main is None:
        return {"main_change": None, "status": "no change applied"}
    verification = verify(before, after) or {"results": []}
    result = next((r for r in verification["results"]
                   if r["loader"] == main["loader"] and r["parameter"] == main["parameter"]), None)
    return {"main_change": f"{main['loader']}: {main['parameter']}={main['suggested']!r}",
            "expected_speedup": main["expected_speedup"],
            "judged_against": result and result.get("judged_against"),
            "measured_speedup": result and result["measured_speedup"], "interval": result and result["interval"],
            "basis": result and result["basis"], "status": result["status"] if result else "missing"}


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="the demo's short version")
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        runs.append(one_run(args.quick))
        r = runs[-1]
        print(f"run {i + 1}: {r['main_change']} expected {r.get('judged_against') or r.get('expected_speedup')}x, "
              f"measured {r.get('measured_speedup')}x {r.get('interval')} -> {r['status']}", file=sys.stderr, flush=True)
    confirmed = sum(1 for r in runs if r["status"] == "confirmed")
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{os.cpu_count()} cores, {platform.machine()}", "torch": torch.__version__,
              "quick": args.quick, "runs": runs, "confirmed": confirmed, "ok": confirmed == len(runs)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "demo_stability.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"main change confirmed in {confirmed} of {len(runs)} runs")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
