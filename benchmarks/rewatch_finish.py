"""How long `finish()` takes after a loop iterated again faster than the shipper cycles, and
whether every step was counted (issue 42): a list of N items watched again for each of E
epochs, no collector (the spool), with and without the sidecar. Each case runs in a fresh
process (the run's threads and sidecar are the process's).

    python -m benchmarks.rewatch_finish [--n 1000000] [--epochs 2] [--repeat 3]

Prints one line per case: steps run, steps in the summary, the account, the loop's and
finish()'s seconds, and the load average (quiet machine: below 1).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, time
import starvewatch
n, epochs = int(sys.argv[1]), int(sys.argv[2])
data = list(range(n))
t0 = time.perf_counter()
for _ in range(epochs):
    for _ in starvewatch.watch(data, name="train"):
        pass
t1 = time.perf_counter()
summary = starvewatch.finish()
t2 = time.perf_counter()
print(json.dumps({"steps": summary["loaders"][0]["steps"], "delivery": summary["delivery"],
                  "loop_s": round(t1 - t0, 2), "finish_s": round(t2 - t1, 2)}))
"""


def run_case(n: int, epochs: int, sidecar: str) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        env = dict(os.environ, STARVEWATCH_DIR=directory, STARVEWATCH_AUTOSTART="0", STARVEWATCH_URL="off",
                   STARVEWATCH_QUIET="1", STARVEWATCH_SIDECAR=sidecar)
        out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(epochs)], env=env, capture_output=True,
                             text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for sidecar in ("1", "0"):
        for _ in range(args.repeat):
            result = run_case(args.n, args.epochs, sidecar)
            account = result["delivery"]
            counted = account["acknowledged"] + account["spooled"] + sum(account["dropped"].values())
            print(f"sidecar={sidecar} run={args.n * args.epochs} summary={result['steps']} account={counted} "
                  f"dropped={account['dropped']} loop={result['loop_s']}s finish={result['finish_s']}s "
                  f"load={os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
