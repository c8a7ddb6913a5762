"""The README's ``adk web`` walk in a real headless browser (issue 26): ``adk web
--memory_service_uri afterthought://`` on the repository's own ``examples/adk_web``, a
worker beside it, and ADK's dev UI driven as a user would: pick the app, say something in
one session, and in a new session see the reply that remembers it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from afterthought.settings import Settings
from afterthought.testing.processes import spawn_worker, wait_settled
from tests.browser_support import launch, needs_chromium, playwright_api
from tests.test_adk_api_server import ROOT, adk_server

pytestmark = needs_chromium

EXAMPLE = ROOT / "examples" / "adk_web"
#: How long a loaded machine may take to answer in the UI, or to store a turn (bounds, not
#: measurements).
REPLY_BOUND_MS = 60_000
SETTLE_BOUND = 60.0
SAID = "I'm allergic to peanuts"
#: Each app of the example: its user, the question of the new session, and what its reply
#: shows of the first. ``PreloadMemoryTool`` searches with the question (words it shares
#: with what was said); the plugin's block holds the facts and recent statements whatever
#: is asked.
CASES = {
    "memory_plugin": ("ada", "Can you suggest a snack for me?", ["allergic to: peanuts", SAID]),
    "memory_tools": ("bob", "What am I allergic to?", [f"user: {SAID}"]),
}


def _settled(settings: Settings) -> bool:
    """:func:`wait_settled`, on a thread of its own: Playwright's sync API runs a loop in
    this one."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, wait_settled(settings, SETTLE_BOUND)).result()


def _say(page: playwright_api.Page, text: str) -> playwright_api.Locator:
    """Type ``text`` into the chat box and send it; the reply's bubble, once there."""
    replies = page.locator(".content-bubble.role-bot")
    before = replies.count()
    box = page.get_by_placeholder("Type a message...")
    box.fill(text)
    box.press("Enter")
    playwright_api.expect(replies).to_have_count(before + 1, timeout=REPLY_BOUND_MS)
    return replies.last


def test_adk_web_on_the_example_remembers_in_a_new_session_what_was_said_in_the_first(
    local_settings: Settings, tmp_path: Path
) -> None:
    agents = tmp_path / "adk_web"  # ADK keeps each agent's sessions beside its agent.py
    shutil.copytree(EXAMPLE, agents, ignore=shutil.ignore_patterns("__pycache__", ".adk"))
    # A home of its own, where ADK's usage-statistics question was answered: the UI opens
    # on the agents, as it does for a user from their second visit on.
    home = tmp_path / "home"
    (home / ".adk").mkdir(parents=True)
    (home / ".adk" / "config.json").write_text(json.dumps({"telemetry": False}))
    env = {**os.environ, **local_settings.as_env(), "HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("GOOGLE_API_KEY", None)  # the example's stand-in model, which shows its memory
    worker = spawn_worker(local_settings)
    try:
        with (
            adk_server("web", agents, "afterthought://", env, tmp_path / "adk.log") as client,
            playwright_api.sync_playwright() as p,
        ):
            browser = launch(p)
            try:
                for app, (user, question, remembered) in CASES.items():
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    page.goto(f"{client.base_url}/dev-ui/?userId={user}")
                    page.get_by_role("button", name="Select an app").click()
                    page.locator("button.app-selector-item", has_text=app).click()
                    first = _say(page, SAID)
                    playwright_api.expect(first).to_contain_text(
                        "no memory", timeout=REPLY_BOUND_MS
                    )
                    first_session = page.url
                    assert _settled(local_settings)

                    page.get_by_role("button", name="New Session").click()
                    reply = _say(page, question)
                    assert page.url != first_session and f"userId={user}" in page.url
                    for text in remembered:
                        playwright_api.expect(reply).to_contain_text(text, timeout=REPLY_BOUND_MS)
                    page.screenshot(path=str(tmp_path / f"{app}.png"))
            finally:
                browser.close()
    finally:
        worker.terminate()
        worker.wait(60)
