"""Checks on DataLoader workers the samplers run once per tick (cheap: no syscalls except
/proc reads of dead workers): how a worker died, whether IterableDataset workers read the
same shard. Kept apart from samplers.py so that module stays about sampling."""
from __future__ import annotations


def exit_signal(pid: int) -> dict:
    """A dead worker not reaped yet: the signal that ended it ({"exit_signal": "SIGBUS"}), from
    the exit code in /proc/<pid>/stat (Linux >= 3.5); {} when it exited normally or unknown."""
    import signal
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        code = int(fields[-1])  # field 52, exit_code: the wait status
    except (OSError, ValueError, IndexError):
        return {}
    signum = code & 0x7F
    try:
        return {"exit_signal": signal.Signals(signum).name} if signum else {}
    except ValueError:
        return {"exit_signal": str(signum)}


def reaped_signal(inner, worker_id: int, pid: int) -> dict:
    """A worker torch already reaped: the signal in its exit code, as torch's Process object
    holds it (read without a syscall); {} when unknown or a normal exit."""
    import signal
    try:
        popen = inner._workers[worker_id]._popen
        code = popen.returncode if popen.pid == pid else None
    except Exception:
        return {}
    if code is None or code >= 0:
        return {}
    try:
        return {"exit_signal": signal.Signals(-code).name}
    except ValueError:
        return {"exit_signal": str(-code)}


def shard_check(hashes: list[list[int]]) -> dict | None:
    """Workers of an IterableDataset that yield the same batches at the same positions read
    the same shard. Positions hashed by at least two workers are compared; a repeat at a
    position by chance (values drawn from a few prototypes) is rare, a missing shard makes
    every position repeat. None before 4 positions are comparable."""
    compared = repeated = 0
    reads: list[int] = []
    for position in range(len(hashes[0])):
        values = [h[position] for h in hashes if h[position]]
        if len(values) < 2:
            continue
        compared += 1
        most = max(values.count(v) for v in set(values))
        if most > 1:
            repeated += 1
            reads.append(most)
    if compared < 4:
        return None
    return {"compared_batches": compared, "repeated_batches": repeated,
            "reads_per_batch": max(reads) if reads else 1, "workers": len(hashes)}
