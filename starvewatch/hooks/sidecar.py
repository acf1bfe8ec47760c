"""The sidecar process: samples the host, the DataLoader worker processes and the GPUs (psutil and
NVML work across processes) for one training process, and hands the readings back on a pipe.

Why a process: every /proc read or NVML call releases the GIL, and each time a monitor thread
takes it back the training thread waits (see benchmarks/overhead.py). Sampling from here, the
training process's sampler thread does one pipe read per tick instead of a dozen syscalls.

Protocol, one JSON object per line both ways:
  training -> sidecar (stdin):  {"pids": [worker pids]}, {"final": true}; EOF: exit.
  sidecar -> training (stdout): {"kind": "host" | "gpu", ...} samples, {"kind": "processes",
  "states": {pid: state}}, and {"kind": "ready"} once set up, {"kind": "final"} at the end.
Run as `python -m starvewatch.hooks.agent '<json settings>'`; never imported by the hot path.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time


class Sidecar:
    def __init__(self, settings: dict, out) -> None:
        from .samplers import HostSampler, _psutil
        self.out = out
        self.parent_pid = int(settings["pid"])
        self.host_every = float(settings.get("host_interval_s", 0.5))
        self.gpu_every = float(settings.get("gpu_interval_s", 1.0))
        psutil = _psutil()
        self.host = HostSampler(psutil, pid=self.parent_pid) if psutil is not None else None
        self.pids: list[int] = []
        self.halt = threading.Event()
        self.final = threading.Event()
        self._write_lock = threading.Lock()

    def send(self, obj: dict) -> bool:
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        try:
            with self._write_lock:
                self.out.write(line)
                self.out.flush()
            return True
        except (OSError, ValueError):  # the training process is gone
            self.halt.set()
            return False

    def read_commands(self, stream) -> None:
        for line in stream:
            try:
                command = json.loads(line)
            except ValueError:
                continue
            if "pids" in command:
                self.pids = [int(p) for p in command["pids"]]
            if command.get("final"):
                self.final.set()
                break
        self.halt.set()  # EOF: the training process closed the pipe or died

    def tick_host(self) -> None:
        if self.host is None:
            return
        self.send(self.host.sample())
        states = {str(pid): self.host.process_state(pid) for pid in self.pids}
        self.send({"kind": "processes", "t_ns": time.time_ns(), "states": states})

    def tick_gpu(self) -> bool:
        from . import nvml
        if not nvml.init():
            return False
        devices = nvml.sample(self.parent_pid)
        if devices:
            self.send({"kind": "gpu", "t_ns": time.time_ns(), "devices": devices})
        return True

    def run(self) -> None:
        self.send({"kind": "ready", "pid": os.getpid()})
        next_host = next_gpu = time.monotonic()
        gpu_enabled = True
        while not self.halt.is_set():
            if os.getppid() != self.parent_pid:  # the training process died (we were re-parented)
                break
            now = time.monotonic()
            if now >= next_host:
                self.tick_host()
                next_host += self.host_every * max(1, int((now - next_host) // self.host_every) + 1)
            if gpu_enabled and now >= next_gpu:
                gpu_enabled = self.tick_gpu()
                next_gpu += self.gpu_every * max(1, int((now - next_gpu) // self.gpu_every) + 1)
            self.halt.wait(max(0.0, min(next_host, next_gpu if gpu_enabled else next_host) - time.monotonic()))
        if self.final.is_set():  # one last reading: short runs get data too
            self.tick_host()
            if gpu_enabled:
                self.tick_gpu()
            self.send({"kind": "final"})


def main(argv: list[str]) -> int:
    settings = json.loads(argv[1]) if len(argv) > 1 else {"pid": os.getppid()}
    sidecar = Sidecar(settings, sys.stdout)
    reader = threading.Thread(target=sidecar.read_commands, args=(sys.stdin,), daemon=True)
    reader.start()
    try:
        sidecar.run()
    except KeyboardInterrupt:  # the job's Ctrl-C reaches the whole process group
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
