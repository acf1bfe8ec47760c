"""A stall as one line of text: who holds the stalled batch and where it is (the loading
thread's innermost frame from a faulthandler dump).

Its own module because the console report, the CLI, the exports and the dashboard all print
stalls the same way, and none of them needs the findings' analysis.
"""
from __future__ import annotations


def stack_frames(stack: str | None) -> list[str]:
    """The frames of the thread that loads data, innermost first, from a faulthandler dump:
    the thread whose frames include a DataLoader fetch (or `__getitem__`/`__iter__`), else
    the first thread written."""
    if not stack or not isinstance(stack, str):  # an old row may hold any JSON: no frames in it
        return []
    threads = [block.strip().splitlines() for block in stack.split("\n\n") if block.strip()]
    threads = [[line.strip() for line in t[1:] if line.strip().startswith("File ")] for t in threads]
    threads = [t for t in threads if t]
    for marker in ("in fetch", "in __getitem__", "in __iter__", "in __next__"):
        for frames in threads:
            if any(line.endswith(marker) for line in frames):
                return frames
    return threads[0] if threads else []


def stall_where(stall: dict) -> str:
    """One line: who holds the stalled batch and where it is (console, CLI, exports)."""
    parts = []
    if stall.get("worker") is not None and stall.get("worker_pid"):
        parts.append(f"worker {stall['worker']} (pid {stall['worker_pid']}, {stall.get('worker_state')})")
    elif stall.get("worker") is not None:  # its process has not started (spawn is slow)
        parts.append(f"worker {stall['worker']} (not started yet)")
    elif stall.get("worker_state"):
        parts.append(stall["worker_state"])
    if stall.get("phase") == "iter":
        parts.append("inside iter() (start-up)")
    if stall.get("indices"):
        shown = stall["indices"][:8]
        parts.append("loading indices " + ", ".join(map(str, shown)) + (" ..." if len(stall["indices"]) > 8 else ""))
    frames = stack_frames(stall.get("stack"))
    if frames:
        parts.append("at " + frames[0])
    return "; ".join(parts)
