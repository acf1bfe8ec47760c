"""Plotly figure builders: data in, figure out. Shared by the HTML export and the dashboard."""
from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

WAIT_COLOR = "#d9534f"
COMPUTE_COLOR = "#5b8def"
LAYOUT = dict(template="plotly_white", margin=dict(l=50, r=20, t=70, b=40), height=340,
              legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
              title_y=0.97)


def _text(title: str) -> str:
    """Plotly reads a subset of HTML (links, styled spans, line breaks) in every title, legend
    entry, annotation and hover label: whatever carries a name goes through here, so a run,
    loader or worker name is shown as the text it is."""
    return html.escape(str(title), quote=False)


def _empty(title: str, note: str = "no data yet") -> go.Figure:
    fig = go.Figure(layout=dict(title=_text(title), **LAYOUT))
    fig.add_annotation(text=note, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def _translucent(color: str, alpha: float = 0.22) -> str:
    red, green, blue = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


def wait_attribution(loader: dict | None, title: str = "Who made the loop wait") -> go.Figure:
    """A loader summary's `attribution` (analysis/wait_attribution.py): one bar per stage and
    one per worker (plus the main process's hand-over), each its share of the attributed wait."""
    name = (loader or {}).get("name") or ""
    full = _text(f"{name}: {title}") if name else _text(title)
    attribution = (loader or {}).get("attribution")
    if not attribution:
        return _empty(f"{name}: {title}" if name else title, "no per-batch worker records (no DataLoader workers yet)")
    from ...analysis.wait_attribution import STAGE_TEXT
    stages = [(s, v["share"]) for s, v in attribution["stages"].items() if v["share"] > 0 or s != "unknown"]
    workers = [(f"worker {w['worker']}", w["share"]) for w in attribution["workers"]]
    fig = go.Figure(layout=dict(title=full, yaxis=dict(title="share of the wait", tickformat=".0%",
                                                        rangemode="tozero"), **LAYOUT))
    fig.add_trace(go.Bar(x=[s for s, _ in stages], y=[v for _, v in stages], name="stage",
                         marker_color=WAIT_COLOR, hovertext=[STAGE_TEXT.get(s, s) for s, _ in stages]))
    fig.add_trace(go.Bar(x=[w for w, _ in workers] + ["main process"],
                         y=[v for _, v in workers] + [attribution["main_process_share"]],
                         name="worker", marker_color=COMPUTE_COLOR))
    return fig


def step_timeline(series: dict, title: str = "Wait vs compute per step") -> go.Figure:
    """Per bucket of steps (Query.step_series), the mean wait and compute as lines, each over its
    min-max band: every step's extremes, from raw rows or from the rollups of a folded run, so
    one slow (or fast) step in a bucket shows at any length, never a sample. Epochs marked."""
    points = series.get("points") or []
    if not points:
        return _empty(title)
    # numpy arrays: plotly validates them at once and sends them as binary (a third smaller,
    # several times faster to build than lists of 1,000 numbers per trace).
    x = np.fromiter((p["index"] for p in points), dtype=np.int64, count=len(points))
    fig = go.Figure(layout=dict(title=_text(title), xaxis_title="step", yaxis_title="ms", **LAYOUT))
    banded = any(p["count"] > 1 for p in points)  # one step per bucket: min = mean = max
    for part, label, color in (("compute_ms", "compute", COMPUTE_COLOR), ("wait_ms", "data wait", WAIT_COLOR)):
        low, mean, high = np.array([p[part] for p in points], dtype=np.float64).T
        fig.add_trace(go.Scatter(x=x, y=mean, name=f"{label} (mean)", legendgroup=part, line=dict(color=color)))
        if banded:
            # The band: its lower edge, then the upper edge filled down to it ("tonexty": to the
            # trace just before). Both edges are drawn thin, so each is a visible trace.
            fig.add_trace(go.Scatter(x=x, y=low, name=f"{label} (min)", legendgroup=part, showlegend=False,
                                     line=dict(color=color, width=0.5), hoverinfo="skip"))
            fig.add_trace(go.Scatter(x=x, y=high, name=f"{label} (min–max)",
                                     legendgroup=part, fill="tonexty", fillcolor=_translucent(color),
                                     line=dict(color=color, width=0.5), customdata=low,
                                     hovertemplate=f"{label}: %{{customdata:.3g}}–%{{y:.3g}} ms<extra></extra>"))
    for epoch in series.get("epochs", []):
        fig.add_vline(x=epoch["index"], line=dict(color="#999", dash="dash", width=1))
    return fig


def wait_fraction_over_time(series: dict, title: str = "Input wait over time") -> go.Figure:
    points = series.get("points") or []
    if not points:
        return _empty(title)
    fig = go.Figure(layout=dict(title=_text(title), yaxis=dict(title="share of the loop", tickformat=".0%",
                                                         range=[0, 1]), **LAYOUT))
    fig.add_trace(go.Scatter(x=[p["t"] for p in points], y=[p["input_wait_fraction"] for p in points],
                             name="input wait", line=dict(color=WAIT_COLOR), fill="tozeroy"))
    fig.add_hrect(y0=0.2, y1=1, fillcolor=WAIT_COLOR, opacity=0.06, line_width=0)
    fig.add_hrect(y0=0.05, y1=0.2, fillcolor="#f0ad4e", opacity=0.06, line_width=0)
    return fig


RATE_WINDOW_S = 5.0  # throughput as a rate over at least this long: never one bucket's integer count


def windowed_rate(series: dict, field: str = "steps") -> tuple[list[float], list[float], float]:
    """Per rollup bucket (Query.rollup_series), `field` per second over a window centred on it:
    (seconds at each bucket's middle, rates, window in seconds). A bucket of one second holds a
    whole number of batches, so a job at 1.5 batches/s reads 1, 2, 1, 2; over 5 s it reads 1.5.
    The window is at least RATE_WINDOW_S and 5 buckets; at a run's ends it shrinks to what exists
    (a bucket missing inside the run is a stretch with no batch: it counts as zero)."""
    points = series.get("points") or []
    if not points:
        return [], [], 0.0
    bucket = float(series.get("bucket_s") or 1)
    window = max(RATE_WINDOW_S, 5 * bucket)
    starts = np.array([p["t_s"] for p in points], dtype=np.float64)
    counts = np.array([p.get(field) or 0 for p in points], dtype=np.float64)
    first, last = starts[0], starts[-1] + bucket
    middles = starts + bucket / 2
    rates = []
    for middle in middles:
        lo, hi = max(first, middle - window / 2), min(last, middle + window / 2)
        inside = (starts >= lo - 1e-9) & (starts + bucket <= hi + 1e-9)
        held = starts[inside]
        span = held[-1] + bucket - held[0] if len(held) else bucket
        rates.append(float(counts[inside].sum() / max(bucket, span)))
    return middles.tolist(), rates, window


def throughput_over_time(series: dict, title: str = "Throughput") -> go.Figure:
    from datetime import datetime, timezone
    middles, rates, window = windowed_rate(series)
    if not middles:
        return _empty(title)
    fig = go.Figure(layout=dict(title=_text(title), yaxis=dict(title="batches/s", rangemode="tozero"), **LAYOUT))
    fig.add_trace(go.Scatter(x=[datetime.fromtimestamp(t, tz=timezone.utc) for t in middles], y=rates,
                             name=f"batches/s ({window:.0f} s window)", line=dict(color=COMPUTE_COLOR, shape="spline"),
                             hovertemplate="%{y:.3g} batches/s<extra></extra>"))
    return fig


def log_ticks(low: float, high: float) -> tuple[list[float], list[str]]:
    """Tick values and labels for a log axis from `low` to `high`: 1, 2, 5 of each decade when the
    axis spans few decades, powers of ten alone past four; every label a whole number as read
    ("20", "0.5"), never plotly's "2 5 10 2 5 100"."""
    import math
    if not (low > 0 and high > low):
        return [], []
    decades = math.log10(high / low)
    steps = (1,) if decades > 4 else (1, 2, 5)
    values = []
    for exponent in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        for step in steps:
            value = step * 10.0 ** exponent
            if low <= value <= high:
                values.append(value)
    if len(values) < 2:
        return [], []  # under a decade with one round value: plotly's own ticks read better
    return values, [f"{v:,.{max(0, -math.floor(math.log10(v)))}f}" if v < 1 else f"{v:,.0f}" for v in values]


def clip_point(pairs: list[tuple[float, int]], factor: float = 3.0) -> float | None:
    """Where a histogram's axis should end: `factor` x the p95, unless the maximum is already
    within that. None when there is nothing to draw. A few long waits (an epoch's start, a
    stall) would otherwise squeeze every other bar into one at the left."""
    total = sum(n for _, n in pairs)
    if not total:
        return None
    ordered = sorted(pairs)
    top = ordered[-1][0]
    seen, p95 = 0, top
    for value, n in ordered:
        seen += n
        if seen >= 0.95 * total:
            p95 = value
            break
    if p95 <= 0 or top <= factor * p95:
        return top
    return factor * p95


def clipped_histogram(pairs: list[tuple[float, int]], title: str, unit: str = "ms", color: str = WAIT_COLOR,
                      what: str = "batches", bins: int = 40) -> go.Figure:
    """A histogram of (value, count) pairs on a linear axis clipped at clip_point(); what lies
    beyond is one separate bar at the right, labelled with its count and the maximum."""
    pairs = [(v, n) for v, n in pairs if n]
    clip = clip_point(pairs)
    if clip is None:
        return _empty(title)
    top = max(v for v, _ in pairs)
    width = (clip or 1.0) / bins
    counts = [0] * bins
    over = 0
    for v, n in pairs:
        if v > clip:
            over += n
        else:
            counts[min(bins - 1, int(v / width))] += n
    fig = go.Figure(layout=dict(title=_text(title), xaxis_title=unit, yaxis_title=what, bargap=0.05, **LAYOUT))
    fig.add_trace(go.Bar(x=[(i + 0.5) * width for i in range(bins)], y=counts, width=width, marker_color=color,
                         name=f"≤ {clip:.3g} {unit}", hovertemplate=f"%{{x:.3g}} {unit}: %{{y}} {what}<extra></extra>"))
    right = clip + width
    if over:
        x_over = clip + 2.5 * width
        fig.add_trace(go.Bar(x=[x_over], y=[over], width=2 * width, marker_color="#555", name=f"> {clip:.3g} {unit}",
                             hovertemplate=f"{over} {what} above {clip:.3g} {unit} (max {top:.3g} {unit})<extra></extra>"))
        fig.add_annotation(x=x_over, y=over, yanchor="bottom", showarrow=False,
                           text=f"{over:,} over {clip:.3g} {unit}<br>max {top:,.4g} {unit}")
        right = clip + 4 * width
    fig.update_xaxes(range=[0, right])
    fig.update_layout(meta={"clip": clip, "overflow": over, "max": top})
    return fig


def distribution_histogram(dist: dict, title: str, color: str = WAIT_COLOR) -> go.Figure:
    """From Query.distributions(): every step's value, exact counts (the dashboard and the HTML
    report; the same before and after a run's rows are folded)."""
    return clipped_histogram([(v, n) for v, n in dist.get("buckets") or []], title, color=color)


def _worker_series(events: list[dict], field: str) -> dict[int, tuple[list, list]]:
    from datetime import datetime, timezone
    out: dict[int, tuple[list, list]] = {}
    for e in events:
        t = datetime.fromtimestamp(e["t_ns"] / 1e9, tz=timezone.utc)
        for w in e.get("workers") or []:
            if w.get(field) is None:
                continue
            xs, ys = out.setdefault(w["id"], ([], []))
            xs.append(t)
            ys.append(w[field])
    return out


def _worker_order(item) -> tuple:
    """Numbered workers in order, then named ones (a mix must not fail to sort)."""
    worker = item[0]
    return (1, 0, str(worker)) if isinstance(worker, str) else (0, worker, "")


def worker_load_over_time(events: list[dict], title: str = "Load time per batch, per worker") -> go.Figure:
    """Each worker's mean load time per batch in each sampling interval (the slow worker stands out)."""
    series = _worker_series(events, "load_ms_interval") or _worker_series(events, "load_ms_mean")
    if not series:
        return _empty(title, "no worker has loaded a batch yet")
    fig = go.Figure(layout=dict(title=_text(title), yaxis_title="ms per batch", **LAYOUT))
    for worker, (xs, ys) in sorted(series.items(), key=_worker_order):
        fig.add_trace(go.Scatter(x=xs, y=ys, name=_text(f"worker {worker}"), mode="lines+markers",
                                 marker=dict(size=4)))
    return fig


def worker_memory_over_time(events: list[dict], title: str = "Memory per worker") -> go.Figure | None:
    """USS (memory only that worker holds) when known, else RSS; None when no sample has either."""
    for field, name in (("uss_bytes", "USS"), ("pss_bytes", "PSS"), ("rss_bytes", "RSS")):
        series = _worker_series(events, field)
        if series:
            break
    else:
        return None
    # From zero: a few hundred KiB of noise must not look like a leak.
    fig = go.Figure(layout=dict(title=_text(f"{title} ({name})"), yaxis=dict(title="MiB", rangemode="tozero"),
                                **LAYOUT))
    for worker, (xs, ys) in sorted(series.items(), key=_worker_order):
        fig.add_trace(go.Scatter(x=xs, y=[y / 2**20 for y in ys], name=_text(f"worker {worker}"), mode="lines"))
    return fig


def system_over_time(samples: list[dict], title: str = "Host and GPU") -> go.Figure:
    host = [s for s in samples if s.get("kind") == "host"]
    gpu = [s for s in samples if s.get("kind") == "gpu"]
    if not host and not gpu:
        return _empty(title)
    fig = go.Figure(layout=dict(title=_text(title), yaxis=dict(title="%", range=[0, 105]), **LAYOUT))

    def t(s):
        return s["t_ns"] / 1e9

    if host:
        from datetime import datetime, timezone
        xs = [datetime.fromtimestamp(t(s), tz=timezone.utc) for s in host]
        fig.add_trace(go.Scatter(x=xs, y=[s.get("cpu_pct") for s in host], name="CPU %"))
        fig.add_trace(go.Scatter(x=xs, y=[100 * (1 - s["mem_available_bytes"] / s["mem_total_bytes"])
                                          if s.get("mem_total_bytes") else None for s in host], name="RAM used %"))
        fig.add_trace(go.Scatter(x=xs, y=[100 * s["shm_used_bytes"] / s["shm_total_bytes"]
                                          if s.get("shm_total_bytes") else None for s in host], name="/dev/shm %"))
    if gpu:
        from datetime import datetime, timezone
        xs = [datetime.fromtimestamp(t(s), tz=timezone.utc) for s in gpu]
        fig.add_trace(go.Scatter(x=xs, y=[_mean(d.get("gpu_util_pct") for d in s["devices"]) for s in gpu],
                                 name="GPU util %"))
        fig.add_trace(go.Scatter(x=xs, y=[_mean(100 * d["mem_used_bytes"] / d["mem_total_bytes"]
                                                for d in s["devices"] if d.get("mem_total_bytes"))
                                          for s in gpu], name="GPU mem %"))
    return fig


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
