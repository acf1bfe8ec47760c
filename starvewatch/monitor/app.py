"""The collector's FastAPI app, built by `create_app(settings)`."""
from __future__ import annotations

import hmac
import os
import signal
import threading
import time
import zlib
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Query as Q, Request
from fastapi.concurrency import run_in_threadpool
import orjson
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from pydantic import ValidationError

from ..version import __version__
from ..schema import EVENTS_SCHEMA, SUMMARY_SCHEMA
from .metrics import make_registry, render
from .models import EventBatch
from .query import NotFound, Query
from .settings import CollectorSettings
from .spool_import import SpoolImporter
from .store import Store

SERVICE = "starvewatch"
TOKEN_COOKIE = "starvewatch_token"


class FastJSONResponse(Response):
    """orjson-rendered JSON. Routes return it directly: a plain dict would first go through
    FastAPI's jsonable_encoder, which costs ~30 ms on a 1000-point series."""

    media_type = "application/json"

    def render(self, content) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def _describe_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "; ".join(parts) + more


async def read_json_body(request: Request, settings: CollectorSettings) -> bytes:
    """The request body, decompressed, within both size limits. The whole body is read even
    when too large, so the client gets a 413 rather than a reset connection."""
    ctype = request.headers.get("content-type", "")
    if not ctype.split(";")[0].strip().lower() == "application/json":
        raise HTTPException(415, f"Content-Type must be application/json, got {ctype or 'none'!r}")
    chunks, size, too_large = [], 0, False
    async for chunk in request.stream():
        size += len(chunk)
        if size > settings.max_body_bytes:
            too_large = True
            chunks = []
        elif not too_large:
            chunks.append(chunk)
    if too_large:
        raise HTTPException(413, f"body of {size} bytes is over the limit of {settings.max_body_bytes}; "
                                 f"split the batch")
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding == "gzip":
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = decoder.decompress(body, settings.max_decompressed_bytes + 1)
        except zlib.error as exc:
            raise HTTPException(400, f"body is not valid gzip: {exc}") from None
        if len(out) > settings.max_decompressed_bytes or decoder.unconsumed_tail:
            raise HTTPException(413, f"decompressed body is over the limit of "
                                     f"{settings.max_decompressed_bytes} bytes; split the batch")
        return out
    if encoding not in ("identity", ""):
        raise HTTPException(415, f"unsupported Content-Encoding {encoding!r} (use gzip or none)")
    return body


def create_app(settings: CollectorSettings | None = None) -> FastAPI:
    settings = settings or CollectorSettings()
    settings.check()
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        store = Store(settings.db_path)
        query = Query(store, lost_after_s=settings.lost_after_s)
        importer = SpoolImporter(store, settings.dir / "spool")
        state.update(store=store, query=query, importer=importer, started=time.time(),
                     last_activity=time.time(), stop=threading.Event())
        app.state.store, app.state.query = store, query
        importer.scan()  # spools of offline or interrupted runs appear without a manual step
        worker = threading.Thread(target=_background, args=(state, settings), daemon=True,
                                  name="starvewatch-collector-background")
        worker.start()
        if settings.pid_file_autostarted is not None:
            from .pid_file import write_pid_file
            write_pid_file(settings, settings.pid_file_autostarted)
        try:
            yield
        finally:
            if settings.pid_file_autostarted is not None:
                from .pid_file import remove_pid_file
                remove_pid_file(settings)
            state["stop"].set()
            worker.join(5)
            store.close()

    app = FastAPI(title="starvewatch collector", version=__version__, lifespan=lifespan,
                  docs_url="/api/docs", openapi_url="/api/openapi.json", redoc_url=None,
                  default_response_class=FastJSONResponse)
    app.state.settings = settings
    app.state.registry = make_registry(lambda: state.get("query"), settings)

    if settings.token:
        expected = settings.token.encode()

        @app.middleware("http")
        async def require_token(request: Request, call_next):
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else None
            token = token or request.cookies.get(TOKEN_COOKIE)
            from_query = request.query_params.get("token")
            if not token and from_query:
                token = from_query
            if not token or not hmac.compare_digest(token.encode(), expected):
                return JSONResponse({"service": SERVICE, "detail": "missing or wrong token"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
            if from_query and request.method == "GET":
                # A browser logs in once with ?token=: a cookie from then on, and the token
                # leaves the address bar.
                url = request.url.remove_query_params("token")
                response = RedirectResponse(str(url), status_code=303)
                response.set_cookie(TOKEN_COOKIE, settings.token, httponly=True, samesite="strict")
                return response
            return await call_next(request)

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound):
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.get("/healthz")
    async def healthz():
        return {"service": SERVICE, "version": __version__, "pid": os.getpid(),
                "events_schema": EVENTS_SCHEMA, "summary_schema": SUMMARY_SCHEMA,
                "uptime_s": time.time() - state.get("started", time.time())}

    @app.post("/api/v1/ingest")
    async def ingest(request: Request):
        body = await read_json_body(request, settings)
        try:
            batch = EventBatch.model_validate_json(body)
        except ValidationError as exc:
            raise HTTPException(422, f"invalid event batch: {_describe_validation(exc)}") from None
        stored = await run_in_threadpool(state["store"].ingest, batch)
        state["last_activity"] = time.time()
        return {"stored": stored, "duplicate": not stored, "records": len(batch.steps),
                "run_url": f"/runs/{batch.run_id}"}

    @app.get("/api/v1/runs")
    def list_runs(status: str | None = Q(None, pattern="^(live|stalled|finished|lost)$"),
                  q: str | None = Q(None, max_length=200)):
        return FastJSONResponse({"runs": state["query"].list_runs(status=status, search=q)})

    @app.get("/api/v1/runs/{run_id}")
    def run_detail(run_id: str):
        return FastJSONResponse(state["query"].detail(run_id))

    @app.delete("/api/v1/runs/{run_id}")
    def delete_run(run_id: str):
        if not state["store"].delete_run(run_id):
            raise NotFound(f"unknown run id {run_id!r}")
        return {"deleted": run_id}

    @app.get("/api/v1/runs/{run_id}/summary")
    def summary(run_id: str, rank: int | None = Q(None, ge=0)):
        return FastJSONResponse(state["query"].summary(run_id, rank))

    @app.get("/api/v1/runs/{run_id}/steps")
    def steps(run_id: str, after: int = Q(0, ge=0), limit: int = Q(10_000, ge=1, le=100_000),
              loader: str | None = None):
        return FastJSONResponse(state["query"].steps_page(run_id, after=after, limit=limit, loader=loader))

    @app.get("/api/v1/runs/{run_id}/series")
    def series(run_id: str, loader: str | None = None, rank: int | None = Q(None, ge=0),
               points: int = Q(500, ge=1, le=10_000)):
        return FastJSONResponse(state["query"].rollup_series(run_id, loader=loader, rank=rank, points=points))

    @app.get("/api/v1/runs/{run_id}/steps/series")
    def step_series(run_id: str, loader: str = "train", rank: int = Q(0, ge=0),
                    points: int = Q(1000, ge=1, le=10_000)):
        return FastJSONResponse(state["query"].step_series(run_id, loader=loader, rank=rank, points=points))

    @app.get("/api/v1/runs/{run_id}/events/{kind}")
    def events(run_id: str, kind: str, since_ns: int = Q(0, ge=0), limit: int = Q(5000, ge=1, le=50_000)):
        if kind not in ("samples", "workers", "stalls"):
            raise HTTPException(404, f"unknown event kind {kind!r}: samples, workers or stalls")
        return FastJSONResponse({"events": state["query"].events(run_id, kind, since_ns=since_ns, limit=limit)})

    @app.get("/api/v1/runs/{run_id}/export")
    def export_run(run_id: str, format: str = Q("json", pattern="^(json|csv|md|html)$")):
        from .export import export_text
        from .sources import LocalSource, SourceError
        source = LocalSource(state["store"], "this collector")
        try:
            body = export_text(source, run_id, format)
        except SourceError as exc:
            raise NotFound(str(exc)) from None
        media = {"json": "application/json", "csv": "text/csv", "md": "text/markdown",
                 "html": "text/html"}[format]
        filename = f"starvewatch-{run_id}.{format}"
        return Response(body, media_type=f"{media}; charset=utf-8",
                        headers={"Content-Disposition": f'attachment; filename="{filename}"'})

    @app.get("/metrics")
    def metrics():
        body, content_type = render(app.state.registry)
        return PlainTextResponse(body, media_type=content_type)

    if settings.dashboard:
        from ..dashboard import mount
        mount(app, settings)

    return app


def _background(state: dict, settings: CollectorSettings) -> None:
    """Spool sweeps and, for an auto-started collector, exit after a long idle time."""
    stop: threading.Event = state["stop"]
    while not stop.wait(settings.spool_scan_s):
        try:
            state["importer"].scan()
        except Exception:  # one bad file or a full disk must not end the sweeps
            pass
        if settings.idle_exit_s > 0:
            store = state["store"]
            newest = store.reader().execute("SELECT max(last_seen) FROM streams WHERE finished = 0").fetchone()[0]
            last = max(state["last_activity"], newest or 0, state["started"])
            if time.time() - last > settings.idle_exit_s:
                os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts down gracefully
                return
