"""DESIGN.md's write-path invariants W1-W9 under faults: real Redis, real arq workers
(in-process, and as processes that get SIGKILLed), the real SDK against the Zep fake."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
from google.adk.agents import LlmAgent
from google.adk.tools.agent_tool import AgentTool

from afterthought.agent_hooks import ZepMemoryService, create_callbacks
from afterthought.connections import connect
from afterthought.contract import DeadLetter, QueuedMessage
from afterthought.dead_letters import DeadLetters
from afterthought.enqueue import Enqueuer
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.testing import Fault, RedisServer, ZepFake
from afterthought.testing.cli import run_cli_here
from afterthought.testing.stand_in_model import StandInLlm
from afterthought.worker.flush import Flusher
from afterthought.worker.jobs import check_redis, dispatch_once
from tests.adk_support import make_runner, new_session, say
from tests.conftest import BOTH_LAYOUTS, drain, enqueue, queued, run_worker_once, where

ROOT = Path(__file__).resolve().parents[1]
ADDS = "POST /threads/.*/messages"


def _posts(fake: ZepFake) -> list[tuple[int, int]]:
    """(status, messages in the call) of every add_messages call."""
    return [
        (r.status, len(r.body["messages"]))
        for r in fake.requests
        if r.method == "POST" and r.path.endswith("/messages")
    ]


@BOTH_LAYOUTS
async def test_unauthorized_pauses_every_worker_and_dead_letters_nothing(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    settings = make_settings(
        backend="zep", zep_api_key="k", zep_base_url=zep_fake.base_url, pause_seconds=30
    )
    keys, tk, shard = where(settings, queued("x", 1))
    zep_fake.inject(Fault(match=ADDS, status=401, times=1))
    await enqueue(settings, queued("I live in Lisbon.", 1))
    await run_worker_once(settings)

    assert await redis.exists(keys.paused)
    assert zep_fake.messages() == [] and not await redis.llen(keys.dead(shard))
    assert await redis.llen(keys.pending(tk)) == 1
    await redis.zadd(keys.ready(shard), {tk: 0})  # due, yet paused:
    assert not await dispatch_once(redis, redis, keys)  # type: ignore[arg-type]

    await redis.delete(keys.paused)  # the pause expires (or the operator fixed the key)
    await drain(settings)
    assert [m["content"] for m in zep_fake.messages()] == ["I live in Lisbon."]


@BOTH_LAYOUTS
async def test_a_429_holds_back_every_sender(zep_settings: Settings, zep_fake: ZepFake) -> None:
    zep_fake.inject(Fault(match=ADDS, status=429, retry_after=1.5))
    await enqueue(zep_settings, queued("one", 1, session="s1"))
    worker = asyncio.create_task(drain(zep_settings))
    gate = Keys(zep_settings.key_prefix).rate_limit
    redis = aioredis.Redis.from_url(zep_settings.redis_url)
    while not await redis.exists(gate):  # the worker has read the 429 and closed the gate
        await asyncio.sleep(0.01)
    await redis.aclose()
    await enqueue(zep_settings, queued("two", 2, session="s2"))  # another thread
    await worker
    await drain(zep_settings)

    posts = [r for r in zep_fake.requests if r.method == "POST" and r.path.endswith("/messages")]
    limited = next(r for r in posts if r.status == 429)
    later = [r for r in posts if r.at > limited.at]
    assert len(later) == 2 and all(r.at - limited.at >= 1.4 for r in later)  # nobody early
    assert sorted(m["content"] for m in zep_fake.messages()) == ["one", "two"]


@BOTH_LAYOUTS
async def test_too_large_is_resplit_and_resent(zep_settings: Settings, zep_fake: ZepFake) -> None:
    zep_fake.inject(Fault(match=ADDS, status=413, times=2))
    await enqueue(zep_settings, *[queued(f"m{i}", i) for i in range(30)])
    await drain(zep_settings)

    assert [m["content"] for m in zep_fake.messages()] == [f"m{i}" for i in range(30)]
    posts = _posts(zep_fake)
    assert posts[:2] == [(413, 30), (413, 15)]
    assert all(size <= 7 for status, size in posts[2:] if status == 202)


@BOTH_LAYOUTS
async def test_too_large_after_some_calls_landed_resends_only_the_rest(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    for fault in (Fault(status=413), Fault(), Fault(status=413)):  # refused, stored, refused
        zep_fake.inject(Fault(match=ADDS, status=fault.status))
    await enqueue(zep_settings, *[queued(f"m{i}", i) for i in range(30)])
    await drain(zep_settings)

    assert [m["content"] for m in zep_fake.messages()] == [f"m{i}" for i in range(30)]
    assert _posts(zep_fake)[:3] == [(413, 30), (202, 15), (413, 15)]


async def test_a_long_replay_reads_the_thread_once_per_lease(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    """A backfilled session is reconciled from one read, kept current as calls land."""
    turns = [queued(f"turn {i}", i) for i in range(300)]
    await enqueue(zep_settings, *turns[:40])  # persisted live, before the replay
    await drain(zep_settings)
    zep_fake.requests.clear()
    await enqueue(zep_settings, *(m.model_copy(update={"replay": True}) for m in turns))
    await drain(zep_settings)

    assert [m["content"] for m in zep_fake.messages()] == [f"turn {i}" for i in range(300)]
    reads = [r for r in zep_fake.requests if r.method == "GET" and r.path.endswith("/messages")]
    assert len(reads) == 1  # one page of 100 covers the 40 stored; then the cache


@BOTH_LAYOUTS
async def test_dead_letters_are_listed_and_replayed(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    zep_fake.inject(Fault(match=ADDS, status=422))
    await enqueue(zep_settings, queued("I live in Lisbon.", 1))
    await drain(zep_settings)
    letters = DeadLetters(redis, zep_settings)
    ((index, letter),) = await letters.listing()
    assert letter.reason.startswith("bad_request (status=422")

    done = await letters.replay([index])
    assert (done.replayed, done.malformed, done.refused) == (1, 0, 0)
    await drain(zep_settings)
    assert [m["content"] for m in zep_fake.messages()] == ["I live in Lisbon."]
    assert await letters.count() == 0


async def test_a_dead_letter_replay_counts_only_once_the_replica_holds_it(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    """With ``redis_wait_replicas``, a replay only the master holds (its replica not
    attached: a failover would drop it, the letter back among the dead) is not counted
    replayed but unconfirmed, and the letters after it are left for the next replay; with
    the replica attached it counts. Each message is stored once either way."""
    zep_fake.inject(Fault(match=ADDS, status=422, times=2))
    with RedisServer() as url:
        settings = make_settings(
            redis_url=url, backend="zep", zep_api_key="test-key", zep_base_url=zep_fake.base_url
        )
        await enqueue(settings, queued("I live in Lisbon.", 1))
        await enqueue(settings, queued("I keep bees.", 1, session="s2"))
        await drain(settings)
        client = connect(url)
        letters = DeadLetters(client, settings.model_copy(update={"redis_wait_replicas": 1}))
        try:
            assert await letters.count() == 2
            done = await letters.replay()
            assert done.replayed == 0
            assert done.unconfirmed == 1
            assert await letters.count() == 1  # the master took the first; the next waits
            port = urlsplit(url).port
            with RedisServer(args=["--replicaof", "127.0.0.1", str(port)]):
                while (await client.info("replication")).get("slave0", {}).get("state") != "online":
                    await asyncio.sleep(0.05)
                done = await letters.replay()
            assert (done.replayed, done.unconfirmed) == (1, 0)
        finally:
            await client.aclose()
        await drain(settings)
    assert sorted(m["content"] for m in zep_fake.messages()) == [
        "I keep bees.",
        "I live in Lisbon.",
    ]


@BOTH_LAYOUTS
def test_dlq_command_lists_without_content_and_replays(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    zep_fake.inject(Fault(match=ADDS, status=400, times=2))
    asyncio.run(enqueue(zep_settings, queued("secret-ish text", 1)))
    asyncio.run(enqueue(zep_settings, queued("second", 2, session="s2")))
    asyncio.run(drain(zep_settings))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli_here(zep_settings, "dlq", *args)

    listed = cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert len(rows) == 2 and "secret" not in listed.stdout
    assert {"index", "at", "thread", "reason", "attempts", "bytes"} <= set(rows[0])
    assert cli("purge", "1").returncode == 2  # refuses without --yes
    assert cli("replay").returncode == 2  # names nothing
    replayed = cli("replay", "--all")
    assert replayed.returncode == 0 and "replayed=2" in replayed.stdout
    asyncio.run(drain(zep_settings))
    assert sorted(m["content"] for m in zep_fake.messages()) == ["second", "secret-ish text"]


@BOTH_LAYOUTS
def test_a_purge_by_id_deletes_that_letter_though_another_took_its_index(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    """An operator lists the dead letters and purges the second by its id; meanwhile a
    replay took the first away, so the second is now at index 0 and index 1 is gone (or
    another letter's): the purge by id deletes exactly the letter listed, the other stays."""
    zep_fake.inject(Fault(match=ADDS, status=400, times=3))
    for n, session in enumerate(["s1", "s2", "s3"], 1):
        asyncio.run(enqueue(zep_settings, queued(f"said in {session}", n, session=session)))
        asyncio.run(drain(zep_settings))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli_here(zep_settings, "dlq", *args)

    first, second, third = json.loads(cli("list", "--json").stdout)
    assert cli("replay", "--id", first["id"]).returncode == 0  # the others move up
    purged = cli("purge", "--id", second["id"], "--yes")
    assert purged.returncode == 0 and "purged=1" in purged.stdout, purged.stderr
    assert [row["id"] for row in json.loads(cli("list", "--json").stdout)] == [third["id"]]
    again = cli("purge", "--id", second["id"], "--yes")
    assert again.returncode == 1 and "no dead letter with id" in again.stderr
    asyncio.run(drain(zep_settings))
    assert [m["content"] for m in zep_fake.messages()] == ["said in s1"]


@BOTH_LAYOUTS
async def test_a_dead_workers_threads_are_recovered(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """A worker claimed the thread (and may have sent its batch), then died."""
    settings = make_settings(
        backend="zep",
        zep_api_key="k",
        zep_base_url=zep_fake.base_url,
        lease_seconds=1.0,
        backend_timeout=0.4,
        backend_settle_seconds=0.2,
    )
    await enqueue(settings, queued("one", 1), queued("two", 2))
    dead = Flusher(settings, redis, backend=_never_used())
    assert await dead.claim(limit=10)
    keys, tk, _ = where(settings, queued("x", 1))
    await redis.hset(keys.thread(tk), "inflight", "1:2")

    await drain(settings, timeout=30)  # the bound of W4
    assert [m["content"] for m in zep_fake.messages()] == ["one", "two"]


def _never_used():  # type: ignore[no-untyped-def]
    from afterthought.backends.local import LocalBackend

    return LocalBackend(":memory:")


async def test_redis_outage_is_buffered_then_drained_in_order(
    make_settings: Callable[..., Settings],
) -> None:
    server = RedisServer()
    url = server.start()
    settings = make_settings(redis_url=url, breaker_failures=2, breaker_seconds=0.2)
    enqueuer = Enqueuer(settings)
    try:
        server.stop()
        results = [await enqueuer.enqueue([queued(f"m{i}", i)]) for i in range(3)]
        assert results == [False, False, False] and enqueuer.buffered == 3
        RedisServer(port=server.port).start()  # back on the same address
        assert await enqueuer.drain_buffer(timeout=30)  # by itself: no turn needed
        assert await enqueuer.enqueue([queued("m3", 3)])
        assert enqueuer.buffered == 0 and enqueuer.dropped == 0
        client = aioredis.Redis.from_url(url)
        raw = await client.lrange(
            Keys(settings.key_prefix).pending(queued("x", 1).thread_key), 0, -1
        )
        assert [QueuedMessage.decode(r).content for r in raw] == ["m0", "m1", "m2", "m3"]
        await client.shutdown(nosave=True)
    finally:
        server.close()


def _drain_threads() -> int:
    return sum(t.name == "afterthought-drain" and t.is_alive() for t in threading.enumerate())


async def test_closing_an_enqueuer_ends_its_drain_thread(
    make_settings: Callable[..., Settings],
) -> None:
    """Opening and closing memories (a batch job, a test suite) must not pile up drain
    threads, each with a loop and a Redis connection: the last run leaked ~1,300 fds."""
    server = RedisServer()
    url = server.start()
    settings = make_settings(redis_url=url, breaker_failures=1, breaker_seconds=0.05)
    try:
        before = _drain_threads()
        for _ in range(20):  # nothing buffered: closing starts no thread
            await Enqueuer(settings).aclose()
        assert _drain_threads() == before
        enqueuer = Enqueuer(settings)
        server.stop()
        assert not await enqueuer.enqueue([queued("m0", 0)])
        assert _drain_threads() == before + 1  # the buffer has its thread
        RedisServer(port=server.port).start()
        await enqueuer.aclose()  # drained, then the thread ends
        assert enqueuer.buffered == 0 and enqueuer.dropped == 0
        assert _drain_threads() == before
        client = aioredis.Redis.from_url(url)
        raw = await client.lrange(
            Keys(settings.key_prefix).pending(queued("x", 1).thread_key), 0, -1
        )
        assert [QueuedMessage.decode(r).content for r in raw] == ["m0"]
        await client.shutdown(nosave=True)
    finally:
        server.close()


async def test_buffer_overflow_is_spooled_and_counted(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    """Past the buffer the thread goes on in the spool, buffered messages first (see
    tests/test_spool.py): nothing is dropped while the spool has room."""
    settings = make_settings(redis_url="redis://127.0.0.1:1/0", buffer_size=2)
    enqueuer = Enqueuer(settings)
    for i in range(3):
        await enqueuer.enqueue([queued(f"m{i}", i)])
    assert (enqueuer.buffered, enqueuer.spooled, enqueuer.dropped) == (0, 3, 0)
    assert "enqueue spooled=3" in caplog.text


async def test_queue_caps_push_back(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    settings = make_settings(thread_queue_cap=2)
    enqueuer = Enqueuer(settings)
    assert await enqueuer.enqueue([queued("a", 1), queued("b", 2)])
    assert not await enqueuer.enqueue([queued("c", 3)])  # refused by the cap: held back
    assert enqueuer.buffered == 1
    assert await redis.get(Keys(settings.key_prefix).depth()) == b"2"
    await enqueuer.aclose()


@BOTH_LAYOUTS
async def test_previous_payload_version_is_accepted_and_unknown_dead_lettered(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    old, future = queued("old format", 1), queued("from the future", 2)
    keys, tk, shard = where(zep_settings, old)
    for seq, message, version in ((1, old, 0), (2, future, 99)):
        body = message.encode().replace('"v":1', f'"v":{version}')
        await redis.rpush(keys.pending(tk), f'{{"seq":{seq},' + body[1:])
    await redis.hset(keys.thread(tk), "seq", 2)
    await redis.zadd(keys.ready(shard), {tk: 0})
    await drain(zep_settings)

    assert [m["content"] for m in zep_fake.messages()] == ["old format"]
    (raw,) = await redis.lrange(keys.dead(shard), 0, -1)
    assert "version 99" in DeadLetter.parse(raw).reason


async def test_worker_warns_unless_redis_never_evicts_and_persists(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer() as url:
        client = aioredis.Redis.from_url(url)
        await client.config_set("appendonly", "yes")
        with caplog.at_level(logging.WARNING):
            found = await check_redis(client)
        assert (found.maxmemory_policy, found.persistence) == ("noeviction", "aof")
        # The worker's own warnings only: another test's drain thread may still be logging.
        assert not [r for r in caplog.records if r.name == "afterthought.worker"]
        await client.config_set("maxmemory-policy", "allkeys-lru")
        await client.config_set("appendonly", "no")
        await client.config_set("save", "")
        with caplog.at_level(logging.WARNING):
            found = await check_redis(client)
        assert (found.maxmemory_policy, found.persistence) == ("allkeys-lru", "none")
        assert "may evict queued messages" in caplog.text
        assert "persists nothing" in caplog.text
        await client.aclose()


async def test_writes_cost_one_round_trip_and_every_key_is_prefixed(
    make_settings: Callable[..., Settings],
) -> None:
    """W1 and W9, measured on a private Redis: a turn's writes are one EVALSHA per model
    call; after the worker, every key carries the prefix and transient ones are gone."""
    with RedisServer() as url:
        settings = make_settings(redis_url=url, key_prefix="acme")
        client = aioredis.Redis.from_url(url)
        runner, _ = make_runner(create_callbacks(settings=settings))
        session = await new_session(runner, "alice")
        await say(runner, "alice", session, "warm-up")  # loads the script once
        seen: list[str] = []

        async def watch() -> None:
            async with client.monitor() as monitor:
                async for command in monitor.listen():
                    if command["client_type"] != "lua":  # what clients sent, not scripts
                        seen.append(command["command"].split()[0].lower())

        watching = asyncio.create_task(watch())
        marker = aioredis.Redis.from_url(url)
        while "echo" not in seen:  # MONITOR is on once it reports our marker
            await marker.echo("start")
            await asyncio.sleep(0.01)
        seen.clear()
        await say(runner, "alice", session, "I live in Lisbon.")
        while "ping" not in seen:  # ... and has reported all before this one
            await marker.ping()
            await asyncio.sleep(0.01)
        watching.cancel()
        await marker.aclose()
        writes = [c for c in seen if c in WRITE_COMMANDS]
        assert writes == ["evalsha", "evalsha"]  # the user's message, then the reply

        await drain(settings)
        keys = [k.decode() async for k in client.scan_iter(match="*")]
        assert all(k.startswith("acme:") or (k.startswith("arq:") and ":acme:" in k) for k in keys)
        assert not [k for k in keys if ":lease:" in k or ":dispatch" in k]
        for key in keys:  # durable state, or a key that expires by itself
            if ":arq:queue" not in key and not any(part in key for part in DURABLE):
                assert await client.pttl(key) > 0, key
        await client.aclose()


WRITE_COMMANDS = {
    "evalsha",
    "eval",
    "set",
    "rpush",
    "lpush",
    "zadd",
    "hset",
    "incr",
    "incrby",
    "del",
    "expire",
    "pexpire",
    "psetex",
    "setex",
    "lpop",
    "zrem",
}
DURABLE = (
    ":pending:",
    ":thread:",
    ":threads:",
    ":epoch:",
    ":id:",
    ":depth",
    ":ready",
    ":synth:",
    ":tomb:",
    ":quarantine",
    ":audit",
    ":layout",
    ":served-by",
    ":user-ids",  # the deployment's default backend user ids
    ":marker",  # named durable state: it tells a Redis that lost its data
    ":tombstone_keys",  # a fingerprint of each tombstone key used
)


async def test_nested_agent_tool_runs_are_not_remembered(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    callbacks = create_callbacks(settings=zep_settings)
    helper = LlmAgent(
        name="translator",
        model=StandInLlm(script=["bonjour"]),
        before_model_callback=callbacks.before_model_callback,
        after_model_callback=callbacks.after_model_callback,
    )
    model = StandInLlm(
        script=[{"call": "translator", "args": {"request": "hello"}}, "It is bonjour."]
    )
    runner, _ = make_runner(callbacks, model, tools=[AgentTool(helper)])
    await say(runner, "alice", await new_session(runner, "alice"), "Translate hello.")
    await drain(zep_settings)

    assert [(m["role"], m["content"]) for m in zep_fake.messages()] == [
        ("user", "Translate hello."),
        ("assistant", "It is bonjour."),
    ]


async def test_re_adding_a_session_adds_nothing(zep_settings: Settings, zep_fake: ZepFake) -> None:
    runner, _ = make_runner(create_callbacks(settings=zep_settings))
    session_id = await new_session(runner, "alice")
    for text in ("I live in Lisbon.", "I like genmaicha."):
        await say(runner, "alice", session_id, text)
    await drain(zep_settings)
    stored = [m["content"] for m in zep_fake.messages()]
    assert len(stored) == 4

    service = ZepMemoryService(settings=zep_settings)
    session = await runner.session_service.get_session(
        app_name="memtest", user_id="alice", session_id=session_id
    )
    assert session is not None
    for _ in range(2):
        await service.add_session_to_memory(session)
        await drain(zep_settings)
    assert [m["content"] for m in zep_fake.messages()] == stored


async def test_a_session_added_only_at_the_end_is_stored_once(
    zep_settings: Settings, zep_fake: ZepFake
) -> None:
    no_hooks = LlmAgent(name="plain", model=StandInLlm(script=["Noted.", "Noted again."]))
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService

    plain = Runner(app_name="memtest", agent=no_hooks, session_service=InMemorySessionService())
    session_id = await new_session(plain, "alice")
    await say(plain, "alice", session_id, "I live in Lisbon.")
    await say(plain, "alice", session_id, "I like genmaicha.")
    session = await plain.session_service.get_session(
        app_name="memtest", user_id="alice", session_id=session_id
    )
    assert session is not None
    service = ZepMemoryService(settings=zep_settings)
    await service.add_session_to_memory(session)
    await service.add_events_to_memory(
        app_name="memtest", user_id="alice", events=session.events[-2:], session_id=session_id
    )
    await drain(zep_settings)
    assert [m["content"] for m in zep_fake.messages()] == [
        "I live in Lisbon.",
        "Noted.",
        "I like genmaicha.",
        "Noted again.",
    ]
    found = await service.search_memory(app_name="memtest", user_id="alice", query="Lisbon")
    texts = [p.text or "" for m in found.memories for p in m.content.parts or []]
    assert any("Lisbon" in t for t in texts)
    assert all(m.id and m.timestamp and m.author in ("user", "fact") for m in found.memories)


async def test_opt_in_direct_write_persists_through_a_redis_outage(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    server = RedisServer()
    url = server.start()
    settings = make_settings(
        redis_url=url,
        backend="zep",
        zep_api_key="k",
        zep_base_url=zep_fake.base_url,
        direct_write_on_outage=True,
        breaker_seconds=0.2,  # waited out below, once Redis is back
    )
    try:
        runner, _ = make_runner(create_callbacks(settings=settings))
        session = await new_session(runner, "alice")
        await say(runner, "alice", session, "I live in Lisbon.")
        await drain(settings)  # provisioned by the worker
        await say(runner, "alice", session, "Hello again.")  # the agent reads its identity
        await drain(settings)
        server.stop()
        await say(runner, "alice", session, "I moved to Porto.")
        for _ in range(100):  # the direct write runs in the background
            if len(zep_fake.messages()) == 6:
                break
            await asyncio.sleep(0.05)
        assert [m["content"] for m in zep_fake.messages() if m["role"] == "user"] == [
            "I live in Lisbon.",
            "Hello again.",
            "I moved to Porto.",
        ]
        RedisServer(port=server.port).start()
        await asyncio.sleep(settings.breaker_seconds)
        await say(runner, "alice", session, "Thanks.")
        await drain(settings)
        contents = [m["content"] for m in zep_fake.messages() if m["role"] == "user"]
        assert contents == ["I live in Lisbon.", "Hello again.", "I moved to Porto.", "Thanks."]
        assert len(zep_fake.messages()) == 8  # and each reply once
        client = aioredis.Redis.from_url(url)
        await client.shutdown(nosave=True)
    finally:
        server.close()
