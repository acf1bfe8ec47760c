"""What the user is told, produced once (issue 34): the words for the verdict, the headline,
the other loaders beside it, why nothing is recommended, and whether this run is slower than
the one before it. Every surface (the console report, the run page, the JSON summary, the
Markdown and HTML exports, the runs list, compare) shows these sentences; none makes its own.

Pure: from a summary (and, for the reason of a silence, the diagnosis's LoaderFacts). The
identifiers stay in the JSON (`limiting_factor`, `input_bound`); prose uses the phrases here.
"""
from __future__ import annotations

from ..schema import MIN_SECONDS_FOR_VERDICT, MIN_STEPS_FOR_VERDICT

# One vocabulary for the band, on every surface (badge, filter, headline, exports).
BAND_WORDS = {
    "high": "input-bound",
    "moderate": "partly input-bound",
    "not": "not input-bound",
    "insufficient_data": "not enough data yet",
}

LIMITING_PHRASES = {
    "input_bound_cpu": "loading is CPU work (decoding, transforms)",
    "input_bound_io": "loading waits on reads or sleeps, not on the CPU",
    "input_bound_main": "the training process's own share of each batch (receiving and rebuilding it)",
    "epoch_startup": "the workers' start-up at every epoch",
    "host_bound": "the GPU is underused while the loop hardly waits for data",
    "compute_bound": "the training step itself, not the data",
}

# What helps where no DataLoader setting does (the reason's second half).
INSTEAD = ("lighter or precomputed transforms, caching decoded samples, freeing cores, moving "
           "augmentation to the GPU, or `starvewatch tune` to measure settings on this host")


def band_words(band: str | None) -> str:
    return BAND_WORDS.get(band or "insufficient_data", str(band))


def limiting_phrase(factor: str | None) -> str | None:
    return LIMITING_PHRASES.get(factor, factor.replace("_", " ")) if factor else None


def plural(n: float, word: str, many: str | None = None) -> str:
    """"1 worker", "2 workers", "1.6 cores"."""
    text = f"{n:g}" if isinstance(n, float) else f"{n:,}"
    return f"{text} {word if n == 1 else (many or word + 's')}"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def needs_more(steps: int, wall_s: float) -> str | None:
    """How much more loop a verdict needs, or None when there is enough."""
    parts = []
    if steps < MIN_STEPS_FOR_VERDICT:
        parts.append(plural(MIN_STEPS_FOR_VERDICT - steps, "more step"))
    if wall_s < MIN_SECONDS_FOR_VERDICT:
        parts.append(f"{seconds(MIN_SECONDS_FOR_VERDICT - wall_s)} more of loop")
    if not parts:
        return None
    return (f"{plural(steps, 'step')} in {seconds(wall_s)} so far; a verdict needs at least "
            f"{MIN_STEPS_FOR_VERDICT} steps and {seconds(MIN_SECONDS_FOR_VERDICT)} of loop: "
            + " and ".join(parts))


def seconds(s: float) -> str:
    return f"{s * 1000:.2g} ms" if s < 1 else f"{s:.3g} s"


def training_loader(summary: dict) -> dict | None:
    name = (summary.get("verdict") or {}).get("training_loader")
    return next((p for p in summary.get("loaders") or [] if p["name"] == name), None)


def headline(summary: dict) -> str:
    """One sentence: the run's band in words and its fraction, the ceiling where it matters."""
    verdict = summary["verdict"]
    band = verdict.get("input_bound")
    words = band_words(band)
    if band == "insufficient_data":
        more = (summary.get("answer") or {}).get("needs_more")
        return f"{words[0].upper()}{words[1:]}" + (f": {more}" if more else "")
    text = f"{words[0].upper()}{words[1:]}: the loop waited for data {pct(verdict.get('input_wait_fraction'))} of its wall time"
    stake = verdict.get("speedup_at_stake")
    if stake and band in ("moderate", "high"):
        who = "GPU" if verdict.get("gpu_idle_fraction") is not None or (summary.get("system") or {}).get("gpu_samples") \
            else "loop"
        text += f"; up to {stake:.2f}x faster if the {who} never waited for data"
    return text


def other_loader_lines(summary: dict) -> list[str]:
    """The loaders beside the training one, each with its own verdict: "val: input-bound, 38.0%
    of its own steps"."""
    train = (summary.get("verdict") or {}).get("training_loader")
    out = []
    for p in summary.get("loaders") or []:
        if p["name"] == train:
            continue
        if p.get("verdict") == "insufficient_data" or p.get("input_wait_fraction") is None:
            out.append(f"{p['name']}: {band_words('insufficient_data')} ({plural(p['steps'], 'step')})")
        else:
            out.append(f"{p['name']}: {band_words(p['verdict'])}, {pct(p['input_wait_fraction'])} of its own steps")
    return out


def silence_reason(summary: dict, facts: dict) -> str | None:
    """Why nothing is recommended where the run waits (moderate or high), in measured numbers,
    and what would help instead; None where something is recommended or the band is not so."""
    verdict = summary["verdict"]
    if verdict.get("input_bound") not in ("moderate", "high"):
        return None
    if any(r.get("kind") == "speedup" for r in summary.get("recommendations") or []):
        return None
    name = verdict.get("training_loader")
    starved = [p for p in summary["loaders"] if p.get("verdict") in ("moderate", "high")]
    f = facts.get(name) if name in facts and any(p["name"] == name for p in starved) else \
        next((facts[p["name"]] for p in starved if p["name"] in facts), None)
    system = summary.get("system") or {}
    why = []
    if f is not None:
        cores = f.cores
        busy = system.get("cpu_pct_mean")
        proc = system.get("process_cpu_pct_mean")
        if f.host_cpu_saturated or (f.others_cores and f.others_cores >= 0.5 * cores):
            text = f"the host's CPU was {busy:.0f}% busy" if busy is not None else "the host's CPU was busy"
            if f.others_cores:
                held = (system.get("cpu_count") or cores) > cores  # affinity: fewer CPUs than the host's
                text += f", other processes used {f.others_cores:.1f} of " + (
                    f"the {plural(cores, 'core')} this process may use" if held else f"its {plural(cores, 'core')}")
            if proc is not None:
                text += f", this process {proc:.0f}%"
            why.append(text + ": more workers would compete for the same cores with the training step")
        elif f.loading_saturates_cores:
            why.append(f"the {plural(f.active_workers or 0, 'worker')} already keep all {plural(cores, 'core')} busy loading")
        elif f.storage_bound:
            why.append(f"reads are blocked on storage ({system.get('iowait_pct_mean', 0):.0f}% I/O wait): "
                       f"more readers would queue behind the device")
        idle = [x for x in summary.get("findings") or [] if x.get("kind") == "idle_workers" and x.get("loader") == f.name]
        if idle:
            why.append("workers are idle for lack of shards (see the finding), so more workers would find none")
        if not why:
            why.append(f"loading takes {f.load:.1f} ms a batch against {f.body:.1f} ms of the rest of the step "
                       f"with {plural(f.workers or 0, 'worker')} on {plural(cores, 'core')}; no DataLoader setting is "
                       f"predicted to gain 2% or more")
    else:
        why.append("no DataLoader setting is predicted to gain 2% or more")
    return f"Nothing to change in the DataLoader settings: {'; '.join(why)}. What would help instead: {INSTEAD}."


def build(summary: dict, facts: dict | None = None) -> dict:
    """summary["answer"]: the sentences every surface shows."""
    verdict = summary["verdict"]
    train = training_loader(summary)
    answer = {"band_words": band_words(verdict.get("input_bound")),
              "limiting_factor": limiting_phrase(verdict.get("limiting_factor")),
              "needs_more": None}
    if verdict.get("input_bound") == "insufficient_data":
        answer["needs_more"] = needs_more(train["steps"] if train else 0, verdict.get("wall_s") or 0.0)
    summary["answer"] = answer
    answer["headline"] = headline(summary)
    answer["other_loaders"] = other_loader_lines(summary)
    summary["no_recommendation_reason"] = silence_reason(summary, facts or {})
    answer["no_recommendation_reason"] = summary["no_recommendation_reason"]
    regression = summary.get("regression")
    answer["regression"] = regression["sentence"] if regression else None
    return answer
