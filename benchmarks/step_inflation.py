"""How much summary/1 inflated the wait fraction and the speed-up at stake of a loop marked by
a framework's callbacks (issue 34 item 1): the test programs' Lightning and Hugging Face runs
(tests/programs/lightning_train.py, hf_train.py: tiny CPU models, ~2 ms of loading per sample),
each read as summary/1 did (wait / (wait + compute), the time outside the callbacks' step
marks left out) and as summary/2 does (wait / the wall step). Not a CI test: its figures depend
on the machine. Usage: python -m benchmarks.step_inflation"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAMS = Path(__file__).resolve().parent.parent / "tests" / "programs"


def _run(program: str, *args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "STARVEWATCH_URL": "off",
           "STARVEWATCH_AUTOSTART": "0", "STARVEWATCH_QUIET": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        env["STARVEWATCH_DIR"] = tmp
        done = subprocess.run([sys.executable, str(PROGRAMS / program), *args], env=env, cwd=tmp,
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        out = json.loads(done.stdout.strip().splitlines()[-1])
    return out.get("summary") or out["trainer"]


def inflation(summary: dict, loader: str = "train") -> dict:
    part = next(p for p in summary["loaders"] if p["name"] == loader)
    steps = part["steps"]
    wait = part["wait_ms"]["mean"] * steps + (part.get("epoch_end_wait_ms_total") or 0)
    compute = part["compute_ms"]["mean"] * steps
    other = part["other_ms_total"] or 0
    v1, v2 = wait / (wait + compute), wait / (wait + compute + other)
    return {"steps": steps, "wait_ms": round(wait, 1), "compute_ms": round(compute, 1),
            "other_ms": round(other, 1), "fraction_v1": round(v1, 3), "fraction_v2": round(v2, 3),
            "speedup_at_stake_v1": round(1 / (1 - v1), 2), "speedup_at_stake_v2": round(1 / (1 - v2), 2),
            "reported": part["input_wait_fraction"]}


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        figures = {"lightning": inflation(_run("lightning_train.py")),
                   "huggingface": inflation(_run("hf_train.py", out))}
    figures["load_1min"] = os.getloadavg()[0]
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
