"""What the benchmarks share: a results file in benchmarks/results/, a README section between markers.

A results file holds the figures a benchmark prints plus how it was run: `measured_at` (UTC, ISO
8601), `cpu_count`, `load_average` at the start and `load_average_end` (os.getloadavg(): the 1, 5
and 15 minute averages), `quick` (a shortened run, not the one the README's targets are for) and
`args` (the command line's arguments). benchmarks/readme_table.py reads them.
"""
from __future__ import annotations

import argparse
import json
import os
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"


def started(args: argparse.Namespace, quick: bool) -> dict:
    """The start of a results record: when, on how many CPUs, under what load, with what arguments."""
    return {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "cpu_count": os.cpu_count(), "load_average": list(os.getloadavg()), "quick": quick,
            "args": {k: (_shown(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}


def _shown(path: Path) -> str:
    """A path as a results file shows it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def write(record: dict, path: Path | str) -> Path:
    """Adds the load at the end and writes `record` as JSON to `path`; says where."""
    path = Path(path)
    record["load_average_end"] = list(os.getloadavg())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written to {path}")
    return path


def replace_section(text: str, begin: str, end: str, body: str) -> str:
    """`text` with what lies between the `begin` and `end` markers replaced by `body`."""
    if begin not in text or end not in text:
        raise SystemExit(f"no {begin} ... {end} section in the file")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def write_readme_section(begin: str, end: str, body: str, readme: Path = README) -> None:
    readme.write_text(replace_section(readme.read_text(), begin, end, body))
