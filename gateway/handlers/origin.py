"""Which browser requests come from somewhere else (cross-site request forgery).

A web page can make the browser send requests to any address, the developer's gateway on
127.0.0.1 included, and in single-user mode those need no token. What the browser cannot
hide is where the request comes from: it sends `Origin` on every POST and WebSocket
handshake, and `Sec-Fetch-Site` on every request. So for every endpoint (HTTP and
WebSocket) a request is refused when

- its `Origin` is neither this gateway's own (the `Origin`'s host and port are the `Host`
  header's) nor one of the operator's `allowed_origins` (`*` allows any, but only with
  tokens: without them every page could run code as the local user), or
- it carries no `Origin` and `Sec-Fetch-Site: cross-site` (a cross-site GET sends none),

except a top-level navigation to the page (`GET /` with `Sec-Fetch-Mode: navigate`), so that
a link to the gateway still opens it: the page runs nothing by itself. Plain API clients
send neither header and are not affected. The other half of the defence is in
`BaseHandler.json_body`: only JSON media types, which a page cannot send to another site
without the CORS preflight this gateway never answers.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable

from tornado.httputil import HTTPHeaders, HTTPServerRequest

from gateway.auth import is_loopback_host
from gateway.errors import Forbidden


def _normal(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def origin_allowed(origin: str, host: str, allowed_origins: Iterable[str]) -> bool:
    """Same origin (the `Origin`'s host:port is `host`), or one the operator allows."""
    normal = _normal(origin)
    allowed = {_normal(o) for o in allowed_origins}
    if "*" in allowed or normal in allowed:
        return True
    parts = urllib.parse.urlsplit(normal)
    return parts.scheme in ("http", "https") and parts.netloc == host.strip().lower()


def cross_site_refusal(
    headers: HTTPHeaders, allowed_origins: Iterable[str], *, navigation_ok: bool = False
) -> str | None:
    """Why this request must be refused as cross-site, or None when it may go on.

    `navigation_ok`: a top-level navigation (`Sec-Fetch-Mode: navigate`) without an
    `Origin` is let through (the page)."""
    origin = headers.get("Origin")
    host = headers.get("Host", "")
    if origin is not None:
        if origin_allowed(origin, host, allowed_origins):
            return None
        return (
            f"Requests from the web origin {origin[:200]!r} are not allowed: this gateway "
            "answers only its own page and the origins its operator allows."
        )
    site = headers.get("Sec-Fetch-Site", "").strip().lower()
    if site == "cross-site":
        if navigation_ok and headers.get("Sec-Fetch-Mode", "").strip().lower() == "navigate":
            return None
        return "Cross-site requests are not allowed (Sec-Fetch-Site: cross-site)."
    return None


def refuse_foreign(
    request: HTTPServerRequest,
    *,
    single_user: bool,
    allowed_origins: Iterable[str],
    navigation_ok: bool = False,
) -> None:
    """Raise Forbidden for a request this gateway must not answer: a cross-site one, or, in
    single-user mode, one addressed to a name that is not loopback (a DNS-rebound web page,
    evil.example -> 127.0.0.1, would otherwise be same-origin with the gateway)."""
    if single_user and not is_loopback_host(request.host):
        raise Forbidden("Without tokens this gateway answers only on a loopback address.")
    if single_user:  # `*` would let every web page run code as the local user
        allowed_origins = [o for o in allowed_origins if o.strip() != "*"]
    reason = cross_site_refusal(request.headers, allowed_origins, navigation_ok=navigation_ok)
    if reason is not None:
        raise Forbidden(reason)
