"""The Dash dashboard, mounted on the collector's FastAPI app at `/` (Dash 4, FastAPI backend):
one port for the API, /metrics and the pages. Every asset is served locally (works offline)."""
from __future__ import annotations

from pathlib import Path


def mount(app, settings) -> None:
    from dash import Dash

    from .layout import root_layout
    from .callbacks import register

    dash_app = Dash(__name__, server=app, backend="fastapi", title="starvewatch", update_title=None,
                    suppress_callback_exceptions=True, serve_locally=True, use_async=True,
                    assets_folder=str(Path(__file__).with_name("assets")))
    dash_app.layout = root_layout()
    register(dash_app, lambda: app.state.query)
    from .tuning_panel import register as register_tuning
    register_tuning(dash_app, lambda: app.state.query)
    app.state.dash = dash_app
