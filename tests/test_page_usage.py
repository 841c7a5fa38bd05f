"""The page shows what a run used beside its time, and what its user's budget has left
(issue 34): a finished run's CPU and peak memory from its record, and, for a user with a
CPU-seconds budget, `GET /v1/usage`'s CPU left this hour in the header (hidden without one).
Chromium, a real local gateway with a tokens file."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import Page
from tests.support import GatewayThread, serving

LIMITED, FREE = "limited-token-0123456789", "free-token-0123456789ab"
BUDGET_S = 30.0  # under a minute: written to a tenth of a second


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    tokens: Path = tmp_path_factory.mktemp("page-usage") / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                LIMITED: {"user": "lim", "role": "user", "cpu_seconds_per_hour": BUDGET_S},
                FREE: {"user": "free", "role": "user"},
            }
        )
    )
    yield from serving(
        GatewayThread(backend="local", tokens=tokens, allow_local_multi_user=True).start()
    )


@pytest.fixture
def context(chromium_browser: Any) -> Iterator[Any]:
    made = chromium_browser.new_context(viewport={"width": 1360, "height": 900})
    try:
        yield made
    finally:
        made.close()


def run_with(page: Page, token: str) -> None:
    p = page.page
    p.fill("#token", token)
    p.locator("#token").dispatch_event("change")
    page.type_code("x = sum(range(20_000_000)); print(x)")  # about half a CPU-second
    p.locator("#run").click()
    assert page.wait_status("succeeded", "failed", "error") == "succeeded"


def test_a_runs_usage_and_the_budget_left(context: Any, gateway: GatewayThread) -> None:
    page = Page(context.new_page(), f"http://127.0.0.1:{gateway.port}")
    run_with(page, LIMITED)
    p = page.page
    shown = p.locator("#duration").inner_text()
    assert re.search(r"CPU \d+ ms|CPU \d+\.\d s", shown) and "peak" in shown, shown
    budget = p.locator("#budget")
    budget.wait_for(state="visible")
    text = budget.inner_text()
    match = re.fullmatch(r"CPU left: (?:(\d+) min )?(\d+(?:\.\d)?) s this hour", text)
    assert match, text
    shown = 60 * int(match[1] or 0) + float(match[2])
    # what the gateway says is left (nothing was spent since the page asked), as written
    record = gateway.client(LIMITED).request("GET", "/v1/usage").json()["users"][0]
    left = record["last_hour"]["cpu_seconds_left"]
    assert left < BUDGET_S - 0.2 and abs(shown - left) <= 0.15, (text, left)


def test_no_budget_shows_none(context: Any, gateway: GatewayThread) -> None:
    page = Page(context.new_page(), f"http://127.0.0.1:{gateway.port}")
    run_with(page, FREE)
    assert "CPU" in page.page.locator("#duration").inner_text()
    assert page.page.locator("#budget").is_hidden()
