"""One headless Chromium for the tests that drive the page (Playwright).

Chromium double-forks its crash handlers, so they are reparented to pytest (the census's
subreaper) rather than to the browser: the whole launch happens inside
`census.harness_owned`, which claims them with the driver, and they end with the browser.
Without Playwright or Chromium the test is skipped, or fails under GATEWAY_REQUIRE=chromium.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests import census, needs

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A launched Playwright browser, closed (with its driver) on exit."""
    sync_api = needs.import_module(
        "playwright.sync_api", "chromium", "install the test extras (pip install -e '.[test]')"
    )
    if not CHROMIUM.exists():
        needs.missing("chromium", f"{CHROMIUM} is missing (apt-get install chromium)")
    with census.harness_owned("Playwright's driver, Chromium and its crash handlers"):
        playwright = sync_api.sync_playwright().start()
        try:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        except BaseException:
            playwright.stop()
            raise
    try:
        yield browser
    finally:
        try:
            browser.close()
        finally:
            playwright.stop()
