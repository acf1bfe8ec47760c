"""Finding (or starting) the collector. Runs on the shipper thread, never on `watch()`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from ...local_secrets import UnsafeSecret, collector_key, local_token, new_challenge, private_dir, proof_ok
from .transport import HttpTransport, TransportError

START_TIMEOUT_S = 20.0
IDLE_EXIT_S = 3600


def probe(transport: HttpTransport, key: str | None = None) -> str:
    """'starvewatch' when our collector answers, 'other' for another server, 'unavailable' for
    a server error (a collector behind a proxy may be down: delivery keeps trying), 'none' if
    nothing answers.

    With `key` (a loopback collector: local_secrets.py), the collector must prove it holds the
    user's collector key before it is ours: asked without the token, with a fresh challenge, so a
    program squatting the port gets neither the token nor a record."""
    challenge = new_challenge() if key is not None else None
    asking = transport.without_token() if key is not None else transport
    try:
        status, body = asking.request("GET", "/healthz" + (f"?challenge={challenge}" if challenge else ""))
    except TransportError:
        return "none"
    finally:
        if asking is not transport:
            asking.close()
    if status >= 500 or status in (408, 429):
        return "unavailable"
    if key is None and status == 401 and b"starvewatch" in body:
        return "starvewatch"  # ours, and the token is wrong: delivery will say so
    try:
        answer = json.loads(body)
        if status != 200 or not isinstance(answer, dict) or answer.get("service") != "starvewatch":
            return "other"
    except ValueError:
        return "other"
    if key is not None and not proof_ok(key, challenge, answer.get("proof")):
        return "not-ours"
    return "starvewatch"


def _key_for(url: str, directory: Path) -> str | None:
    """The user's collector key for a loopback URL (made when missing), else None."""
    if _loopback_host(url) is None:
        return None  # a team collector: TLS and its token say who it is
    return collector_key(private_dir(), make=True)


def _loopback_host(url: str) -> str | None:
    host = urllib.parse.urlsplit(url).hostname or ""
    return host if host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.") else None


def start_collector(directory: Path, host: str, port: int) -> None:
    """A detached `starvewatch serve` that outlives this training process. Started through a
    shell that exits at once, so the collector is nobody's child (no zombie, no wait)."""
    import shlex

    from ...private_files import make_private_dirs, open_private
    make_private_dirs(directory)
    env = dict(os.environ, STARVEWATCH_DIR=str(directory))
    cmd = [sys.executable, "-m", "starvewatch", "serve", "--host", host, "--port", str(port),
           "--dir", str(directory), "--idle-exit", str(IDLE_EXIT_S), "--autostarted"]
    # The log opened here, owner-only and never through a symlink (a shell's `>>` follows one:
    # another user could have pointed collector.log at a file of yours to truncate).
    log_fd = open_private(directory / "collector.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        script = f"{' '.join(map(shlex.quote, cmd))} </dev/null &"
        subprocess.run(["/bin/sh", "-c", script], env=env, start_new_session=True, check=True,
                       stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd)
    finally:
        os.close(log_fd)


def _wait_until_up(transport: HttpTransport, timeout_s: float, key: str | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe(transport, key) == "starvewatch":
            return True
        time.sleep(0.2)
    return False


def find_collector(url: str, directory: Path, transport: HttpTransport, *, autostart: bool,
                   local_rank: int) -> str:
    """Probe the collector, start it when it may be started here; 'starvewatch', 'other',
    'not-ours' (a loopback server that cannot prove it is the user's) or 'none'. Runs in the
    sidecar (or on the shipper thread without one), never on `watch()`."""
    try:
        key = _key_for(url, directory)
    except (UnsafeSecret, OSError) as exc:
        print(f"starvewatch: {exc}; keeping data in the spool", file=sys.stderr, flush=True)
        return "not-ours"
    if key is not None:
        transport.require_proof(key)  # every connection of it, from now on
    found = probe(transport, key)
    if found == "none" and autostart and local_rank == 0:
        host = _loopback_host(url)
        if host is not None:
            try:
                found = _autostart(directory, host, urllib.parse.urlsplit(url).port or 80, transport, key)
            except OSError as exc:  # a symlink planted as collector.lock or .log: never followed
                print(f"starvewatch: cannot start a collector in {directory}: {exc}", file=sys.stderr, flush=True)
                found = "none"
    elif found == "none" and local_rank != 0:
        found = "starvewatch" if _wait_until_up(transport, START_TIMEOUT_S, key) else "none"
    if found == "starvewatch" and key is not None and not transport.has_token:
        # Proved ours: the per-user token too, for a collector that cannot tell users apart by uid.
        token = local_token(private_dir(), make=True)
        if token:
            transport.use_token(token)
    return found


def connect(session) -> None:
    """In-process delivery (no sidecar): find the collector, then say where the dashboard is."""
    settings = session.settings
    found = find_collector(settings.url, settings.dir, session.transport, autostart=settings.autostart,
                           local_rank=session.local_rank)
    if found == "starvewatch":
        session.shipper.pipeline.reset_backoff()
    elif found == "other":
        session.shipper.pipeline.spool_only()
    announce(session, found)


def announce(session, found: str) -> None:
    settings = session.settings
    if found == "starvewatch":
        session.dashboard_url = f"{settings.url}/runs/{session.run_id}"
        if not settings.quiet and session.rank == 0:
            from ...console import info_stream
            print(f"starvewatch: live dashboard at {session.dashboard_url}", file=info_stream(), flush=True)
    elif found == "other" and not settings.quiet:
        print(f"starvewatch: {settings.url} answers, but is not a starvewatch collector (check "
              f"STARVEWATCH_URL); keeping this run's data in {settings.dir / 'spool'}, for "
              f"`starvewatch import` or a collector started with this directory", file=sys.stderr, flush=True)
    elif found == "not-ours" and not settings.quiet:
        print(f"starvewatch: {settings.url} answers but cannot prove it is your collector (another user's, "
              f"or another program on the port): nothing was sent to it; keeping data in "
              f"{settings.dir / 'spool'} (STARVEWATCH_URL=http://127.0.0.1:OTHER_PORT starts your own)",
              file=sys.stderr, flush=True)


def _autostart(directory: Path, host: str, port: int, transport: HttpTransport, key: str | None = None) -> str:
    import fcntl

    from ...private_files import make_private_dirs, open_private
    make_private_dirs(directory)
    # Never through a symlink someone planted, and owner-only (issue 36 item 5).
    fd = open_private(directory / "collector.lock", os.O_RDWR | os.O_CREAT)
    with os.fdopen(fd, "r+") as lock:
        # One starter per machine: the others wait here, then find it running.
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = probe(transport, key)
        if found != "none":
            return found
        start_collector(directory, host, port)
        return "starvewatch" if _wait_until_up(transport, START_TIMEOUT_S, key) else "none"


def previous_run(url: str, token: str | None, run: dict, timeout_s: float = 2.0) -> str | None:
    """The latest run of the same name that the collector holds and that started before `run`
    (a summary's `run`), for the end-of-run report's compare link; None when there is none or
    the collector does not answer in time. Called once, at finish(), after delivery."""
    transport = HttpTransport(url, token, timeout_s=timeout_s)
    try:
        status, body = transport.request("GET", "/api/v1/runs?" + urllib.parse.urlencode({"search": run["name"]}))
        runs = json.loads(body)["runs"] if status == 200 else []
    except (TransportError, ValueError, KeyError, TypeError):
        return None
    finally:
        transport.close()
    started = run.get("started_at") or "~"  # ISO strings of the same format compare in time order
    # Lost, interrupted and too-short runs are no baseline (as the collector's previous_run_id).
    earlier = [r for r in runs if isinstance(r, dict) and r.get("name") == run["name"] and r.get("id") != run["id"]
               and (r.get("started_at") or "") < started and r.get("status") not in ("lost", "interrupted")
               and r.get("verdict") not in (None, "insufficient_data")]
    return max(earlier, key=lambda r: r.get("started_at") or "")["id"] if earlier else None


def run_regression(url: str, token: str | None, run_id: str, timeout_s: float = 2.0) -> dict | None:
    """The collector's judgement of this run against the previous one of its name (its
    summary's `regression`: analysis/regression.py), for the end-of-run report; None when
    there is none or the collector does not answer in time."""
    transport = HttpTransport(url, token, timeout_s=timeout_s)
    try:
        status, body = transport.request("GET", f"/api/v1/runs/{urllib.parse.quote(run_id, safe='')}/summary")
        found = json.loads(body).get("regression") if status == 200 else None
    except (TransportError, ValueError, AttributeError):
        return None
    finally:
        transport.close()
    return found if isinstance(found, dict) and isinstance(found.get("sentence"), str) else None
