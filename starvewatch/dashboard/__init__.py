"""The Dash dashboard, mounted on the collector's FastAPI app at `/`."""
from __future__ import annotations


def mount(app, settings) -> None:
    from fastapi.responses import HTMLResponse

    @app.get("/", response_class=HTMLResponse)
    def index():
        return "<!doctype html><title>starvewatch</title><p>starvewatch collector: see /api/v1/runs</p>"
