"""The memory inspector in a real headless browser (Playwright on the system's Chromium),
served by the real command: logged in with the token it printed, a user's facts listed, a
forget's dry run and then the forget, and a browser without the token shown nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from afterthought.backends.base import UserRef
from afterthought.facts import StoredFact
from afterthought.settings import Settings
from tests.adk_support import APP
from tests.browser_support import launch, needs_chromium, playwright_api
from tests.test_inspector import remember, served, stored

pytestmark = needs_chromium


def _stored(settings: Settings, user_id: str) -> tuple[list[UserRef], list[StoredFact]]:
    """:func:`stored`, on a thread of its own: Playwright's sync API runs a loop in this one."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, stored(settings, user_id)).result()


@pytest.fixture
def server(local_settings: Settings) -> Iterator[tuple[str, str]]:
    """``afterthought inspect --allow-forget``, as the command serves it."""
    with served(local_settings, "--allow-forget") as (url, token):
        yield url, token


def test_a_browser_logs_in_sees_the_facts_and_forgets_what_the_dry_run_showed(
    local_settings: Settings, server: tuple[str, str], tmp_path: Path
) -> None:
    asyncio.run(remember(local_settings, "alice", "I live in Lisbon.", "I'm allergic to peanuts."))
    _, facts = _stored(local_settings, "alice")
    url, token = server
    with playwright_api.sync_playwright() as p:
        browser = launch(p)
        try:
            stranger = browser.new_page()
            answer = stranger.goto(f"{url}/user?app={APP}&user=alice")
            assert answer is not None and answer.status == 401
            assert "Lisbon" not in stranger.content()

            page = browser.new_page()
            page.goto(f"{url}/login")
            page.fill("#token", token)
            page.click("#login")
            page.fill("#q", "alice")
            page.click("#search")
            page.click("a.user")
            current = page.inner_text("#current")
            assert "lives in: Lisbon" in current and "I live in Lisbon." in current
            page.screenshot(path=str(tmp_path / "user.png"), full_page=True)

            page.click("#forget-user")
            assert int(page.inner_text("#dry-facts")) == len(facts) > 0
            dry_ids = page.inner_text("#dry-ids").split()
            assert _stored(local_settings, "alice")[1] == facts  # nothing yet
            page.click("#confirm")
            assert int(page.inner_text("#done-facts")) == len(facts)
            assert page.inner_text("#done-ids").split() == dry_ids
            assert _stored(local_settings, "alice") == ([], [])

            page.goto(f"{url}/user?app={APP}&user=alice")
            assert page.inner_text("#current") == "None."
            again = stranger.goto(f"{url}/")  # the stranger still gets nothing
            assert again is not None and again.status == 401
            page.click("#logout")  # the browser's own post: its session ends
            ended = page.goto(f"{url}/")
            assert ended is not None and ended.status == 401
        finally:
            browser.close()
