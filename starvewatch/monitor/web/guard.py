"""The collector's front door, one ASGI middleware around every route, WebSockets included.

In order, for each request:
1. **Host** (no token set): only a loopback name or the bound address. A web page the user
   visits can point its own DNS name at 127.0.0.1 (DNS rebinding); its requests then carry
   that name in `Host`, and are refused.
2. **Token** (when set): bearer header, the login cookie, or `?token=` once (a browser is
   redirected to the same address without it, with the cookie set). Every route, every method,
   the Dash WebSocket too. The cookie never holds the token: it holds an HMAC of the token under
   a server secret (session.py), and its name carries the port, since browsers send a host's
   cookies to every port of it. Wrong tokens from one client are answered one at a time, each
   after a delay that grows with that client's recent failures (guessing is slowed to a crawl).
   A **project token** (`swt_...`, storage/access_tokens.py) is checked beside them, by its
   digest in the store, revoked ones refused: its role must grant the route's action
   (access_rules.py; 403), a run its path names must be of its projects (404), and the request
   runs seeing only its projects (storage/project_scope.py: lists, pages, callbacks, exports).
   Its login cookie carries its id, role, projects and expiry (login_cookie.py).
3. **Origin**: a browser request that changes state (any method but GET/HEAD/OPTIONS) or opens
   a WebSocket must come from this collector's own origin. CORS is never enabled.
4. **Body size**: a `Content-Length` over the limit is answered 413 before a byte of the body
   is read; a body without one stops being read at the limit (413 again).
5. **Body silence and drips**: a client that stops sending mid-body gets 408 after
   `body_timeout_s`; one that keeps sending but slower than `min_body_bytes_per_s` (after a
   grace of `body_timeout_s`) gets 408 too. Each connection waits on its own; other clients are
   served meanwhile.

Every response carries headers that forbid framing by other origins and content sniffing, the
500 of an unexpected error included (answered here, logged in one line plus one traceback per
kind of error). A client that disconnects mid-body costs one log line.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import time
from collections import OrderedDict
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, urlencode, urlsplit

import orjson

from ...logonce import RateLimitedLog
from ..storage import access_tokens
from ..storage.project_scope import scoped
from . import access_rules
from .connections import connection_uid, release_slot
from .framing import response_headers
from .peer import UNKNOWABLE, peer_uid
from .login_cookie import SESSION_S, Sessions

log = logging.getLogger("starvewatch.collector")
_traced: set[str] = set()  # kinds of internal errors whose traceback was logged already
stalled = RateLimitedLog(log)
SERVICE = "starvewatch"
COOKIE_PREFIX = "starvewatch_session_"
FAILED_DELAY_STEP_S = 0.05     # each recent failure of a client adds this much to its next one
FAILED_DELAY_MAX_S = 2.0
FAILURES_FORGOTTEN_S = 600.0   # a client without failures for this long starts again from zero
MAX_TRACKED_CLIENTS = 4096
MAX_PENDING_PER_CLIENT = 8     # wrong answers of one client waiting at once; more: 429 at once
MAX_PENDING = 512              # wrong answers waiting at once, all clients (file descriptors)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"referrer-policy", b"no-referrer"),
)


ON_ABORT = "starvewatch.on_abort"  # scope key: what a route asks closed when its answer is cut


class ClientStalled(Exception):
    """A client that stopped reading a streamed answer."""


class BodyRefused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def host_name(host_header: str) -> str:
    """The host part of a `Host` header or an origin's netloc (`[::1]:80` -> `::1`)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def is_loopback_name(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _header_text(value: str) -> str:
    """Header values arrive as latin-1; a token is compared as the UTF-8 text it was set as."""
    return value.encode("latin-1").decode("utf-8", "surrogateescape")


def cookie_name(port: int) -> str:
    return f"{COOKIE_PREFIX}{port}"


def _caused_by(exc: BaseException, kind: type) -> bool:
    """`exc` is `kind`, alone or inside an ExceptionGroup (Starlette's task groups)."""
    if isinstance(exc, kind):
        return True
    inner = getattr(exc, "exceptions", None)
    return bool(inner) and any(_caused_by(e, kind) for e in inner)


def _client_disconnected(exc: BaseException) -> bool:
    """Starlette's ClientDisconnect, raised alone or inside an ExceptionGroup."""
    from starlette.requests import ClientDisconnect
    if isinstance(exc, ClientDisconnect):
        return True
    inner = getattr(exc, "exceptions", None)
    return bool(inner) and all(_client_disconnected(e) for e in inner)


class _Failures:
    """Recent wrong tokens per client: each next wrong answer waits longer, and one client's
    guesses are answered one at a time (parallel connections gain nothing). A client is its
    address, and on loopback also the local user owning its socket (peer.py): another user's
    guesses never slow yours. A waiting wrong answer holds no connection slot (connections.py
    releases it), and a client may have at most MAX_PENDING_PER_CLIENT of them: more are answered
    429 at once, their token not looked at, so guessing stays slow and bounded in memory."""

    def __init__(self) -> None:
        self.clients: OrderedDict[str, list] = OrderedDict()  # key -> [count, last_s, lock, pending]
        self.addresses: dict[str, int] = {}  # address -> wrong answers waiting, all its clients
        self.pending = 0

    def watched(self, address: str) -> bool:
        return self.addresses.get(address, 0) > 0

    def over_cap(self, key: str) -> bool:
        entry = self.clients.get(key)
        return entry is not None and entry[3] >= MAX_PENDING_PER_CLIENT

    def retry_after_s(self, key: str) -> int:
        entry = self.clients.get(key)
        return max(1, round(min(FAILED_DELAY_MAX_S, FAILED_DELAY_STEP_S * (entry[0] if entry else 1))))

    async def pause(self, key: str, address: str) -> None:
        now = time.monotonic()
        entry = self.clients.get(key)
        if entry is None or (now - entry[1] > FAILURES_FORGOTTEN_S and entry[3] == 0):
            entry = [0, now, asyncio.Lock(), 0]
        self.clients[key] = entry
        self.clients.move_to_end(key)
        while len(self.clients) > MAX_TRACKED_CLIENTS:
            oldest = next(iter(self.clients))
            if self.clients[oldest][3]:
                break  # one with answers waiting stays until they are sent
            self.clients.popitem(last=False)
        entry[3] += 1
        self.pending += 1
        self.addresses[address] = self.addresses.get(address, 0) + 1
        try:
            async with entry[2]:
                entry[0] += 1
                entry[1] = time.monotonic()
                await asyncio.sleep(min(FAILED_DELAY_MAX_S, FAILED_DELAY_STEP_S * entry[0]))
        finally:
            entry[3] -= 1
            self.pending -= 1
            left = self.addresses[address] - 1
            if left:
                self.addresses[address] = left
            else:
                del self.addresses[address]


class Guard:
    def __init__(self, app, settings) -> None:
        self.app = app
        self.settings = settings
        self.token = settings.token.encode() if settings.token else None
        self.bound_host = host_name(settings.host) if settings.host else ""
        self.cookie = cookie_name(settings.port)
        self._sessions = Sessions(settings) if settings.token else None
        self.failures = _Failures()
        self.own_uid = os.geteuid()
        local = getattr(settings, "local_token", None)
        self.local_token = local.encode() if local else None

    @property
    def sessions(self) -> Sessions:
        """Made at the first login when the collector has no token of its own (a project token's)."""
        if self._sessions is None:
            self._sessions = Sessions(self.settings)
        return self._sessions

    # ---- the checks --------------------------------------------------------------------------
    def _host_allowed(self, host_header: str | None) -> bool:
        if self.token is not None:
            return True  # a rebinding page cannot know the token
        if not host_header:
            return False
        host = host_name(host_header)
        return is_loopback_name(host) or host == self.bound_host

    def _given_token(self, headers: dict, query: str) -> tuple[str | None, str]:
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return _header_text(auth[7:].strip()), "header"
        cookies = SimpleCookie()
        try:
            cookies.load(headers.get("cookie", ""))
        except CookieError:  # a malformed Cookie header: no cookie
            cookies = SimpleCookie()
        if self.cookie in cookies:
            return _header_text(cookies[self.cookie].value), "cookie"
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key == "token":
                return value, "query"
        return None, ""

    def _token_ok(self, given: str | None, where: str) -> bool:
        if given is None:
            return False
        if where == "cookie":
            return self.sessions.valid(given)
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.token)

    @staticmethod
    def _cookie_may(method: str, path: str) -> bool:
        """A login cookie reads pages: GET and HEAD, and the dashboard's own callbacks (Dash
        POSTs them; they only read). Never ingest, delete or store: a script that runs in the
        collector's origin (the browser sends the cookie with it) changes nothing."""
        return method in SAFE_METHODS or method == "WEBSOCKET" or path.startswith("/_dash-")

    def _same_user(self, scope, headers: dict) -> bool:
        """Without a token, a loopback collector answers only its own user (and root): on a
        shared machine every account can connect to 127.0.0.1, and the files are 0600 for a
        reason. The user is the uid owning the client's socket (peer.py); the browser, the
        notebook's frame and VS Code's port forwarding all connect as the user. Someone who
        cannot be told apart (no /proc) shows the per-user token (local_secrets.py) instead."""
        client = scope.get("client")
        if not client or not _is_ip(client[0]):
            return True  # not a socket (an in-process test client)
        uid = connection_uid(client, scope.get("server"))
        if uid is not None and uid in (self.own_uid, 0, UNKNOWABLE):
            # (UNKNOWABLE: no /proc/net/tcp, as on macOS: every local user is let in, as before;
            # docs/security.md says so.)
            return True
        given, _ = self._given_token(headers, "")
        return self.local_token is not None and given is not None and hmac.compare_digest(
            given.encode("utf-8", "surrogateescape"), self.local_token)

    @staticmethod
    def _origin_ok(headers: dict) -> bool:
        origin = headers.get("origin")
        if origin is None:
            return True  # not a browser's cross-origin request (browsers always send Origin there)
        host = headers.get("host", "")
        parts = urlsplit(origin)
        return bool(host) and parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()

    # ---- ASGI --------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope.get("method", "GET") if kind == "http" else "WEBSOCKET"
        query = scope.get("query_string", b"").decode("latin-1")

        if not self._host_allowed(headers.get("host")):
            return await self._refuse(scope, receive, send, 403, "this collector answers to a loopback "
                                      "address only (Host header refused: DNS rebinding protection)")
        given, where = self._given_token(headers, query)
        project_token = _is_project_token(given, where)
        if self.token is None and not project_token and not self._same_user(scope, headers):
            return await self._refuse(scope, receive, send, 403, "this collector belongs to another user of "
                                      "this machine (start your own: another --port, or your own STARVEWATCH_DIR)")
        if kind == "http" and method == "GET" and scope.get("path") == "/healthz" and self.settings.collector_key:
            challenge = dict(parse_qsl(query)).get("challenge")
            if challenge is not None:
                # Training's question before it sends a token or a record: do you hold my
                # collector key (local_secrets.py)? Answered before the token, which the
                # question is there to protect.
                return await self._prove(send, challenge)
        login = None
        if project_token:
            login = await self._project_login(scope, receive, send, method, given, where)
            if login is None:
                return  # refused, answered
            if where == "query" and method == "GET":
                return await self._login_redirect(scope, send, query, login)
        elif self.token is not None:
            address = (scope.get("client") or ("?",))[0]
            key = None
            if given is not None and self.failures.watched(address):
                # This address has wrong answers waiting: a client with too many of them is
                # answered at once, its token not looked at (it learns nothing from it).
                key = _client_key(scope)
                if self.failures.over_cap(key):
                    return await self._refuse(scope, receive, send, 429, "too many wrong tokens from this "
                                              "client; wait before trying again", extra=(
                                                  (b"retry-after", str(self.failures.retry_after_s(key)).encode()),))
            if where == "cookie" and self._token_ok(given, where) and not self._cookie_may(method, scope.get("path", "")):
                return await self._refuse(scope, receive, send, 403, "the login cookie reads pages only: "
                                          "this route wants the token (Authorization: Bearer)")
            if not self._token_ok(given, where):
                return await self._wrong_token(scope, receive, send, given, key)
            if where == "query" and method == "GET":
                return await self._login_redirect(scope, send, query)
        if (method not in SAFE_METHODS) and not self._origin_ok(headers):
            return await self._refuse(scope, receive, send, 403, "cross-origin request refused")
        if login is not None:
            scope[PRINCIPAL] = login
            with scoped(login.visible):  # every read of this request sees the token's projects only
                return await self._admitted(scope, receive, send, kind, headers)
        return await self._admitted(scope, receive, send, kind, headers)

    async def _wrong_token(self, scope, receive, send, given, key=None) -> None:
        """401 to a wrong or missing token; a guess (a missing token is no attempt) is slowed."""
        if given is not None:
            if self.failures.pending >= MAX_PENDING:
                return await self._refuse(scope, receive, send, 429, "too many wrong tokens; wait "
                                          "before trying again", extra=((b"retry-after", b"2"),))
            # The wait holds no connection slot: clients with the right token keep
            # being served whatever number of guesses wait (connections.py).
            release_slot(scope.get("client"))
            address = (scope.get("client") or ("?",))[0]
            await self.failures.pause(key or _client_key(scope), address)
        return await self._refuse(scope, receive, send, 401, "missing or wrong token",
                                  extra=((b"www-authenticate", b"Bearer"),))

    async def _project_login(self, scope, receive, send, method: str, given: str, where: str):
        """The project token's record when it is live and its role may take this route, a run
        its path names being of its projects; None once refused (answered)."""
        from anyio import to_thread
        if self.failures.watched((scope.get("client") or ("?",))[0]):
            key = _client_key(scope)
            if self.failures.over_cap(key):  # as for the collector's token: not looked at
                return await self._refuse(scope, receive, send, 429, "too many wrong tokens from this client; "
                                          "wait before trying again", extra=(
                                              (b"retry-after", str(self.failures.retry_after_s(key)).encode()),))
        store = getattr(scope["app"].state, "store", None)
        if store is None:
            return await self._refuse(scope, receive, send, 503, "the collector is starting")
        if where == "cookie":
            found = self.sessions.project_login(given)
            login = None
            if found is not None and await to_thread.run_sync(access_tokens.live, store, found[0]):
                login = access_tokens.AccessToken(found[0], found[1], found[2], 0.0)
        else:
            login = await to_thread.run_sync(access_tokens.find, store, given)
        if login is None:
            return await self._wrong_token(scope, receive, send, given)
        route = access_rules.matched_route(scope["app"].router.routes, scope)
        action = access_rules.action_for(method, route)
        if not access_rules.allowed(login.role, action) or (
                where == "cookie" and action != access_rules.READ and action != access_rules.OPEN):
            return await self._refuse(scope, receive, send, 403, f"a {login.role} token may not "
                                      f"{method} {scope.get('path', '')[:200]!r} (docs/security.md: roles)")
        run_id = access_rules.run_named(route, scope)
        if run_id is not None:
            def known() -> bool:
                with scoped(login.visible):
                    return store.run_row(run_id) is not None
            # Ingest may make a run; a route naming one reads or changes a run that must be visible.
            if not await to_thread.run_sync(known):
                return await self._refuse(scope, receive, send, 404, f"unknown run id {run_id[:200]!r}")
        return login

    async def _admitted(self, scope, receive, send, kind: str, headers: dict) -> None:
        """The request, past the token and origin checks: a WebSocket as it is, HTTP within the body limits."""
        if kind == "websocket":
            return await self.app(scope, receive, send)

        limit = self.settings.max_body_bytes
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return await self._respond(send, 400, f"bad Content-Length {length[:40]!r}")
            if int(length) > limit:
                return await self._respond(send, 413, f"body of {int(length)} bytes is over the limit "
                                                      f"of {limit}; split the batch")
        await self._guarded(scope, receive, send, limit)

    async def _guarded(self, scope, receive, send, limit: int) -> None:
        state = {"read": 0, "done": False, "started": False, "refused": None, "since": None}
        timeout_s = self.settings.body_timeout_s
        min_rate = self.settings.min_body_bytes_per_s

        async def limited_receive():
            if state["done"]:
                return await receive()  # after the body: the app may wait for a disconnect
            now = time.monotonic()
            if state["since"] is None:
                state["since"] = now
            # A drip never goes silent for the whole timeout: the body as a whole must arrive
            # at `min_rate` on average, after a grace of one timeout.
            rate_left_s = state["since"] + timeout_s + state["read"] / min_rate - now
            wait_s = min(timeout_s, rate_left_s)
            try:
                if wait_s <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), wait_s)
            except asyncio.TimeoutError:
                detail = (f"no request data for {timeout_s:g} s" if wait_s == timeout_s else
                          f"request body slower than {min_rate:g} bytes/s")
                state["refused"] = BodyRefused(408, detail)
                raise state["refused"] from None
            if message["type"] == "http.request":
                state["read"] += len(message.get("body", b""))
                if state["read"] > limit:
                    state["refused"] = BodyRefused(413, f"body is over the limit of {limit} bytes; "
                                                        f"split the batch")
                    raise state["refused"]
                state["done"] = not message.get("more_body", False)
            else:
                state["done"] = True
            return message

        async def secured_send(message):
            if state["refused"] is not None:
                return  # the app caught our refusal and answers anyway: ours goes out instead
            if message["type"] == "http.response.start":
                state["started"] = True
                message = dict(message, headers=[*message.get("headers", []),
                                                 *response_headers(scope, SECURITY_HEADERS)])
            elif message["type"] == "http.response.body" and message.get("more_body"):
                # A streamed answer (the CSV export) to a client that stopped reading: cut after
                # the body timeout, so the export's read transaction ends and the WAL can be
                # checkpointed again (it once stayed pinned for as long as the client waited).
                try:
                    return await asyncio.wait_for(send(message), timeout_s)
                except asyncio.TimeoutError:
                    raise ClientStalled(f"the client read nothing for {timeout_s:g} s of a streamed "
                                        f"answer") from None
            await send(message)

        try:
            await self.app(scope, limited_receive, secured_send)
        except Exception as exc:
            # Raised through the app (perhaps inside an ExceptionGroup from a task group):
            # our refusal of the body answers; a client gone mid-body is one line; any other
            # error is answered 500 here, with the security headers.
            if state["refused"] is None:
                return await self._app_failed(exc, scope, send, state["started"], timeout_s)
        refused = state["refused"]
        if refused is not None and not state["started"]:
            await self._respond(send, refused.status, refused.detail)

    async def _app_failed(self, exc: Exception, scope, send, started: bool, timeout_s: float) -> None:
        """An error raised through the app that is not our refusal of the body: a client gone
        mid-body is one line, a client that stopped reading a streamed answer closes its
        generators, anything else is logged (one traceback per kind) and answered 500."""
        where = f"{scope.get('method')} {scope.get('path', '')[:200]!r}"
        if _client_disconnected(exc):
            log.info("client %s disconnected before sending the whole body of %s",
                     _client_text(scope), where)
            return
        if _caused_by(exc, ClientStalled):
            # The route's generators (the export's read transaction) closed now, not
            # whenever the garbage collector gets to them.
            for close in scope.get(ON_ABORT, ()):
                await asyncio.get_running_loop().run_in_executor(None, close)
            stalled.error("stalled", "client %s read nothing for %g s of a streamed answer to %s; "
                          "connection closed", _client_text(scope), timeout_s, where)
            return  # unfinished: uvicorn closes the connection (one rate-limited line)
        kind = type(exc).__name__
        log.error("internal error on %s: %s: %s", where, kind, str(exc)[:300],
                  exc_info=exc if kind not in _traced else None)  # one traceback per kind
        _traced.add(kind)
        if started:
            raise exc
        return await self._respond(send, 500, "internal error; the collector's log says which")

    # ---- answers -----------------------------------------------------------------------------
    async def _respond(self, send, status: int, detail: str, extra=()) -> None:
        body = orjson.dumps({"service": SERVICE, "detail": detail})
        # Connection: close, as the unread rest of a refused body must not be taken for the
        # next request.
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"), *SECURITY_HEADERS, *extra]})
        await send({"type": "http.response.body", "body": body})

    async def _prove(self, send, challenge: str) -> None:
        from ...local_secrets import MAX_CHALLENGE_CHARS, proof
        if not (16 <= len(challenge) <= MAX_CHALLENGE_CHARS and all(c in "0123456789abcdef" for c in challenge)):
            return await self._respond(send, 422, "challenge: 16 to 128 lowercase hex digits")
        body = orjson.dumps({"service": SERVICE, "proof": proof(self.settings.collector_key, challenge)})
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"), *SECURITY_HEADERS]})
        await send({"type": "http.response.body", "body": body})

    async def _refuse(self, scope, receive, send, status: int, detail: str, extra=()) -> None:
        if scope["type"] == "http":
            return await self._respond(send, status, detail, extra)
        message = await receive()  # websocket.connect
        if message["type"] != "websocket.connect":
            return
        if "websocket.http.response" in scope.get("extensions", {}):
            return await self._respond(_WebSocketDenial(send), status, detail, extra)
        await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})

    async def _login_redirect(self, scope, send, query: str, login=None) -> None:
        # A browser logs in once with ?token=: a cookie from then on, and the token leaves the
        # address bar (and the browser's history).
        rest = urlencode([(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "token"])
        path = scope.get("raw_path") or scope["path"].encode("utf-8")
        path = b"/" + path.lstrip(b"/")  # `//host/` would send the browser to another site
        location = path + (f"?{rest}".encode("latin-1", "replace") if rest else b"")
        cookie = SimpleCookie()
        cookie[self.cookie] = (self.sessions.new_value() if login is None else
                               self.sessions.new_project_value(login.id, login.role, login.projects))
        cookie[self.cookie].update({"httponly": True, "samesite": "Strict", "path": "/", "max-age": SESSION_S,
                                    "secure": scope.get("scheme") == "https"})
        await send({"type": "http.response.start", "status": 303, "headers": [
            (b"location", location), (b"content-length", b"0"),
            (b"set-cookie", cookie[self.cookie].OutputString().encode("latin-1")), *SECURITY_HEADERS]})
        await send({"type": "http.response.body", "body": b""})


PRINCIPAL = "starvewatch.project_token"  # scope key: the project token a request was admitted with


def _is_project_token(given: str | None, where: str) -> bool:
    """A project token (or its login cookie), checked by the store rather than against the
    collector's own token."""
    if given is None:
        return False
    if where == "cookie":
        return given.startswith(Sessions.PROJECT_PREFIX)
    return access_tokens.looks_like(given)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _client_key(scope) -> str:
    """A client for the slowing of wrong tokens: its address, and on loopback its local user."""
    client = scope.get("client")
    address = client[0] if client else "?"
    uid = peer_uid(client, scope.get("server"))
    return address if uid is None else f"{address}/uid={uid}"


def _client_text(scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


class _WebSocketDenial:
    """Sends an HTTP answer to a WebSocket handshake (the ASGI denial-response extension)."""

    def __init__(self, send) -> None:
        self.send = send

    async def __call__(self, message):
        await self.send(dict(message, type=message["type"].replace("http.", "websocket.http.", 1)))
