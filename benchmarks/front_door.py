"""What a stranger can cost a token-protected collector (issue 27): memory under unfinished giant
headers, memory under an expanding body, and wrong-token guesses per second.

    python benchmarks/front_door.py [--before /path/to/older/checkout]

Starts a real `starvewatch serve` with a token (uvicorn subprocess) from this checkout, and from
`--before` when given (a checkout of the code before the change, for comparison), and measures:
- `headers`: 8 connections each sending up to 32 MiB of one header line that never ends; the
  collector's peak resident memory (/proc VmHWM) before and after;
- `expanding`: a 33 KB gzip body holding 11 million `{}` in a free-form sample field (with the
  token: this is what a client that has the token can send); status and memory growth;
- `guesses`: wrong tokens from 16 parallel connections for 5 s; answers per second.
Writes benchmarks/results/front_door.json.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.procfs import peak_rss_bytes  # noqa: E402
from benchmarks.results_io import RESULTS, started  # noqa: E402

TOKEN = "front-door-benchmark-token-0123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def request(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            token: str | None = TOKEN) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method,
                                 headers=dict(headers or {}))
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        err.close()
        return err.code


def start(root: Path, directory: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    # `python -m` puts the working directory first on sys.path: run from `root`, so its code runs.
    env = {**os.environ, "PYTHONPATH": str(root), "STARVEWATCH_TOKEN": TOKEN, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "starvewatch", "serve", "--port", str(port), "--dir", str(directory)],
                            env=env, cwd=str(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if request(port, "GET", "/healthz") == 200:
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the collector did not start")


def giant_headers(port: int, pid: int) -> dict:
    before = peak_rss_bytes(pid)
    sent = [0] * 8

    def attack(i: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(b"GET /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fill: ")
            piece = b"a" * 65536
            try:
                while sent[i] < 32 * 2**20:
                    sock.sendall(piece)
                    sent[i] += len(piece)
            except OSError:
                pass

    threads = [threading.Thread(target=attack, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return {"grown_mib": round((peak_rss_bytes(pid) - before) / 2**20, 1),
            "sent_mib_per_connection_max": round(max(sent) / 2**20, 2)}


def expanding_body(port: int, pid: int) -> dict:
    head = {"schema": "starvewatch.events/1", "run_id": "bomb", "stream": "bomb-s", "seq": 1,
            "samples": [{"kind": "host", "t_ns": 1, "junk": []}]}
    prefix, _, suffix = json.dumps(head).partition('"junk": []')
    body = gzip.compress((prefix + '"junk": [').encode() + b"{}," * 10_999_999 + b"{}]" + suffix.encode(), 9)
    before = peak_rss_bytes(pid)
    started_s = time.monotonic()
    status = request(port, "POST", "/api/v1/ingest", body,
                     {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    return {"gzip_kb": round(len(body) / 1000, 1), "status": status,
            "seconds": round(time.monotonic() - started_s, 2),
            "grown_mib": round((peak_rss_bytes(pid) - before) / 2**20, 1)}


def guesses(port: int, seconds: float = 5.0) -> dict:
    count = [0]
    stop = time.monotonic() + seconds

    def guess() -> None:
        while time.monotonic() < stop:
            request(port, "GET", "/api/v1/runs", token="wrong-guess")
            count[0] += 1

    threads = [threading.Thread(target=guess) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return {"answers_per_s": round(count[0] / seconds, 1)}


def measure(root: Path) -> dict:
    out = {}
    for name in ("headers", "expanding", "guesses"):  # a fresh collector each: no carry-over
        with tempfile.TemporaryDirectory() as tmp:
            proc, port = start(root, Path(tmp))
            try:
                out[name] = (giant_headers(port, proc.pid) if name == "headers" else
                             expanding_body(port, proc.pid) if name == "expanding" else guesses(port))
            finally:
                proc.kill()
                proc.wait(30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before the change")
    args = parser.parse_args()
    result = started(args, quick=False)
    result["after"] = measure(Path(__file__).resolve().parent.parent)
    if args.before:
        result["before"] = measure(args.before)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "front_door.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
