"""Plotly figure builders: data in, figure out. Shared by the HTML export and the dashboard."""
from __future__ import annotations

import plotly.graph_objects as go

WAIT_COLOR = "#d9534f"
COMPUTE_COLOR = "#5b8def"
LAYOUT = dict(template="plotly_white", margin=dict(l=50, r=20, t=70, b=40), height=340,
              legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
              title_y=0.97)


def _empty(title: str, note: str = "no data yet") -> go.Figure:
    fig = go.Figure(layout=dict(title=title, **LAYOUT))
    fig.add_annotation(text=note, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def step_timeline(series: dict, title: str = "Wait vs compute per step") -> go.Figure:
    """Mean wait and compute per bucket of steps, with the max wait as a band; epochs marked."""
    points = series.get("points") or []
    if not points:
        return _empty(title)
    x = [p["index"] for p in points]
    fig = go.Figure(layout=dict(title=title, xaxis_title="step", yaxis_title="ms", **LAYOUT))
    fig.add_trace(go.Scatter(x=x, y=[p["compute_ms"][1] for p in points], name="compute (mean)",
                             stackgroup="loop", line=dict(color=COMPUTE_COLOR)))
    fig.add_trace(go.Scatter(x=x, y=[p["wait_ms"][1] for p in points], name="data wait (mean)",
                             stackgroup="loop", line=dict(color=WAIT_COLOR)))
    if series.get("bucket_steps", 1) > 1:
        fig.add_trace(go.Scatter(x=x, y=[p["wait_ms"][2] for p in points], name="data wait (max)",
                                 line=dict(color=WAIT_COLOR, dash="dot", width=1)))
    for epoch in series.get("epochs", []):
        fig.add_vline(x=epoch["index"], line=dict(color="#999", dash="dash", width=1))
    return fig


def wait_fraction_over_time(series: dict, title: str = "Input wait over time") -> go.Figure:
    points = series.get("points") or []
    if not points:
        return _empty(title)
    fig = go.Figure(layout=dict(title=title, yaxis=dict(title="share of the loop", tickformat=".0%",
                                                         range=[0, 1]), **LAYOUT))
    fig.add_trace(go.Scatter(x=[p["t"] for p in points], y=[p["input_wait_fraction"] for p in points],
                             name="input wait", line=dict(color=WAIT_COLOR), fill="tozeroy"))
    fig.add_hrect(y0=0.2, y1=1, fillcolor=WAIT_COLOR, opacity=0.06, line_width=0)
    fig.add_hrect(y0=0.05, y1=0.2, fillcolor="#f0ad4e", opacity=0.06, line_width=0)
    return fig


def throughput_over_time(series: dict, title: str = "Throughput") -> go.Figure:
    points = series.get("points") or []
    if not points:
        return _empty(title)
    fig = go.Figure(layout=dict(title=title, yaxis_title="batches/s", **LAYOUT))
    fig.add_trace(go.Scatter(x=[p["t"] for p in points], y=[p["batches_per_s"] for p in points],
                             name="batches/s", line=dict(color=COMPUTE_COLOR)))
    return fig


def wait_histogram(series: dict, title: str = "Wait per batch") -> go.Figure:
    points = series.get("points") or []
    if not points:
        return _empty(title)
    fig = go.Figure(layout=dict(title=title, xaxis_title="ms (bucket mean)", yaxis_title="steps", **LAYOUT))
    fig.add_trace(go.Histogram(x=[p["wait_ms"][1] for p in points], y=[p["count"] for p in points],
                               histfunc="sum", marker_color=WAIT_COLOR, nbinsx=40, name="wait"))
    return fig


def system_over_time(samples: list[dict], title: str = "Host and GPU") -> go.Figure:
    host = [s for s in samples if s.get("kind") == "host"]
    gpu = [s for s in samples if s.get("kind") == "gpu"]
    if not host and not gpu:
        return _empty(title)
    fig = go.Figure(layout=dict(title=title, yaxis=dict(title="%", range=[0, 105]), **LAYOUT))

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


def worker_memory_over_time(memory: dict, title: str = "DataLoader workers: private memory (USS)") -> go.Figure:
    """USS per worker process over time (GET /runs/{id}/workers/memory): copy-on-read growth
    after fork shows as lines that climb with the samples served."""
    series = memory.get("series") or []
    if not series:
        return _empty(title, "no worker memory readings (num_workers=0, or no sidecar)")
    fig = go.Figure(layout=dict(title=title, xaxis_title="time", yaxis_title="MiB", **LAYOUT))
    from datetime import datetime, timezone
    for s in series:
        fig.add_trace(go.Scatter(
            x=[datetime.fromtimestamp(t, tz=timezone.utc) for t in s["t"]],
            y=[u / 2**20 for u in s["uss_bytes"]], mode="lines+markers",
            name=f"{s['loader']} worker {s['worker']} (pid {s['pid']})"))
    return fig
