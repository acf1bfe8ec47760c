"""Callback requests are checked before Dash sees them.

Dash answers 500 to any callback request it cannot dispatch (not JSON, an unknown output, a
missing input): a malformed request would look like a server fault. Here a request to
`/_dash-update-component` must name one of this dashboard's server-side callbacks with exactly
its declared outputs, inputs and state; anything else is a 400. Values stay free: the callbacks
themselves take any JSON value (callbacks.py coerces what is not of the expected type).
"""
from __future__ import annotations

import orjson

UPDATE_PATH = "/_dash-update-component"
WEBSOCKET_PATH = "/_dash-ws-callback"


def _same(declared: dict, given) -> bool:
    return (isinstance(given, dict) and given.get("id") == declared["id"]
            and given.get("property") == declared["property"])


def _output_specs(entry: dict) -> list[dict]:
    outputs = entry["output"] if isinstance(entry["output"], list) else [entry["output"]]
    return [{"id": o.component_id, "property": o.component_property} for o in outputs]


def callback_request_problem(body: bytes, callback_map: dict) -> str | None:
    """Why `body` is not a dispatchable callback request, or None."""
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return f"body is not JSON: {exc}"
    if not isinstance(request, dict):
        return "body is not a JSON object"
    entry = callback_map.get(request.get("output")) if isinstance(request.get("output"), str) else None
    if entry is None or "callback" not in entry:
        return "output does not name a server-side callback of this dashboard"
    specs = _output_specs(entry)
    outputs = request.get("outputs")
    if isinstance(entry["output"], list):
        if not (isinstance(outputs, list) and len(outputs) == len(specs)
                and all(_same(s, o) for s, o in zip(specs, outputs))):
            return "outputs differ from the callback's"
    elif not _same(specs[0], outputs):
        return "outputs differ from the callback's"
    for key in ("inputs", "state"):
        declared, given = entry.get(key) or [], request.get(key, [])
        if not (isinstance(given, list) and len(given) == len(declared)
                and all(_same(d, g) for d, g in zip(declared, given))):
            return f"{key} differ from the callback's"
    changed = request.get("changedPropIds", [])
    if not (isinstance(changed, list) and all(isinstance(c, str) for c in changed)):
        return "changedPropIds is not a list of strings"
    return None


def websocket_message_problem(message: dict, dash_app) -> str | None:
    """Why a WebSocket message is not one the Dash renderer sends here, or None. (Dash's
    handler fails with a traceback on a binary frame, a JSON list or a payload of the wrong type.)"""
    if message.get("text") is None:
        return "binary frames are not part of the protocol"
    try:
        data = orjson.loads(message["text"])
    except orjson.JSONDecodeError:
        return "a message is a JSON object"
    if not isinstance(data, dict):
        return "a message is a JSON object"
    kind = data.get("type")
    if kind == "heartbeat":
        return None
    if kind == "get_props_response":
        return None if isinstance(data.get("requestId"), str) else "requestId is not a string"
    if kind == "callback_request":
        payload = data.get("payload")
        if not isinstance(payload, dict) or not isinstance(data.get("requestId"), str):
            return "a callback request needs a requestId and a payload object"
        entry = dash_app.callback_map.get(payload.get("output")) if isinstance(payload.get("output"), str) else None
        if entry is None or not (entry.get("websocket") or getattr(dash_app, "_websocket_callbacks", False)):
            return "no callback of this dashboard runs over WebSocket"
        return callback_request_problem(orjson.dumps(payload), dash_app.callback_map)
    return "unknown message type"


class CallbackRequestCheck:
    """ASGI middleware: reads a callback request's body (the collector's front door has bounded
    its size and its pace), checks it, and hands the same bytes on. On the callback WebSocket,
    a message that is not the renderer's closes the connection (1008) instead of reaching Dash."""

    def __init__(self, app, dash_app) -> None:
        self.app = app
        self.dash_app = dash_app

    async def _websocket(self, scope, receive, send):
        closed = False

        async def checked_receive():
            nonlocal closed
            message = await receive()
            if message["type"] == "websocket.receive" and not closed:
                problem = websocket_message_problem(message, self.dash_app)
                if problem is not None:
                    closed = True
                    await send({"type": "websocket.close", "code": 1008, "reason": problem[:120]})
                    return {"type": "websocket.disconnect", "code": 1008}
            return message

        async def guarded_send(message):
            if not closed:  # after our close, what Dash still sends has nowhere to go
                await send(message)

        await self.app(scope, checked_receive, guarded_send)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and scope["path"] == WEBSOCKET_PATH:
            return await self._websocket(scope, receive, send)
        if scope["type"] != "http" or scope["path"] != UPDATE_PATH or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = callback_request_problem(body, self.dash_app.callback_map)
        if problem is not None:
            payload = orjson.dumps({"detail": f"not a callback request of this dashboard: {problem}"})
            await send({"type": "http.response.start", "status": 400, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
