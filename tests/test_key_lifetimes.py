"""Every key has a lifetime, or is durable state named as such (issue 22): a session's and
a user's keys expire ``idle_ttl_seconds`` after their last message, never while one waits,
and a user who comes back after that has the same backend user, their memory, and every
message stored once.

Redis' clock is not waited for: :func:`_idle` does what Redis does once that much time has
passed with nothing written (deletes every key whose expiry falls within it), and the
writer's clock (:class:`HandedOut`) is a number the test moves."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from afterthought.backends import open_backend
from afterthought.backends.base import MemoryBackend, UserRef
from afterthought.contract import MEMORY_SESSION, QueuedMessage
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys
from afterthought.queue import HandedOut, ThreadQueue
from afterthought.settings import Settings
from afterthought.testing import ZepFake
from tests.conftest import BOTH_LAYOUTS, drain, enqueue, queued

IDLE_SECONDS = 3600
#: The longest lifetime of the other per-session and per-user keys (the context cache's).
WEEK_MS = 7 * 86400 * 1000

#: What docs/DESIGN.md ("Key lifetimes") names as durable: deployment-wide or per shard
#: (bounded by the layout, not by users), or per user and removed by their forget.
DURABLE = {
    "layout", "marker", "depth", "lost", "late_repaired", "forgets", "audit", "quarantine",
    "dead", "ready", "backfill", "synth", "tomb", "epoch", "arq", "user-ids", "served-by",
    "tombstone_keys",
}  # fmt: skip
#: Kinds kept per session and per user, and so what must never outlive the idle lifetime.
PER_SESSION = {"thread", "id:thread", "seen", "pending", "lease", "ctx:thread"}
PER_USER = {"id:user", "threads", "ctx:user", "ctx:index", "forgetting", "synthesizing"}


def _kind(key: str, prefix: str) -> str:
    """``thread``, ``id:user``, ... of one of the deployment's keys (either layout)."""
    if key.startswith("arq:"):
        return "arq"
    rest = key.split("}:", 1)[1] if key.startswith("{") else key.removeprefix(f"{prefix}:")
    parts = rest.split(":")
    return ":".join(parts[:2]) if parts[0] in {"id", "ctx", "forgot"} else parts[0]


async def _keys(redis: aioredis.Redis, prefix: str) -> dict[str, int]:
    """The deployment's keys (only its own prefix is scanned) -> PTTL."""
    found: dict[str, int] = {}
    for pattern in (f"{prefix}:*", f"{{{prefix}:*", f"arq:*{prefix}:*"):
        async for key in redis.scan_iter(match=pattern, count=1000):
            found[key.decode()] = int(await redis.pttl(key))
    return found


async def _idle(redis: aioredis.Redis, prefix: str, seconds: float) -> int:
    """What Redis does once ``seconds`` pass with nothing written: every key that expires
    within them is gone, and the others have that much less to live. How many went."""
    passed, gone = int(seconds * 1000), []
    for key, ttl in (await _keys(redis, prefix)).items():
        if 0 < ttl <= passed:
            gone.append(key)
        elif ttl > passed:
            await redis.pexpire(key, ttl - passed)
    if gone:
        await redis.delete(*gone)
    return len(gone)


def _said(user: int, session: int, n: int) -> QueuedMessage:
    return QueuedMessage.build(
        app="soak",
        user_id=f"user-{user}",
        session_id=f"s{session}",
        invocation_id=f"inv-{session}-{n}",
        role="user",
        ordinal=0,
        content=f"user {user} session {session} says {n}",
    )


def _unbounded(keys: dict[str, int], prefix: str, *, longest_ms: int) -> list[str]:
    """Keys with no lifetime that are not named durable, or a per-session or per-user key
    that would outlive ``longest_ms``."""
    bad = []
    for key, ttl in keys.items():
        kind = _kind(key, prefix)
        if ttl == -1 and kind not in DURABLE:
            bad.append(f"{kind} (no lifetime)")
        elif kind in PER_SESSION | PER_USER and ttl > longest_ms:
            bad.append(f"{kind} ({ttl} ms)")
    return bad


async def test_a_drained_session_and_its_user_have_lifetimes(
    local_settings: Settings, redis: aioredis.Redis, prefix: str
) -> None:
    """Fails on the code before issue 22: ``thread``, ``id:thread``, ``id:user`` and
    ``threads`` had no lifetime (~370 B a session, forever)."""
    await enqueue(local_settings, queued("I like tea", 1), queued("and biscuits", 2))
    await drain(local_settings)
    keys = await _keys(redis, prefix)
    idle_ms = 30 * 86400 * 1000  # the default ``idle_ttl_seconds``
    for kind in ("thread", "id:user", "threads"):
        (ttl,) = [t for k, t in keys.items() if _kind(k, prefix) == kind]
        assert 0 < ttl <= idle_ms, kind
    assert "id:thread" not in {_kind(k, prefix) for k in keys}  # the session is in id:user
    assert not _unbounded(keys, prefix, longest_ms=max(idle_ms, WEEK_MS))


@pytest.mark.timeout(600)  # 1,200 messages through a real worker, on a shared machine
async def test_soak_200_users_then_idle_keeps_no_key_of_idle_sessions(
    make_settings: Callable[..., Settings], redis: aioredis.Redis, prefix: str
) -> None:
    settings = make_settings(idle_ttl_seconds=IDLE_SECONDS, worker_concurrency=64)
    users, sessions = 200, [1 + (u * 7) % 5 for u in range(200)]  # 1..5 each: 600
    for u in range(users):
        for s in range(sessions[u]):
            await enqueue(settings, _said(u, s, 1), _said(u, s, 2))
    await drain(settings, timeout=600)
    busy = await _keys(redis, prefix)
    assert not _unbounded(busy, prefix, longest_ms=WEEK_MS)
    memory = {k: int(await redis.memory_usage(k) or 0) for k in busy}
    # Ten users say more while no worker runs: their keys must outlast any idle time.
    waiting = range(10)
    for u in waiting:
        await enqueue(settings, _said(u, 0, 3))
    after_drain = await _keys(redis, prefix)
    keys, queue = Keys.of(settings), ThreadQueue(redis, settings)
    for u in waiting:
        m = _said(u, 0, 3)
        ref = queue.ref_of(m)
        held = [keys.thread(ref), keys.user(m.app, m.user_id), keys.user_threads(m.app, m.user_id)]
        assert [after_drain[k] for k in held] == [-1] * 3

    expired_at_idle = await _idle(redis, prefix, IDLE_SECONDS)
    at_idle = Counter(_kind(k, prefix) for k in await _keys(redis, prefix))
    expired_later = await _idle(redis, prefix, 365 * 86400)  # the context cache: 7 days
    left = await _keys(redis, prefix)
    per_kind = Counter(_kind(k, prefix) for k in left)
    # What remains: the waiting users' queues, and durable state (one ``synth`` a user).
    for kind, n in per_kind.items():
        assert kind in DURABLE or n <= len(waiting), kind
    per_user = sum(n for kind, n in per_kind.items() if kind in {"synth", "tomb", "epoch"})
    assert per_user <= users
    session_keys = sum(n for kind, n in per_kind.items() if kind in PER_SESSION)
    assert session_keys <= 2 * len(waiting)  # thread, pending
    from afterthought.lifetimes import sweep

    swept = await sweep(redis, settings, apply=True)  # the idle users' durable keys
    after_sweep = Counter(_kind(k, prefix) for k in await _keys(redis, prefix))
    per_user_swept = sum(n for kind, n in after_sweep.items() if kind in {"synth", "epoch"})
    assert per_user_swept <= len(waiting)  # theirs: a message of theirs waits
    print(
        json.dumps(
            {
                "users": users,
                "sessions": sum(sessions),
                "keys_after_drain": len(busy),
                "bytes_per_session_after_drain": round(
                    sum(v for k, v in memory.items() if _kind(k, prefix) in PER_SESSION | PER_USER)
                    / sum(sessions)
                ),
                "expired_after_idle_ttl": expired_at_idle,
                "left_after_idle_ttl_by_kind": dict(sorted(at_idle.items())),
                "expired_after_7_days": expired_later,
                "left_by_kind": dict(sorted(per_kind.items())),
                "per_user_keys_left_per_idle_user": per_user / users,
                "session_keys_left": session_keys,
                "removed_by_sweep": dict(swept.removed),
                "per_user_keys_left_after_sweep": sum(
                    n for kind, n in after_sweep.items() if kind in {"synth", "tomb", "epoch"}
                ),
            }
        )
    )
    # The waiting users' messages are all still there, and go out once.
    await drain(settings)
    backend = open_backend(settings)
    try:
        for u in waiting:
            user = await IdentityRegistry(redis, settings).lookup_user(
                app="soak", user_id=f"user-{u}"
            )
            assert user is not None
            texts = await _texts(backend, user)
            assert texts == Counter(
                f"user {u} session {s} says {n}"
                for s in range(sessions[u])
                for n in (1, 2, 3)
                if n < 3 or s == 0
            )
    finally:
        await backend.aclose()


async def _texts(backend: MemoryBackend, user: UserRef) -> Counter[str]:
    """What the backend stores of the user, text -> how many times."""
    messages, _ = await backend.user_messages(user=user, after=None, limit=1000)
    return Counter(m.content for m in messages)


@BOTH_LAYOUTS
async def test_a_user_back_after_expiry_keeps_identity_memory_and_every_message_once(
    make_settings: Callable[..., Settings],
    zep_fake: ZepFake,
    redis: aioredis.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = make_settings(
        backend="zep",
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
        idle_ttl_seconds=IDLE_SECONDS,
    )
    now = [0.0]
    queue = ThreadQueue(redis, settings, handed_out=HandedOut.of(settings, clock=lambda: now[0]))
    before = [queued(f"I like tea, part {n}", n) for n in (1, 2, 3)]
    assert await queue.enqueue(before, now_ms=_ms()) == 3
    await drain(settings)
    registry = IdentityRegistry(redis, settings)
    first = await registry.lookup(app="memtest", user_id="alice", session_id="s1")
    assert first.user is not None and first.thread_uuid is not None

    # A month on: Redis expired the session and the user; Zep no longer replays the
    # thread's creation (its idempotency window is not documented: assume it passed).
    zep_fake.idempotency_window = 0.0
    now[0] += IDLE_SECONDS
    assert await _idle(redis, prefix, IDLE_SECONDS) >= 4
    gone = await registry.lookup(app="memtest", user_id="alice", session_id="s1")
    assert gone.user is None and gone.thread_uuid is None

    caplog.set_level(logging.ERROR, logger="afterthought.queue")
    after = [queued(f"and biscuits, part {n}", n) for n in (4, 5, 6)]
    assert await queue.enqueue(after, now_ms=_ms()) == 3
    assert "redis lost queued messages" not in caplog.text  # an expiry is not a loss
    await drain(settings)
    keys = Keys.of(settings)
    shard = keys.shard_of("memtest", "alice")
    assert int(await redis.get(keys.lost(shard)) or 0) == 0

    again = await registry.lookup(app="memtest", user_id="alice", session_id="s1")
    assert again.user == first.user  # the same backend user and graph
    named = await registry.backend_user_id(app="memtest", user_id="alice")
    assert [u["user_id"] for u in zep_fake.users()] == [named]
    stored = Counter(m["content"] for m in zep_fake.messages())
    assert stored == Counter(m.content for m in before + after)  # none lost, none twice
    backend = open_backend(settings)
    try:
        assert await _texts(backend, first.user) == stored
        block = await backend.get_context(user=first.user, query="tea", max_chars=4000, timeout=10)
        assert "I like tea" in block  # the memory from before the expiry
    finally:
        await backend.aclose()


async def test_a_counter_gone_within_the_idle_lifetime_is_still_a_loss(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """The other side of the expiry rule: a thread hash gone sooner than it could have
    expired went with Redis' data, and the numbers handed out are not handed out again."""
    now = [0.0]
    handed = HandedOut.of(local_settings, clock=lambda: now[0])
    queue = ThreadQueue(redis, local_settings, handed_out=handed)
    assert await queue.enqueue([queued("one", 1), queued("two", 2)], now_ms=_ms()) == 2
    ref = queue.ref_of(queued("one", 1))
    keys = Keys.of(local_settings)
    await redis.delete(keys.thread(ref), keys.pending(ref))  # a failover to a lagging replica
    now[0] += local_settings.idle_ttl_seconds / 4
    assert await queue.enqueue([queued("three", 3)], now_ms=_ms()) == 1
    assert handed.get(ref)[0] == 3  # it went on after the numbers Redis lost


def _change(kind: str, content: str) -> QueuedMessage:
    return QueuedMessage.build(
        app="memtest",
        user_id="alice",
        session_id=MEMORY_SESSION,
        invocation_id=f"{kind}:{content}",
        role="user",
        ordinal=0,
        content=content,
        kind=kind,  # type: ignore[arg-type]
        trust="app",
    )


async def test_a_fact_deleted_and_added_again_after_its_thread_expired_is_queued(
    make_settings: Callable[..., Settings], redis: aioredis.Redis, prefix: str
) -> None:
    """``seen`` (a day) outlives an idle thread's hash (here an hour): the thread numbers
    from 1 again, and its ``seen`` scores, of the old numbering, made the re-added fact look
    like a re-push of the first add (silently dropped)."""
    settings = make_settings(idle_ttl_seconds=IDLE_SECONDS)
    queue = ThreadQueue(redis, settings)
    fact = _change("fact", "Alice prefers tea over coffee")
    assert await queue.enqueue([fact], now_ms=_ms()) == 1
    await drain(settings)
    await _idle(redis, prefix, IDLE_SECONDS)
    keys = Keys.of(settings)
    assert not await redis.exists(keys.thread(queue.ref_of(fact)))
    assert await queue.enqueue([_change("forget", "some-memory-id")], now_ms=_ms()) == 1
    assert await queue.enqueue([fact], now_ms=_ms() + 1) == 1  # a new change: queued
    assert await queue.enqueue([fact], now_ms=_ms() + 2) == 0  # its re-push is not


@BOTH_LAYOUTS
async def test_a_person_active_in_one_long_thread_stays_one_person_in_every_app(
    make_settings: Callable[..., Settings], redis: aioredis.Redis, prefix: str
) -> None:
    """The person (one user id in every app) lived ``idle_ttl_seconds`` from their last
    new thread: one who kept talking in one thread lost it, and another app's first turn
    had no memory of them. Each message renews it."""
    settings = make_settings(idle_ttl_seconds=IDLE_SECONDS)
    queue = ThreadQueue(redis, settings)
    assert await queue.enqueue([queued("I like tea", 1)], now_ms=_ms()) == 1
    await drain(settings)
    registry = IdentityRegistry(redis, settings)
    first = await registry.lookup_user(app="memtest", user_id="alice")
    assert first is not None
    person = Keys.of(settings).person("alice")
    for n in range(2, 5):  # one thread, a message every 0.6 idle lifetimes
        await _idle(redis, prefix, IDLE_SECONDS * 0.6)
        assert await queue.enqueue([queued(f"and biscuits {n}", n)], now_ms=_ms()) == 1
        assert 0.99 * IDLE_SECONDS * 1000 < await redis.pttl(person) <= IDLE_SECONDS * 1000
        await drain(settings)
    assert await registry.lookup_user(app="preload_agent", user_id="alice") == first


async def test_a_forgotten_persons_message_does_not_bring_the_person_back(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """The renewal only renews: a person whose entry a forget deleted is not made again by
    a message queued after it (whose worker provisions them afresh)."""
    queue = ThreadQueue(redis, local_settings)
    assert await queue.enqueue([queued("I like tea", 1)], now_ms=_ms()) == 1
    await drain(local_settings)
    person = Keys.of(local_settings).person("alice")
    assert await redis.exists(person)
    await redis.delete(person)  # as a forget's marks delete it
    assert await queue.enqueue([queued("and biscuits", 2)], now_ms=_ms()) == 1
    assert not await redis.exists(person)


def _ms() -> int:
    return int(time.time() * 1000)


@BOTH_LAYOUTS
async def test_the_sweep_gives_keys_of_an_older_version_their_lifetimes(
    make_settings: Callable[..., Settings],
    redis: aioredis.Redis,
    prefix: str,
    second_prefix: str,
) -> None:
    """Keys written before they had lifetimes (made here by taking theirs away) get the
    documented one from ``afterthought sweep`` — in pages, resumed from the cursor each
    run prints — except a session whose messages wait and its user; durable state and
    another deployment's keys keep what they had."""
    from afterthought.lifetimes import sweep

    settings = make_settings(idle_ttl_seconds=IDLE_SECONDS)
    for u in range(3):
        for s in range(2):
            await enqueue(settings, _said(u, s, 1))
    await drain(settings)
    waiting = _said(0, 0, 2)  # user 0's session 0 says more while no worker runs
    await enqueue(settings, waiting)
    keys, queue = Keys.of(settings), ThreadQueue(redis, settings)
    for u in range(3):
        for s in range(2):  # each session's entry, as a version before the user's map wrote it
            said = _said(u, s, 1)
            await redis.set(keys.session(said.app, said.user_id, said.session_id), f"{u}/{s}")
            await redis.hdel(keys.user(said.app, said.user_id), keys.thread_field(*said_ids(said)))
    await redis.set(keys.session("soak", "gone", "s"), "x")  # its user's entry expired
    other = Keys(second_prefix, settings.redis_shards)
    others = [
        other.thread(other.thread_ref("soak", "user-0", "s0")),
        other.user("soak", "user-0"),
        other.user_threads("a", "u"),
    ]
    for name in others:
        await redis.set(name, "x")
    before = await _keys(redis, prefix)
    for name, ttl in before.items():  # as an older version wrote them
        if _kind(name, prefix) in {"thread", "id:thread", "id:user", "threads"} and ttl > 0:
            await redis.persist(name)
    old = await _keys(redis, prefix)

    dry = await sweep(redis, settings, apply=False)
    assert dry.cursor is None and dict(dry.given) == {
        "thread": 5, "id:thread": 1, "id:user": 2, "threads": 2,
    }  # fmt: skip
    assert dry.moved == 6  # into their user's map, where they live as long as the user
    unchanged = {name: ttl == -1 for name, ttl in old.items()}
    assert {n: t == -1 for n, t in (await _keys(redis, prefix)).items()} == unchanged

    runs, cursor = 0, None
    while True:
        runs += 1
        done = await sweep(redis, settings, apply=True, cursor=cursor, pages=1, page=5)
        if done.cursor is None:
            break
        cursor = done.cursor
    assert runs > 2  # resumed, not done at once
    now = await _keys(redis, prefix)
    held = {keys.thread(queue.ref_of(waiting))}
    held |= {keys.session(waiting.app, waiting.user_id, waiting.session_id)}
    held |= {keys.user(waiting.app, waiting.user_id)}
    held |= {keys.user_threads(waiting.app, waiting.user_id)}
    for name, ttl in now.items():
        kind = _kind(name, prefix)
        if name in held:
            assert ttl == -1, kind  # a message of theirs waits
        elif kind in {"thread", "id:thread", "id:user", "threads"}:
            assert 0 < ttl <= IDLE_SECONDS * 1000, kind
        else:
            assert (ttl == -1) == (old[name] == -1), kind  # durable stays durable
    assert [await redis.pttl(name) for name in others] == [-1, -1, -1]
    assert not (await sweep(redis, settings, apply=True)).given  # nothing left to give
    for u in range(3):
        for s in range(2):
            said = _said(u, s, 1)
            mapped = await redis.hget(
                keys.user(said.app, said.user_id), keys.thread_field(*said_ids(said))
            )
            assert mapped == f"{u}/{s}".encode()
            assert not await redis.exists(keys.session(said.app, said.user_id, said.session_id))
    await redis.delete(*others)


def said_ids(m: QueuedMessage) -> tuple[str, str, str]:
    return m.app, m.user_id, m.session_id


@pytest.fixture
def second_prefix(prefix: str) -> str:
    """Another deployment's prefix on the same Redis (its keys deleted by the test)."""
    return f"{prefix}x"


async def test_the_sweep_command_is_a_dry_run_unless_told(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """What it finds is printed as JSON (the dry run's and the applied run's), and a run
    that stops at ``--pages`` prints the cursor the next run resumes from."""
    from afterthought.testing.cli import run_cli_here

    keys = Keys.of(local_settings)
    await redis.set(keys.synthesized("app", "ada"), "c")  # durable; nothing else of ada left
    await redis.hset(keys.thread("0123456789abcdef01234567"), "seq", 3)  # without a lifetime
    found = {"given": {"thread": 1}, "removed": {"synth": 1}}
    dry = run_cli_here(local_settings, "sweep")
    assert dry.returncode == 2 and "add --yes" in dry.stderr, dry.stderr
    assert json.loads(dry.stdout) | found == json.loads(dry.stdout)
    assert json.loads(dry.stdout)["dry_run"] is True
    # A page at a time, resumed from each printed cursor: what the pages find adds up to
    # what the dry run found (which page finds it depends on the rest of the keyspace).
    given: dict[str, int] = {}
    removed: dict[str, int] = {}
    runs, cursor = 0, None
    while True:
        more = ["--cursor", cursor] if cursor else []
        run = run_cli_here(local_settings, "sweep", "--yes", "--pages", "1", *more)
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        for total, part in ((given, report["given"]), (removed, report["removed"])):
            for name, count in part.items():
                total[name] = total.get(name, 0) + count
        runs, cursor = runs + 1, report["cursor"]
        if cursor is None:
            break
        assert f"run again with --cursor {cursor}" in run.stderr
        assert runs < 10_000
    assert runs >= 2  # one of the two name patterns a page: a cursor was printed
    assert {"given": given, "removed": removed} == found
    assert await redis.pttl(keys.thread("0123456789abcdef01234567")) > 0
    bad = run_cli_here(local_settings, "sweep", "--cursor", "x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--cursor" in bad.stderr


async def test_a_session_back_after_its_idle_lifetime_keeps_its_backend_thread(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis, prefix: str
) -> None:
    settings = zep_settings.model_copy(update={"idle_ttl_seconds": IDLE_SECONDS})
    queue = ThreadQueue(redis, settings)
    assert await queue.enqueue([queued("I like tea", 1)], now_ms=_ms()) == 1
    await drain(settings)
    registry = IdentityRegistry(redis, settings)
    first = await registry.lookup(app="memtest", user_id="alice", session_id="s1")
    zep_fake.idempotency_window = 0.0  # Zep no longer replays the thread's creation
    await _idle(redis, prefix, IDLE_SECONDS)
    assert await queue.enqueue([queued("and biscuits", 2)], now_ms=_ms()) == 1
    await drain(settings)
    again = await registry.lookup(app="memtest", user_id="alice", session_id="s1")
    assert again.thread_uuid == first.thread_uuid


@pytest.mark.parametrize("mode", ["query", "cached"])
async def test_a_user_back_after_their_idle_lifetime_has_their_memory_from_the_first_turn(
    any_settings: Settings, redis: aioredis.Redis, prefix: str, mode: str
) -> None:
    """Their registry entries and cached blocks expired (``idle_ttl_seconds``, then the
    cache's week): the first turns of the user back, before any worker provisioned them
    again, read their memory from the backend user their id names (the template is
    deterministic). On the code before, the read found no entry and showed no memory until
    the worker had re-provisioned them."""
    from afterthought.agent_hooks import create_callbacks
    from afterthought.testing.stand_in_model import memory_lines
    from tests.adk_support import make_runner, say

    settings = any_settings.model_copy(
        update={"idle_ttl_seconds": IDLE_SECONDS, "context_mode": mode}
    )
    runner, model = make_runner(create_callbacks(settings=settings), app="memtest")
    session = await runner.session_service.create_session(app_name="memtest", user_id="ada")
    await say(runner, "ada", session.id, "My locker code is Quuxblorf.")
    await drain(settings)
    await _idle(redis, prefix, 365 * 86400)  # every registry entry and cached block
    registry = IdentityRegistry(redis, settings)
    assert await registry.lookup_user(app="memtest", user_id="ada") is None

    for text in ("What is my locker code?", "And again?"):  # no worker runs between
        later = await runner.session_service.create_session(app_name="memtest", user_id="ada")
        await say(runner, "ada", later.id, text)
        assert any("Quuxblorf" in line for line in memory_lines(model.requests[-1])), text
    await runner.close()
