"""The tuner's conversation with the collector (httpx): find the run, read its consumption
rate, store the tuning results with it."""
from __future__ import annotations

import os


class CollectorError(RuntimeError):
    """The collector cannot be reached or has no such run; the message says what to do."""


def collector_url() -> str:
    from ..hooks.settings import DEFAULT_URL, OFF_VALUES
    from ..envvars import collector_url as written
    url = os.environ.get("STARVEWATCH_URL") or DEFAULT_URL
    return DEFAULT_URL if url.strip().lower() in OFF_VALUES else (written(url) or DEFAULT_URL)


class Collector:
    def __init__(self, url: str | None = None, token: str | None = None, timeout_s: float = 10.0) -> None:
        import httpx
        self.url = (url or collector_url()).rstrip("/")
        token = token or os.environ.get("STARVEWATCH_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        from ..tls import client_context
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s,
                                   verify=client_context())

    def close(self) -> None:
        self.client.close()

    def _request(self, method: str, path: str, **kwargs):
        import httpx
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CollectorError(f"cannot reach the collector at {self.url} ({exc}); start it with "
                                 f"`starvewatch serve` or set STARVEWATCH_URL") from None
        if response.status_code == 401:
            raise CollectorError(f"the collector at {self.url} wants a token: set STARVEWATCH_TOKEN")
        return response

    def find_run(self, name: str) -> dict:
        """The newest run named `name` (or with that id)."""
        response = self._request("GET", "/api/v1/runs", params={"q": name})
        if response.status_code != 200:
            raise CollectorError(f"the collector answered {response.status_code}: {response.text[:200]}")
        runs = response.json()["runs"]
        exact = [r for r in runs if r["id"] == name] or [r for r in runs if r["name"] == name]
        if not exact:
            raise CollectorError(f"no run named {name!r} at {self.url}: train with starvewatch.watch() "
                                 f"first (STARVEWATCH_RUN_NAME={name}), or leave out the run name")
        return max(exact, key=lambda r: r["started_at"] or "")

    def summary(self, run_id: str) -> dict:
        response = self._request("GET", f"/api/v1/runs/{run_id}/summary")
        if response.status_code != 200:
            raise CollectorError(f"cannot read run {run_id}: {response.status_code} {response.text[:200]}")
        return response.json()

    def store_tuning(self, run_id: str, document: dict) -> None:
        response = self._request("POST", f"/api/v1/runs/{run_id}/tuning", json=document)
        if response.status_code != 200:
            raise CollectorError(f"the collector did not store the results: {response.status_code} "
                                 f"{response.text[:300]}")


def pick_loader(summary: dict, name: str | None) -> dict:
    loaders = summary.get("loaders") or []
    if name is not None:
        found = next((l for l in loaders if l["name"] == name), None)
        if found is None:
            raise CollectorError(f"run {summary['run']['id']} has no loader {name!r} "
                                 f"(it has: {', '.join(l['name'] for l in loaders) or 'none'})")
        return found
    if not loaders:
        raise CollectorError(f"run {summary['run']['id']} has no loader data yet")
    return loaders[0]


def consumption_from(loader: dict) -> float | None:
    """Batches/s the training loop could take if it never waited: 1 / (compute + other) per step."""
    steps = loader.get("steps") or 0
    compute = (loader.get("compute_ms") or {}).get("mean")
    if not steps or not compute:
        return None
    other = (loader.get("other_ms_total") or 0.0) / steps
    return 1000.0 / (compute + other)
