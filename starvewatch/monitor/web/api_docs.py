"""`/api/docs`: the API's routes as one plain page drawn from the OpenAPI document, served by the
collector itself. Swagger UI would load its scripts from a CDN (another origin, at a floating
version, unavailable offline); this page loads nothing, and the machine-readable document stays
at /api/openapi.json."""
from __future__ import annotations

import html

STYLE = ("body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}"
         "code{background:#f5f5f5;padding:1px 4px}li{margin:6px 0}.m{font-weight:bold;display:inline-block;"
         "width:5em}.p{color:#555;font-size:90%}")


def docs_page(openapi: dict) -> str:
    rows = []
    for path, methods in sorted(openapi.get("paths", {}).items()):
        for method, op in methods.items():
            params = ", ".join(
                f"{p['name']} ({p.get('in')})" for p in op.get("parameters", []))
            rows.append(f"<li><span class='m'>{html.escape(method.upper())}</span><code>{html.escape(path)}</code>"
                        f" {html.escape(op.get('summary', ''))}"
                        + (f"<div class='p'>parameters: {html.escape(params)}</div>" if params else "") + "</li>")
    info = openapi.get("info", {})
    title = html.escape(f"{info.get('title', 'API')} {info.get('version', '')}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style>"
            f"</head><body><h1>{title}</h1><p>The machine-readable description: "
            f"<a href='/api/openapi.json'>/api/openapi.json</a>.</p><ul>{''.join(rows)}</ul></body></html>")
