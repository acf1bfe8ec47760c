"""Which host figure moved between two runs whose advice differs (issue 35 item 5).

The model predicts from the host as measured during each run (the host's CPU, the cores this
process may use, the other processes' cores, the loading's CPU share), so the same code under
another load gets other advice. Where two runs' advice differs, compare and
verify-after-change say which of those figures moved, so that a difference the load explains
is not taken for the model's noise (and one no figure explains is not taken for the load's).
Pure: summaries in, dicts and one sentence out.
"""
from __future__ import annotations

# (key, words, moved when the two values differ by at least this much, format)
FIGURES = (("host_cpu_pct", "host CPU busy", 10.0, "{:.0f}%"),
           ("usable_cores", "usable cores", 1.0, "{:g}"),
           ("others_cores", "other processes' cores", 0.25, "{:.2f}"),
           ("loading_cpu_share", "the loading's CPU share", 0.1, "{:.2f}"))
# Two promises this far apart (ratio) are different advice, though the change is the same.
PROMISE_APART = 1.25


def host_figures(facts, system: dict | None) -> dict:
    """The host figures the training loader's prediction rested on (summary["host"]): from its
    LoaderFacts where the diagnosis had them, else from the run's system summary."""
    system = system or {}
    quota_use = system.get("cgroup_cpu_pct_mean")
    out = {"host_cpu_pct": quota_use if quota_use is not None else system.get("cpu_pct_mean"),
           "usable_cores": system.get("usable_cores") or system.get("cpu_count"),
           "others_cores": None, "loading_cpu_share": None}
    if facts is not None:
        out["usable_cores"] = facts.cores
        out["others_cores"] = facts.others_cores if facts.process_cpu_cores is not None else None
        out["loading_cpu_share"] = facts.loading_cpu_fraction()
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


def _figures(summary: dict) -> dict:
    """A summary's host figures; an older summary without `host`, from its system summary."""
    return summary.get("host") or host_figures(None, summary.get("system"))


def moved(before: dict, after: dict) -> list[dict]:
    """[{"figure", "words", "before", "after", "text"}] for each host figure that moved between
    the two runs' summaries by its threshold or more; figures one run lacks are left out."""
    old, new = _figures(before), _figures(after)
    out = []
    for key, words, threshold, fmt in FIGURES:
        a, b = old.get(key), new.get(key)
        if a is None or b is None or abs(b - a) < threshold:
            continue
        out.append({"figure": key, "words": words, "before": a, "after": b,
                    "text": f"{words} {fmt.format(a)} → {fmt.format(b)}"})
    return out


def top_advice(summary: dict) -> dict | None:
    """The training loader's first speed-up advice (the change the answer leads with)."""
    name = (summary.get("verdict") or {}).get("training_loader")
    recs = [r for r in summary.get("recommendations") or [] if r.get("kind", "speedup") == "speedup"]
    return next((r for r in recs if r.get("loader") == name), None) or (recs[0] if recs else None)


def advice_text(rec: dict | None) -> str:
    if rec is None:
        return "no change"
    change = f"{rec['parameter']}={rec['suggested']!r}" if rec.get("parameter") else str(rec.get("suggested"))
    return change + (f" ({rec['expected_speedup']:.2f}x)" if rec.get("expected_speedup") else "")


def _differs(a: dict | None, b: dict | None) -> bool:
    if (a is None) != (b is None):
        return True
    if a is None:
        return False
    if (a.get("parameter"), a.get("suggested")) != (b.get("parameter"), b.get("suggested")):
        return True
    x, y = a.get("expected_speedup"), b.get("expected_speedup")
    return bool(x and y) and max(x, y) > PROMISE_APART * min(x, y)


def advice_moved(before: dict, after: dict) -> dict | None:
    """{"before", "after", "host_moved", "sentence"} where the two runs' advice differs (another
    change, advice against none, or promises more than 25% apart); None where it agrees."""
    a, b = top_advice(before), top_advice(after)
    if not _differs(a, b):
        return None
    moves = moved(before, after)
    sentence = f"The advice differs ({advice_text(a)} before, {advice_text(b)} after): "
    if moves:
        sentence += "the host moved: " + "; ".join(m["text"] for m in moves) + "."
    else:
        sentence += "no host figure moved (host CPU, usable cores, other processes' cores, the loading's CPU " \
                    "share): the runs themselves differed."
    return {"before": advice_text(a), "after": advice_text(b), "host_moved": moves, "sentence": sentence}


def verification_note(verification: dict | None) -> str | None:
    """One sentence under verify-after-change where the host moved between the two runs: the
    prediction was made on the one host and measured on the other."""
    moves = (verification or {}).get("host_moved") or []
    if not moves:
        return None
    return ("The host moved between the two runs (" + "; ".join(m["text"] for m in moves)
            + "): the prediction was made on the first and measured on the second.")
