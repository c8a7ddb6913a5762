"""The memory inspector's pages through Starlette's TestClient: nothing without the token,
hostile text escaped, a forget's dry run is what the forget deletes, read-only refuses."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from starlette.testclient import TestClient

from afterthought.agent_hooks import create_callbacks
from afterthought.backends import open_backend
from afterthought.backends.base import UserRef
from afterthought.cli import _parser
from afterthought.connections import connect
from afterthought.facts import StoredFact
from afterthought.inspector.app import COOKIE, SECURITY_HEADERS, create_app
from afterthought.settings import Settings
from afterthought.worker.forget import Forgetter
from tests.adk_support import APP, make_runner, new_session, say
from tests.conftest import drain

TOKEN = "the-test-token-" + "x" * 20
HOSTILE = "<script>alert('owned')</script> & <b>bold</b>"


async def remember(settings: Settings, user: str, *lines: str) -> None:
    """``user``'s turns through a real ADK Runner and the callbacks, stored by a worker."""
    runner, _ = make_runner(create_callbacks(settings=settings))
    session = await new_session(runner, user)
    for line in lines:
        await say(runner, user, session, line)
    await drain(settings)


async def stored(settings: Settings, user_id: str) -> tuple[list[UserRef], list[StoredFact]]:
    """What the backend holds of the user, read as the forget reads it."""
    client = connect(settings.redis_url)
    backend = open_backend(settings)
    try:
        users = await Forgetter(settings, client, backend).backend_users(APP, user_id)
        facts = [f for u in users for f in await backend.list_facts(user=u)]
        return users, facts
    finally:
        await backend.aclose()
        await client.aclose()


@contextmanager
def inspector(settings: Settings, **options: bool) -> Iterator[TestClient]:
    app, _ = create_app(settings, token=TOKEN, hosts=["testserver", "127.0.0.1"], **options)
    with TestClient(app, base_url="http://testserver") as client:
        yield client


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _number(page: str, id_: str) -> int:
    found = re.search(rf'id="{id_}">(\d+)<', page)
    assert found, id_
    return int(found.group(1))


def _ids(page: str, id_: str) -> list[str]:
    found = re.search(rf'<ul id="{id_}">(.*?)</ul>', page, re.S)
    assert found, id_
    return re.findall(r"<li>([^<]+)</li>", found.group(1))


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found
    return found.group(1)


@pytest.fixture
def alice(local_settings: Settings) -> Settings:
    asyncio.run(
        remember(local_settings, "alice", "I live in Lisbon.", "I'm allergic to peanuts.", HOSTILE)
    )
    return local_settings


PAGES = [
    "/",
    "/?q=alice",
    f"/user?app={APP}&user=alice",
    f"/forget?app={APP}&user=alice",
    "/dead-letters",
    "/quarantine",
]


def test_without_the_token_every_page_is_401_and_shows_nothing(alice: Settings) -> None:
    with inspector(alice, allow_forget=True) as client:
        for path in PAGES:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": f"{COOKIE}=x"}):
                answer = client.get(path, headers=headers)
                assert answer.status_code == 401, path
                assert "Lisbon" not in answer.text and "alice" not in answer.text
                for name, value in SECURITY_HEADERS.items():
                    assert answer.headers[name] == value
        refused = client.post("/forget", data={"app": APP, "user": "alice"})
        assert refused.status_code == 401
        for path in PAGES:  # and each of them with the token
            assert client.get(path, headers=AUTH).status_code == 200, path
        assert client.get("/", headers={**AUTH, "Host": "evil.example"}).status_code == 400
    _, facts = asyncio.run(stored(alice, "alice"))
    assert facts  # the refused forget deleted nothing


def test_the_login_sets_an_httponly_strict_cookie_that_is_not_the_token(alice: Settings) -> None:
    with inspector(alice) as client:
        wrong = client.post("/login", data={"token": "guess"}, follow_redirects=False)
        assert wrong.status_code == 401 and COOKIE not in wrong.headers.get("set-cookie", "")
        elsewhere = client.post(
            "/login",
            data={"token": TOKEN},
            headers={"Origin": "http://evil.example"},
            follow_redirects=False,
        )
        assert elsewhere.status_code == 401
        right = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert right.status_code == 303
        cookie = right.headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        assert TOKEN not in cookie
        page = client.get(f"/user?app={APP}&user=alice")  # the client keeps the cookie
        assert page.status_code == 200 and "Lisbon" in page.text


def test_hostile_text_is_shown_escaped(alice: Settings) -> None:
    with inspector(alice) as client:
        page = client.get(f"/user?app={APP}&user=alice", headers=AUTH).text
    escaped = "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;"
    assert escaped in page
    assert "<script" not in page and "<b>bold" not in page


def test_a_users_page_shows_facts_with_the_statements_they_came_from(alice: Settings) -> None:
    with inspector(alice) as client:
        page = client.get(f"/user?app={APP}&user=alice", headers=AUTH).text
        listed = client.get("/?q=ali", headers=AUTH).text
    current = page.partition('id="current"')[2].partition("</table>")[0]
    assert "lives in: Lisbon" in current
    assert "“I live in Lisbon.”" in current  # its provenance, quoted
    assert 'class="text statement">I live in Lisbon.<' in page
    assert "/user?app=memtest&amp;user=alice" in listed


def test_the_forget_of_a_user_deletes_what_its_dry_run_listed(alice: Settings) -> None:
    asyncio.run(remember(alice, "bob", "I live in Oslo."))
    _, facts = asyncio.run(stored(alice, "alice"))
    with inspector(alice, allow_forget=True) as client:
        dry = client.get(f"/forget?app={APP}&user=alice", headers=AUTH).text
        assert _number(dry, "dry-facts") == len(facts) > 0
        assert _number(dry, "dry-statements") == 6  # three turns and three replies
        assert _ids(dry, "dry-ids") == [f.uuid for f in facts][:5]
        assert asyncio.run(stored(alice, "alice"))[1] == facts  # a dry run deletes nothing

        done = client.post(
            "/forget", data={"app": APP, "user": "alice", "csrf": _csrf(dry)}, headers=AUTH
        )
        assert done.status_code == 200
    assert _number(done.text, "done-facts") == _number(dry, "dry-facts")
    assert _number(done.text, "done-statements") == _number(dry, "dry-statements")
    assert _ids(done.text, "done-ids") == _ids(dry, "dry-ids")
    assert asyncio.run(stored(alice, "alice")) == ([], [])
    assert asyncio.run(stored(alice, "bob"))[1]  # nobody else's


def test_the_forget_of_a_fact_deletes_what_its_dry_run_listed(alice: Settings) -> None:
    _, facts = asyncio.run(stored(alice, "alice"))
    (peanuts,) = [f for f in facts if "peanut" in f.value]
    with inspector(alice, allow_forget=True) as client:
        dry = client.get(f"/forget?app={APP}&user=alice&fact={peanuts.uuid}", headers=AUTH).text
        assert _ids(dry, "dry-ids") == [peanuts.uuid]
        done = client.post(
            "/forget",
            data={"app": APP, "user": "alice", "fact": peanuts.uuid, "csrf": _csrf(dry)},
            headers=AUTH,
        ).text
    assert _ids(done, "done-ids") == [peanuts.uuid]
    assert _number(done, "done-statements") == _number(dry, "dry-statements")
    left = asyncio.run(stored(alice, "alice"))[1]
    assert [f.uuid for f in left] == [f.uuid for f in facts if f.uuid != peanuts.uuid]


def test_a_read_only_inspector_shows_the_dry_run_and_refuses_the_forget(alice: Settings) -> None:
    with inspector(alice) as client:
        dry = client.get(f"/forget?app={APP}&user=alice", headers=AUTH).text
        assert 'id="read-only"' in dry and 'id="confirm"' not in dry
        csrf = re.search(r'value="([0-9a-f]{64})"', dry)
        assert csrf is None  # no form to post
        refused = client.post("/forget", data={"app": APP, "user": "alice"}, headers=AUTH)
        assert refused.status_code == 403
    assert asyncio.run(stored(alice, "alice"))[1]


def test_a_forget_without_its_csrf_token_or_from_another_origin_is_refused(
    alice: Settings,
) -> None:
    with inspector(alice, allow_forget=True) as client:
        client.post("/login", data={"token": TOKEN})
        csrf = _csrf(client.get(f"/forget?app={APP}&user=alice").text)
        form = {"app": APP, "user": "alice"}
        assert client.post("/forget", data=form).status_code == 403
        assert client.post("/forget", data={**form, "csrf": "0" * 64}).status_code == 403
        other = client.post(
            "/forget", data={**form, "csrf": csrf}, headers={"Origin": "http://evil.example"}
        )
        assert other.status_code == 403
        cross = client.post(
            "/forget", data={**form, "csrf": csrf}, headers={"Sec-Fetch-Site": "cross-site"}
        )
        assert cross.status_code == 403
    assert asyncio.run(stored(alice, "alice"))[1]


def test_its_logs_hold_no_id_and_no_content(
    alice: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with inspector(alice, allow_forget=True) as client:
        for path in PAGES:
            client.get(path, headers=AUTH)
        dry = client.get(f"/forget?app={APP}&user=alice", headers=AUTH).text
        client.post("/forget", data={"app": APP, "user": "alice", "csrf": _csrf(dry)}, headers=AUTH)
    said = "\n".join(r.getMessage() for r in caplog.records if r.name == "afterthought.inspect")
    assert "route=/user status=200" in said and "forget user=" in said
    for word in ("alice", "Lisbon", "peanut", "script", "q="):
        assert word not in said


def test_it_listens_on_loopback_unless_told_otherwise() -> None:
    args = _parser().parse_args(["inspect"])
    assert args.host == "127.0.0.1" and not args.allow_forget
