"""Where the CLI, export and compare read runs from: a running collector (HTTP) or, offline,
a spool directory or database read into a temporary store. Same methods either way."""
from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from ...ids import url_segment


class SourceError(Exception):
    """A problem the user can fix: the message says how. Printed without a traceback."""


class LocalSource:
    def __init__(self, store, description: str) -> None:
        from .query import Query
        self.store = store
        self.query = Query(store)
        self.description = description

    @classmethod
    def offline(cls, directory: Path | None = None, spool: Path | None = None, db: Path | None = None):
        """A private copy: the database (if any) plus every spooled batch, nothing modified."""
        from .spool_import import SpoolImporter
        from .store import Store
        tmp = Path(tempfile.mkdtemp(prefix="starvewatch-offline-"))
        db = Path(db) if db else (Path(directory) / "starvewatch.db" if directory else None)
        store = Store(tmp / "offline.db")
        if db is not None and db.exists():
            source = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            with source:
                source.backup(store._writer)
            source.close()
            store._stats_cache.clear()
            store.migrate_schema(vacuum=False)  # a copy of an older database: every migration
        spool = Path(spool) if spool else (Path(directory) / "spool" if directory else None)
        if spool is not None and spool.is_dir():
            SpoolImporter(store, spool, delete=False, set_aside=False).scan()
        return cls(store, f"offline data in {spool or db}")

    def list_runs(self, status=None, search=None) -> list[dict]:
        return self.query.list_runs(status=status, search=search)

    def summary(self, run_id: str) -> dict:
        return self._call(self.query.summary, run_id)

    def detail(self, run_id: str) -> dict:
        return self._call(self.query.detail, run_id)

    def csv_chunks(self, run_id: str):
        """The CSV export as UTF-8 chunks: the collector's API route streams the same function
        (every step, rolled-up spans as their marked buckets: folded_reads.export_rows)."""
        from ..outputs.export import csv_chunks
        from .folded_reads import export_rows
        self._call(self.query.detail, run_id)
        return csv_chunks(run_id, export_rows(self.store, run_id, 20_000))

    def trace(self, run_id: str, steps: str | None = None, window: str | None = None,
              rank: int | None = None) -> dict:
        """The run as a Chrome trace (monitor/outputs/trace_export.py)."""
        from ..outputs.trace_export import build_trace
        self._call(self.query.detail, run_id)
        return build_trace(self.store, run_id, steps=steps, window=window, rank=rank)

    def series(self, run_id: str, loader: str | None = None, points: int = 500) -> dict:
        return self._call(self.query.rollup_series, run_id, loader=loader, points=points)

    def step_series(self, run_id: str, loader: str, rank: int = 0, points: int = 1000) -> dict:
        return self._call(self.query.step_series, run_id, loader=loader, rank=rank, points=points)

    def samples(self, run_id: str) -> list[dict]:
        return self._call(self.query.events, run_id, "samples", limit=50_000)

    def distributions(self, run_id: str, loader: str) -> dict:
        return self._call(self.query.distributions, run_id, loader)

    def delete(self, run_id: str) -> None:
        if not self.store.delete_run(run_id):
            raise SourceError(f"unknown run {run_id!r}")

    def _call(self, fn, *args, **kwargs):
        from .query import NotFound
        try:
            return fn(*args, **kwargs)
        except NotFound as exc:
            raise SourceError(f"{exc}; `starvewatch runs` lists the runs") from None

    def close(self) -> None:
        self.store.close()


class NotYourCollector(SourceError):
    """A loopback collector that cannot prove it holds the user's collector key: said, never
    taken for "not running" (reading offline data instead would hide the squatter)."""


class CertificateRefused(SourceError):
    """The collector's TLS certificate did not verify."""


def _certificate_refused(exc: BaseException) -> bool:
    import ssl
    seen = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class RemoteSource:
    def __init__(self, url: str, token: str | None = None) -> None:
        import httpx
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url
        self.description = f"the collector at {url}"
        from ...tls import client_context
        self.client = httpx.Client(base_url=url, headers=headers, timeout=60, verify=client_context())
        self._proved = False  # _prove(), before the first request

    def _unreachable(self, exc) -> SourceError:
        if _certificate_refused(exc):
            return CertificateRefused(
                f"the collector at {self.url} has a certificate this machine does not trust ({exc}); "
                f"for a self-signed one, set STARVEWATCH_CA_FILE to its PEM file")
        return SourceError(f"cannot reach the collector at {self.url}: {exc}")

    def _prove(self) -> None:
        """A loopback collector proves it holds the user's collector key before the CLI sends
        it a token (local_secrets.py; asked on a connection without one); then the per-user
        token goes along when no STARVEWATCH_TOKEN was given."""
        import urllib.parse

        import httpx

        from ...local_secrets import (UnsafeSecret, collector_key, local_token, new_challenge, private_dir,
                                      proof_ok)
        self._proved = True
        parts = urllib.parse.urlsplit(self.url)
        if (parts.hostname or "") not in ("localhost", "::1") and not (parts.hostname or "").startswith("127."):
            return
        try:
            key = collector_key(private_dir())
        except (UnsafeSecret, OSError) as exc:
            raise SourceError(str(exc)) from None
        if key is None:
            return  # no collector of this user ran here yet: nothing to prove, no token to send
        challenge = new_challenge()
        try:
            from ...tls import client_context
            answer = httpx.get(f"{self.url}/healthz", params={"challenge": challenge}, timeout=30,
                               verify=client_context())
            proof = answer.json().get("proof") if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return  # unreachable: the request itself says so
        if not proof_ok(key, challenge, proof):
            self.client.headers.pop("Authorization", None)
            raise NotYourCollector(f"{self.url} answers but cannot prove it is your collector (another user's, or "
                              f"another program on the port); nothing was sent to it")
        if "Authorization" not in self.client.headers:
            token = local_token(private_dir())
            if token:
                self.client.headers["Authorization"] = f"Bearer {token}"

    def _get(self, path: str, **params):
        import httpx
        if not self._proved:
            self._prove()
        try:
            response = self.client.get(path, params={k: v for k, v in params.items() if v is not None})
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        self._check(response)
        return response.json()

    def _check(self, response) -> None:
        """A SourceError the user can act on for an error answer."""
        if response.status_code == 404:
            raise SourceError(f"{response.json().get('detail', 'not found')}; `starvewatch runs` lists the runs")
        if response.status_code == 401:
            raise SourceError(f"the collector at {self.url} wants a token: set STARVEWATCH_TOKEN")
        if response.status_code >= 400:
            raise SourceError(f"the collector answered {response.status_code}: {response.text[:300]}")

    def healthy(self) -> bool:
        """Whether the collector answers; a certificate refused is said, never taken for
        "not running" (reading offline data instead would hide someone in the middle)."""
        try:
            return self._get("/healthz").get("service") == "starvewatch"
        except (CertificateRefused, NotYourCollector):
            raise
        except (SourceError, ValueError):
            return False

    def list_runs(self, status=None, search=None) -> list[dict]:
        return self._get("/api/v1/runs", status=status, q=search)["runs"]

    def summary(self, run_id: str) -> dict:
        from ...analysis.summary import upgrade  # an older collector's summary/1, read as /2
        return upgrade(self._get(f"/api/v1/runs/{url_segment(run_id)}/summary"))

    def detail(self, run_id: str) -> dict:
        return self._get(f"/api/v1/runs/{url_segment(run_id)}")

    def csv_chunks(self, run_id: str):
        """The collector's CSV export as it streams it (rolled-up spans as marked buckets), so
        the CLI writes what the API serves: the raw-steps pages would miss the folded spans."""
        import httpx
        try:
            if not self._proved:
                self._prove()
            with self.client.stream("GET", f"/api/v1/runs/{url_segment(run_id)}/export",
                                    params={"format": "csv"}) as response:
                if response.status_code >= 400:
                    response.read()
                    self._check(response)
                yield from response.iter_bytes()
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def trace(self, run_id: str, steps: str | None = None, window: str | None = None,
              rank: int | None = None) -> dict:
        return self._get(f"/api/v1/runs/{url_segment(run_id)}/export", format="trace", steps=steps,
                         window=window, rank=rank)

    def series(self, run_id: str, loader: str | None = None, points: int = 500) -> dict:
        return self._get(f"/api/v1/runs/{url_segment(run_id)}/series", loader=loader, points=points)

    def step_series(self, run_id: str, loader: str, rank: int = 0, points: int = 1000) -> dict:
        return self._get(f"/api/v1/runs/{url_segment(run_id)}/steps/series", loader=loader, rank=rank, points=points)

    def samples(self, run_id: str) -> list[dict]:
        return self._get(f"/api/v1/runs/{url_segment(run_id)}/events/samples", limit=50_000)["events"]

    def distributions(self, run_id: str, loader: str) -> dict:
        return self._get(f"/api/v1/runs/{url_segment(run_id)}/distributions", loader=loader)

    def delete(self, run_id: str) -> None:
        import httpx
        try:
            if not self._proved:
                self._prove()
            response = self.client.delete(f"/api/v1/runs/{url_segment(run_id)}")
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code == 404:
            raise SourceError(f"unknown run {run_id!r}")
        response.raise_for_status()

    def close(self) -> None:
        self.client.close()


def open_source(url: str | None = None, spool: str | None = None, db: str | None = None,
                directory: Path | None = None, token: str | None = None, offline_fallback: bool = True):
    """The collector when it answers; else (or with --spool/--db) the offline data."""
    if spool or db:
        if spool and not Path(spool).is_dir():
            raise SourceError(f"{spool} is not a directory")
        return LocalSource.offline(spool=Path(spool) if spool else None, db=Path(db) if db else None)
    remote = RemoteSource(url, token)
    if remote.healthy():
        return remote
    remote.close()
    if offline_fallback and directory is not None and ((Path(directory) / "spool").exists() or
            (Path(directory) / "starvewatch.db").exists()):
        return LocalSource.offline(directory=Path(directory))
    raise SourceError(f"no starvewatch collector answers at {url}, and there is no offline data in "
                      f"{directory}; start one with `starvewatch serve` or pass --spool DIR")


def resolve_run(source, run: str) -> str:
    """'latest', an exact id, a unique id prefix, or a run name (its latest run)."""
    runs = source.list_runs()
    if not runs:
        raise SourceError(f"no runs in {source.description}")
    if run == "latest":
        return runs[0]["id"]
    ids = [r["id"] for r in runs]
    if run in ids:
        return run
    prefixed = [i for i in ids if i.startswith(run)]
    if len(prefixed) == 1:
        return prefixed[0]
    named = [r["id"] for r in runs if r["name"] == run]
    if named:
        return named[0]
    if len(prefixed) > 1:
        raise SourceError(f"{run!r} matches {len(prefixed)} runs: {', '.join(prefixed[:5])}")
    raise SourceError(f"unknown run {run!r}; `starvewatch runs` lists the runs")
