"""The collector's FastAPI app, built by `create_app(settings)`."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
import zlib
from contextlib import asynccontextmanager
from typing import Callable

from fastapi import FastAPI, HTTPException, Query as Q, Request
from fastapi.concurrency import run_in_threadpool
import orjson
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError

from ...ids import content_disposition
from ...logonce import RateLimitedLog
from ...version import __version__
from ...schema import EVENTS_SCHEMA, SUMMARY_SCHEMA
from .guard import PRINCIPAL, SERVICE, Guard
from .json_bounds import json_values_problem
from ..outputs.metrics import make_registry, render
from .wire_models import EventBatch
from ..storage.query import NotFound, Query
from .collector_settings import CollectorSettings
from ..storage.spool_import import SpoolImporter
from ..storage.open_store import database_errors, open_store, storage_exhausted
from ..storage.project_scope import RunProjectError

log = logging.getLogger("starvewatch.collector")
sweep_errors = RateLimitedLog(log)
# Every integer query parameter ends here: SQLite's integers are 64-bit, and a larger one is
# the client's mistake (422), not the collector's OverflowError (500).
INT64_MAX = 2**63 - 1


class FastJSONResponse(Response):
    """orjson-rendered JSON. Routes return it directly: a plain dict would first go through
    FastAPI's jsonable_encoder, which costs ~30 ms on a 1000-point series."""

    media_type = "application/json"

    def render(self, content) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)


LIMITED_LISTS = ("steps", "phases", "samples", "workers", "stalls")  # bounded by starvewatch/limits.py


def _describe_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "; ".join(parts) + more


async def read_json_body(request: Request, settings: CollectorSettings) -> bytes:
    """The request body, decompressed, within both size limits. The compressed size is
    enforced as the body arrives (monitor/web/guard.py: 413 before or while reading); here the
    decompressed size, which is never inflated past its limit."""
    ctype = request.headers.get("content-type", "")
    if not ctype.split(";")[0].strip().lower() == "application/json":
        raise HTTPException(415, f"Content-Type must be application/json, got {ctype[:80] or 'none'!r}")
    body = await request.body()
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
        if not decoder.eof:
            raise HTTPException(400, "gzip body is truncated")
        body = out
    elif encoding not in ("identity", ""):
        raise HTTPException(415, f"unsupported Content-Encoding {encoding[:40]!r} (use gzip or none)")
    problem = json_values_problem(body)  # before parsing: what parsing it may cost is bounded
    if problem is not None:
        raise HTTPException(413, problem)
    return body


def create_app(settings: CollectorSettings | None = None, *,
               ui: Callable[[FastAPI, CollectorSettings], None] | None = None) -> FastAPI:
    """The collector: ingest, API, /metrics. It knows no UI: `ui`, when given, mounts pages on
    the app (the dashboard, composed by `starvewatch serve` in cli/collector_commands.py) before
    the guard wraps everything, so the guard sees the UI's requests too. The routes come in
    groups, one function each; `state` holds what the lifespan opened (store, query, importer)."""
    settings = settings or CollectorSettings()
    settings.check()
    state: dict = {}
    app = FastAPI(title="starvewatch collector", version=__version__, lifespan=_lifespan(state, settings),
                  docs_url=None, openapi_url="/api/openapi.json", redoc_url=None,
                  default_response_class=FastJSONResponse)
    app.state.settings = settings
    app.state.registry = make_registry(lambda: state.get("query"), settings)
    _service_routes(app, state)
    _ingest_routes(app, state, settings)
    _run_routes(app, state)
    _run_data_routes(app, state)
    _tuning_routes(app, state, settings)
    _export_routes(app, state)
    _metrics_routes(app)
    if ui is not None:
        ui(app, settings)
    # Added last, so it is the outermost: it sees every request first, the UI's too.
    app.add_middleware(Guard, settings=settings)
    return app


def _lifespan(state: dict, settings: CollectorSettings):
    """Opens the store, query layer and spool importer for the app's lifetime, with the
    background sweeps and the optional exporters; closes them in order at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # On the thread pool, as every ingest: its first use imports anyio's backend (~20 ms of
        # CPU), here rather than in the first batch a run delivers (issue 41).
        store = await run_in_threadpool(open_store, settings.store_target, max_db_bytes=settings.max_db_bytes)
        query = Query(store, lost_after_s=settings.lost_after_s)
        importer = SpoolImporter(store, settings.dir / "spool")
        state.update(store=store, query=query, importer=importer, started=time.time(),
                     last_activity=time.time(), stop=threading.Event())
        app.state.store, app.state.query = store, query
        try:  # spools of offline or interrupted runs appear without a manual step
            importer.scan()
        except Exception as exc:  # noqa: BLE001 - an unreadable spool directory never stops serve
            sweep_errors.error(f"sweep:{type(exc).__name__}", "spool sweep of %s failed: %s: %s",
                               settings.dir / "spool", type(exc).__name__, exc)
        exporters = _start_exporters(settings, lambda: query)
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
            for exporter in exporters:
                try:
                    exporter.close()
                except Exception:  # an unreachable OTLP endpoint must not block the shutdown
                    pass
            store.close()

    return lifespan


def _service_routes(app: FastAPI, state: dict) -> None:
    """Errors as JSON, the API's own docs page and /healthz (how a client knows this is a collector)."""

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound):
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.get("/api/docs", include_in_schema=False)
    def api_docs():
        from .api_docs import docs_page
        return Response(docs_page(app.openapi()), media_type="text/html; charset=utf-8")

    @app.get("/healthz")
    async def healthz():
        """Whether a starvewatch collector answers here, its version and schemas. The hooks and the
        CLI ask it first. Without the token of a collector that has one, it answers 401 with a
        body naming starvewatch, so a client still knows what answers. (`?challenge=` is answered
        by the guard, before the token: the collector's proof that it is the user's, guard.py.)

        Example: `curl http://127.0.0.1:8412/healthz` gives `{"service": "starvewatch", "version":
        "0.1.0", "pid": 4242, ...}`."""
        return {"service": SERVICE, "version": __version__, "pid": os.getpid(),
                "events_schema": EVENTS_SCHEMA, "summary_schema": SUMMARY_SCHEMA,
                "uptime_s": time.time() - state.get("started", time.time())}


def _ingest_routes(app: FastAPI, state: dict, settings: CollectorSettings) -> None:
    """POST /api/v1/ingest: one batch of a run's records, validated at the door, stored whole or not at all."""

    @app.post("/api/v1/ingest")
    async def ingest(request: Request):
        """Store one batch of a run's step records and samples (what the hooks send). A batch is
        stored whole or not at all, and once: a batch sent again answers `"duplicate": true`.

        Example: `curl -X POST -H 'Content-Type: application/json' --data @batch.json
        http://127.0.0.1:8412/api/v1/ingest`."""
        body = await read_json_body(request, settings)
        try:
            batch = EventBatch.model_validate_json(body)
        except ValidationError as exc:
            if all(e["type"] == "too_long" and e["loc"] and e["loc"][0] in LIMITED_LISTS for e in exc.errors()):
                # Only over the records per list (starvewatch/limits.py): a sender with larger
                # limits splits on 413, where a 422 would make it set the batch aside.
                raise HTTPException(413, f"batch over the collector's limits: {_describe_validation(exc)}; "
                                         f"split the batch") from None
            raise HTTPException(422, f"invalid event batch: {_describe_validation(exc)}") from None
        login = request.scope.get(PRINCIPAL)  # a project token's (guard.py): its run must be of its project
        projects = None if login is None or login.visible is None else login.projects
        try:
            stored = await run_in_threadpool(state["store"].ingest, batch, projects)
        except RunProjectError as exc:  # nothing was written
            raise HTTPException(403, str(exc)) from None
        except ValueError as exc:  # the store refused it whole (rolled back): nothing was written
            raise HTTPException(422, f"invalid event batch: {exc}") from None
        except database_errors() as exc:
            if not storage_exhausted(exc):
                raise
            # 507: the batch was not stored (rolled back, caches with it); the sender keeps it
            # and sends it again later, counted once.
            sweep_errors.error("disk-full", "batch not stored: %s", exc)
            raise HTTPException(507, f"the collector's disk is full ({exc}); the batch was not stored, "
                                     f"send it again later") from None
        state["last_activity"] = time.time()
        return {"stored": stored, "duplicate": not stored, "records": len(batch.steps),
                "run_url": f"/runs/{batch.run_id}"}


def _run_routes(app: FastAPI, state: dict) -> None:
    """The runs: list, detail, delete, summary and stragglers."""

    @app.get("/api/v1/runs")
    def list_runs(status: str | None = Q(None, pattern="^(live|stalled|finished|lost)$"),
                  q: str | None = Q(None, max_length=200)):
        """The runs, newest first, each with its project (null: none), status, verdict, input wait
        and throughput. `status` keeps one status; `q` keeps runs whose name or id contains it. A
        project token sees its projects' runs only (docs/security.md).

        Example: `curl 'http://127.0.0.1:8412/api/v1/runs?status=live&q=resnet'`."""
        return FastJSONResponse({"runs": state["query"].list_runs(status=status, search=q)})

    @app.get("/api/v1/runs/{run_id}")
    def run_detail(run_id: str):
        """One run: its metadata (host, ranks, status, start and end) and its loaders.

        Example: `curl http://127.0.0.1:8412/api/v1/runs/train-20261122-021033-19e2a8`."""
        return FastJSONResponse(state["query"].detail(run_id))

    @app.delete("/api/v1/runs/{run_id}")
    def delete_run(run_id: str):
        """Delete a run and all its data (`starvewatch runs delete RUN` asks first). Needs the
        collector's token or an `admin` project token of the run's project.

        Example: `curl -X DELETE http://127.0.0.1:8412/api/v1/runs/train-20261122-021033-19e2a8`."""
        if not state["store"].delete_run(run_id):
            raise NotFound(f"unknown run id {run_id!r}")
        return {"deleted": run_id}

    @app.get("/api/v1/runs/{run_id}/summary")
    def summary(run_id: str, rank: int | None = Q(None, ge=0, le=INT64_MAX)):
        """The run's summary (`starvewatch.summary/2`, as `finish()` returns it): each loader's
        figures, the verdict and the recommendations. `rank` gives one rank's alone.

        Example: `curl http://127.0.0.1:8412/api/v1/runs/RUN_ID/summary`."""
        return FastJSONResponse(state["query"].summary(run_id, rank))

    @app.get("/api/v1/runs/{run_id}/stragglers")
    def stragglers(run_id: str):
        """For a run of several ranks: which ranks are slower than the others (the straggler
        rule of [The diagnosis](../diagnosis.md)).

        Example: `curl http://127.0.0.1:8412/api/v1/runs/RUN_ID/stragglers`."""
        state["query"].run_meta(run_id)  # 404 for an unknown run
        return FastJSONResponse(state["query"].stragglers(run_id))


def _run_data_routes(app: FastAPI, state: dict) -> None:
    """A run's recorded data: step pages, series, distributions, worker memory, events."""

    @app.get("/api/v1/runs/{run_id}/steps")
    def steps(run_id: str, after: int = Q(0, ge=0, le=INT64_MAX), limit: int = Q(10_000, ge=1, le=100_000),
              loader: str | None = None):
        """The run's raw step rows, a page at a time (`next_after`). Steps folded by the storage
        budget are in `rolled_up` (per rank: before `until`); the CSV export has their buckets.

        Example: `curl 'http://127.0.0.1:8412/api/v1/runs/RUN_ID/steps?limit=1000&after=0'`."""
        return FastJSONResponse(state["query"].steps_page(run_id, after=after, limit=limit, loader=loader))

    @app.get("/api/v1/runs/{run_id}/series")
    def series(run_id: str, loader: str | None = None, rank: int | None = Q(None, ge=0, le=INT64_MAX),
               points: int = Q(500, ge=1, le=10_000)):
        """The run's figures over time in at most `points` buckets, per loader or for one `rank`
        (the run page's charts).

        Example: `curl 'http://127.0.0.1:8412/api/v1/runs/RUN_ID/series?loader=train&points=300'`."""
        return FastJSONResponse(state["query"].rollup_series(run_id, loader=loader, rank=rank, points=points))

    @app.get("/api/v1/runs/{run_id}/steps/series")
    def step_series(run_id: str, loader: str = "train", rank: int = Q(0, ge=0, le=INT64_MAX),
                    points: int = Q(1000, ge=1, le=10_000)):
        """One loader's wait and compute per step, thinned to at most `points` steps (the slowest
        of each stretch kept), for one rank.

        Example: `curl 'http://127.0.0.1:8412/api/v1/runs/RUN_ID/steps/series?loader=train'`."""
        return FastJSONResponse(state["query"].step_series(run_id, loader=loader, rank=rank, points=points))

    @app.get("/api/v1/runs/{run_id}/distributions")
    def distributions(run_id: str, loader: str = "train"):
        """Wait and compute per batch of one loader as log-bucketed counts (the compare page's).

        Example: `curl 'http://127.0.0.1:8412/api/v1/runs/RUN_ID/distributions?loader=train'`."""
        return FastJSONResponse(state["query"].distributions(run_id, loader))

    @app.get("/api/v1/runs/{run_id}/workers/memory")
    def workers_memory(run_id: str):
        """Memory of each DataLoader worker over time (USS and PSS, read by the sidecar): a growing
        worker shows copy-on-read.

        Example: `curl http://127.0.0.1:8412/api/v1/runs/RUN_ID/workers/memory`."""
        return FastJSONResponse(state["query"].worker_memory(run_id))

    @app.get("/api/v1/runs/{run_id}/events/{kind}")
    def events(run_id: str, kind: str, since_ns: int = Q(0, ge=0, le=INT64_MAX), limit: int = Q(5000, ge=1, le=50_000),
               newest: bool = False):
        """The run's raw events of one `kind`: `samples` (host and GPU readings), `workers` (worker
        load times) or `stalls`, after `since_ns`; `newest=true` gives the last ones.

        Example: `curl 'http://127.0.0.1:8412/api/v1/runs/RUN_ID/events/stalls'`."""
        if kind not in ("samples", "workers", "stalls"):
            raise HTTPException(404, f"unknown event kind {kind!r}: samples, workers or stalls")
        return FastJSONResponse({"events": state["query"].events(run_id, kind, since_ns=since_ns, limit=limit,
                                                                 newest=newest)})


def _tuning_routes(app: FastAPI, state: dict, settings: CollectorSettings) -> None:
    """`starvewatch tune` results stored with a run, and read back."""

    @app.post("/api/v1/runs/{run_id}/tuning")
    async def store_tuning(run_id: str, request: Request):
        """Store `starvewatch tune` results with a run (`tune --run NAME` sends them); the run page
        shows them.

        Example: `curl -X POST -H 'Content-Type: application/json' --data @tuning.json
        http://127.0.0.1:8412/api/v1/runs/RUN_ID/tuning`."""
        from ...analysis.measured_tuning import TuningDocument
        body = await read_json_body(request, settings)
        try:
            document = TuningDocument.model_validate_json(body)
        except ValidationError as exc:
            raise HTTPException(422, f"invalid tuning results: {_describe_validation(exc)}") from None
        try:
            stored = await run_in_threadpool(state["store"].save_tuning, run_id, document.model_dump(by_alias=True))
        except ValueError as exc:  # a bound of the run (storage/run_bounds.py)
            raise HTTPException(422, str(exc)) from None
        if not stored:
            raise NotFound(f"unknown run id {run_id!r}")
        return {"stored": True, "run_id": run_id}

    @app.get("/api/v1/runs/{run_id}/tuning")
    def tuning(run_id: str):
        """The `starvewatch tune` results stored with a run: each configuration measured and the
        one picked.

        Example: `curl http://127.0.0.1:8412/api/v1/runs/RUN_ID/tuning`."""
        document = state["query"].tuning(run_id)
        if document is None:
            raise NotFound(f"run {run_id!r} has no tuning results: `starvewatch tune module:factory "
                           f"--run NAME` measures and stores them")
        return FastJSONResponse(document)


def _export_routes(app: FastAPI, state: dict) -> None:
    """A run as a file: JSON, CSV (streamed), Markdown or HTML."""

    @app.get("/api/v1/runs/{run_id}/export")
    def export_run(request: Request, run_id: str, format: str = Q("json", pattern="^(json|csv|md|html|trace)$"),
                   steps: str | None = Q(None, max_length=50, pattern=r"^\d*:\d*$"),
                   window: str | None = Q(None, max_length=50, pattern=r"^[0-9.]*:[0-9.]*$"),
                   rank: int | None = Q(None, ge=0, le=2**31)):
        """The run as a file to download: `json` (the summary), `csv` (one row per step, streamed),
        `md` (a report), `html` (one self-contained report with charts, opens offline) or `trace`
        (a Chrome/Perfetto timeline; `steps` A:B or `window` S:E seconds, `rank`).

        Example: `curl -OJ 'http://127.0.0.1:8412/api/v1/runs/RUN_ID/export?format=csv'`."""
        from ..outputs.export import csv_chunks, export_text
        from ..storage.sources import LocalSource, SourceError
        source = LocalSource(state["store"], "this collector")
        if format == "trace":  # a Chrome trace / Perfetto timeline (outputs/trace_export.py)
            try:
                trace = source.trace(run_id, steps=steps, window=window, rank=rank)
            except SourceError as exc:
                raise NotFound(str(exc)) from None
            except ValueError as exc:
                raise HTTPException(400, str(exc)) from None
            return Response(orjson.dumps(trace), media_type="application/json", headers={
                "Content-Disposition": content_disposition(f"starvewatch-{run_id}.trace.json")})
        media = {"json": "application/json", "csv": "text/csv", "md": "text/markdown",
                 "html": "text/html"}[format]
        headers = {"Content-Disposition": content_disposition(f"starvewatch-{run_id}.{format}")}
        if format == "csv":
            # Streamed page by page: a 1M-step run never sits in memory.
            state["query"].detail(run_id)  # 404 before the 200 has gone out
            from ..storage.folded_reads import export_rows
            from .guard import ON_ABORT
            rows = export_rows(state["store"], run_id)
            chunks = csv_chunks(run_id, rows)

            def close() -> None:  # the guard cut the answer (a client that stopped reading)
                for generator in (chunks, rows):
                    try:
                        generator.close()  # ends the read transaction: the WAL is free again
                    except ValueError:
                        pass  # running in another thread right now: it ends with the response
            request.scope.setdefault(ON_ABORT, []).append(close)
            return StreamingResponse(chunks, media_type=f"{media}; charset=utf-8", headers=headers)
        try:
            body = export_text(source, run_id, format)
        except SourceError as exc:
            raise NotFound(str(exc)) from None
        except Exception as exc:  # this run's stored data cannot be rendered: said for this run alone
            sweep_errors.error(f"export:{type(exc).__name__}", "export of run %s failed: %s: %s", run_id[:128],
                               type(exc).__name__, str(exc)[:300])
            raise HTTPException(500, f"run {run_id!r} cannot be exported as {format}: its stored data could not "
                                     f"be rendered ({type(exc).__name__}: {str(exc)[:200]}); other runs are "
                                     f"not affected") from None
        return Response(body, media_type=f"{media}; charset=utf-8", headers=headers)


def _metrics_routes(app: FastAPI) -> None:
    """/metrics: the live runs' figures for Prometheus."""

    @app.get("/metrics")
    def metrics():
        """The live runs' figures in Prometheus' text format (input wait, batches/s, verdict level
        per run and loader); see [Fleets](../fleets.md).

        Example: `curl http://127.0.0.1:8412/metrics`."""
        body, content_type = render(app.state.registry)
        return PlainTextResponse(body, media_type=content_type)


def _start_exporters(settings: CollectorSettings, get_query) -> list:
    """The optional exporters the settings ask for (imported only then)."""
    out = []
    if settings.otlp_endpoint:
        from ..outputs.otel import OtelExporter
        out.append(OtelExporter(get_query, settings, settings.otlp_endpoint, interval_s=settings.otlp_interval_s))
    if settings.tensorboard_dir:
        from ..outputs.tensorboard import TensorBoardWriter
        out.append(TensorBoardWriter(get_query, settings, settings.tensorboard_dir,
                                     settings.tensorboard_interval_s).start())
    return out


def _background(state: dict, settings: CollectorSettings) -> None:
    """Spool sweeps and, for an auto-started collector, exit after a long idle time."""
    from .resident_memory import TRIM_EVERY_S, give_back
    stop: threading.Event = state["stop"]
    trimmed_at = time.monotonic()
    while not stop.wait(settings.spool_scan_s):
        if time.monotonic() - trimmed_at >= TRIM_EVERY_S:  # freed malloc pages back to the kernel
            give_back()
            trimmed_at = time.monotonic()
        try:
            # One collector at a time sweeps a spool directory that several share (PgStore.once).
            with state["store"].once(f"spool:{(settings.dir / 'spool').resolve()}") as mine:
                if mine:
                    state["importer"].scan()
        except Exception as exc:  # a full disk or an unreadable directory must not end the sweeps
            sweep_errors.error(f"sweep:{type(exc).__name__}", "spool sweep of %s failed: %s: %s",
                               settings.dir / "spool", type(exc).__name__, exc)
        if settings.idle_exit_s > 0:
            try:
                store = state["store"]
                newest = store.reader().execute("SELECT max(last_seen) FROM streams WHERE finished = 0").fetchone()[0]
            except database_errors() as exc:  # busy or locked for longer than the busy timeout: ask again next time
                sweep_errors.error("idle-check", "idle check failed: %s", exc)
                continue
            last = max(state["last_activity"], newest or 0, state["started"])
            if time.time() - last > settings.idle_exit_s:
                os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts down gracefully
                return
