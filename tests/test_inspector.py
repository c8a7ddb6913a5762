"""The memory inspector's pages through Starlette's TestClient: nothing without the token,
hostile text escaped, a forget's dry run is what the forget deletes, read-only refuses."""

from __future__ import annotations

import asyncio
import html
import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from afterthought.agent_hooks import create_callbacks
from afterthought.backends import open_backend
from afterthought.backends.base import UserRef
from afterthought.cli import _parser
from afterthought.connections import connect
from afterthought.facts import StoredFact
from afterthought.inspector.app import COOKIE, SECURITY_HEADERS, Inspector, create_app
from afterthought.settings import Settings
from afterthought.shared_store import announce
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
def served_app(settings: Settings, **options: Any) -> Iterator[tuple[TestClient, Inspector]]:
    """The app in a TestClient (its own cookie jar: one browser), and its state."""
    app, state = create_app(settings, token=TOKEN, hosts=["testserver", "127.0.0.1"], **options)
    with TestClient(app, base_url="http://testserver") as client:
        yield client, state


@contextmanager
def inspector(settings: Settings, **options: Any) -> Iterator[TestClient]:
    with served_app(settings, **options) as (client, _):
        yield client


@contextmanager
def served(settings: Settings, *flags: str) -> Iterator[tuple[str, str]]:
    """``afterthought inspect --port 0 FLAGS`` in its own process: its URL and token, as
    it printed them."""
    server = subprocess.Popen(
        [sys.executable, "-m", "afterthought.cli", "inspect", "--port", "0", *flags],
        env={**os.environ, **settings.as_env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        address = re.search(r"(http://\S+?)/login", server.stdout.readline())
        token = server.stdout.readline().removeprefix("token: ").strip()
        assert address and token, server.stderr.read() if server.stderr else ""
        yield address.group(1), token
    finally:
        server.terminate()
        server.wait(timeout=30)


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _number(page: str, id_: str) -> int:
    found = re.search(rf'id="{id_}">(\d+)<', page)
    assert found, id_
    return int(found.group(1))


def _ids(page: str, id_: str) -> list[str]:
    found = re.search(rf'<ul id="{id_}">(.*?)</ul>', page, re.S)
    assert found, id_
    return re.findall(r"<li>([^<]+)</li>", found.group(1))


def _confirm(page: str) -> dict[str, str]:
    """The fields the dry run's confirm posts, as a browser sends them."""
    found = re.search(r'<form method="post" action="/forget">(.*?)</form>', page, re.S)
    assert found, "no confirm"
    fields = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', found.group(1))
    return {name: html.unescape(value) for name, value in fields}


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

        done = client.post("/forget", data=_confirm(dry), headers=AUTH)
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
        done = client.post("/forget", data=_confirm(dry), headers=AUTH).text
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
        confirm = _confirm(client.get(f"/forget?app={APP}&user=alice").text)
        form = {k: v for k, v in confirm.items() if k != "csrf"}
        assert client.post("/forget", data=form).status_code == 403
        assert client.post("/forget", data={**form, "csrf": "0" * 64}).status_code == 403
        other = client.post("/forget", data=confirm, headers={"Origin": "http://evil.example"})
        assert other.status_code == 403
        for site in ("cross-site", "same-site"):  # same-site: another port of this host
            cross = client.post("/forget", data=confirm, headers={"Sec-Fetch-Site": site})
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
        client.post("/forget", data=_confirm(dry), headers=AUTH)
    said = "\n".join(r.getMessage() for r in caplog.records if r.name == "afterthought.inspect")
    assert "route=/user status=200" in said and "forget user=" in said
    for word in ("alice", "Lisbon", "peanut", "script", "q="):
        assert word not in said


def test_it_listens_on_loopback_unless_told_otherwise() -> None:
    args = _parser().parse_args(["inspect"])
    assert args.host == "127.0.0.1" and not args.allow_forget


def _logged_in(client: TestClient, token: str = TOKEN, **headers: str) -> httpx.Response:
    return client.post("/login", data={"token": token}, headers=headers, follow_redirects=False)


def _cookie_of(answer: httpx.Response) -> tuple[str, str, str]:
    """The name, value and attributes of the cookie a login set."""
    name, _, rest = answer.headers["set-cookie"].partition("=")
    value, _, attributes = rest.partition(";")
    return name, value, attributes.lower()


def test_a_login_is_a_session_of_its_own_that_a_logout_ends(local_settings: Settings) -> None:
    with served_app(local_settings, port=8765) as (browser, state):
        with TestClient(browser.app, base_url="http://testserver") as other:
            name, first, attributes = _cookie_of(_logged_in(browser))
            assert _cookie_of(_logged_in(other))[1] != first  # random: one a login
        assert name == f"{COOKIE}_8765"  # two inspectors on one machine keep their own
        assert {"httponly", "samesite=strict", "path=/"} <= {
            a.strip() for a in attributes.split(";")
        }
        assert TOKEN not in first and len(first) >= 40
        page = browser.get("/")
        assert page.status_code == 200
        logout = re.search(r'"/logout"><input type="hidden" name="csrf" value="([^"]+)"', page.text)
        assert logout
        assert browser.post("/logout", data={}).status_code == 403  # its CSRF token, or no logout
        out = browser.post("/logout", data={"csrf": logout.group(1)}, follow_redirects=False)
        assert out.status_code == 303
        browser.cookies.clear()
        again = browser.get("/", headers={"Cookie": f"{name}={first}"})  # a copy of it
        assert again.status_code == 401
        assert len(state.sessions) == 1  # the other browser's


def test_a_login_ends_after_its_idle_time(local_settings: Settings) -> None:
    now = [0.0]
    with served_app(local_settings, session_idle_seconds=600) as (browser, state):
        state.clock = lambda: now[0]
        assert _logged_in(browser).status_code == 303
        for _ in range(3):  # each use keeps it
            now[0] += 500
            assert browser.get("/").status_code == 200
        now[0] += 601
        assert browser.get("/").status_code == 401
        assert state.sessions == {}


def test_one_inspectors_login_is_no_login_of_another(local_settings: Settings) -> None:
    """Two on one machine (cookies are not told apart by port), with one token even."""
    with (
        served_app(local_settings, port=8765) as (first, _),
        served_app(local_settings, port=8766) as (second, _),
    ):
        _, value, _ = _cookie_of(_logged_in(first))
        _logged_in(second)
        copied = second.get("/", headers={"Cookie": f"{COOKIE}_8766={value}"})
        assert copied.status_code == 401
        assert first.get("/").status_code == second.get("/").status_code == 200


def test_a_login_from_a_browser_that_says_only_origin_null_is_taken(
    local_settings: Settings,
) -> None:
    """Under the no-referrer policy a browser without ``Sec-Fetch-Site`` sends ``Origin:
    null`` for our own forms; one that says another site is still refused."""
    with inspector(local_settings) as client:
        for foreign in (
            {"Origin": "http://evil.example"},
            {"Sec-Fetch-Site": "cross-site", "Origin": "null"},
            {"Sec-Fetch-Site": "same-site"},
        ):
            assert _logged_in(client, **foreign).status_code == 401, foreign
        assert _logged_in(client, Origin="null").status_code == 303
        assert client.get("/").status_code == 200


def test_a_forget_from_a_browser_that_says_only_origin_null_runs(alice: Settings) -> None:
    with inspector(alice, allow_forget=True) as client:
        _logged_in(client, Origin="null")
        confirm = _confirm(client.get(f"/forget?app={APP}&user=alice").text)
        done = client.post("/forget", data=confirm, headers={"Origin": "null"})
        assert done.status_code == 200 and 'id="done"' in done.text
    assert asyncio.run(stored(alice, "alice")) == ([], [])


def test_a_forget_where_no_worker_announced_does_not_say_forgotten(alice: Settings) -> None:
    """No worker to compare with (a worker that stops takes its store back): the forget
    deletes from the inspector's store and says it cannot tell whether that is theirs."""
    asyncio.run(remember(alice, "bob", "I live in Oslo."))
    with inspector(alice, allow_forget=True) as client:
        dry = client.get(f"/forget?app={APP}&user=alice", headers=AUTH).text
        assert 'id="unsure"' in dry and "no worker announced its store" in dry
        done = client.post("/forget", data=_confirm(dry), headers=AUTH).text
        assert 'id="unsure"' in done and "Forgotten." not in done
        assert str(alice.local_db_path) in done  # which store it deleted from

        asyncio.run(_announce(alice))  # a worker of this store, alive
        dry = client.get(f"/forget?app={APP}&user=bob", headers=AUTH).text
        assert 'id="unsure"' not in dry
        done = client.post("/forget", data=_confirm(dry), headers=AUTH).text
        assert 'id="forgotten"' in done and 'id="unsure"' not in done
    assert asyncio.run(stored(alice, "alice")) == asyncio.run(stored(alice, "bob")) == ([], [])


async def _announce(settings: Settings) -> None:
    client = connect(settings.redis_url)
    backend = open_backend(settings)
    try:
        await announce(client, settings, backend, worker="inspector-test:1")
    finally:
        await backend.aclose()
        await client.aclose()


def test_a_confirm_runs_only_the_dry_run_it_was_shown(alice: Settings) -> None:
    """What was stored since the dry run the operator saw is shown to them before any of
    it is deleted."""
    with inspector(alice, allow_forget=True) as client:
        seen = client.get(f"/forget?app={APP}&user=alice", headers=AUTH).text
        asyncio.run(remember(alice, "alice", "I'm allergic to shellfish."))
        _, facts = asyncio.run(stored(alice, "alice"))
        again = client.post("/forget", data=_confirm(seen), headers=AUTH)
        assert again.status_code == 409 and 'id="changed"' in again.text
        assert _number(again.text, "dry-facts") == len(facts) > _number(seen, "dry-facts")
        assert asyncio.run(stored(alice, "alice"))[1] == facts  # nothing deleted
        done = client.post("/forget", data=_confirm(again.text), headers=AUTH)
        assert done.status_code == 200 and _number(done.text, "done-facts") == len(facts)
        (peanuts,) = [f for f in facts if "peanut" in f.value]  # forgotten with the user
        gone = client.get(f"/forget?app={APP}&user=alice&fact={peanuts.uuid}", headers=AUTH)
        assert 'id="nothing"' in gone.text
        refused = client.post("/forget", data=_confirm(seen) | {"fact": peanuts.uuid}, headers=AUTH)
        assert refused.status_code == 409 and 'id="nothing"' in refused.text
    assert asyncio.run(stored(alice, "alice")) == ([], [])


@pytest.mark.parametrize(
    ("user_id", "marked"),
    [
        ("\u0430lice", "U+0430"),  # a Cyrillic a
        ("al\u200bice", "U+200B"),  # a zero-width space
        ("alice ", "U+0020"),  # a trailing space
        ("\u202eecila", "U+202E"),  # right-to-left override
    ],
)
def test_a_look_alike_id_is_shown_apart_from_the_id_it_mimics(
    local_settings: Settings, user_id: str, marked: str
) -> None:
    with inspector(local_settings) as client:
        shown = client.get("/user", params={"app": APP, "user": user_id}, headers=AUTH).text
        plain = client.get("/user", params={"app": APP, "user": "alice"}, headers=AUTH).text
        hostile = client.get("/user", params={"app": APP, "user": HOSTILE}, headers=AUTH).text

    def header(page: str) -> str:
        found = re.search(r'<span id="user-id">(.*?)</span> <span class="muted">', page)
        assert found
        return found.group(1)

    assert header(plain) == "alice"
    assert marked in header(shown) and header(shown) != header(plain)
    assert "<script" not in hostile and "&lt;script&gt;" in header(hostile)


IPV6 = socket.has_ipv6


@pytest.mark.skipif(not IPV6, reason="no IPv6")
def test_an_inspector_on_the_ipv6_loopback_answers_its_own_address(
    local_settings: Settings,
) -> None:
    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    with served(local_settings, "--host", "::1") as (url, token):
        assert url.startswith("http://[::1]:")
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.get("/login").status_code == 200
            page = client.get("/", headers={"Authorization": f"Bearer {token}"})
            assert page.status_code == 200
            for host in ("[::2]", "evil.example", "[::1", "[::1]evil"):
                assert client.get("/login", headers={"Host": host}).status_code == 400, host


def test_a_damaged_dead_letter_is_listed_and_breaks_no_page_replay_or_forget(
    alice: Settings,
) -> None:
    """A letter whose header cannot be read (damaged, or another program's) is listed as
    unreadable, and so is a quarantine entry that cannot be read; the pages, a replay and
    a forget's sweep go on past them."""
    from afterthought.dead_letters import DeadLetters
    from afterthought.keys import Keys
    from afterthought.quarantine import UNREADABLE_ENTRY, Quarantine

    async def plant() -> None:
        client = connect(alice.redis_url)
        try:
            dead = Keys.of(alice).dead(Keys.of(alice).shard_ids[0])
            for raw in (b"\xff\xfe not json\n{}", b"[1, 2]\nitem", b"no header at all"):
                await client.rpush(dead, raw)
            await client.expire(dead, 3600)
            quarantined = Keys.of(alice).quarantine(Keys.of(alice).shard_of(APP, "alice"))
            for raw in (b"\xff not json", b"[1]", b'{"fact": 3, "at": "x"}'):
                await client.rpush(quarantined, raw)
            await client.expire(quarantined, 3600)
        finally:
            await client.aclose()

    async def replay_and_forget() -> tuple[int, int]:
        client = connect(alice.redis_url)
        backend = open_backend(alice)
        try:
            replayed = await DeadLetters(client, alice).replay()
            done = await Forgetter(alice, client, backend).forget_user(app=APP, user_id="alice")
            return replayed.malformed, done.users
        finally:
            await backend.aclose()
            await client.aclose()

    asyncio.run(plant())
    with inspector(alice) as client:
        letters = client.get("/dead-letters", headers=AUTH)
        assert letters.status_code == 200
        assert letters.text.count("unreadable letter header") == 3
        assert client.get(f"/user?app={APP}&user=alice", headers=AUTH).status_code == 200
        held = client.get("/quarantine", headers=AUTH)
        assert held.status_code == 200 and held.text.count("unreadable entry") == 3
    malformed, users = asyncio.run(replay_and_forget())
    assert malformed == 3 and users == 1

    async def drop_unreadable() -> int:
        client = connect(alice.redis_url)
        try:
            quarantine = Quarantine(client, alice)
            ids = [e.id for e in await quarantine.entries() if e.reason == UNREADABLE_ENTRY]
            return sum([await quarantine.drop(i) for i in ids])
        finally:
            await client.aclose()

    assert asyncio.run(drop_unreadable()) == 3  # an operator can drop each by its id
    assert asyncio.run(stored(alice, "alice")) == ([], [])
