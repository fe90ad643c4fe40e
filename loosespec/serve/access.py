"""Who may call the server: the ``Host`` / ``Origin`` checks (:class:`_Access`, a guard against DNS rebinding),
``--allow-origin`` parsing, and :class:`_Gate`, the ASGI middleware that applies them with the body size limit,
the API key on ``/v1/*`` and request counting."""

from __future__ import annotations

import secrets
import urllib.parse
from typing import Optional

from loosespec.serve.metrics import Metrics
from loosespec.serve.protocol import ApiError, ServerSettings

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _host_port(value: str) -> Optional[tuple[str, Optional[int]]]:
    """``name[:port]`` (a Host header, an origin's authority) as (lower-case name, port or None); None if malformed
    (``evil:80@127.0.0.1`` is malformed here: no user part)."""
    try:
        parts = urllib.parse.urlsplit("//" + value.strip())
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    return name.rstrip("."), port


def _origin(value: str) -> Optional[tuple[str, str, Optional[int]]]:
    """``scheme://name[:port]`` as (scheme, name, port: the scheme's default when none is written); None if
    malformed (a path, ``null``)."""
    scheme, sep, rest = value.strip().partition("://")
    if not sep or not scheme or not all(c.isalnum() or c in "+.-" for c in scheme):
        return None
    authority = _host_port(rest)
    if authority is None:
        return None
    scheme = scheme.lower()
    return scheme, authority[0], authority[1] if authority[1] is not None else _DEFAULT_PORTS.get(scheme)


def parse_allow_origins(values) -> tuple[str, ...]:
    """``--allow-origin`` values (each may list several, comma-separated): ``*``, origins
    (``http://localhost:3000``) or host names (``gpu-box.lan``, ``gpu-box.lan:8000``). Raises ValueError naming a
    value that is neither."""
    out: list[str] = []
    for value in values or ():
        for item in str(value).split(","):
            item = item.strip()
            if not item:
                continue
            if item != "*":
                shown = item[:-1] if item.endswith("/") and "://" in item else item
                if ("://" in item and _origin(shown) is None) or ("://" not in item and _host_port(item) is None):
                    raise ValueError(
                        f"--allow-origin {item!r} is neither an origin (scheme://host[:port], no path), "
                        "a host name (host[:port]) nor '*'"
                    )
                item = shown
            out.append(item)
    return tuple(dict.fromkeys(out))


class _Access:
    """Which requests the server answers, by their ``Host`` and ``Origin`` headers: a guard against DNS rebinding
    (a web page whose name an attacker resolves to 127.0.0.1 would otherwise drive a server on loopback).

    ``Host`` must name the bound address, a loopback name (localhost, 127.0.0.1, ::1) or the address the connection
    arrived at, with the server's port when a port is written, or a host of ``--allow-origin``; not checked on a
    wildcard bind (0.0.0.0, ::: the server is open to the network and reachable by names it cannot know; use
    --api-key). ``Origin``, when sent (browsers do), must be listed by ``--allow-origin`` (an origin, or a host name:
    any scheme and port) or be the request's own origin (the Host's: FastAPI's /docs page). ``*`` allows any."""

    def __init__(self, bind_host: str, allow: tuple[str, ...]):
        self.any = "*" in allow
        bind = bind_host.strip().strip("[]").lower().rstrip(".")
        self.wildcard = bind in ("", "0.0.0.0", "::")
        self.names = set(_LOOPBACK_NAMES) | (set() if self.wildcard else {bind})
        self.origins: set[tuple] = set()  # (scheme, name, port)
        self.hosts: set[tuple[str, Optional[int]]] = set()  # for Host: (name, port or None: any)
        self.origin_hosts: set[tuple[str, Optional[int]]] = set()  # for Origin, any scheme: the host names listed
        for item in allow:
            if item == "*":
                continue
            if "://" in item:
                origin = _origin(item)
                self.origins.add(origin)
                self.hosts.add((origin[1], None))  # a proxy in front may forward the origin's name
            else:
                self.hosts.add(_host_port(item))
                self.origin_hosts.add(_host_port(item))

    @staticmethod
    def _listed(entries, name: str, port: Optional[int]) -> bool:
        return any(name == n and (p is None or p == port) for n, p in entries)

    def check(self, host: Optional[str], origin: Optional[str], server, scheme: str = "http") -> Optional[ApiError]:
        if self.any:
            return None
        local_name, local_port = (server[0], server[1]) if server else (None, None)
        if host is not None and not self.wildcard:
            authority = _host_port(host)
            names = self.names | ({str(local_name).lower()} if local_name else set())
            ok = authority is not None and (
                (authority[0] in names and authority[1] in (None, local_port)) or self._listed(self.hosts, *authority)
            )
            if not ok:
                return ApiError(
                    403,
                    f"Host {host!r} is not allowed: this server answers requests addressed to "
                    f"{', '.join(sorted(names))} (port {local_port}), a guard against DNS rebinding; "
                    "to accept this name, start it with --allow-origin NAME",
                    "invalid_request_error",
                    None,
                    "host_not_allowed",
                )
        if origin is not None:
            o = _origin(origin)
            same = None
            if o is not None and host is not None and (authority := _host_port(host)) is not None:
                same = o[0] == scheme and authority[0] == o[1] and (authority[1] or _DEFAULT_PORTS.get(scheme)) == o[2]
            if o is None or not (o in self.origins or self._listed(self.origin_hosts, o[1], o[2]) or same):
                return ApiError(
                    403,
                    f"Origin {origin!r} is not allowed: web pages may call this server only from "
                    "origins named by --allow-origin (a guard against DNS rebinding and cross-site "
                    "requests)",
                    "invalid_request_error",
                    None,
                    "origin_not_allowed",
                )
        return None


class _Gate:
    """Pure ASGI middleware: Host / Origin check (:class:`_Access`), body size limit, bearer-token auth on /v1/*,
    request counting."""

    def __init__(self, app, settings: ServerSettings, metrics: Metrics):
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.key = settings.api_key.encode() if settings.api_key else None
        self.access = _Access(settings.host, settings.allow_origins)
        self.cors = bool(settings.allow_origins)  # a CORS middleware inside answers allowed origins' preflights

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in ("/v1/completions", "/v1/chat/completions", "/v1/models") else None
        status_box = [500]

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
            await send(message)

        try:
            error = self._check(scope, path)
            if error is not None:
                headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
                status_box[0] = error.status
                await error.response(headers)(scope, receive, send)
                return
            await self.app(scope, self._limited(receive), counting_send)
        finally:
            if endpoint is not None:
                self.metrics.requests.labels(endpoint, str(status_box[0])).inc()

    def _check(self, scope, path: str) -> Optional[ApiError]:
        headers: dict = {}
        for name, value in scope.get("headers") or []:
            if name in headers and name in (b"host", b"origin") and headers[name] != value:
                return ApiError(400, f"more than one {name.decode()} header")
            headers[name] = value
        host, origin = headers.get(b"host"), headers.get(b"origin")
        error = self.access.check(
            host.decode("latin-1") if host is not None else None,
            origin.decode("latin-1") if origin is not None else None,
            scope.get("server"),
            scope.get("scheme", "http"),
        )
        if error is not None:
            return error
        if self.cors and scope.get("method") == "OPTIONS" and b"access-control-request-method" in headers:
            return None  # a CORS preflight from an allowed origin: it carries no credentials
        if self.key is not None and path.startswith("/v1"):
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self.key):
                return ApiError(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer <key>'",
                    "authentication_error",
                    None,
                    "invalid_api_key",
                )
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.settings.max_body_bytes
            except ValueError:
                return ApiError(400, "bad Content-Length header")
            if too_big:
                return ApiError(
                    413, f"request body over {self.settings.max_body_bytes} bytes", code="request_too_large"
                )
        return None

    def _limited(self, receive):
        limit, seen = self.settings.max_body_bytes, [0]

        async def wrapped():
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > limit:  # a chunked body without Content-Length: cut it off
                    raise ApiError(413, f"request body over {limit} bytes", code="request_too_large")
            return message

        return wrapped
