"""What the answer at the top of a run says, as text: the verdict in one sentence, a change as
"setting: now → suggested", which recommendations are speed-ups. Shared by the dashboard's
answer card and the HTML report's verdict box, so both say the same."""
from __future__ import annotations


from .sentences import LIMITING_PHRASES as FACTORS  # noqa: F401  (one set of phrases)


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
    """The run's headline as analysis/sentences.py words it for every surface, with the limit."""
    from .sentences import headline, limiting_phrase
    text = (summary.get("answer") or {}).get("headline") or headline(summary)
    factor = summary["verdict"].get("limiting_factor")
    if factor and summary["verdict"]["input_bound"] != "insufficient_data":
        text += f" (the limit: {limiting_phrase(factor)})"
    return text + "."
