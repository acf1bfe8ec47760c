"""benchmarks/readme_table.py: the performance page's overhead table from fabricated results files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import readme_table

ROOT = Path(__file__).resolve().parent.parent


def _write(results: Path, name: str, data: dict) -> None:
    results.mkdir(exist_ok=True)
    (results / f"{name}.json").write_text(json.dumps(data))


def _rows(text: str) -> dict[str, list[str]]:
    """what -> [measured, target, command] of each table row."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4 and cells[0] != "what":
            rows[cells[0]] = cells[1:]
    return rows


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """overhead.json with a met target, an unmet one and a missing part; a quick sampler.json;
    a short soak with a lost record; no instructions, ingest or dashboard file."""
    out = tmp_path / "results"
    _write(out, "overhead", {
        "measured_at": "2026-11-20T10:00:00Z", "cpu_count": 2, "quick": False,
        "load_average": [0.4, 0.3, 0.2], "load_average_end": [1.2, 0.5, 0.3],
        "plain_iterator": {"added_ns": 281.4, "thread_cpu_added_ns": 250.0},
        "fast_dataloader": {"added_pct": 3.25, "thread_cpu_added_pct": 0.5, "repeats": 12},
        "pause": {"ms": 12.0, "bare_ms": 4.0},
    })
    _write(out, "sampler", {"measured_at": "2026-11-21T10:00:00Z", "cpu_count": 16, "quick": True,
                            "load_average": [2.0, 1.0, 1.0], "load_average_end": [2.04, 1.0, 1.0],
                            "thread_pct": 0.05, "sidecar_pct": 0.6})
    _write(out, "soak", {"measured_at": "2026-11-22T10:00:00Z", "args": {"seconds": 5.0},
                         "records_run": 1000, "records_lost": 1, "records_doubled": 0,
                         "page_s": {"p50": 0.1, "max": 0.5, "errors": []},
                         "rss": {"t_s": [0.0, 5.0], "collector_bytes": [2**20, 3 * 2**20]}})
    _write(out, "soak-600s-10-clients", {"measured_at": "2026-11-22T11:00:00Z", "args": {"seconds": 600.0},
                                         "records_run": 7_200_000, "records_lost": 0, "records_doubled": 0,
                                         "collector_rss": {"start_bytes": 84 * 2**20, "plateau_bytes": 119 * 2**20,
                                                           "max_bytes": 122 * 2**20, "end_bytes": 119 * 2**20,
                                                           "slope_second_half_bytes_per_h": -11 * 2**20}})
    _write(out, "end_to_end", {"measured_at": "2026-11-28T10:00:00Z", "cpu_count": 2, "quick": False,
                               "load_average": [0.5, 0.4, 0.3], "load_average_end": [0.9, 0.5, 0.3],
                               "summary": {"new": {"steps_per_s_median": 251_000.4, "finish_s_median": 1.234,
                                                   "spooled_median": 0},
                                           "base": {"steps_per_s_median": 52_000.0, "finish_s_median": 2.7,
                                                    "spooled_median": 95_199}}})
    return out


def test_rows_from_fabricated_results(results: Path) -> None:
    rows = _rows(readme_table.table(results))
    assert len(rows) == len(readme_table.ROWS)

    plain = rows["`watch()` cost per batch (bare loop over a list)"]
    assert plain[0].startswith("**281 ns**")
    assert plain[1] == "C core ≤ 100 ns (**not met**)"  # a file from before both cores: judged as it is
    assert plain[2] == "`python benchmarks/overhead.py`"

    fast = rows["`DataLoader(TensorDataset, batch_size=1)`, step `b[0] + 1`: what `watch()` adds"]
    assert fast[0].startswith("**+3.2%** wall")
    assert fast[1] == "C core ≤ +1% (**not met**)"

    pause = rows["longest time the training thread was held up (1 ms-step loop)"]
    assert pause[0] == "**12.0 ms** watched vs 4.0 ms bare"
    assert pause[1] == "≤ 10 ms (**not met**)"

    # a part missing from a file that exists, and whole files missing
    assert rows["same loader + a tiny `nn.Linear` train step"][0] == "not measured"
    assert rows["same loader + a tiny `nn.Linear` train step"][1] == "C core ≤ +1%"
    for what in ("what `watch()` adds to a `DataLoader` loop (instructions)", "collector ingest over HTTP",
                 "run page of a 1M-step run interactive"):
        assert rows[what][0] == "not measured"

    sampler = rows["system sampling (thread / sidecar process)"]
    assert sampler == ["**0.05% / 0.60%** of a core (quick run)", "< 1%", "`python benchmarks/sampler.py`"]

    soak = rows["soak, 600 s: 2 trainings + 30 clients at 10x a 100 steps/s job"]
    assert soak[0].startswith("**1,000 records, 1 lost, 0 doubled**")
    assert soak[0].endswith("(quick run)")  # 5 s, not the 600 s the row is for
    assert soak[1] == "0 lost; page ≤ 2 s (**not met**)"
    e2e = rows["watched 300,000-step loop to every step in the collector's store, end to end"]
    assert e2e == ["**251,000 steps/s**, finish() 1.23 s, 0 spooled (previous release: 52,000 steps/s, 95,199 "
                   "spooled); medians of interleaved pairs", "≥ 250,000 steps/s, 0 spooled",
                   "`python benchmarks/end_to_end.py`"]
    rss = rows["collector RSS, 600 s soak: 2 trainings + 10 clients"]
    assert rss[0] == "84 → plateau **119 MiB** (max 122 MiB; second half -11 MiB/h; 7.2M step rows)"
    assert rss[1] == "bounded"
    assert rss[2].startswith("`python benchmarks/soak.py --clients 10 ")  # its own command, not the file's name


def test_footnote_dates_and_loads(results: Path) -> None:
    text = readme_table.table(results)
    note = text.strip().splitlines()[-1]
    assert "`overhead.json` measured 2026-11-20, load 0.4–1.2 on 2 CPUs;" in note
    assert "`sampler.json` measured 2026-11-21, load 2.0 on 16 CPUs, quick run;" in note
    assert "`soak.json` measured 2026-11-22, load not recorded, quick run;" in note
    assert "`soak-600s-10-clients.json` measured 2026-11-22, load not recorded;" in note
    assert note.endswith("not measured: `instructions.json`, `ingest.json`, `dashboard.json`, "
                         "`instructions_per_thread.json`.")


def test_thresholds_both_ways(tmp_path: Path) -> None:
    out = tmp_path / "results"
    for added_ns, marked in ((100.0, False), (100.5, True)):
        _write(out, "overhead", {"plain_iterator": {"added_ns": added_ns, "thread_cpu_added_ns": 1.0}})
        target = _rows(readme_table.table(out))["`watch()` cost per batch (bare loop over a list)"][1]
        assert target.endswith("(**not met**)") is marked


def test_main_writes_between_markers_and_check(results: Path, tmp_path: Path) -> None:
    docs = tmp_path / "performance.md"
    docs.write_text(f"# Performance\n\nbefore\n\n{readme_table.BEGIN}\nold table\n{readme_table.END}\n\nafter\n")
    paths = ["--results", str(results), "--docs", str(docs)]
    assert readme_table.main(paths + ["--check"]) == 1
    assert "old table" in docs.read_text()  # --check wrote nothing
    assert readme_table.main(paths) == 0
    text = docs.read_text()
    assert "old table" not in text
    assert text.startswith("# Performance\n\nbefore\n\n" + readme_table.BEGIN
                           + "\n| what | measured | target | command |")
    assert text.endswith(readme_table.END + "\n\nafter\n")
    assert readme_table.main(paths + ["--check"]) == 0
    docs.write_text(docs.read_text().replace("| what |", "| WHAT |"))  # the page goes stale
    assert readme_table.main(paths + ["--check"]) == 1


def test_the_table_is_on_the_performance_page_and_the_readme_links_it() -> None:
    text = (ROOT / "docs/performance.md").read_text()
    assert text.count(readme_table.BEGIN) == 1 and text.count(readme_table.END) == 1
    section = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    assert section.index(readme_table.BEGIN) < section.index(readme_table.END)
    readme = (ROOT / "README.md").read_text()
    assert readme_table.BEGIN not in readme and "](docs/performance.md)" in readme


def test_repo_tables_are_up_to_date() -> None:
    """The site's figures are the results files' (written by the script)."""
    assert readme_table.main(["--check"]) == 0


def test_both_hot_path_cores_against_the_c_core_target(tmp_path: Path) -> None:
    """instructions_per_thread.json: both cores over the bare loop, the C core judged against
    its +300 instructions per batch; a mode missing from the file reads "not measured"."""
    out = tmp_path / "results"

    def mode(thread: int, process: int) -> dict:
        return {"training_thread": thread, "process": process}

    for c_thread, marked in ((1300, False), (1301, True)):
        _write(out, "instructions_per_thread", {"per_batch": {
            "barelist": mode(1000, 1500), "list:c": mode(c_thread, 2600), "list:python": mode(3600, 5000),
            "bare": mode(900_000, 950_000), "watched:python": mode(902_500, 953_000)}})
        rows = _rows(readme_table.table(out))
        plain = rows["hot path, instructions per item over a bare list loop (training thread)"]
        assert plain[0] == (f"**C core {c_thread - 1000:+,}**, Python core +2,600 (process: +1,100 / +3,500) "
                            "of 1,000")
        assert plain[1] == "C core ≤ +300" + (" (**not met**)" if marked else "")
        assert plain[2] == "`python benchmarks/instructions_per_thread.py`"
        loader = rows["hot path, instructions per batch over a bare `DataLoader` loop (training thread)"]
        assert loader[:2] == ["not measured", "C core ≤ +300"]  # watched:c is missing


def _fresh(c_added: float, python_added: float, key: str) -> dict:
    """A figure of overhead_fresh.py: both cores, from rounds of fresh processes."""
    def core(added):
        return {key: added, f"{key}_best": added / 2, "thread_cpu_added_ns": 1.0, "thread_cpu_added_pct": 0.2,
                "sidecar_cpu_us_per_batch": 1.5}
    return {"rounds": 10, "bare_ns_per_batch": 23_000.0, "cores": {"c": core(c_added), "python": core(python_added)},
            key: c_added}


def test_both_cores_from_fresh_processes_and_parts_kept_from_an_earlier_run(tmp_path: Path) -> None:
    """overhead.py --only plain,fast,train: both cores per row, judged on the C core; a quick
    part says so while the parts kept from a full run earlier do not, and the footnote dates them."""
    out = tmp_path / "results"
    _write(out, "overhead", {
        "measured_at": "2026-11-25T10:00:00Z", "cpu_count": 2, "quick": True,
        "load_average": [0.5, 0.5, 0.5], "load_average_end": [0.6, 0.5, 0.5],
        "plain_iterator": _fresh(99.0, 1500.0, "added_ns"),
        "fast_dataloader": _fresh(1.4, 12.0, "added_pct"),
        "train_step": _fresh(0.3, 2.0, "added_pct"),
        "p99": {"added_pct": 1.0, "watched_ms": 1.01, "bare_ms": 1.0},
        "part_measured_at": {"plain_iterator": "2026-11-25T10:00:00Z", "fast_dataloader": "2026-11-25T10:00:00Z",
                             "train_step": "2026-11-25T10:00:00Z", "p99": "2026-11-23T10:00:00Z"},
        "part_quick": {"plain_iterator": True, "fast_dataloader": False, "train_step": False, "p99": False},
    })
    text = readme_table.table(out)
    rows = _rows(text)
    plain = rows["`watch()` cost per batch (bare loop over a list)"]
    assert plain[0].startswith("**C core +99 ns**, Python core +1,500 ns")
    assert plain[0].endswith("(quick run)")
    assert plain[1] == "C core ≤ 100 ns"  # the Python core's 1,500 ns is shown, not judged
    fast = rows["`DataLoader(TensorDataset, batch_size=1)`, step `b[0] + 1`: what `watch()` adds"]
    assert fast[0].startswith("**C core +1.4%**, Python core +12.0% wall")
    assert "sidecar 1.50 / 1.50 µs CPU per batch" in fast[0] and "quick run" not in fast[0]
    assert fast[0].endswith("median of 10 rounds of fresh processes; best of rounds +0.7% / +6.0%")
    assert fast[1] == "C core ≤ +1% (**not met**)"
    assert rows["same loader + a tiny `nn.Linear` train step"][1] == "C core ≤ +1%"
    assert rows["p99 step time, 1 ms steps"][0] == "**+1.0%** (1.010 vs 1.000 ms)"
    assert "(other parts measured 2026-11-23)" in text.strip().splitlines()[-1]


def test_instruction_rows_show_the_noise_floor(tmp_path: Path) -> None:
    out = tmp_path / "results"
    row = {"training_thread": 100, "process": 200, "spread": 3.0}
    _write(out, "instructions_per_thread", {"measured_at": "2026-11-25T10:00:00Z", "per_batch": {
        "baretensors": row, "tensors:c": {**row, "training_thread": 1400, "spread": 12.5},
        "tensors:python": {**row, "training_thread": 2900}}})
    probe = _rows(readme_table.table(out))["hot path with the batch-size probe (a list of tensors: no batch size "
                                          "in its settings), instructions per item over bare (training thread)"]
    assert probe[0] == "**C core +1,300**, Python core +2,800 (process: +0 / +0) of 100; noise floor 12"
    assert probe[1] == "—"
