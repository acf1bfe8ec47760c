"""Checks on DataLoader workers the samplers run once per tick (cheap: no syscalls except
/proc reads of dead workers): how a worker died. Kept apart from samplers.py so that module
stays about sampling; whether IterableDataset workers read the same shard is starvewatch.shards."""
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
