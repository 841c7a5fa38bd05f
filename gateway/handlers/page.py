"""The web page at `/` and its bundle under `/static/dist/`: public, strict CSP.

The page's sources are ES modules in `gateway/static/src/`, bundled by esbuild
(`scripts/page.sh build`) into content-hashed files in `gateway/static/dist/`, which are
committed: the gateway serves them as they are and needs no Node, npm or build at run time.
`dist/manifest.json` names the files of the current bundle, and the hash of the one inline
style the page allows (that of the sandboxed output frames). The page talks to
`WebSocket /v1/stream` and the runs API. Untrusted output never runs in the page: HTML
outputs go into `<iframe sandbox="allow-same-origin" srcdoc>` (no scripts), images into
`<img>`, markdown through DOMPurify, math through KaTeX (untrusted: no links, no classes or
styles of the author's).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from pathlib import Path
from typing import Any

from gateway.errors import NotFound
from gateway.handlers.base import BaseHandler

STATIC = Path(__file__).resolve().parent.parent / "static"
DIST = STATIC / "dist"
MANIFEST = DIST / "manifest.json"

CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".map": "application/json; charset=utf-8",
    ".woff2": "font/woff2",
}

# A bundle file: `dist/<name>-<hash>.<ext>` (or its source map), or one of KaTeX's fonts
# (`dist/KaTeX_Main-Regular-<hash>.woff2`); nothing else is served.
_BUNDLE_FILE = re.compile(
    r"^dist/(?:[a-z]+-[A-Z0-9]{8}\.(?:js|css)(?:\.map)?"
    r"|KaTeX_[A-Za-z0-9]+-[A-Za-z0-9]+-[A-Z0-9]{8}\.woff2)$"
)


def content_security_policy(
    frame_style_sha256: str | None = None, style_nonce: str | None = None
) -> str:
    """Scripts and styles only from this gateway; no inline script at all, and two inline
    styles only: CodeMirror's one `<style>` element, which carries this answer's nonce (the
    editor is given it: `EditorView.cspNonce`; its other inline styles are set through the
    CSSOM, which `style-src` does not govern), and the sandboxed output frames' one style
    sheet, allowed by its hash (a `srcdoc` frame inherits this policy: the output's own
    styles would be refused there, so the page applies them through the CSSOM; its scripts
    are refused by the sandbox too). Fonts (KaTeX's) and images from here, images as data:
    URLs too (outputs, charts); the WebSocket and fetches to this gateway only; nothing may
    frame the page, no form may post anywhere."""
    style = "style-src 'self'"
    if style_nonce:
        style += f" 'nonce-{style_nonce}'"
    if frame_style_sha256:
        style += f" 'sha256-{frame_style_sha256}'"
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            style,
            "img-src 'self' data:",
            "font-src 'self'",
            "connect-src 'self'",
            "frame-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


def _read_manifest() -> dict[str, Any]:
    try:
        manifest = json.loads(MANIFEST.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise NotFound(
            "The page's bundle is missing or unreadable (gateway/static/dist/manifest.json): "
            "run scripts/page.sh build."
        ) from exc
    if not isinstance(manifest, dict):
        raise NotFound("The page's bundle manifest is not an object: run scripts/page.sh build.")
    return manifest


class _PageFileHandler(BaseHandler):
    public = True

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Cache-Control", "no-cache")  # revalidate (ETag) on every load
        self.set_header("Content-Security-Policy", content_security_policy())
        self.set_header("Referrer-Policy", "no-referrer")
        self.set_header("X-Frame-Options", "DENY")
        self.set_header("Cross-Origin-Opener-Policy", "same-origin")


class PageHandler(_PageFileHandler):
    """`GET /`: the page, told whether this gateway wants a token and which bundle to load.
    A link from another site may open it (a cross-site navigation); the page runs nothing by
    itself."""

    navigation_ok = True

    async def get(self) -> None:
        manifest, html = await asyncio.to_thread(
            lambda: (_read_manifest(), (STATIC / "index.html").read_text("utf-8"))
        )
        auth = "token" if self.services.tokens.enabled else "none"
        nonce = secrets.token_urlsafe(18)  # new with every answer, so never guessable
        for key, value in [
            ("auth", auth),
            ("nonce", nonce),
            ("script", str(manifest.get("script", ""))),
            ("style", str(manifest.get("style", ""))),
            ("vendor_style", str(manifest.get("vendor_style", ""))),
        ]:
            html = html.replace("{{" + key + "}}", value)
        frame_style = manifest.get("frame_style_sha256")
        csp = content_security_policy(
            frame_style if isinstance(frame_style, str) else None, style_nonce=nonce
        )
        self.set_header("Content-Security-Policy", csp)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(html)


class StaticHandler(_PageFileHandler):
    """`GET /static/dist/<name>-<hash>.<ext>`: the page's bundle. A file's name changes with
    its content, so it may be cached for good."""

    async def get(self, name: str) -> None:
        content_type = CONTENT_TYPES.get(Path(name).suffix)
        if not _BUNDLE_FILE.match(name) or content_type is None:
            raise NotFound(f"There is no page file {name!r}.")
        try:
            data = await asyncio.to_thread((STATIC / name).read_bytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NotFound(f"There is no page file {name!r}.") from exc
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", "public, max-age=31536000, immutable")
        self.finish(data)
