"""The web page's files and headers, without a browser: the Content-Security-Policy (no
inline script or eval anywhere; inline style only by this answer's nonce and the output
frames' hash), the bundle's files, their media types and caching, and paths that try to
reach anything else (the sources, the manifest, the folder above)."""

from __future__ import annotations

import json
import re

from tests.api import assert_error
from tests.support import REPO, GatewayThread

DIST = REPO / "gateway" / "static" / "dist"


def directives(csp: str) -> dict[str, list[str]]:
    parsed: dict[str, list[str]] = {}
    for part in csp.split(";"):
        name, *values = part.split()
        parsed[name] = values
    return parsed


def test_the_page_and_its_policy(local_gateway: GatewayThread) -> None:
    client = local_gateway.client()
    page = client.request("GET", "/")
    assert page.status == 200 and page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert page.headers["X-Frame-Options"] == "DENY"
    csp = page.headers["Content-Security-Policy"]
    policy = directives(csp)
    assert policy["default-src"] == ["'none'"]
    assert policy["script-src"] == ["'self'"]  # no inline script, no eval, nothing foreign
    assert policy["frame-ancestors"] == ["'none'"] and policy["form-action"] == ["'none'"]
    assert policy["connect-src"] == ["'self'"] and policy["base-uri"] == ["'none'"]
    assert policy["font-src"] == ["'self'"]  # KaTeX's fonts, from the bundle
    assert "unsafe" not in csp  # neither unsafe-inline nor unsafe-eval, for scripts or styles
    assert b'name="gateway-auth" content="none"' in page.body  # no token on this gateway

    # Inline style: CodeMirror's element, by a nonce that is this answer's alone, and the
    # output frames' sheet, by the hash of src/frame.css.
    html = page.body.decode()
    nonce = re.search(r'<meta name="style-nonce" content="([^"]+)">', html)
    assert nonce and len(nonce.group(1)) >= 22
    manifest = json.loads((DIST / "manifest.json").read_text())
    assert policy["style-src"] == [
        "'self'",
        f"'nonce-{nonce.group(1)}'",
        f"'sha256-{manifest['frame_style_sha256']}'",
    ]
    again = client.request("GET", "/")
    assert nonce.group(1) not in again.headers["Content-Security-Policy"]
    assert "{{" not in html  # every placeholder filled


def test_the_bundle_files_and_their_headers(local_gateway: GatewayThread) -> None:
    client = local_gateway.client()
    html = client.request("GET", "/").body.decode()
    manifest = json.loads((DIST / "manifest.json").read_text())
    script, style = manifest["script"], manifest["style"]
    assert f'<script type="module" src="/static/dist/{script}">' in html
    assert f'<link rel="stylesheet" href="/static/dist/{style}">' in html
    assert f'<link rel="stylesheet" href="/static/dist/{manifest["vendor_style"]}">' in html
    fonts = [name for name in manifest["files"] if name.endswith(".woff2")]
    assert len(fonts) == 20 and all(name.startswith("KaTeX_") for name in fonts), fonts
    page_script = client.request("GET", f"/static/dist/{script}")
    # the page's modules import the vendor bundle by its hashed name, next to them
    assert f'from"./{manifest["vendor"]}"'.encode() in page_script.body
    for name, kind in [
        (script, "text/javascript"),
        (manifest["vendor"], "text/javascript"),
        (style, "text/css"),
        (f"{script}.map", "application/json"),
        (f"{manifest['vendor']}.map", "application/json"),
        (manifest["vendor_style"], "text/css"),
        *((font, "font/woff2") for font in fonts),
    ]:
        response = client.request("GET", f"/static/dist/{name}")
        assert response.status == 200 and response.headers["Content-Type"].startswith(kind)
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        # a name changes with its content: cached for good
        assert response.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert response.body == (DIST / name).read_bytes()


def test_nothing_else_is_served(local_gateway: GatewayThread) -> None:
    client = local_gateway.client()
    for bad in [
        "../handlers/page.py",
        "..%2Fhandlers%2Fpage.py",
        "dist/..%2F..%2Fhandlers%2Fpage.py",
        "dist/manifest.json",
        "index.html",
        "src/main.js",
        "src/frame.css",
        "dist/page-ABCDEFGH.js",  # the shape of a bundle file, but none
        "dist/page-abcdefgh.js",
        "dist/.page-ABCDEFGH.js",
        "dist/page-ABCDEFGH.js.txt",
        "dist/KaTeX_Main-Regular-ABCDEFGH.woff2",  # the shape of a font, but none
        "dist/KaTeX_Main-Regular.woff2",
        "dist/../dist/manifest.json",
        "dist/evil-ABCDEFGH.woff2",
        "dist/",
        "nope.js",
        "",
    ]:
        assert_error(client.request("GET", f"/static/{bad}"), 404, "not_found")
