"""pytorch/examples' word_language_model (examples/word_language_model/, one line of starvewatch)
on a synthetic corpus; writes what the run printed to benchmarks/results/word_language_model.txt.

    python -m benchmarks.word_language_model [--tokens 60000] [--epochs 2] [--out FILE]

The corpus has Wikitext-2's shape (train/valid/test text files of lines of words ending in
<eos>), with Zipf-distributed words from a fixed vocabulary; seeded, so reruns read the same text.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "word_language_model"


def write_corpus(directory: Path, tokens: int, vocab: int = 2000, seed: int = 1111) -> None:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    weights = [1.0 / (rank + 1) for rank in range(vocab)]  # Zipf, like natural text
    directory.mkdir(parents=True, exist_ok=True)
    for name, share in (("train.txt", 0.8), ("valid.txt", 0.1), ("test.txt", 0.1)):
        left = int(tokens * share)
        lines = []
        while left > 0:
            n = min(left, rng.randint(5, 25))
            lines.append(" ".join(rng.choices(words, weights, k=n)))
            left -= n
        (directory / name).write_text("\n".join(lines) + "\n")


def run(tokens: int, epochs: int, workdir: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    write_corpus(workdir / "data", tokens)
    env = {**os.environ, "STARVEWATCH_URL": os.environ.get("STARVEWATCH_URL", "off"),
           "STARVEWATCH_AUTOSTART": "0", "STARVEWATCH_DIR": str(workdir / "sw"),
           "STARVEWATCH_RUN_NAME": "word_language_model", **(extra_env or {})}
    env.pop("STARVEWATCH_QUIET", None)  # the report is what we want to see
    env.setdefault("OMP_NUM_THREADS", "1")  # a 2-core VM shared with other jobs: 2 threads thrash
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, str(EXAMPLE / "main.py"), "--data", str(workdir / "data"), "--epochs", str(epochs),
           "--emsize", "64", "--nhid", "64", "--log-interval", "50", "--save", str(workdir / "model.pt")]
    return subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=900)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=60_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "word_language_model.txt"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        done = run(args.tokens, args.epochs, Path(tmp))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# python examples/word_language_model/main.py --epochs {args.epochs} --emsize 64 --nhid 64 "
                   f"(synthetic corpus, {args.tokens} tokens), {started}, exit {done.returncode}\n"
                   f"# stdout\n{done.stdout}# stderr (starvewatch's report)\n{done.stderr}")
    print(out.read_text())
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
