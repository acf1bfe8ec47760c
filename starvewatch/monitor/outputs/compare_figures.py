"""The compare page's charts (dashboard and `starvewatch compare --format html`): the two runs'
wait and compute distributions overlaid, their throughput and input wait on one time axis
(seconds from each run's start), and the verify-after-change intervals with the prediction
marked. Data in, figure out. Every run and loader name reaches plotly as escaped text."""
from __future__ import annotations

import html
import math

import plotly.graph_objects as go

from ...analysis.compare import expected_of, pair_label, start_seconds
from .figures import COMPUTE_COLOR, LAYOUT, WAIT_COLOR, log_ticks, windowed_rate

BEFORE_COLOR = "#8c8c8c"
AFTER_COLOR = "#2a9d8f"
BINS = 40


def _text(text: str) -> str:
    """Plotly reads a subset of HTML in titles, legend entries and tick labels: names are text."""
    return html.escape(text, quote=False)


def _empty(title: str, note: str = "no data yet") -> go.Figure:
    fig = go.Figure(layout=dict(title=_text(title), **LAYOUT))
    fig.add_annotation(text=html.escape(note, quote=False), showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def _shares(pairs: list, edges: list[float]) -> list[float]:
    """Percent of the batches in each bin [edges[i], edges[i+1]); values below the first edge
    count in the first bin, above the last in the last."""
    total = sum(n for _, n in pairs)
    counts = [0] * (len(edges) - 1)
    for v, n in pairs:
        i = 0
        if v > edges[0]:
            i = min(len(counts) - 1, int(math.log(v / edges[0]) / math.log(edges[1] / edges[0])))
        counts[i] += n
    return [100 * c / total for c in counts]


def overlaid_distributions(before: dict, after: dict, title: str, labels: tuple[str, str],
                           unit: str = "ms") -> go.Figure:
    """Two runs' distributions (Query.distributions parts: {"buckets": [[ms, count]...]}) on one
    log axis with shared bins, as the share of each run's batches: runs of different lengths, and
    waits that differ a thousandfold, still read on one chart."""
    sides = [[(v, n) for v, n in (d.get("buckets") or []) if n] for d in (before, after)]
    values = [v for side in sides for v, _ in side]
    if not values:
        return _empty(title)
    positive = [v for v in values if v > 0]
    low = max(min(positive) if positive else 1e-3, 1e-3)
    high = max(max(values), low * 1.5)
    ratio = (high * 1.0001 / low) ** (1 / BINS)
    edges = [low * ratio ** i for i in range(BINS + 1)]
    tickvals, ticktext = log_ticks(edges[0], edges[-1])
    fig = go.Figure(layout=dict(title=_text(title), xaxis=dict(title=f"{unit} (log scale)", type="log",
                                                               tickvals=tickvals or None, ticktext=ticktext or None),
                                yaxis_title="share of batches (%)", **LAYOUT))
    for side, label, color in zip(sides, labels, (BEFORE_COLOR, AFTER_COLOR)):
        if not side:
            continue
        shares = _shares(side, edges)
        count = sum(n for _, n in side)
        # A step outline per run: the overlap stays readable where filled bars would hide each other.
        fig.add_trace(go.Scatter(x=edges, y=shares + [shares[-1]], line_shape="hv", fill="tozeroy",
                                 line=dict(color=color), name=_text(f"{label} ({count:,} batches)"),
                                 hovertemplate=f"from %{{x:.3g}} {unit}: %{{y:.1f}}%<extra></extra>"))
    return fig


def _relative(series: dict, start: float | None) -> list[tuple[float, dict]]:
    """(seconds from the run's start, point) at the middle of each rollup bucket; a bucket is
    whole seconds, so the first may begin before the run did (clamped to 0)."""
    points = series.get("points") or []
    if not points:
        return []
    origin = start if start is not None else points[0]["t_s"]
    half = (series.get("bucket_s") or 1) / 2
    return [(max(0.0, p["t_s"] + half - origin), p) for p in points]


def over_time(before: dict, after: dict, starts: tuple, field: str, title: str, labels: tuple[str, str],
              fraction: bool = False) -> go.Figure:
    """One metric of two rollup series (Query.rollup_series) on one axis: seconds from each run's start."""
    sides = [_relative(s, start) for s, start in zip((before, after), starts)]
    if not any(sides):
        return _empty(title)
    yaxis = dict(title="share of the loop", tickformat=".0%", range=[0, 1]) if fraction else \
        dict(title=field.replace("_per_s", "/s").replace("_", " "), rangemode="tozero")
    fig = go.Figure(layout=dict(title=_text(title), xaxis_title="seconds from the run's start", yaxis=yaxis,
                                **LAYOUT))
    counted = {"batches_per_s": "steps", "samples_per_s": "samples"}.get(field)
    for series, start, side, label, color in zip((before, after), starts, sides, labels, (BEFORE_COLOR, AFTER_COLOR)):
        if not side:
            continue
        if counted:  # a rate over a window, never one bucket's whole count (figures.windowed_rate)
            middles, ys, window = windowed_rate(series, counted)
            origin = start if start is not None else (series.get("points") or [{}])[0].get("t_s", 0)
            xs = [max(0.0, t - origin) for t in middles]
            label = f"{label} ({window:.0f} s window)"
        else:
            xs, ys = [t for t, _ in side], [p.get(field) for _, p in side]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines" if len(side) > 30 else "lines+markers",
                                 name=_text(label), line=dict(color=color)))
    return fig


def verify_intervals(verification: dict | None, title: str = "Verify after change") -> go.Figure:
    """Per applied change: the measured speed-up with its 95% interval, the prediction as a
    diamond against it, and 1x (no change) as a line."""
    results = [r for r in (verification or {}).get("results") or [] if r.get("interval") and r["applied"]]
    if not results:
        return _empty(title, "no applied change with a measured speed-up")
    names = [_text(f"{r['loader']}: {r['parameter']}={r['suggested']!r}") for r in results]
    measured = [r["measured_speedup"] for r in results]
    fig = go.Figure(layout=dict(title=_text(title), xaxis=dict(title="speed-up (after / before)", type="log"),
                                yaxis=dict(type="category", automargin=True), **{**LAYOUT, "height": 160 + 60 * len(results)}))
    fig.add_trace(go.Scatter(
        x=measured, y=names, mode="markers", name="measured (95% interval)",
        marker=dict(color=COMPUTE_COLOR, size=10),
        error_x=dict(type="data", symmetric=False, array=[r["interval"][1] - m for r, m in zip(results, measured)],
                     arrayminus=[m - r["interval"][0] for r, m in zip(results, measured)], thickness=3, width=8),
        customdata=[[r["interval"][0], r["interval"][1], r["status"].replace("_", " ")] for r in results],
        hovertemplate="measured %{x:.3g}x [%{customdata[0]:.3g}, %{customdata[1]:.3g}]: %{customdata[2]}<extra></extra>"))
    predicted = [(expected_of(r), n) for r, n in zip(results, names) if expected_of(r)]
    if predicted:
        fig.add_trace(go.Scatter(x=[p for p, _ in predicted], y=[n for _, n in predicted], mode="markers",
                                 name="predicted", marker=dict(symbol="diamond", size=13, color=WAIT_COLOR,
                                                               line=dict(color="#222", width=1)),
                                 hovertemplate="predicted %{x:.3g}x<extra></extra>"))
    fig.add_vline(x=1.0, line=dict(color="#999", dash="dash", width=1))
    fig.update_layout(meta={"measured": measured, "intervals": [r["interval"] for r in results],
                            "predicted": [p for p, _ in predicted]})
    return fig


def run_labels(comp: dict) -> tuple[str, str]:
    return f"before: {comp['before']['id']}", f"after: {comp['after']['id']}"


def figures_for(comp: dict, distributions: dict, series: dict) -> dict:
    """Every chart of a comparison: {"pairs": [{"label", "wait", "compute", "throughput",
    "input_wait"}], "verify": figure}. `distributions[(side, loader)]` and `series[(side, loader)]`
    hold Query.distributions and Query.rollup_series answers, side "before" or "after"."""
    labels = run_labels(comp)
    starts = (start_seconds(comp["before"]), start_seconds(comp["after"]))
    out = []
    for pair in comp["pairs"]:
        name = pair_label(pair)
        d_before = distributions.get(("before", pair["before"])) or {}
        d_after = distributions.get(("after", pair["after"])) or {}
        s_before = series.get(("before", pair["before"])) or {}
        s_after = series.get(("after", pair["after"])) or {}
        out.append({
            "label": name,
            "wait": overlaid_distributions(d_before.get("wait") or {}, d_after.get("wait") or {},
                                           f"{name}: wait per batch", labels),
            "compute": overlaid_distributions(d_before.get("compute") or {}, d_after.get("compute") or {},
                                              f"{name}: compute per batch", labels),
            "throughput": over_time(s_before, s_after, starts, "batches_per_s", f"{name}: batches/s", labels),
            "input_wait": over_time(s_before, s_after, starts, "input_wait_fraction", f"{name}: input wait",
                                    labels, fraction=True),
        })
    return {"pairs": out, "verify": verify_intervals(comp["verification"])}

