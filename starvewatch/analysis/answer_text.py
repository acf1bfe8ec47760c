"""What the answer at the top of a run says, as text: the verdict in one sentence, a change as
"setting: now → suggested", which recommendations are speed-ups. Shared by the dashboard's
answer card and the HTML report's verdict box, so both say the same."""
from __future__ import annotations


FACTORS = {
    "input_bound_cpu": "data loading is CPU-bound",
    "input_bound_io": "data loading waits on reads or latency, not CPU",
    "epoch_startup": "workers restart at every epoch",
    "host_bound": "the host's CPU is saturated",
    "compute_bound": "compute, not data",
    "gpu_transforms": "GPU-side transforms",
}


def kind(rec: dict) -> str:
    """Recommendations without `kind` come from runs before it existed: they were all speed-ups."""
    return rec.get("kind") or "speedup"


def speedups(summary: dict) -> list[dict]:
    return [r for r in summary.get("recommendations") or [] if kind(r) == "speedup"]


def protective(summary: dict) -> list[dict]:
    return [r for r in summary.get("recommendations") or [] if kind(r) == "protective"]


def change_text(rec: dict) -> str:
    if not rec.get("parameter"):
        return str(rec.get("suggested"))
    return f"{rec['parameter']}: {rec['current']!r} → {rec['suggested']!r}"


def verdict_sentence(summary: dict) -> str:
    v = summary["verdict"]
    band, wait = v["input_bound"], v.get("input_wait_fraction")
    if band == "insufficient_data" or wait is None:
        return "Not enough steps yet to tell whether training waits for data."
    share = f"{100 * wait:.0f}%"
    factor = v.get("limiting_factor")
    reason = FACTORS.get(factor, (factor or "").replace("_", " "))
    if band == "not":
        return f"Not input-bound: training waits for data {share} of the time" + (
            f"; the limit is {reason}." if reason and factor != "compute_bound" else ".")
    stake = v.get("speedup_at_stake")
    gain = f"; it would run up to {stake:.2f}x faster if it never waited" if stake else ""
    why = f" ({reason})" if reason else ""
    return f"{'Input-bound' if band == 'high' else 'Partly input-bound'}: training waits for data {share} of " \
           f"the time{why}{gain}."
