"""The web page at `/` and its files under `/static/`: public, no build step, strict CSP.

The page (gateway/static/) talks to `WebSocket /v1/stream`. Untrusted output never runs in
the page's origin: HTML outputs go into `<iframe sandbox srcdoc>`, images into `<img>`.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from gateway.errors import NotFound
from gateway.handlers.base import BaseHandler

STATIC = Path(__file__).resolve().parent.parent / "static"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain; charset=utf-8",
    ".map": "application/json; charset=utf-8",
}

# Scripts and styles only from this gateway; images also as data: URLs (outputs); the
# WebSocket and downloads to this gateway only; nothing may frame the page. Inline styles
# are allowed for the pandas/HTML outputs, which render in sandboxed srcdoc iframes that
# inherit this policy (no scripts run there: the sandbox has no allow-scripts).
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "frame-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)

_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*$")


class _PageFileHandler(BaseHandler):
    public = True

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Cache-Control", "no-cache")  # revalidate (ETag) on every load
        self.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.set_header("Referrer-Policy", "no-referrer")
        self.set_header("X-Frame-Options", "DENY")
        self.set_header("Cross-Origin-Opener-Policy", "same-origin")

    async def send_file(self, name: str) -> bytes:
        path = STATIC / name
        content_type = CONTENT_TYPES.get(path.suffix)
        if not _NAME.match(name) or content_type is None:
            raise NotFound(f"There is no page file {name!r}.")
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NotFound(f"There is no page file {name!r}.") from exc
        self.set_header("Content-Type", content_type)
        return data


class PageHandler(_PageFileHandler):
    """`GET /`: the page, told whether this gateway wants a token. A link from another
    site may open it (a cross-site navigation); the page runs nothing by itself."""

    navigation_ok = True

    async def get(self) -> None:
        html = (await self.send_file("index.html")).decode("utf-8")
        auth = "token" if self.services.tokens.enabled else "none"
        self.finish(html.replace("{{auth}}", auth))


class StaticHandler(_PageFileHandler):
    """`GET /static/<name>`: the page's scripts, styles and vendored files."""

    async def get(self, name: str) -> None:
        self.finish(await self.send_file(name))
