"""The web page's files and headers, without a browser: the Content-Security-Policy, the
static files' media types, and paths that try to leave the static folder."""

from __future__ import annotations

from tests.api import assert_error
from tests.support import GatewayThread


def test_the_page_files_and_their_headers(local_gateway: GatewayThread) -> None:
    client = local_gateway.client()
    page = client.request("GET", "/")
    assert page.status == 200 and page.headers["Content-Type"] == "text/html; charset=utf-8"
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "frame-ancestors 'none'" in csp
    assert b'content="none"' in page.body  # no token needed on this gateway
    for name, kind in [
        ("app.js", "text/javascript"),
        ("render.js", "text/javascript"),
        ("stream.js", "text/javascript"),
        ("style.css", "text/css"),
    ]:
        response = client.request("GET", f"/static/{name}")
        assert response.status == 200 and response.headers["Content-Type"].startswith(kind)
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    for bad in ["../server.py", "..%2Fserver.py", "nope.js", ".hidden.js", "index.py", ""]:
        assert_error(client.request("GET", f"/static/{bad}"), 404, "not_found")
