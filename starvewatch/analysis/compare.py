"""Two runs side by side: which loaders pair, how each metric changed, what configuration
changed, and the verify-after-change verdict. Pure functions over two summaries, shared by the
dashboard's compare page and `starvewatch compare` (its documents: monitor/outputs/compare_report.py).

Loaders pair by name; when both runs have one loader each, those two pair whatever their names
(a loader renamed between runs is still the same loader). Ratios print as a percent change with
the ratio to three significant digits ("-99.7% (0.00255x)"), never rounded to "0.00x".
"""
from __future__ import annotations

import copy
from datetime import datetime

from ..schema import COMPARE_SCHEMA
from .host_moves import advice_moved
from .loader_settings import setting_changed
from .regression import regression
from .verification import verify

# (label, where in a loader summary, kind): kind "fraction" changes in percentage points.
METRICS = (("input wait", ("input_wait_fraction",), "fraction"),
           ("batches/s", ("batches_per_s",), "rate"),
           ("samples/s", ("samples_per_s",), "rate"),
           ("wait p50 (ms)", ("wait_ms", "p50"), "ms"),
           ("wait p95 (ms)", ("wait_ms", "p95"), "ms"),
           ("compute mean (ms)", ("compute_ms", "mean"), "ms"))


def loader_pairs(before: dict, after: dict) -> list[dict]:
    """[{"before": name, "after": name, "by": "name" | "only loader"}], in the after run's order."""
    old = [l["name"] for l in before.get("loaders") or []]
    new = [l["name"] for l in after.get("loaders") or []]
    if len(old) == 1 and len(new) == 1 and old != new:
        return [{"before": old[0], "after": new[0], "by": "only loader"}]
    return [{"before": n, "after": n, "by": "name"} for n in new if n in old]


def pair_label(pair: dict) -> str:
    return pair["after"] if pair["before"] == pair["after"] else f"{pair['before']} → {pair['after']}"


def _loader(summary: dict, name: str) -> dict:
    return next(l for l in summary["loaders"] if l["name"] == name)


def _get(loader: dict, path: tuple):
    value = loader
    for key in path:
        value = (value or {}).get(key)
    return value


def change(a, b, kind: str) -> dict:
    """{"ratio", "change_pct", "change_points"} of after (b) over before (a); None where unknown."""
    out = {"ratio": None, "change_pct": None, "change_points": None}
    if a is None or b is None:
        return out
    if kind == "fraction":
        out["change_points"] = 100 * (b - a)
    if a:
        out["ratio"] = b / a
        out["change_pct"] = 100 * (b / a - 1)
    return out


def change_text(row: dict) -> str:
    """'-99.7% (0.00255x)', '+150.0% (2.5x)', '-71.4 points' for a share; 'n/a' when unknown."""
    if row.get("change_points") is not None:
        return f"{row['change_points']:+.1f} points"
    ratio, pct = row.get("ratio"), row.get("change_pct")
    if ratio is None or pct is None:
        return "n/a"
    shown = f"{pct:+,.0f}%" if abs(pct) >= 1000 else f"{pct:+.1f}%"
    return f"{shown} ({ratio:.3g}x)"


def value_text(x, kind: str) -> str:
    if x is None:
        return "n/a"
    if kind == "fraction":
        return f"{100 * x:.1f}%"
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.3g}" if x else "0"


def metric_rows(before: dict, after: dict, pairs: list[dict]) -> list[dict]:
    rows = []
    for pair in pairs:
        old, new = _loader(before, pair["before"]), _loader(after, pair["after"])
        for label, path, kind in METRICS:
            a, b = _get(old, path), _get(new, path)
            if a is None and b is None:
                continue
            rows.append({"loader": pair_label(pair), "metric": label, "kind": kind, "before": a, "after": b,
                         **change(a, b, kind)})
    return rows


def config_rows(before: dict, after: dict, pairs: list[dict]) -> list[dict]:
    """Every setting of each pair of loaders, marked changed where its effect changed (not
    where torch only filled in its default: effective_config)."""
    rows = []
    for pair in pairs:
        a = _loader(before, pair["before"]).get("config") or {}
        b = _loader(after, pair["after"]).get("config") or {}
        for key in list(a) + [k for k in b if k not in a]:
            rows.append({"loader": pair_label(pair), "setting": key, "before": a.get(key), "after": b.get(key),
                         "before_set": key in a, "after_set": key in b,
                         "changed": setting_changed(a, b, key)})
    return rows


def aligned_before(before: dict, pairs: list[dict]) -> dict:
    """The before summary with a paired loader renamed to its partner's name, so that
    verify() (which pairs by name) judges the renamed loader too."""
    renames = {p["before"]: p["after"] for p in pairs if p["before"] != p["after"]}
    if not renames:
        return before
    out = copy.deepcopy(before)
    for part in ("loaders", "recommendations", "plans"):
        for item in out.get(part) or []:
            for key in ("name", "loader"):
                if item.get(key) in renames:
                    item[key] = renames[item[key]]
    return out


def comparison(before: dict, after: dict) -> dict:
    """The comparison (schema `starvewatch.compare/1`): both runs, the loader pairs, the metric
    changes, the configuration diff and the verify-after-change verdict (None when the paired
    loaders' configurations are the same)."""
    pairs = loader_pairs(before, after)
    paired_before = {p["before"] for p in pairs}
    paired_after = {p["after"] for p in pairs}
    slower = regression(before, after)
    return {
        "schema": COMPARE_SCHEMA,
        "before": _run(before), "after": _run(after),
        # First on the page: is the later run slower, beyond noise, and the likely cause.
        "regression": slower,
        "pairs": pairs,
        "unpaired": {"before": [l["name"] for l in before["loaders"] if l["name"] not in paired_before],
                     "after": [l["name"] for l in after["loaders"] if l["name"] not in paired_after]},
        "metrics": metric_rows(before, after, pairs),
        "config": config_rows(before, after, pairs),
        "verification": verify(aligned_before(before, pairs), after),
        # Where the two runs' advice differs: which host figure moved (issue 35 item 5).
        "advice_moved": advice_moved(before, after),
    }


def gather(summary_of, distributions_of, series_of, a: str, b: str) -> tuple[dict, dict, dict, dict, dict]:
    """(before, after, comparison, distributions, series) read through three functions, so the
    dashboard (the query layer) and the CLI (a collector or offline data) share one path."""
    before, after = summary_of(a), summary_of(b)
    comp = comparison(before, after)
    distributions, series = {}, {}
    for pair in comp["pairs"]:
        for side, run_id in (("before", a), ("after", b)):
            loader = pair[side]
            distributions[(side, loader)] = distributions_of(run_id, loader)
            series[(side, loader)] = series_of(run_id, loader)
    return before, after, comp, distributions, series


def _run(summary: dict) -> dict:
    run, verdict = summary["run"], summary.get("verdict") or {}
    return {"id": run["id"], "name": run.get("name"), "status": run.get("status"),
            "started_at": run.get("started_at"), "input_bound": verdict.get("input_bound"),
            "input_wait_fraction": verdict.get("input_wait_fraction")}


def start_seconds(summary_run: dict) -> float | None:
    """A run's start as epoch seconds (charts count seconds from each run's start)."""
    started = summary_run.get("started_at")
    if not started:
        return None
    try:
        return datetime.fromisoformat(str(started).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def setting_text(value, is_set: bool = True) -> str:
    """A setting as the dashboard's configuration table shows it (a dict or list spelled out)."""
    if not is_set:
        return "(default)"
    if isinstance(value, (dict, list, tuple)):
        from ..quantities import value as spelled
        return spelled("", value)
    return repr(value)


def expected_of(result: dict):
    return result.get("judged_against") or result.get("expected_speedup")


def speedup_text(x: float) -> str:
    """A speed-up with two decimals in the usual range, three significant digits outside it."""
    return f"{x:.2f}" if 0.1 <= abs(x) < 100 else f"{x:.3g}"


def interval_text(result: dict) -> str:
    """'measured 2.05x [1.90, 2.21] samples/s; predicted 2.40x' -- the prediction against the interval."""
    if result.get("measured_speedup") is None:
        return "not measured"
    low, high = result.get("interval") or (None, None)
    text = f"measured {speedup_text(result['measured_speedup'])}x"
    if low is not None:
        text += f" [{speedup_text(low)}, {speedup_text(high)}]"
    if result.get("basis"):
        text += f" {result['basis']}"
    if result.get("measured_against"):  # a live-tuned run: against its start windows, or the earlier run
        text += f" against the {result['measured_against']}"
    expected = expected_of(result)
    if expected:
        where = "inside" if low is not None and low <= expected <= high else \
            "above" if low is not None and expected > high else "below" if low is not None else "against"
        text += f"; predicted {speedup_text(expected)}x" + (f" ({where} the interval)" if where != "against" else "")
    return text
