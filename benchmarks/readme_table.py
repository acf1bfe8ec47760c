"""The overhead table of the performance page, written from the results files in benchmarks/results/.

    python -m benchmarks.readme_table [--results DIR] [--docs PATH] [--check]

Reads overhead.json, instructions.json, sampler.json, ingest.json, end_to_end.json, dashboard.json, soak.json and
instructions_per_thread.json (each written by the benchmark of the same name) and writes one row per figure, | what |
measured | target | command |, between <!-- overhead:begin --> and <!-- overhead:end --> in
the docs site's performance page (docs/performance.md; the README links it, as a user's landing
page holds one sentence on overhead, not the table). A figure that misses its target is marked "(not met)" here, from the figure; a file
(or a part of one) that is missing reads "not measured"; a file from a shortened run (`--quick`,
or soak.py shorter than 600 s) reads "(quick run)". A line under the table says when, on how
many CPUs and under what load (1-minute average at the start and at the end) each was measured.
--check writes nothing and exits 1 when the table differs.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.results_io import RESULTS, ROOT, replace_section  # noqa: E402

BEGIN, END = "<!-- overhead:begin -->", "<!-- overhead:end -->"
DOCS_PAGE = ROOT / "docs" / "performance.md"  # the site's copy of the table
FILES = ("overhead", "instructions", "sampler", "ingest", "end_to_end", "dashboard", "soak", "soak-600s-10-clients",
         "instructions_per_thread")
MIB = 2**20


@dataclass(frozen=True)
class Row:
    what: str
    file: str  # benchmarks/results/<file>.json
    part: str | None  # the key of its figures in that file (missing: "not measured"); None: top level
    target: str
    figure: Callable[[dict], str]  # the measured cell, from the part (or the whole file: whole=True)
    met: Callable[[dict], bool] | None = None  # None: no target to judge against
    whole: bool = False
    command: str | None = None  # how to measure it again, when not `python benchmarks/<file>.py`


def _cmd(file: str) -> str:
    return f"`python benchmarks/{file}.py`"


def _cuda(c: dict) -> str:
    by_every = {r["every"]: r for r in c["rows"]}
    default = by_every.get(4, c["rows"][0])
    text = f"**+{default['added_ns'] / 1000:.1f} µs** + {default['event_records_per_batch']:.1f} driver calls"
    if 1 in by_every and default is not by_every[1]:
        text += (f" (every step: +{by_every[1]['added_ns'] / 1000:.1f} µs + "
                 f"{by_every[1]['event_records_per_batch']:.0f})")
    return text + ("; CPU stand-in" if c["device"] == "stand-in" else f"; {c['device']}")


def _pause(p: dict) -> str:
    text = f"**{p['ms']:.1f} ms** watched"
    return text + (f" vs {p['bare_ms']:.1f} ms bare" if p.get("bare_ms") is not None else "")


def _soak(s: dict) -> str:
    page = s["page_s"]
    text = (f"**{s['records_run']:,} records, {s['records_lost']:,} lost, {s['records_doubled']:,} doubled**; "
            f"page p50 {page['p50']:.2f} s, slowest {page['max']:.2f} s")
    return text + (f", {len(page['errors'])} errors" if page.get("errors") else "")


def _soak_met(s: dict) -> bool:
    page = s["page_s"]
    return s["records_lost"] == 0 and s["records_doubled"] == 0 and page["max"] <= 2.0 and not page.get("errors")


def _rss(s: dict) -> str:
    """soak.py's `collector_rss`: start, plateau (median of the second half), max, slope."""
    summary = s["collector_rss"]
    return (f"{summary['start_bytes'] / MIB:.0f} → plateau **{summary['plateau_bytes'] / MIB:.0f} MiB** "
            f"(max {summary['max_bytes'] / MIB:.0f} MiB; second half "
            f"{summary['slope_second_half_bytes_per_h'] / MIB:+.0f} MiB/h; {s['records_run'] / 1e6:.1f}M step rows)")


def _end_to_end(s: dict) -> str:
    new, base = s["new"], s["base"]
    return (f"**{new['steps_per_s_median']:,.0f} steps/s**, finish() {new['finish_s_median']:.2f} s, "
            f"{new['spooled_median']:,.0f} spooled (previous release: {base['steps_per_s_median']:,.0f} steps/s, "
            f"{base['spooled_median']:,.0f} spooled); medians of interleaved pairs")


def _delay(d: dict) -> str:
    if d["p95_s"] is None:
        return "**no step counted while the loop ran**"
    return f"**{d['p95_s']:.2f} s** (p50 {d['p50_s']:.2f} s)"


C_CORE_TARGET = 300  # instructions per batch on the training thread (issue 29)


def _cores(bare: str, watched: str) -> tuple[Callable[[dict], str], Callable[[dict], bool]]:
    """The figure and the target check of a row comparing both hot-path cores over `bare`
    (instructions per batch, training thread first, the whole process in brackets)."""
    keys = (bare, f"{watched}:c", f"{watched}:python")

    def added(p: dict, core: str, where: str) -> int:
        return p[f"{watched}:{core}"][where] - p[bare][where]

    def figure(p: dict) -> str:
        if not all(k in p for k in keys):
            return "not measured"
        # the noise floor: how far repeats of the same loop were apart (instructions_per_thread.py)
        floor = max((p[k]["spread"] for k in keys if "spread" in p[k]), default=None)
        return (f"**C core {added(p, 'c', 'training_thread'):+,}**, Python core "
                f"{added(p, 'python', 'training_thread'):+,} (process: {added(p, 'c', 'process'):+,} / "
                f"{added(p, 'python', 'process'):+,}) of {p[bare]['training_thread']:,}"
                + (f"; noise floor {floor:,.0f}" if floor is not None else ""))

    def met(p: dict) -> bool:
        return not all(k in p for k in keys) or added(p, "c", "training_thread") <= C_CORE_TARGET

    return figure, met


PLAIN_TARGET_NS = 100  # wall time per item over bare, C core (issue 29)


def _by_core(r: dict, key: str, fmt: str) -> tuple[str, str]:
    """(C core's, Python core's) `key` of a fresh-process figure (overhead_fresh.py), formatted."""
    return tuple(format(r["cores"][core][key], fmt) for core in ("c", "python"))


def _plain(r: dict) -> str:
    if "cores" not in r:  # a results file from before both cores were measured
        return f"**{r['added_ns']:,.0f} ns** (training thread's CPU {r['thread_cpu_added_ns']:,.0f} ns)"
    wall, cpu = _by_core(r, "added_ns", "+,.0f"), _by_core(r, "thread_cpu_added_ns", "+,.0f")
    best = (f"; best of rounds {_by_core(r, 'added_ns_best', '+,.0f')[0]} / {_by_core(r, 'added_ns_best', '+,.0f')[1]} ns"
            if "added_ns_best" in r["cores"]["c"] else "")
    return (f"**C core {wall[0]} ns**, Python core {wall[1]} ns (training thread's CPU {cpu[0]} / {cpu[1]} ns) "
            f"over {r['bare_ns_per_batch']:,.0f} ns bare; median of {r['rounds']} rounds of fresh processes{best}")


def _loop(r: dict) -> str:
    if "cores" not in r:
        return f"**{r['added_pct']:+.1f}%** wall; training thread's CPU {r['thread_cpu_added_pct']:+.1f}%"
    wall, cpu = _by_core(r, "added_pct", "+.1f"), _by_core(r, "thread_cpu_added_pct", "+.1f")
    sidecar = _by_core(r, "sidecar_cpu_us_per_batch", ".2f")
    best = (f"; best of rounds {_by_core(r, 'added_pct_best', '+.1f')[0]}% / {_by_core(r, 'added_pct_best', '+.1f')[1]}%"
            if "added_pct_best" in r["cores"]["c"] else "")
    return (f"**C core {wall[0]}%**, Python core {wall[1]}% wall (training thread's CPU {cpu[0]}% / {cpu[1]}%; "
            f"apart: sidecar {sidecar[0]} / {sidecar[1]} µs CPU per batch) over {r['bare_ns_per_batch'] / 1e3:.1f} µs "
            f"bare; median of {r['rounds']} rounds of fresh processes{best}")


def _default_core(r: dict) -> dict:
    return r["cores"]["c"] if "cores" in r else r


ROWS = (
    Row("`watch()` cost per batch (bare loop over a list)", "overhead", "plain_iterator",
        f"C core ≤ {PLAIN_TARGET_NS} ns", _plain, lambda r: _default_core(r)["added_ns"] <= PLAIN_TARGET_NS),
    Row("what `watch()` adds to a `DataLoader` loop (instructions)", "instructions", None, "≤ 1%",
        lambda r: f"**{r['added_pct']:+.2f}%** ({r['added_per_batch']:+,.0f} of {r['bare_per_batch']:,.0f} per batch)",
        lambda r: r["added_pct"] <= 1.0),
    Row("`DataLoader(TensorDataset, batch_size=1)`, step `b[0] + 1`: what `watch()` adds", "overhead",
        "fast_dataloader", "C core ≤ +1%", _loop, lambda r: _default_core(r)["added_pct"] <= 1.0),
    Row("same loader + a tiny `nn.Linear` train step", "overhead", "train_step", "C core ≤ +1%", _loop,
        lambda r: _default_core(r)["added_pct"] <= 1.0),
    Row("from `watch()` to the first batch, over bare", "overhead", "startup", "≤ 50 ms",
        lambda r: f"**+{r['added_ms']:.1f} ms** (median of {r['repeats']} fresh processes)",
        lambda r: r["added_ms"] <= 50.0),
    Row("CUDA-event path per batch (events on 1 step in 4 by default)", "overhead", "cuda_path", "—", _cuda),
    Row("p99 step time, 1 ms steps", "overhead", "p99", "≤ +5%",
        lambda r: f"**{r['added_pct']:+.1f}%** ({r['watched_ms']:.3f} vs {r['bare_ms']:.3f} ms)",
        lambda r: r["added_pct"] <= 5.0),
    Row("longest time the training thread was held up (1 ms-step loop)", "overhead", "pause", "≤ 10 ms", _pause,
        lambda r: r["ms"] <= 10.0),
    Row("system sampling (thread / sidecar process)", "sampler", None, "< 1%",
        lambda r: f"**{r['thread_pct']:.2f}% / {r['sidecar_pct']:.2f}%** of a core",
        lambda r: r["thread_pct"] < 1.0 and r["sidecar_pct"] < 1.0),
    Row("collector ingest over HTTP", "ingest", "ingest", "≥ 100,000",
        lambda r: f"**{r['records_per_s']:,.0f} records/s**", lambda r: r["records_per_s"] >= 100_000),
    Row("watched 300,000-step loop to every step in the collector's store, end to end", "end_to_end", "summary",
        "≥ 250,000 steps/s, 0 spooled", _end_to_end,
        lambda s: s["new"]["steps_per_s_median"] >= 250_000 and s["new"]["spooled_median"] == 0),
    Row("record produced to counted by the API, p95", "ingest", "delay", "≤ 1.5 s", _delay,
        lambda r: r["p95_s"] is not None and r["p95_s"] <= 1.5),
    Row("run page of a 1M-step run interactive", "dashboard", "page", "≤ 2 s",
        lambda r: f"**{r['seconds']:.1f} s** (best of 3)", lambda r: r["seconds"] <= 2.0),
    Row("ingest while 10 clients poll a run page", "dashboard", "polled_ingest", "≥ 100,000",
        lambda r: f"**{r['records_per_s']:,.0f} records/s**", lambda r: r["records_per_s"] >= 100_000),
    Row("soak, 600 s: 2 trainings + 30 clients at 10x a 100 steps/s job", "soak", None, "0 lost; page ≤ 2 s",
        _soak, _soak_met),
    Row("collector RSS, 600 s soak: 2 trainings + 10 clients", "soak-600s-10-clients", "collector_rss", "bounded", _rss,
        whole=True, command="`python benchmarks/soak.py --clients 10 --out benchmarks/results/soak-600s-10-clients.json`"),
    Row("hot path, instructions per item over a bare list loop (training thread)", "instructions_per_thread",
        "per_batch", f"C core ≤ +{C_CORE_TARGET}", *_cores("barelist", "list")),
    Row("hot path, instructions per batch over a bare `DataLoader` loop (training thread)",
        "instructions_per_thread", "per_batch", f"C core ≤ +{C_CORE_TARGET}", *_cores("bare", "watched")),
    Row("hot path, instructions per batch over the bare tiny train step (training thread)",
        "instructions_per_thread", "per_batch", f"C core ≤ +{C_CORE_TARGET}", *_cores("baretrain", "train")),
    Row("hot path with the batch-size probe (a list of tensors: no batch size in its settings), instructions "
        "per item over bare (training thread)", "instructions_per_thread", "per_batch", "—",
        _cores("baretensors", "tensors")[0]),
)


def load(results: Path) -> dict[str, dict | None]:
    """Each results file's contents, None for a missing one."""
    out = {}
    for name in FILES:
        path = results / f"{name}.json"
        out[name] = json.loads(path.read_text()) if path.exists() else None
    return out


def is_quick(name: str, data: dict) -> bool:
    if data.get("quick"):
        return True
    if name.startswith("soak"):  # soak.py has no --quick: a run shorter than the README's 600 s is one
        return float(data.get("args", {}).get("seconds", 600.0)) < 600.0
    return False


def cell(row: Row, data: dict | None) -> tuple[str, str]:
    """(measured, target) cells of `row` for its results file's contents."""
    if data is None or (row.part is not None and row.part not in data):
        return "not measured", row.target
    part = data if row.part is None or row.whole else data[row.part]
    measured = row.figure(part)
    quick_parts = data.get("part_quick")  # a file whose parts were measured at different runs
    if quick_parts and row.part in quick_parts and not row.whole:
        quick = quick_parts[row.part]
    else:
        quick = is_quick(row.file, data)
    if quick:
        measured += " (quick run)"
    target = row.target
    if row.met is not None and not row.met(part):
        target += " (**not met**)"
    return measured, target


def _when(name: str, data: dict, results: Path) -> str:
    date = data.get("measured_at") or data.get("date")
    if date:
        return "measured " + str(date)[:10]
    committed = _commit_date(results / f"{name}.json")
    return f"committed {committed}" if committed else "date not recorded"


def _commit_date(path: Path) -> str | None:
    """The date of the commit that last changed `path`, when the file is as committed; else None."""
    try:
        git = ["git", "-C", str(path.parent)]
        if subprocess.run(git + ["diff", "--quiet", "HEAD", "--", path.name], capture_output=True).returncode:
            return None
        out = subprocess.run(git + ["log", "-1", "--format=%cs", "--", path.name], capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None


def _load_text(data: dict) -> str:
    loads = [la[0] for la in (data.get("load_average"), data.get("load_average_end")) if la]
    if not loads:
        return "load not recorded"
    low, high = min(loads), max(loads)
    return f"load {low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"load {low:.1f}–{high:.1f}"


def footnote(files: dict[str, dict | None], results: Path) -> str:
    parts, missing = [], []
    for name in FILES:
        data = files[name]
        if data is None:
            missing.append(f"`{name}.json`")
            continue
        cpus = f" on {data['cpu_count']} CPUs" if data.get("cpu_count") else ""
        quick = ", quick run" if is_quick(name, data) else ""
        when = _when(name, data, results)
        # a file some parts of which were kept from an earlier run (overhead.py --only)
        older = sorted({str(d)[:10] for d in (data.get("part_measured_at") or {}).values()
                        if d and str(d)[:10] != str(data.get("measured_at"))[:10]})
        others = f" (other parts measured {', '.join(older)})" if older else ""
        parts.append(f"`{name}.json` {when}, {_load_text(data)}{cpus}{quick}{others}")
    if missing:
        parts.append("not measured: " + ", ".join(missing))
    return "From `benchmarks/results/`: " + "; ".join(parts) + "."


def table(results: Path = RESULTS) -> str:
    files = load(results)
    lines = ["| what | measured | target | command |", "|---|---|---|---|"]
    for row in ROWS:
        measured, target = cell(row, files[row.file])
        lines.append(f"| {row.what} | {measured} | {target} | {row.command or _cmd(row.file)} |")
    return "\n".join(lines) + "\n\n" + footnote(files, results) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--docs", type=Path, default=DOCS_PAGE, help="the docs page holding the same table")
    parser.add_argument("--check", action="store_true", help="exit 1 when a table is not up to date")
    args = parser.parse_args(argv)
    body = table(args.results)
    stale = []
    for path in (args.docs,):
        text = path.read_text()
        updated = replace_section(text, BEGIN, END, body)
        if updated == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(updated)
    if args.check:
        for path in stale:
            print(f"{path}: the overhead table differs from {args.results}; "
                  "run python -m benchmarks.readme_table", file=sys.stderr)
        return 1 if stale else 0
    print(body, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
