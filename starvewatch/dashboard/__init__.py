"""The Dash dashboard, mounted on the collector's FastAPI app at `/` (Dash 4, FastAPI backend):
one port for the API, /metrics and the pages. Every asset is served locally (works offline)."""
from __future__ import annotations

from pathlib import Path


def mount(app, settings) -> None:
    from dash import Dash

    from .callbacks import register
    from .layout import root_layout
    from .requests import CallbackRequestCheck

    dash_app = Dash(__name__, server=app, backend="fastapi", title="starvewatch", update_title=None,
                    suppress_callback_exceptions=True, serve_locally=True, use_async=True,
                    assets_folder=str(Path(__file__).with_name("assets")))
    dash_app.layout = root_layout()
    register(dash_app, lambda: app.state.query)
    # Dash finds the assets (style.css) on its first request to `/` or `/_dash-*`; a deep link
    # such as /runs/ID or /compare?a=&b= as a fresh collector's first page would be served
    # without its stylesheet. Do it now, once, before any request.
    dash_app._setup_server()
    from .tuning_panel import register as register_tuning
    register_tuning(dash_app, lambda: app.state.query)
    # Every inline script Dash writes is known now: the pages' CSP allows those, and no other.
    from ..monitor.web.framing import set_script_hashes
    set_script_hashes(dash_app.csp_hashes())
    app.state.dash = dash_app
    # Added after Dash's own middleware, so it runs before it.
    app.add_middleware(CallbackRequestCheck, dash_app=dash_app)
