"""A session's backend thread is kept with its user (issues 21 and 22): Zep v4 takes no
client thread id, so once Redis lost the map of sessions to threads (an idle lifetime, a
snapshot restored) and Zep no longer replays the thread's creation, a session would go on
in a new thread, and the whole-thread reconciliation of what Redis gave back would read
that empty thread and send everything again. The map is rebuilt from the backend instead
(each thread's first message carries its session's tag), once, for a user the backend
already had; a new user pays nothing for it."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis import Redis

from afterthought import identity
from afterthought.backends.base import SESSION_FIELD
from afterthought.backends.zep import ZepBackend
from afterthought.connections import connect
from afterthought.contract import QueuedMessage
from afterthought.identity import IdentityRegistry
from afterthought.keys import MAPPED_FIELD, Keys
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.testing import Fault, ZepFake
from afterthought.testing.redis_server import RedisServer
from afterthought.worker.metrics import THREAD_MAP_REBUILDS
from tests.conftest import drain, enqueue, queued
from tests.redelivery_support import flusher, settings_for


def _ms() -> int:
    return int(time.time() * 1000)


def _said(n: int, *, session: str = "s1") -> QueuedMessage:
    return QueuedMessage.build(
        app="app",
        user_id="ada",
        session_id=session,
        invocation_id=f"inv{n}",
        role="user",
        ordinal=0,
        content=f"m{n}",
    )


def _rebuilds() -> float:
    return sum(
        THREAD_MAP_REBUILDS.labels(outcome)._value.get()  # type: ignore[attr-defined]
        for outcome in ("whole", "truncated")
    )


async def _drain(settings: Settings) -> None:
    worker = flusher(settings)
    try:
        for _ in range(20):
            done = await worker.drain(budget=3.0)
            if not await worker.redis.zcard(worker.keys.ready(None)) and not done:
                return
    finally:
        await worker.redis.aclose()
        await worker.backend.aclose()


@pytest.mark.parametrize("registered", [False, True], ids=["user-lost", "session-lost"])
async def test_a_rollback_with_keys_ignored_keeps_the_session_in_one_thread(
    tmp_path: Path, registered: bool
) -> None:
    """m1..m3 queued, snapshot, stored; m4, m5 queued and stored; Redis restarts from the
    snapshot (m1..m3 queued again, the thread's registry entry gone); m6 queued. Zep
    ignores keys. ``registered``: the user (another session of theirs) was in the registry
    before the snapshot, so only ``served-by`` says their map may be missing a thread.
    Before the map was kept with the user and rebuilt: 2 threads, m1..m3 stored twice."""
    server = RedisServer()
    server.start()
    try:
        with ZepFake(honor_idempotency=False) as fake:
            settings = settings_for(server.url, fake, tmp_path)
            r = connect(settings.redis_url)
            queue = ThreadQueue(r, settings)
            if registered:
                assert await queue.enqueue([_said(0, session="s0")], now_ms=_ms()) == 1
            await _drain(settings)  # a worker has seen the server (and the user)
            assert await queue.enqueue([_said(n) for n in (1, 2, 3)], now_ms=_ms()) == 3
            Redis.from_url(server.url).save()
            await _drain(settings)
            assert await queue.enqueue([_said(n) for n in (4, 5)], now_ms=_ms()) == 2
            await _drain(settings)
            await r.aclose()
            server.stop()
            server.start()  # from the snapshot
            r = connect(settings.redis_url)
            queue = ThreadQueue(r, settings, handed_out=queue.handed_out)
            assert await queue.enqueue([_said(6)], now_ms=_ms()) == 1
            before = _rebuilds()
            await _drain(settings)
            await r.aclose()
            s1 = [
                t
                for t in fake.threads()
                if any(m["content"] == "m1" for m in fake.messages(t["uuid"]))
            ]
            stored = Counter(m["content"] for m in fake.messages())
            assert stored == Counter(f"m{n}" for n in range(0 if registered else 1, 7))
            assert len(s1) == 1 and len(fake.threads()) == 1 + registered
            assert _rebuilds() == before + 1
    finally:
        server.close()


async def test_a_user_with_threads_over_several_pages_has_each_session_rebuilt_once(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """Eight sessions, a page of threads holds three: every session back after the user's
    entry was lost goes on in its own thread; the rebuild ran once (three pages, a call per
    thread), and a thread's first message is what named its session."""
    zep_fake.max_page_size = 3
    sessions = [f"s{n}" for n in range(8)]
    queue = ThreadQueue(redis, zep_settings)
    for n, sid in enumerate(sessions):
        assert await queue.enqueue([queued(f"first of {sid}", n, session=sid)], now_ms=_ms())
    await drain(zep_settings)
    keys = Keys.of(zep_settings)
    registry = IdentityRegistry(redis, zep_settings)
    threads = {
        sid: (await registry.lookup(app="memtest", user_id="alice", session_id=sid)).thread_uuid
        for sid in sessions
    }
    assert len(set(threads.values())) == 8
    assert {m["metadata"][SESSION_FIELD] for m in zep_fake.messages()} == {
        keys.session_tag("memtest", "alice", sid) for sid in sessions
    }
    zep_fake.idempotency_window = 0.0  # Zep no longer replays the threads' creation
    # Redis lost the user and their map (and, as a version before the map kept them, the
    # sessions' entries).
    await redis.delete(
        keys.user("memtest", "alice"), *(keys.session("memtest", "alice", s) for s in sessions)
    )
    zep_fake.requests.clear()
    before = _rebuilds()
    for n, sid in enumerate(sessions):
        assert await queue.enqueue([queued(f"then {sid}", 10 + n, session=sid)], now_ms=_ms())
    await drain(zep_settings)
    for sid, thread_uuid in threads.items():
        assert [m["content"] for m in zep_fake.messages(thread_uuid)] == [
            f"first of {sid}",
            f"then {sid}",
        ]
    assert len(zep_fake.threads()) == 8
    assert _rebuilds() == before + 1
    listed = [q for q in zep_fake.requests if (q.method, q.path) == ("GET", "/threads")]
    firsts = [q for q in zep_fake.requests if q.query == {"page_size": "1", "order": "asc"}]
    assert (len(listed), len(firsts)) == (3, 8)
    assert (await redis.hget(keys.user("memtest", "alice"), MAPPED_FIELD)) is not None


async def test_a_rebuild_reads_at_most_its_bound_newest_first(
    zep_settings: Settings,
    zep_fake: ZepFake,
    redis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Past ``MAP_REBUILD_THREADS`` the rebuild stops (newest threads first) and says so:
    the session of an older thread goes on in a new one, the recent ones keep theirs."""
    monkeypatch.setattr(identity, "MAP_REBUILD_THREADS", 2)
    queue = ThreadQueue(redis, zep_settings)
    sessions = ["old", "mid", "new"]
    for n, sid in enumerate(sessions):
        assert await queue.enqueue([queued(f"first of {sid}", n, session=sid)], now_ms=_ms())
        await drain(zep_settings)  # one by one: the threads' creation order
    zep_fake.idempotency_window = 0.0
    keys = Keys.of(zep_settings)
    await redis.delete(keys.user("memtest", "alice"))
    for n, sid in enumerate(sessions):
        assert await queue.enqueue([queued(f"then {sid}", 10 + n, session=sid)], now_ms=_ms())
    await drain(zep_settings)
    by_thread = sorted(
        [m["content"] for m in zep_fake.messages(t["uuid"])] for t in zep_fake.threads()
    )
    assert by_thread == sorted(
        [["first of old"], ["then old"], ["first of mid", "then mid"], ["first of new", "then new"]]
    )
    assert "truncated=True" in caplog.text and "threads=2" in caplog.text


async def test_a_new_user_pays_no_backend_call_for_the_map(
    zep_settings: Settings,
    zep_fake: ZepFake,
    redis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user the backend did not have: their map is whole from the start, so their first
    session and their next make the very calls they make where no map is kept at all (the
    capability off): no thread listed, none read back."""

    async def two_sessions(user_id: str) -> list[tuple[str, str, str]]:
        zep_fake.requests.clear()
        queue = ThreadQueue(redis, zep_settings)
        for n, sid in enumerate(("s1", "s2")):
            said = QueuedMessage.build(
                app="memtest",
                user_id=user_id,
                session_id=sid,
                invocation_id=f"inv{n}",
                role="user",
                ordinal=0,
                content=f"hello {n}",
            )
            assert await queue.enqueue([said], now_ms=_ms()) == 1
            await drain(zep_settings)
        return [
            (q.method, _UUID.sub("{id}", q.path), repr(sorted(q.query.items())))
            for q in zep_fake.requests
            if not q.path.startswith("/users/afterthought-probe")
        ]

    before = _rebuilds()
    made = await two_sessions("alice")
    assert _rebuilds() == before
    assert not [call for call in made if call[:2] == ("GET", "/threads")], made
    monkeypatch.setattr(
        ZepBackend, "capabilities", replace(ZepBackend.capabilities, replays_thread_creates=True)
    )
    assert made == await two_sessions("bob")


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_the_local_store_replays_thread_creates(
    make_settings: Callable[..., Settings],
) -> None:
    """No map is rebuilt on the local store: its thread creates are replayed for good."""
    from afterthought.backends import open_backend

    assert open_backend(make_settings()).capabilities.replays_thread_creates


async def test_a_session_entry_of_before_the_map_moves_into_it(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """A deployment upgraded with a session's own entry (``id:thread``, which expires with
    the session) and a user entry without a map: the session's next flush moves the entry
    into the user's map, so it lives as long as the user, not the session."""
    queue = ThreadQueue(redis, zep_settings)
    assert await queue.enqueue([queued("before", 1)], now_ms=_ms()) == 1
    await drain(zep_settings)
    keys, field = (
        Keys.of(zep_settings),
        Keys.of(zep_settings).thread_field("memtest", "alice", "s1"),
    )
    user, old = keys.user("memtest", "alice"), keys.session("memtest", "alice", "s1")
    thread_uuid = (await redis.hget(user, field)).decode()
    await redis.hdel(user, field, MAPPED_FIELD)  # as a version before the map wrote them
    await redis.set(old, thread_uuid)
    assert await queue.enqueue([queued("after", 2)], now_ms=_ms()) == 1
    await drain(zep_settings)
    assert (await redis.hget(user, field)).decode() == thread_uuid
    assert not await redis.exists(old)
    assert [m["content"] for m in zep_fake.messages(thread_uuid)] == ["before", "after"]


async def test_a_session_a_rebuild_records_just_after_the_lookup_goes_on_in_its_thread(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """Another worker's rebuild of the user's map (it holds the map's lock, not the
    session's) records the session right after this worker looked it up under the
    session's lock, and before it asks whether the map is whole: it is whole by then, and
    the session goes on in the thread the rebuild found, not in a new one."""
    registry = IdentityRegistry(redis, zep_settings)
    backend = ZepBackend(zep_settings)
    user, _ = await registry.ensure_user(backend, app="memtest", user_id="alice")
    found = await backend.create_thread(user=user, idempotency_key="found by the rebuild")
    tag = Keys.of(zep_settings).session_tag("memtest", "alice", "s1")
    lookup = registry.lookup
    looked = 0

    async def rebuilt_meanwhile(**kwargs: str) -> identity.Identity:
        nonlocal looked
        known = await lookup(**kwargs)
        looked += 1
        if looked == 2:  # under the session's lock: the other worker's record lands now
            await registry._record_threads("memtest", "alice", user, {tag: found})
        return known

    registry.lookup = rebuilt_meanwhile  # type: ignore[method-assign]
    _, thread_uuid, created = await registry.ensure_thread(
        backend, app="memtest", user_id="alice", session_id="s1"
    )
    await backend.aclose()
    assert (thread_uuid, created) == (found, False) and len(zep_fake.threads()) == 1


async def test_a_rebuild_that_keeps_failing_never_backs_the_session_off_for_minutes(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """After Redis lost the user's map, a session's next batch waits for the map's rebuild
    (a list of the user's threads, and a read of each one's first message): many calls,
    each of which may fail. Such a failure is not the batch's: counted as its failed
    attempt it backed the thread off exponentially (a handover run's session waited past
    the two minutes its backlog had to drain) and, at ``retry_max_attempts``, sent it to
    the dead letters. Five failed rebuilds in a row: each retry comes after a first
    failure's delay, and the batch is then stored in the session's thread."""
    await enqueue(zep_settings, queued("first", 1))
    await drain(zep_settings)
    registry = IdentityRegistry(redis, zep_settings)
    thread = (await registry.lookup(app="memtest", user_id="alice", session_id="s1")).thread_uuid
    keys = Keys.of(zep_settings)
    zep_fake.idempotency_window = 0.0  # Zep no longer replays the thread's creation
    await redis.delete(keys.user("memtest", "alice"), keys.session("memtest", "alice", "s1"))
    await enqueue(zep_settings, queued("then", 2))
    failures = 5
    zep_fake.inject(Fault(match=r"^GET /threads$", status=500, times=failures))
    worker = flusher(zep_settings)
    tk = keys.thread_ref("memtest", "alice", "s1")
    ready = keys.ready(keys.shard_of_ref(tk))
    waits = []
    try:
        for _ in range(failures):
            stats = await worker.drain(budget=30)
            assert stats["deferred"] == 1
            waits.append(await redis.zscore(ready, tk) - _ms())
            await redis.zadd(ready, {tk: 0}, xx=True)  # due again now
        await worker.drain(budget=30)
    finally:
        await worker.redis.aclose()
        await worker.backend.aclose()
    assert max(waits) <= 2000 and not await redis.llen(keys.dead(keys.shard_of_ref(tk)))
    assert [m["content"] for m in zep_fake.messages(thread)] == ["first", "then"]
