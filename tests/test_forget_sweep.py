"""Forgetting leaves nothing behind: after ``forget --user``, every Redis key of the
deployment and every byte of the local store (or the Zep fake's state) is searched for
the user's words, and none is found — also when the forget races the worker's first
batch. Another user's words, searched the same way, are all still there (so the search
can fail)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from afterthought.agent_hooks import create_callbacks
from afterthought.backends import open_backend
from afterthought.backends.base import MemoryBackend
from afterthought.contract import QueuedMessage
from afterthought.keys import Keys
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.testing import ZepFake
from afterthought.testing.stand_in_model import memory_lines
from afterthought.worker import flush
from afterthought.worker.flush import Flusher
from afterthought.worker.forget import Forgetter
from afterthought.worker.synthesize import Synthesizer
from tests.adk_support import APP, make_runner, new_session, say
from tests.conftest import PassingClock, drain, enqueue, run_worker_once
from tests.sweep import Gate, file_hits, redis_hits

ALICE = {
    "lines": [
        "I live in Zanzibar now, moved last spring.",
        "My quokka is called Pemberton and he hates thunderstorms.",
        "I'm allergic to marzipan, seriously, even a crumb.",
    ],
    "words": ["zanzibar", "quokka", "pemberton", "marzipan", "thunderstorms"],
}
BOB = {
    "lines": ["I live in Reykjavik.", "My tortoise Gustavsson likes strawberries."],
    "words": ["reykjavik", "gustavsson", "strawberries"],
}
#: Alice's words in a message that ended as a dead letter.
DEAD_WORDS = "My locker combination mentions a walrus named Klaxon."


async def _talk(settings: Settings, user: str, lines: list[str]) -> None:
    """Two sessions: the first still open when the forget comes (its overlay cached)."""
    runner, _ = make_runner(create_callbacks(settings=settings))
    for chunk in (lines[:1], lines[1:]):
        session = await new_session(runner, user)
        for line in chunk:
            await say(runner, user, session, line)
    await drain(settings)


async def _dead_letter(settings: Settings, redis: aioredis.Redis, text: str) -> None:
    """A message of Alice's that a worker gave up on."""
    message = QueuedMessage.build(
        app=APP,
        user_id="alice",
        session_id="gave-up",
        invocation_id="i",
        role="user",
        ordinal=0,
        content=text,
    )
    await enqueue(settings, message)
    queue, tk, now = ThreadQueue(redis, settings), message.thread_key, int(time.time() * 1000)
    assert await queue.claim([tk], ["tok"], now_ms=now) == [True]
    assert await queue.begin(tk, "tok", first=1, last=1, cut=(30, 2500), read=(None, None))
    await queue.dead_letter(tk, "tok", count=1, reason="bad_request", attempts=1, now_ms=now)
    await queue.release(tk, "tok", next_ms=now)


@pytest.fixture(params=["local", "zep"])
def setup(
    request: pytest.FixtureRequest, make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> tuple[Settings, ZepFake | None]:
    if request.param == "local":
        return make_settings(), None
    zep = make_settings(
        backend="zep",
        memory_mode="managed",  # our synthesis writes facts too
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
    )
    return zep, zep_fake


async def test_after_forget_no_key_and_no_byte_holds_the_users_words(
    setup: tuple[Settings, ZepFake | None], redis: aioredis.Redis
) -> None:
    settings, zep_fake = setup
    await _talk(settings, "alice", ALICE["lines"])
    await _talk(settings, "bob", BOB["lines"])
    backend = open_backend(settings)
    await Synthesizer(settings, redis, backend).run(app=APP, user_id="alice")
    await _dead_letter(settings, redis, DEAD_WORDS)
    words = [*ALICE["words"], "walrus", "klaxon"]
    found = {w for ws in (await redis_hits(redis, settings.key_prefix, words)).values() for w in ws}
    assert {"zanzibar", "walrus"} <= found  # cached, dead-lettered: the sweep sees them
    stored = {w for ws in file_hits(settings, ALICE["words"], zep_fake).values() for w in ws}
    assert stored == set(ALICE["words"])

    done = await Forgetter(settings, redis, backend).forget_user(app=APP, user_id="alice")
    await backend.aclose()

    assert not done.pending and done.dead_letters == 1
    assert await redis_hits(redis, settings.key_prefix, words) == {}
    assert file_hits(settings, words, zep_fake) == {}
    bobs = {w for ws in file_hits(settings, BOB["words"], zep_fake).values() for w in ws}
    assert bobs == set(BOB["words"])  # Bob's are all still there
    assert await redis_hits(redis, settings.key_prefix, ["reykjavik"])


class _Paused:
    """A backend whose first call of ``method`` does its work, then waits at ``gate``
    before it replies: the call has committed, its caller does not know yet."""

    def __init__(self, inner: MemoryBackend, method: str, gate: Gate) -> None:
        self._inner = inner
        self._method = method
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name != self._method or self._gate.reached.is_set():
            return attr

        async def paused(*args: Any, **kwargs: Any) -> Any:
            result = await attr(*args, **kwargs)
            await self._gate.wait()
            return result

        return paused


async def _within(work: Awaitable[Any], seconds: float = 60) -> Any:
    return await asyncio.wait_for(work, seconds)


@pytest.mark.parametrize("step", ["ensure_user", "create_thread", "add_messages"])
async def test_a_forget_racing_the_first_batch_leaves_nothing(
    setup: tuple[Settings, ZepFake | None], redis: aioredis.Redis, step: str
) -> None:
    """The forget starts while the worker is inside ``step`` of Alice's first batch (the
    step has committed): the worker sends nothing after it, the forget waits for the worker
    to let go, and then deletes what the step created."""
    settings, zep_fake = setup
    message = QueuedMessage.build(
        app=APP,
        user_id="alice",
        session_id="s",
        invocation_id="i",
        role="user",
        ordinal=0,
        content=ALICE["lines"][1],
    )
    follow_up = message.model_copy(update={"key": message.key + "-2", "content": DEAD_WORDS})
    await enqueue(settings, message)
    await enqueue(settings, follow_up)
    backend = open_backend(settings)
    gate = Gate()
    flusher = Flusher(settings, redis, cast(MemoryBackend, _Paused(backend, step, gate)))
    (lease,) = await flusher.claim(limit=1)
    flushing = asyncio.create_task(flusher.flush_thread(lease))
    await _within(gate.reached.wait())

    forgetter = Forgetter(settings, redis, backend, poll_seconds=0.02)
    forgetting = asyncio.create_task(forgetter.forget_user(app=APP, user_id="alice"))
    keys = Keys(settings.key_prefix)
    while not await redis.exists(keys.forgetting(APP, "alice")):
        await asyncio.sleep(0.01)
    gate.go.set()
    stats = await _within(flushing)
    done = await _within(forgetting)
    await drain(settings)
    await backend.aclose()

    assert not done.pending
    assert stats["messages"] <= 1  # only what had committed before the forget
    words = [*ALICE["words"], "walrus", "klaxon"]
    assert await redis_hits(redis, settings.key_prefix, words) == {}
    assert file_hits(settings, words, zep_fake) == {}
    if zep_fake is not None:
        assert zep_fake.users() == []  # not re-created after the forget


async def test_a_pending_forget_holds_new_messages_hides_memory_and_is_resumed(
    local_settings: Settings, redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker still holds one of the user's threads (stalled past our wait): the forget
    stays pending, shown by ``status``; meanwhile nothing of theirs is served or cached
    and what they say waits; a worker resumes the forget, then their new words flow."""
    from afterthought.context_cache import ContextCache
    from afterthought.status import snapshot

    settings = local_settings.model_copy(
        update={
            "lease_seconds": 1.0,
            "backend_timeout": 0.3,
            "backend_settle_seconds": 0.2,
            # No margin: her next turn, said right after the forget began (its wait passes
            # at once), is hers to keep, not refused as said with the forgotten ones.
            "forget_clock_margin_seconds": 0.0,
        }
    )
    # A held thread is looked at again this soon (5 s in a deployment): the drain after the
    # forget is resumed need not wait it out.
    monkeypatch.setattr(flush, "HOLD_MS", 50)
    await _talk(settings, "alice", ALICE["lines"][:1])
    keys = Keys(settings.key_prefix)
    (tk,) = [t.decode() for t in await redis.smembers(keys.user_threads(APP, "alice"))]
    await redis.set(keys.lease(tk), "a-stalled-worker", px=60_000)
    backend = open_backend(settings)
    passing = PassingClock()  # the stalled worker holds on past the forget's wait
    forgetter = Forgetter(settings, redis, backend, clock=passing, sleep=passing.sleep)

    done = await forgetter.forget_user(app=APP, user_id="alice")
    assert done.pending
    status = await snapshot(redis, settings)
    assert status.forgets.pending == 1
    cache = ContextCache(settings)
    found = await cache.read(redis, app=APP, user_id="alice", session_id="any")
    assert found.forgetting and found.block is None
    assert not await cache.write(
        redis,
        app=APP,
        user_id="alice",
        session_id=None,
        graph_uuid="g",
        block="Zanzibar",
        version=1,
        epoch=found.epoch,
    )
    runner, model = make_runner(create_callbacks(settings=settings))
    session = await new_session(runner, "alice")
    await say(runner, "alice", session, "Call me Ishmael from now on.")
    assert not any("zanzibar" in line.lower() for line in memory_lines(model.requests[-1]))
    await run_worker_once(settings)
    assert await redis.llen(keys.pending(message_thread(session))) == 2  # both turns wait

    await redis.delete(keys.lease(tk))
    (resumed,) = await forgetter.resume_pending()
    await backend.aclose()
    assert not resumed.pending
    assert (await snapshot(redis, settings)).forgets.pending == 0
    await redis.delete(keys.forgetting(APP, "alice"))  # the cool-down, not waited out here
    await drain(settings)
    assert file_hits(settings, ALICE["words"][:1]) == {}
    assert file_hits(settings, ["ishmael"])  # said after the forget: kept


def message_thread(session: str) -> str:
    from afterthought.contract import thread_key

    return thread_key(app=APP, user_id="alice", session_id=session)


async def test_the_audit_log_is_off_without_a_key_and_never_names_the_user(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    from afterthought.keys import digest

    keyless = make_settings(audit_key=None)
    await _talk(keyless, "alice", ALICE["lines"][:1])
    assert not await redis.exists(Keys(keyless.key_prefix).audit)

    keyed = make_settings()
    await _talk(keyed, "alice", ALICE["lines"][:1])
    entries = [fields for _, fields in await redis.xrange(Keys(keyed.key_prefix).audit)]
    assert entries
    plain = digest(APP, "alice").encode()
    assert all(plain not in value for e in entries for value in e.values())
    assert len({e[b"user"] for e in entries}) == 1  # one user, one keyed reference


async def test_a_dead_letter_outlives_no_forget_when_the_thread_set_idled_out(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    """The user's thread set expires (``idle_ttl_seconds``) while a dead letter of theirs
    waits for an operator: the forget finds the letter by whose it is, and a dry run
    counts it."""
    settings = make_settings()
    await _dead_letter(settings, redis, DEAD_WORDS)
    await redis.delete(Keys.of(settings).user_threads(APP, "alice"))
    backend = open_backend(settings)
    forgetter = Forgetter(settings, redis, backend)
    assert (await forgetter.held(APP, "alice")).dead_letters == 1
    done = await forgetter.forget_user(app=APP, user_id="alice")
    await backend.aclose()
    assert done.dead_letters == 1
    assert await redis_hits(redis, settings.key_prefix, ["walrus", "klaxon"]) == {}
