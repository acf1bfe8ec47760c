"""What each role of a project token may do, route by route (issue 40 item 3).

Every route of the app has a rule here: the action it takes. A request made with a project
token is let through when the token's role grants the route's action; a route without a rule is
refused to every project token (and tests/test_project_tokens.py fails on it), so a new route
is closed until someone decides. The collector's own token and the per-user token are
unrestricted and never look here.

Which runs a token sees is not decided here but in the store's reads (storage/project_scope.py):
the guard sets the token's projects for the request, and a run of another project is unknown
(404) to every route and callback; ingest into another project's run is refused 403 by the store.
"""
from __future__ import annotations

# The actions, and which roles grant each.
OPEN = "open"      # the collector's identity (/healthz): any valid token
READ = "read"      # pages, API reads, exports, /metrics, the dashboard's callbacks and WebSocket
WRITE = "write"    # send records (ingest) and `starvewatch tune` results
DELETE = "delete"  # delete a run

GRANTS = {
    "read": frozenset({OPEN, READ}),
    "write": frozenset({OPEN, WRITE}),
    "admin": frozenset({OPEN, READ, WRITE, DELETE}),
}

# (method, route path as the app declares it) -> action. "WEBSOCKET" for a WebSocket route.
RULES: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): OPEN,
    ("GET", "/api/openapi.json"): READ,
    ("HEAD", "/api/openapi.json"): READ,
    ("GET", "/api/docs"): READ,
    ("POST", "/api/v1/ingest"): WRITE,
    ("GET", "/api/v1/runs"): READ,
    ("GET", "/api/v1/runs/{run_id}"): READ,
    ("DELETE", "/api/v1/runs/{run_id}"): DELETE,
    ("GET", "/api/v1/runs/{run_id}/summary"): READ,
    ("GET", "/api/v1/runs/{run_id}/stragglers"): READ,
    ("GET", "/api/v1/runs/{run_id}/steps"): READ,
    ("GET", "/api/v1/runs/{run_id}/series"): READ,
    ("GET", "/api/v1/runs/{run_id}/steps/series"): READ,
    ("GET", "/api/v1/runs/{run_id}/distributions"): READ,
    ("GET", "/api/v1/runs/{run_id}/workers/memory"): READ,
    ("GET", "/api/v1/runs/{run_id}/events/{kind}"): READ,
    ("POST", "/api/v1/runs/{run_id}/tuning"): WRITE,
    ("GET", "/api/v1/runs/{run_id}/tuning"): READ,
    ("GET", "/api/v1/runs/{run_id}/export"): READ,
    ("GET", "/metrics"): READ,
    # The dashboard (Dash, mounted by `serve`): its pages, assets and callbacks only read.
    ("GET", "/assets"): READ,
    ("GET", "/_dash-component-suites/{package_name}/{fingerprinted_path:path}"): READ,
    ("GET", "/_dash-layout"): READ,
    ("GET", "/_dash-dependencies"): READ,
    ("POST", "/_dash-update-component"): READ,
    ("GET", "/_reload-hash"): READ,
    ("GET", "/_favicon.ico"): READ,
    ("WEBSOCKET", "/_dash-ws-callback"): READ,
    ("GET", "/"): READ,
    ("GET", "{path:path}"): READ,  # Dash's pages (/runs/ID, /compare), added when the app starts
}
# A path no route declares (a page of the dashboard's client-side router, /runs/ID, or a 404):
# read with GET and HEAD, nothing else.
UNROUTED = {"GET": READ, "HEAD": READ}


def route_methods(route) -> list[str]:
    """The methods a route answers ("WEBSOCKET" for a WebSocket route, GET for a mount)."""
    methods = getattr(route, "methods", None)
    if methods:
        return sorted(methods)
    return ["WEBSOCKET"] if "websocket" in type(route).__name__.lower() else ["GET"]


def matched_route(routes, scope):
    """The route of `routes` that answers `scope` (its path and method), or None."""
    from starlette.routing import Match
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route
        if match == Match.PARTIAL and partial is None:
            partial = route  # the path is a route's, the method is not: that route's rule decides
    return partial


def action_for(method: str, route) -> str | None:
    """The action a request takes, by its method and the route that answers it (None: no rule)."""
    if route is None:
        return UNROUTED.get(method)
    if method == "HEAD" and (method, route.path) not in RULES:
        method = "GET"
    return RULES.get((method, route.path))


def allowed(role: str, action: str | None) -> bool:
    return action is not None and action in GRANTS.get(role, frozenset())


def run_named(route, scope) -> str | None:
    """The run id a request's path names ({run_id}), or None."""
    if route is None:
        return None
    _, child = route.matches(scope)
    return (child.get("path_params") or {}).get("run_id")
