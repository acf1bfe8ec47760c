"""Head-of-line blocking (issue 38): with in_order=True a DataLoader hands batches over in
sampler order, so the loop waits for one slow worker's batch while the other workers' later
batches sit ready. Named from the loader's attribution (analysis/wait_attribution.py): the
part of the wait during which a later batch of the epoch had already been handed over."""
from __future__ import annotations

MIN_SHARE = 0.2  # of the attributed wait: below it, the order costs little
# Samplers whose order is random already: handing batches over as they are ready changes
# which random order the loop sees, not what it sees. Others (a SequentialSampler, a custom
# batch sampler, an IterableDataset's stream) may be in an order the training relies on.
ORDER_FREE_SAMPLERS = frozenset({"RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler",
                                 "DistributedSampler"})


def order_free(config: dict | None) -> bool:
    config = config or {}
    return config.get("sampler") in ORDER_FREE_SAMPLERS and config.get("batch_sampler") == "BatchSampler"


def skew(attribution: dict) -> dict | None:
    """Per-worker batch times and what they make of the input time per batch: in order, the
    slowest worker paces every round (slowest / workers); out of order, every worker serves at
    its own pace (1 / sum of rates). None without two workers that served."""
    times = [ms for ms in attribution.get("worker_batch_ms") or () if ms]
    if len(times) < 2:
        return None
    return {"slowest_ms": max(times), "fastest_ms": min(times),
            "in_order_ms": max(times) / len(times), "out_of_order_ms": 1.0 / sum(1.0 / ms for ms in times)}


def head_of_line_findings(loaders: list[dict]) -> list[dict]:
    out = []
    for loader in loaders:
        a = loader.get("attribution")
        config = loader.get("config") or {}
        if not a or a["head_of_line_share"] < MIN_SHARE or config.get("in_order") is False:
            continue
        if loader.get("verdict") not in ("moderate", "high"):
            continue
        worker = max(a["workers"], key=lambda w: w["head_of_line_ms"])
        s = skew(a)
        slow = f" ({s['slowest_ms']:.1f} ms a batch against {s['fastest_ms']:.1f} ms for the fastest)" if s else ""
        if "in_order" not in config:
            fix = "torch 2.6 and later can hand batches over as they are ready (DataLoader(in_order=False))"
        elif order_free(config):
            fix = ("in_order=False hands batches over as they are ready (see the recommendation); "
                   "or even out the workers' shards")
        else:
            fix = ("even out the workers' shards; in_order=False would hand batches over as they are ready, "
                   f"but this loader's sampling ({config.get('sampler')}) may rely on the order")
        out.append({
            "kind": "head_of_line", "loader": loader["name"], "severity": "warning",
            "title": (f"'{loader['name']}' waited for worker {worker['worker']}{slow} while later batches were "
                      f"ready: head-of-line blocking, {100 * a['head_of_line_share']:.0f}% of the wait"),
            "detail": {"worker": worker["worker"], "head_of_line_share": round(a["head_of_line_share"], 4),
                       "head_of_line_ms": round(a["head_of_line_ms"], 3),
                       "worker_batch_ms": [round(ms, 3) if ms else None for ms in a["worker_batch_ms"]],
                       "order_free": order_free(config), "in_order_available": "in_order" in config},
            "fix": fix,
        })
    return out
