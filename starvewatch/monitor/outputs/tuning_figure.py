"""Live tuning's throughput chart (issue 39 item 6): the loop's samples/s per window with its
95% interval, above the configuration each window ran, both over training steps. Data in
(the summary's `tuning` section, `starvewatch.live_tuning/1`), figure out; the run page's tuning
panel shows it beside the timeline table."""
from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ...analysis.verification import RUN_TO_RUN_NOISE, Z_95
from .figures import LAYOUT, _text

DECISION_COLORS = {"measured": "#5b8def", "kept": "#2e9e5b", "reverted": "#999999",
                   "slower_reverted": "#d9534f", "no_steps": "#cccccc", "disabled": "#555555"}


def window_points(live: dict | None) -> dict[str, list[dict]]:
    """Per loader, one point per window that ran steps: its first step (windows counted from
    the loader's first tuned step), steps, configuration, decision, rate and 95% interval. The
    interval holds the window's own spread and the run-to-run floor the decisions use
    (analysis/verification.speedup_interval), so two windows whose bars overlap well were not
    told apart."""
    out: dict[str, list[dict]] = {}
    for r in (live or {}).get("records") or []:
        st = (r.get("figures") or {}).get("step_time") or {}
        steps, mean_ms = st.get("steps") or 0, st.get("mean_ms")
        if not steps or not mean_ms or r.get("decision") == "disabled":
            continue
        points = out.setdefault(r.get("loader") or "", [])
        first = points[-1]["first_step"] + points[-1]["steps"] if points else 0
        per_step = st.get("samples_per_step")
        rate = (per_step or 1.0) / (mean_ms / 1e3)
        se_rel = (st.get("sd_ms") or 0.0) / math.sqrt(steps) / mean_ms
        spread = math.exp(Z_95 * math.sqrt(se_rel ** 2 + RUN_TO_RUN_NOISE ** 2))
        points.append({"window": r.get("window"), "first_step": first, "steps": steps,
                       "config": r.get("config") or {}, "decision": r.get("decision"),
                       "basis": "samples/s" if per_step else "batches/s",
                       "rate": rate, "low": rate / spread, "high": rate * spread})
    return {k: v for k, v in out.items() if v}


def tuning_timeline(live: dict | None, config_text=str, title: str = "Live tuning: throughput per window") -> go.Figure | None:
    """Top: each window's rate at its middle step, error bars its interval, coloured by the
    decision (legend entries say which colour is which); bottom: workers and prefetch depth over steps (a step line). None without windows."""
    per_loader = window_points(live)
    if not per_loader:
        return None
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.68, 0.32], vertical_spacing=0.06)
    basis = "samples/s"
    for loader, points in per_loader.items():
        basis = points[0]["basis"]
        name = _text(loader) + " " if len(per_loader) > 1 else ""  # one loader: short legend names
        fig.add_trace(go.Scatter(
            x=[p["first_step"] + p["steps"] / 2 for p in points], y=[p["rate"] for p in points],
            mode="markers+lines", name=f"{name}{basis}", legendgroup=name, line=dict(color="#bbbbbb", width=1),
            marker=dict(size=9, color=[DECISION_COLORS.get(p["decision"], "#5b8def") for p in points]),
            error_y=dict(type="data", symmetric=False, array=[p["high"] - p["rate"] for p in points],
                         arrayminus=[p["rate"] - p["low"] for p in points], thickness=1.5, width=4),
            customdata=[[p["window"], _text(config_text(p["config"])), (p["decision"] or "").replace("_", " "),
                         p["low"], p["high"], p["steps"]] for p in points],
            hovertemplate=("window %{customdata[0]} (%{customdata[5]} steps): %{customdata[1]}<br>"
                           "%{y:.1f} [%{customdata[3]:.1f}, %{customdata[4]:.1f}] " + basis +
                           "<br>%{customdata[2]}<extra></extra>")), row=1, col=1)
        xs, workers, prefetch = [], [], []
        for p in points:  # a step line: each window's configuration from its first step to its last
            for x in (p["first_step"], p["first_step"] + p["steps"]):
                xs.append(x)
                workers.append(p["config"].get("num_workers") or 0)
                prefetch.append(p["config"].get("prefetch_factor") if p["config"].get("num_workers") else None)
        fig.add_trace(go.Scatter(x=xs, y=workers, mode="lines", name=f"{name}workers", legendgroup=name,
                                 line=dict(color="#5b8def", shape="hv")), row=2, col=1)
        fig.add_trace(go.Scatter(x=xs, y=prefetch, mode="lines", name=f"{name}prefetch", legendgroup=name,
                                 line=dict(color="#f0ad4e", shape="hv", dash="dot")), row=2, col=1)
    seen = [d for d in DECISION_COLORS if any(p["decision"] == d for ps in per_loader.values() for p in ps)]
    for decision in seen:  # the markers' colours, in the legend (entries only: no data)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=decision.replace("_", " "),
                                 marker=dict(size=9, color=DECISION_COLORS[decision])), row=1, col=1)
    # The legend under the chart: a timeline's names and the decisions' colours take two lines.
    fig.update_layout(**dict(LAYOUT, height=470, margin=dict(l=50, r=20, t=50, b=40),
                             legend=dict(orientation="h", y=-0.16, yanchor="top", x=0)), title=_text(title))
    fig.update_yaxes(title_text=basis, rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="setting", rangemode="tozero", dtick=1, row=2, col=1)
    fig.update_xaxes(title_text="step (tuned loader)", row=2, col=1)
    return fig
