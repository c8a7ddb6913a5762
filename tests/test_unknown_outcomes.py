"""Nothing lost, nothing doubled when outcomes are unknown (issue 10): late Redis replies,
refused connections, a full queue, poisoned and refused messages, failed heartbeats,
evicted payloads, invalid Unicode, a seeded session. Real Redis (through a misbehaving
proxy where a fault is needed), real arq workers, the real SDK against the fake.

No test waits on the wall clock for a result: each polls for the state it expects, with
a generous bound, or drives time by hand (ready scores, a fake clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from afterthought.agent_hooks import create_callbacks
from afterthought.agent_hooks.turn_memory import OWNER_KEY
from afterthought.backends.base import BackendError, OutgoingMessage
from afterthought.backends.local import LocalBackend
from afterthought.contract import DeadLetter, QueuedMessage
from afterthought.enqueue import Enqueuer
from afterthought.keys import Keys
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.status import snapshot
from afterthought.testing import Fault, RedisProxy, RedisServer, ZepFake
from afterthought.worker.flush import Flusher, _Lease, _LeaseLost
from tests.adk_support import APP, make_runner, say
from tests.conftest import backend_user_id, drain, enqueue, queued, until

ADDS = "POST /threads/.*/messages"


def _said(user_id: str, text: str, invocation: str, **fields: object) -> QueuedMessage:
    """A message of the test app (session ``s1`` unless told), built as the hooks build it."""
    values: dict[str, object] = {"session_id": "s1", "role": "user", "ordinal": 0, **fields}
    return QueuedMessage.build(
        app="memtest", user_id=user_id, invocation_id=invocation, content=text, **values
    )  # type: ignore[arg-type]


async def _pending(redis: aioredis.Redis, settings: Settings, tk: str) -> list[str]:
    raw = await redis.lrange(Keys(settings.key_prefix).pending(tk), 0, -1)
    return [QueuedMessage.decode(r).content for r in raw]


# --- the agent's side: W2 and W7 -------------------------------------------------------------
async def test_an_enqueue_whose_reply_came_late_is_queued_once(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    """Cause 1 of issue 10: the script ran, the reply missed the deadline; the message is
    sent again (the buffer drains) and must not be queued twice."""
    from tests.conftest import REDIS_URL

    with RedisProxy(REDIS_URL) as proxy:
        settings = make_settings(redis_url=proxy.url)  # the fixture's generous deadline
        enqueuer = Enqueuer(settings)
        first, second = queued("I live in Lisbon.", 1), queued("I like tea.", 2)
        # Connected, layout checked, script loaded: whatever the machine's load.
        assert await enqueuer.enqueue([queued("warm-up", 0, session="s0")])
        # A turn's deadline from here on (a held reply outlasts any deadline).
        enqueuer._settings = settings.model_copy(update={"enqueue_timeout": 0.1})
        proxy.hold_replies()
        assert not await enqueuer.enqueue([first])  # unknown outcome: held for the drain
        await until(lambda: proxy.held_replies)  # the script ran at Redis
        proxy.release_replies()
        await enqueuer.enqueue([second])  # the next turn
        assert await enqueuer.drain_buffer(timeout=20)
        await enqueuer.aclose()
    assert await _pending(redis, settings, first.thread_key) == ["I live in Lisbon.", "I like tea."]


async def test_the_buffer_drains_without_another_turn(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    """Cause 2 of issue 10: Redis refused long enough to open the breaker; the session's
    last messages must reach Redis when it returns, with no further enqueue."""
    from tests.conftest import REDIS_URL

    with RedisProxy(REDIS_URL) as proxy:
        settings = make_settings(redis_url=proxy.url, breaker_failures=2, breaker_seconds=0.2)
        enqueuer = Enqueuer(settings)
        proxy.refuse()
        said = [queued(f"line {n}", n) for n in range(4)]
        for message in said:
            assert not await enqueuer.enqueue([message])
        assert enqueuer.buffered == 4
        proxy.resume()

        async def all_queued() -> bool:
            return len(await _pending(redis, settings, said[0].thread_key)) == 4

        await until(all_queued)
        assert await _pending(redis, settings, said[0].thread_key) == [m.content for m in said]
        # The drain thread lets go of what it sent once the reply is in: a moment later.
        assert await enqueuer.drain_buffer(timeout=20) and enqueuer.dropped == 0
        await enqueuer.aclose()


async def test_a_full_thread_never_holds_up_another_user(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    settings = make_settings(thread_queue_cap=2)
    enqueuer = Enqueuer(settings)
    alice = [queued(f"alice {n}", n) for n in range(3)]
    for message in alice:
        await enqueuer.enqueue([message])  # the third is refused by the cap and held
    assert enqueuer.buffered == 1
    bob = _said("bob", "Bob here.", "b1")
    assert await enqueuer.enqueue([bob])  # straight into Redis, not behind Alice
    assert await _pending(redis, settings, bob.thread_key) == ["Bob here."]
    await drain(settings)
    assert await enqueuer.drain_buffer(timeout=20)  # the full thread drained; its turn came
    await drain(settings)
    keys = Keys(settings.key_prefix)
    assert not await redis.llen(keys.pending(alice[0].thread_key))
    await enqueuer.aclose()


async def test_a_re_push_of_a_queued_or_persisted_key_adds_nothing(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    queue = ThreadQueue(redis, local_settings)
    one, two = queued("one", 1), queued("two", 2)
    assert await queue.enqueue([one, two], now_ms=1) == 2
    assert await queue.enqueue([one, two, one], now_ms=2) == 0  # queued: nothing added
    await drain(local_settings)
    assert await queue.enqueue([two], now_ms=3) == 0  # persisted: still nothing
    three = queued("three", 3)
    assert await queue.enqueue([three, three], now_ms=4) == 1  # a key twice in one call


async def test_a_message_with_a_lone_surrogate_is_repaired_and_stored(
    local_settings: Settings,
) -> None:
    runner, _ = make_runner(create_callbacks(settings=local_settings))
    session = await runner.session_service.create_session(app_name=APP, user_id="alice")
    await say(runner, "alice", session.id, "I live in Lisbon \ud800 now.")
    await drain(local_settings)
    backend = LocalBackend(local_settings.local_db_path)
    user = await _user(local_settings, backend)
    stored, _ = await backend.user_messages(user=user, after=None, limit=10)
    assert [m.content for m in stored if m.role == "user"] == ["I live in Lisbon \ufffd now."]


async def test_a_session_seeded_with_another_sessions_state_is_remembered(
    local_settings: Settings,
) -> None:
    runner, _ = make_runner(create_callbacks(settings=local_settings))
    service = runner.session_service
    first = await service.create_session(app_name=APP, user_id="alice")
    await say(runner, "alice", first.id, "I live in Lisbon.")
    stored = await service.get_session(app_name=APP, user_id="alice", session_id=first.id)
    assert stored is not None and stored.state.get(OWNER_KEY) == first.id
    seeded = await service.create_session(app_name=APP, user_id="alice", state=stored.state)
    await say(runner, "alice", seeded.id, "I moved to Porto.")
    await drain(local_settings)
    backend = LocalBackend(local_settings.local_db_path)
    user = await _user(local_settings, backend)
    said, _ = await backend.user_messages(user=user, after=None, limit=10)
    assert sorted(m.content for m in said if m.role == "user") == [  # two threads: any order
        "I live in Lisbon.",
        "I moved to Porto.",
    ]


async def _user(settings: Settings, backend: LocalBackend):  # type: ignore[no-untyped-def]
    ref, _ = await backend.ensure_user(
        zep_user_id=await backend_user_id(settings, app=APP, user_id="alice")
    )
    return ref


# --- the worker's side: W2, W3, W5 -------------------------------------------------------------
@pytest.mark.parametrize("honor", [True, False], ids=["keys-honoured", "keys-ignored"])
async def test_a_call_that_commits_after_the_timeout_is_stored_once(
    honor: bool, make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    zep_fake.honor_idempotency = honor
    settings = make_settings(
        backend="zep",
        zep_api_key="k",
        zep_base_url=zep_fake.base_url,
        backend_timeout=0.3,
        backend_settle_seconds=1.5,
    )
    zep_fake.inject(Fault(match=ADDS, delay=1.2))  # commits 0.9 s after the client gave up
    await enqueue(settings, queued("I live in Lisbon.", 1), queued("I like tea.", 2))
    await drain(settings)
    await until(lambda: all(r.status for r in zep_fake.requests))  # the hung call has landed
    assert [m["content"] for m in zep_fake.messages()] == ["I live in Lisbon.", "I like tea."]


async def test_a_conflict_is_reconciled_not_dead_lettered(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    zep_fake.inject(Fault(match=ADDS, status=409, after_commit=True))
    await enqueue(zep_settings, queued("I live in Lisbon.", 1))
    await drain(zep_settings)
    assert [m["content"] for m in zep_fake.messages()] == ["I live in Lisbon."]
    assert not await redis.llen(Keys(zep_settings.key_prefix).dead())


class _Picky(LocalBackend):
    """Refuses (400) any call carrying "REJECT"; fails (503) any carrying "POISON"."""

    async def add_messages(  # type: ignore[override]
        self, *, messages: Sequence[OutgoingMessage], **kwargs: object
    ) -> str | None:
        if any("REJECT" in m.content for m in messages):
            raise BackendError("bad_request", status=400, code="invalid")
        if any("POISON" in m.content for m in messages):
            raise BackendError("unavailable", status=503)
        return await super().add_messages(messages=messages, **kwargs)  # type: ignore[arg-type]


async def test_one_refused_message_is_dead_lettered_alone(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    said = [f"line {n}" for n in range(30)]
    said[17] = "line 17 REJECT"
    await enqueue(local_settings, *[queued(text, n) for n, text in enumerate(said)])
    backend = _Picky(local_settings.local_db_path)
    flusher = Flusher(local_settings, redis, backend)
    await flusher.drain(budget=30)

    keys = Keys(local_settings.key_prefix)
    (letter,) = [DeadLetter.parse(r) for r in await redis.lrange(keys.dead(), 0, -1)]
    assert QueuedMessage.decode(letter.item).content == "line 17 REJECT"
    assert "bad_request" in letter.reason
    user = await _memtest_user(local_settings, backend)
    stored, _ = await backend.user_messages(user=user, after=None, limit=100)
    assert [m.content for m in stored] == [t for t in said if "REJECT" not in t]


async def test_a_message_that_never_succeeds_is_dead_lettered_and_its_thread_goes_on(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    """Another user's messages succeed meanwhile: this is a poisoned message, not an
    outage. Time is moved by hand (the deferred thread is made due again). No call of this
    backend commits late, so the batch may be cut anew as soon as it keeps failing."""
    settings = make_settings(retry_max_attempts=4, late_commit_seconds=0)
    keys = Keys(settings.key_prefix)
    mine = [queued("before", 1), queued("POISON pill", 2), queued("after", 3)]
    await enqueue(settings, *mine)
    backend = _Picky(settings.local_db_path)
    flusher = Flusher(settings, redis, backend, sleep=_no_wait)  # backoffs: not waited
    for n in range(12):
        other = _said("bob", f"bob {n}", f"b{n}")
        await enqueue(settings, other)
        await flusher.drain(budget=30)
        await redis.zadd(keys.ready(), {mine[0].thread_key: 0}, xx=True)  # due again now
        flusher._ok_marked = 0.0  # each round is "a second later"
    (letter,) = [DeadLetter.parse(r) for r in await redis.lrange(keys.dead(), 0, -1)]
    assert QueuedMessage.decode(letter.item).content == "POISON pill"
    user = await _memtest_user(settings, backend)
    stored, _ = await backend.user_messages(user=user, after=None, limit=100)
    assert [m.content for m in stored if not m.content.startswith("bob")] == ["before", "after"]


async def test_an_outage_dead_letters_nothing(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """Every call fails and none succeeds: past the attempts limit the message still waits."""
    settings = local_settings.model_copy(update={"retry_max_attempts": 2})
    keys = Keys(settings.key_prefix)
    await enqueue(settings, queued("POISON or outage?", 1))
    flusher = Flusher(settings, redis, _Picky(settings.local_db_path), sleep=_no_wait)
    for _ in range(5):
        await flusher.drain(budget=30)
        await redis.zadd(keys.ready(), {queued("x", 1).thread_key: 0}, xx=True)
    assert not await redis.llen(keys.dead())
    assert await redis.llen(keys.pending(queued("x", 1).thread_key)) == 1


async def _no_wait(seconds: float) -> None:
    pass


async def _memtest_user(settings: Settings, backend: LocalBackend):  # type: ignore[no-untyped-def]
    ref, _ = await backend.ensure_user(
        zep_user_id=await backend_user_id(settings, app="memtest", user_id="alice")
    )
    return ref


class _Renewals:
    """A queue whose renewals fail as told."""

    def __init__(self, outcomes: list[bool | Exception]) -> None:
        self.outcomes = outcomes

    async def renew(self, tk: str, token: str, *, now_ms: int) -> bool:
        outcome = self.outcomes.pop(0) if self.outcomes else True
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


async def test_a_failed_heartbeat_is_retried_and_a_lost_lease_stops_sending() -> None:
    now = [0.0]

    def lease(outcomes: list[bool | Exception]) -> _Lease:
        return _Lease(
            _Renewals(outcomes),  # type: ignore[arg-type]
            "tk",
            "token",
            seconds=3.0,
            settle=0.5,
            clock=lambda: now[0],
            claimed_at=0.0,
        )

    kept = lease([RedisError("blip"), True])
    now[0] = 1.0
    assert await kept.renew() < 1.0  # failed: retried soon, not in a third of the lease
    assert kept.remaining() == 2.0 and kept.call_timeout(1.5) == 1.5  # a full call fits
    with pytest.raises(_LeaseLost):
        kept.call_timeout(1.6)  # it would not end, and settle, in time: never cut short
    now[0] = 1.2
    assert await kept.renew() == 1.0  # renewed: three seconds from when it was sent
    assert kept.remaining() == 3.0

    lost = lease([RedisError("down")] * 10)
    now[0] = 2.7
    await lost.renew()
    with pytest.raises(_LeaseLost):
        lost.call_timeout(0.1)  # 0.3 s left: less than the server needs to settle
    now[0] = 3.1
    await lost.renew()
    assert lost.remaining() == 0.0
    await asyncio.wait_for(lost.keep(), timeout=5)  # the heartbeat ends with the lease

    taken = lease([False])  # Redis says another token holds it
    now[0] = 1.0
    await taken.renew()
    with pytest.raises(_LeaseLost):
        taken.call_timeout(0.1)


class _RenewalsThatSwallowACancel:
    """A renewal whose cancellation leaves it as another error, as a client dropping a
    broken connection in a ``finally`` can make it."""

    def __init__(self) -> None:
        self.calls = 0

    async def renew(self, tk: str, token: str, *, now_ms: int) -> bool:
        self.calls += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RedisError("Connection closed by server.") from None
        return True


async def test_an_ended_heartbeat_stops_even_when_its_cancellation_is_lost() -> None:
    renewals = _RenewalsThatSwallowACancel()
    lease = _Lease(
        renewals,  # type: ignore[arg-type]
        "tk",
        "token",
        seconds=0.03,  # renews at once, and retries a failed renewal at once
        settle=0.0,
        clock=lambda: 0.0,  # the lease never runs out: only end() stops the heartbeat
        claimed_at=0.0,
    )
    heartbeat = asyncio.create_task(lease.keep())
    while not renewals.calls:
        await asyncio.sleep(0)
    lease.end(heartbeat)
    await asyncio.wait({heartbeat}, timeout=30)  # a guard only: it ends at the next step
    assert heartbeat.done() and renewals.calls == 1


async def test_a_renewal_no_replica_holds_does_not_extend_the_lease(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    """With ``redis_wait_replicas``, a renewal only a master holds (one cut off from its
    replicas, soon replaced) is a failed renewal: the lease runs out on this worker's clock
    no later than the promoted replica's copy, so two workers never send the same batch.
    The test's Redis has no replica: every renewal goes unconfirmed."""
    settings = make_settings(redis_wait_replicas=1)
    queue = ThreadQueue(redis, settings)
    keys = Keys.of(settings)
    await enqueue(make_settings(), queued("hello", 1))
    tk = keys.thread_ref("memtest", "alice", "s1")
    assert await queue.claim([tk], ["token"], now_ms=0) == [True]
    now = [0.0]
    lease = _Lease(
        queue, tk, "token", seconds=3.0, settle=0.5, clock=lambda: now[0], claimed_at=0.0
    )
    now[0] = 1.0
    assert await lease.renew() < 1.0  # unconfirmed: retried soon
    assert lease.remaining() == 2.0  # not three seconds from the renewal
    assert await redis.get(keys.lease(tk)) == b"token"  # the master took it all the same


async def test_a_worker_never_claims_a_thread_it_is_flushing(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    await enqueue(local_settings, queued("one", 1))
    flusher = Flusher(local_settings, redis, LocalBackend(local_settings.local_db_path))
    (lease,) = await flusher.claim(limit=5)
    await redis.delete(Keys(local_settings.key_prefix).lease(lease.tk))  # as if it expired
    await redis.zadd(Keys(local_settings.key_prefix).ready(), {lease.tk: 0})
    assert await flusher.claim(limit=5) == []


# --- Redis itself: W9 --------------------------------------------------------------------------
async def test_a_lost_payload_is_counted_and_shown_by_status(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(local_settings.key_prefix)
    said = [queued(f"line {n}", n) for n in range(4)]
    await enqueue(local_settings, *said)
    tk = said[0].thread_key
    second = (await redis.lrange(keys.pending(tk), 1, 1))[0]
    await redis.lrem(keys.pending(tk), 1, second)  # as eviction or a lossy failover would
    status = await snapshot(redis, local_settings)  # a gap no worker has checked yet
    assert status.lost_unverified == 1 and status.lost_messages == 0
    await drain(local_settings)
    status = await snapshot(redis, local_settings)
    assert status.lost_messages == 1 and "lost_messages" in status.problems  # and stays


async def test_a_worker_starts_and_drains_redis_at_maxmemory(
    make_settings: Callable[..., Settings],
) -> None:
    with RedisServer() as url:
        settings = make_settings(redis_url=url, breaker_seconds=0.2)  # the held one retries soon
        client = aioredis.Redis.from_url(url)
        enqueuer = Enqueuer(settings)
        await enqueue(settings, queued("hello", 1000))
        await drain(settings)
        # 300 messages, most in sessions never seen: they are provisioned at maxmemory too.
        # Short ones: the limit below, not their size, puts Redis over it, and the store's
        # checks of a text grow faster than its length (2,000 characters: 0.1-0.5 s of
        # CPU each, minutes on a loaded machine).
        said = [queued("x" * 100 + f" {n}", n, session=f"s{n % 20}") for n in range(300)]
        for message in said:
            assert await enqueuer.enqueue([message])
        used = int((await client.info("memory"))["used_memory"])
        await client.config_set("maxmemory", used - 100_000)  # over the limit now
        assert not await enqueuer.enqueue([queued("refused", 999)])  # pushes back, held
        status = await snapshot(client, settings)
        assert "redis_full" in status.problems

        await drain(settings, timeout=60)  # a real worker: starts, drains at maxmemory
        assert not await client.zcard(Keys(settings.key_prefix).ready())
        await client.config_set("maxmemory", 0)
        assert await enqueuer.drain_buffer(timeout=20)  # the held one goes once room is back
        await drain(settings)
        backend = LocalBackend(settings.local_db_path)
        user = await _memtest_user(settings, backend)
        stored, _ = await backend.user_messages(user=user, after=None, limit=1000)
        assert len(stored) == 302
        await enqueuer.aclose()
        await client.aclose()


class _PickyFacts(LocalBackend):
    """Refuses (400) a fact carrying "REJECT"."""

    async def add_fact(self, *, text: str, **kwargs: str) -> None:  # type: ignore[override]
        if "REJECT" in text:
            raise BackendError("bad_request", status=400, code="invalid")
        await super().add_fact(text=text, **kwargs)  # type: ignore[arg-type]


async def test_one_refused_fact_is_dead_lettered_alone(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    facts = [
        _said("alice", text, f"fact:{n}", session_id="~memory", kind="fact", trust="app")
        for n, text in enumerate(["likes tea", "REJECT me", "lives in Porto"])
    ]
    await enqueue(local_settings, *facts)
    backend = _PickyFacts(local_settings.local_db_path)
    await Flusher(local_settings, redis, backend).drain(budget=30)
    keys = Keys(local_settings.key_prefix)
    (letter,) = [DeadLetter.parse(r) for r in await redis.lrange(keys.dead(), 0, -1)]
    assert QueuedMessage.decode(letter.item).content == "REJECT me"
    assert not await redis.llen(keys.pending(facts[0].thread_key))


async def test_two_users_with_one_session_id_get_two_threads(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    from afterthought.identity import IdentityRegistry

    said = {who: _said(who, f"I am {who}.", "i1", session_id="default") for who in ("alice", "bob")}
    for message in said.values():
        await enqueue(any_settings, message)
    await drain(any_settings)
    registry = IdentityRegistry(redis, any_settings)
    threads = {
        who: (await registry.lookup(app="memtest", user_id=who, session_id="default")).thread_uuid
        for who in said
    }
    assert None not in threads.values() and threads["alice"] != threads["bob"]


async def test_a_purge_never_lets_an_old_ack_pop_newer_messages(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """A forget empties a thread a worker is sending; the user goes on talking."""
    await enqueue(local_settings, *[queued(f"old {n}", n) for n in range(3)])
    flusher = Flusher(local_settings, redis, LocalBackend(local_settings.local_db_path))
    (lease,) = await flusher.claim(limit=5)
    await redis.incr(Keys(local_settings.key_prefix).epoch("memtest", "alice"))
    assert await flusher.queue.purge(lease.tk, before_epoch=1) == 3
    await enqueue(local_settings, queued("new", 9))
    assert await flusher.queue.ack(lease.tk, lease.token, last=3) == 1  # "new" stays
    assert await _pending(redis, local_settings, lease.tk) == ["new"]


async def test_a_replayed_session_keeps_words_said_twice(
    local_settings: Settings,
) -> None:
    """A session re-added after every turn (ADK's auto-save): "yes" said twice is two
    messages, not one already stored."""

    def turn(n: int, text: str) -> QueuedMessage:
        return _said("alice", text, f"inv-{n}", replay=True)

    await enqueue(local_settings, turn(1, "yes"))
    await drain(local_settings)
    await enqueue(local_settings, turn(1, "yes"), turn(2, "no"), turn(3, "yes"))
    await drain(local_settings)
    backend = LocalBackend(local_settings.local_db_path)
    user = await _memtest_user(local_settings, backend)
    stored, _ = await backend.user_messages(user=user, after=None, limit=10)
    assert [m.content for m in stored] == ["yes", "no", "yes"]


async def test_a_thread_whose_counter_was_evicted_goes_on_in_order(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(local_settings.key_prefix)
    said = [queued(f"line {n}", n) for n in range(4)]
    await enqueue(local_settings, *said[:3])
    await redis.delete(keys.thread(said[0].thread_key))  # as allkeys-lru might
    await enqueue(local_settings, said[3])
    await drain(local_settings)
    backend = LocalBackend(local_settings.local_db_path)
    user = await _memtest_user(local_settings, backend)
    stored, _ = await backend.user_messages(user=user, after=None, limit=10)
    assert [m.content for m in stored] == [m.content for m in said]


async def test_a_message_given_up_after_an_unknown_outcome_is_read_back_first(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """Its last attempt was stored although it failed (a 500 after the work): it is
    acknowledged, not dead-lettered (a replay would store it twice)."""
    settings = make_settings(
        backend="zep",
        zep_api_key="k",
        zep_base_url=zep_fake.base_url,
        retry_max_age_seconds=0.001,
        backend_settle_seconds=0.2,
    )
    zep_fake.inject(Fault(match=ADDS, status=500, after_commit=True))
    # Every read-back fails too, until the worker is about to give up on the message.
    zep_fake.inject(Fault(match="GET /threads/.*/messages", status=503, times=5))
    await enqueue(settings, queued("I live in Lisbon.", 1))
    await drain(settings)
    assert not [f for f in zep_fake.faults if f.times > 0]  # the give-up path was reached
    assert [m["content"] for m in zep_fake.messages()] == ["I live in Lisbon."]
    assert not await redis.llen(Keys(settings.key_prefix).dead())


@pytest.mark.parametrize("honor", [True, False], ids=["keys-honoured", "keys-ignored"])
async def test_a_batch_narrowed_after_an_unknown_outcome_is_not_sent_again(
    honor: bool, make_settings: Callable[..., Settings], zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    """The batch was stored by a call whose reply was lost; read-backs then kept failing
    until the batch was narrowed to its head. The rest of it must still be read back before
    it is sent (found by the chaos bench). Narrowing cuts the batch anew, which waits until
    no call of it can commit late: here, at once."""
    from afterthought.backends import open_backend

    zep_fake.honor_idempotency = honor
    settings = make_settings(
        backend="zep",
        zep_api_key="k",
        zep_base_url=zep_fake.base_url,
        backend_settle_seconds=0.1,
        late_commit_seconds=0,
    )
    keys = Keys(settings.key_prefix)
    said = [queued(f"line {n}", n) for n in range(4)]
    await enqueue(settings, *said)
    zep_fake.inject(Fault(match=ADDS, status=500, after_commit=True))
    zep_fake.inject(Fault(match="GET /threads/.*/messages", status=503, times=8))
    flusher = Flusher(settings, redis, open_backend(settings))
    for _ in range(8):  # each round: a job; the deferred thread is made due again by hand
        await flusher.drain(budget=30)
        await redis.zadd(keys.ready(), {said[0].thread_key: 0}, xx=True)
    assert [m["content"] for m in zep_fake.messages()] == [m.content for m in said]
    assert not [f for f in zep_fake.faults if f.times > 0]  # narrowing was reached


class _Hanging(LocalBackend):
    """A backend whose writes never answer."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.called = asyncio.Event()

    async def add_messages(self, **kwargs: object) -> str | None:  # type: ignore[override]
        self.called.set()
        await asyncio.Event().wait()
        return None


async def test_a_drain_cut_short_gives_its_threads_back(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """The job's timeout (or a stop) cancels the drain: its threads' tasks end with it and
    give their leases back, instead of running on, unseen, past the job."""
    await enqueue(local_settings, queued("one", 1))
    backend = _Hanging(local_settings.local_db_path)
    flusher = Flusher(local_settings, redis, backend)
    drain = asyncio.create_task(flusher.drain(budget=30))
    await asyncio.wait({asyncio.create_task(backend.called.wait())}, timeout=30)
    tk = queued("one", 1).thread_key
    lease = Keys(local_settings.key_prefix).lease(tk)
    assert await redis.exists(lease)
    drain.cancel()
    for _ in range(300):  # a guard only: the lease goes as the task unwinds
        if not await redis.exists(lease):
            break
        await asyncio.sleep(0.1)
    assert not await redis.exists(lease)
    assert await redis.zscore(Keys(local_settings.key_prefix).ready(), tk) is not None
