"""Late commits (issue 21): a call given up on is served minutes later, by a server that
honours idempotency keys or ignores them, and a worker paused past its lease sends after
losing it. Per thread: nothing lost, nothing stored twice (copies repaired and skipped by
reads aside), nothing out of order.

Real Redis, real flushers, the real SDK over HTTP into the Zep fake. Time is the test's own
clock: the fake serves a late request when it says so, and it is the flushers' clock and
in-job sleep; nothing waits on the wall clock for a result. What the repair reads of Redis'
time (when a thread was noted) is given to it explicitly."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from afterthought.backends import open_backend
from afterthought.backends.base import COPY_OF_FIELD, MemoryBackend
from afterthought.backends.zep import ZepBackend
from afterthought.keys import Keys
from afterthought.search import SearchRequest
from afterthought.settings import Settings
from afterthought.status import snapshot
from afterthought.testing import Fault, ZepFake
from afterthought.testing import zep_fake as fake_module
from afterthought.worker.flush import Flusher
from tests.conftest import backend_user_id, enqueue, queued

ADDS = "POST /threads/.*/messages"
#: Minutes, as the issue measured (Zep stopped 60-150 s, requests served late).
LATE = 150.0


class Clock:
    """Seconds the test moves: the fake's clock, the flushers' clock and their sleep."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Iterator[ZepFake]:
    with ZepFake(clock=clock, key_in_flight="409") as started:
        yield started


def _settings(make: Callable[..., Settings], fake: ZepFake, **values: Any) -> Settings:
    return make(
        backend="zep",
        zep_api_key="k",
        zep_base_url=fake.base_url,
        backend_timeout=2.0,
        backend_settle_seconds=0.5,
        **values,
    )


def _flusher(settings: Settings, redis: aioredis.Redis, clock: Clock, **kwargs: Any) -> Flusher:
    backend = kwargs.pop("backend", None) or open_backend(settings)
    return Flusher(settings, redis, backend, clock=clock, sleep=clock.sleep, **kwargs)


def _wall_ms(seconds_from_now: float = 0.0) -> int:
    return int((time.time() + seconds_from_now) * 1000)


async def _due_again(redis: aioredis.Redis, settings: Settings, *refs: str) -> None:
    """Deferred threads made due now (instead of waiting out their backoff)."""
    keys = Keys.of(settings)
    for ref in refs:
        await redis.zadd(keys.ready(keys.shard_of_ref(ref)), {ref: 0}, xx=True)


def _verdict(fake: ZepFake, said: dict[str, list[str]]) -> dict[str, int]:
    """Lost, duplicated and reordered messages over all threads, as reads see them (a
    marked copy is skipped), and the copies still unmarked in the raw threads."""
    by_session: dict[str, list[str]] = {}
    raw_copies = 0
    for thread in fake.threads():
        stored = fake.messages(thread["uuid"])
        visible = [m for m in stored if COPY_OF_FIELD not in m["metadata"]]
        seen = Counter((m["metadata"]["afterthought_key"], m["content"]) for m in stored)
        raw_copies += sum(n - 1 for n in seen.values())
        session = _session_of(visible, said)
        by_session[session] = [m["content"] for m in visible]
    lost = duplicated = reordered = 0
    for session, wanted in said.items():
        got = by_session.get(session, [])
        lost += sum(1 for text in wanted if text not in got)
        duplicated += len(got) - len(set(got))
        firsts = list(dict.fromkeys(got))
        reordered += firsts != [t for t in wanted if t in firsts]
    return {"lost": lost, "duplicated": duplicated, "reordered": reordered, "raw": raw_copies}


def _session_of(stored: Sequence[dict[str, Any]], said: dict[str, list[str]]) -> str:
    texts = {m["content"] for m in stored}
    return next((s for s, wanted in said.items() if texts & set(wanted)), "")


def _adds_of(fake: ZepFake, text: str) -> list[str | None]:
    """The idempotency key of every add that carried ``text``."""
    return [
        r.idempotency_key
        for r in fake.requests
        if r.method == "POST"
        and r.path.endswith("/messages")
        and any(m.get("content") == text for m in r.body.get("messages", []))
    ]


# --- keys honoured: the resend is the same call -----------------------------------------
async def test_a_call_served_minutes_late_is_stored_once_where_keys_are_honoured(
    make_settings: Callable[..., Settings], fake: ZepFake, clock: Clock, redis: aioredis.Redis
) -> None:
    """The first attempt is served 150 s late; every resend meanwhile meets it in
    progress (409). However many attempts and jobs fail, the batch is resent as it was,
    under its key, never cut anew: when the late one lands, the next attempt replays it."""
    settings = _settings(make_settings, fake)
    said = [queued("I live in Lisbon.", 1), queued("I like tea.", 2)]
    await enqueue(settings, *said)
    fake.inject(Fault(match=ADDS, late=LATE))
    flusher = _flusher(settings, redis, clock)
    for _ in range(8):  # jobs in a row, each of three attempts, the thread due again at once
        await flusher.drain(budget=30)
        await _due_again(redis, settings, said[0].thread_key)
        clock.now += 5
    assert fake.held() == 1 and fake.messages() == []  # still in progress, nothing doubled
    clock.now += LATE
    await flusher.drain(budget=30)
    assert _verdict(fake, {"s1": [m.content for m in said]}) == {
        "lost": 0,
        "duplicated": 0,
        "reordered": 0,
        "raw": 0,
    }
    assert len(set(_adds_of(fake, "I live in Lisbon."))) == 1  # one key, at every attempt
    assert not await redis.llen(Keys.of(settings).pending(said[0].thread_key))


async def test_a_batch_cut_anew_after_a_refusal_is_resent_as_cut_by_another_worker(
    make_settings: Callable[..., Settings], fake: ZepFake, clock: Clock, redis: aioredis.Redis
) -> None:
    """Zep refused the batch as too large, so it went in two calls of two; the first of
    them is served 150 s late. Another worker process, which knows nothing of the thread,
    takes it over: it resends the same call of two under its key (the cut is recorded with
    the batch), not four messages in one call under another key."""
    settings = _settings(make_settings, fake, batch_size=4)
    said = [queued(f"line {n}", n) for n in range(4)]
    await enqueue(settings, *said)
    fake.inject(Fault(match=ADDS, status=413))
    fake.inject(Fault(match=ADDS, late=LATE))
    await _flusher(settings, redis, clock).drain(budget=30)
    for _ in range(3):  # new processes, one after another
        await _due_again(redis, settings, said[0].thread_key)
        clock.now += 5
        await _flusher(settings, redis, clock).drain(budget=30)
    clock.now += LATE
    await _due_again(redis, settings, said[0].thread_key)
    await _flusher(settings, redis, clock).drain(budget=30)
    assert _verdict(fake, {"s1": [m.content for m in said]}) == {
        "lost": 0,
        "duplicated": 0,
        "reordered": 0,
        "raw": 0,
    }
    sizes = [
        len(r.body["messages"])
        for r in fake.requests
        if r.method == "POST" and r.path.endswith("/messages")
    ]
    assert sizes == [4] + [2] * (len(sizes) - 1), sizes  # refused whole, then calls of two
    assert len(set(_adds_of(fake, "line 0")[1:])) == 1


# --- keys ignored: the late copy is found and repaired --------------------------------------
async def test_a_copy_a_late_commit_makes_where_keys_are_ignored_is_repaired(
    make_settings: Callable[..., Settings], fake: ZepFake, clock: Clock, redis: aioredis.Redis
) -> None:
    """The copies are marked in the thread (Zep deletes no message), and what Zep's graph
    made of them is deleted, once it has made it: until then the thread stays watched."""
    fake.honor_idempotency = False
    settings = _settings(make_settings, fake)
    said = [queued("I live in Lisbon.", 1), queued("I like tea.", 2)]
    await enqueue(settings, *said)
    fake.inject(Fault(match=ADDS, late=LATE))
    flusher = _flusher(settings, redis, clock)
    await flusher.drain(budget=30)  # dropped, read back (absent), resent, stored
    later = [queued("I moved to Porto.", 3)]
    await enqueue(settings, *later)
    await flusher.drain(budget=30)
    fake.ingestion_lag_seconds = 10.0
    clock.now += LATE  # the first attempt lands: after "I moved to Porto."
    contents = [m["content"] for m in fake.messages()]
    assert contents == ["I live in Lisbon.", "I like tea.", "I moved to Porto.", *contents[:2]]

    everything = {"s1": [m.content for m in said + later]}
    backend = open_backend(settings)
    assert isinstance(backend, ZepBackend)
    user, cursor, history = await _user(backend, settings), None, []
    while True:  # page by page, as synthesis reads: each message once, before any repair
        page, cursor = await backend.user_messages(user=user, after=cursor, limit=2)
        if not page:
            break
        history += [m.content for m in page]
    assert history == everything["s1"]

    early = await flusher.repair_late(now_ms=_wall_ms(1))  # noted just now: not read yet
    assert early["threads"] == 0
    unmade = await flusher.repair_late(now_ms=_wall_ms(60))  # their episodes are not made yet
    assert unmade["copies_waiting"] == 2 and not unmade["copies_marked"], unmade
    clock.now += 10.0  # Zep has ingested the copies: two episodes and their facts again
    assert await _seen_by_readers(backend, await _user(backend, settings), everything["s1"]) == {
        "context": 2,
        "edges": 2,
        "episodes": 2,
    }
    stats = await flusher.repair_late(now_ms=_wall_ms(60))
    assert stats["copies_marked"] == 2
    assert _verdict(fake, everything) == {"lost": 0, "duplicated": 0, "reordered": 0, "raw": 2}
    (thread,) = fake.threads()
    copies = [m for m in fake.messages(thread["uuid"]) if COPY_OF_FIELD in m["metadata"]]
    assert [m["content"] for m in copies] == ["I live in Lisbon.", "I like tea."]

    marked, _ = await backend.user_messages(user=user, after=None, limit=10)
    assert [m.content for m in marked] == everything["s1"]  # reads skip the marked copies
    assert await _seen_by_readers(backend, user, everything["s1"]) == {
        "context": 0,
        "edges": 0,
        "episodes": 0,
    }
    status = await snapshot(redis, settings)
    assert status.late_copies == 2 and status.late_watched == 1

    assert (await flusher.repair_late(now_ms=_wall_ms(60)))["copies_marked"] == 0  # once
    horizon = settings.late_commit_seconds
    await flusher.repair_late(now_ms=_wall_ms(horizon + 1))  # past: no longer watched
    assert (await snapshot(redis, settings)).late_watched == 0
    await backend.aclose()


async def _user(backend: MemoryBackend, settings: Settings) -> Any:
    found = await backend.find_user(
        zep_user_id=await backend_user_id(settings, app="memtest", user_id="alice")
    )
    assert found is not None
    return found


async def test_a_copy_whose_episode_carries_no_key_is_marked_and_said_unmatched(
    make_settings: Callable[..., Settings], fake: ZepFake, clock: Clock, redis: aioredis.Redis
) -> None:
    """Where Zep keeps no metadata on a message's episode, the copy's episode cannot be
    told from the first copy's: none is deleted (neither could be the wrong one), the copy
    is marked, and the repair says what the graph may still hold."""
    fake.honor_idempotency = False
    fake.episode_metadata = "dropped"
    settings = _settings(make_settings, fake)
    said = [queued("I live in Lisbon.", 1)]
    await enqueue(settings, *said)
    fake.inject(Fault(match=ADDS, late=LATE))
    flusher = _flusher(settings, redis, clock)
    await flusher.drain(budget=30)
    clock.now += LATE
    stats = await flusher.repair_late(now_ms=_wall_ms(60))
    assert stats["copies_marked_unmatched"] == 1 and not stats["copies_marked"], stats
    assert len(fake.episodes(of_messages=True)) == 2  # the graph's second mention stays
    assert (await snapshot(redis, settings)).late_copies == 1


# --- a repair that meets failures -----------------------------------------------------------
#: Each kind of call a repair makes of Zep: a page of the thread, its episodes, the delete
#: of a copy's episode, the mark of the copy.
REPAIR_CALLS = {
    "read": "GET /threads/.*/messages",
    "episodes": "GET /threads/.*/episodes",
    "delete": "DELETE /graphs/.*/episodes/",
    "mark": "PATCH /threads/.*/messages/",
}


async def _late_copies(
    settings: Settings, fake: ZepFake, clock: Clock, redis: aioredis.Redis, count: int
) -> tuple[Flusher, dict[str, list[str]]]:
    """A thread whose first call of ``count`` messages, given up on, was served after the
    resend and a later message, where keys are ignored: ``count`` copies, their episodes
    made."""
    fake.honor_idempotency = False
    said = [queued(f"line {n}", n) for n in range(count)]
    await enqueue(settings, *said)
    fake.inject(Fault(match=ADDS, late=LATE))
    flusher = _flusher(settings, redis, clock)
    await flusher.drain(budget=30)
    later = [queued("I moved to Porto.", count)]
    await enqueue(settings, *later)
    await flusher.drain(budget=30)
    clock.now += LATE
    return flusher, {"s1": [m.content for m in said + later]}


@pytest.mark.parametrize("failing", list(REPAIR_CALLS))
async def test_a_failed_call_is_retried_within_the_repair_run(
    failing: str,
    make_settings: Callable[..., Settings],
    fake: ZepFake,
    clock: Clock,
    redis: aioredis.Redis,
) -> None:
    """Zep fails a call of the repair (twice in a row: 503, then a dropped connection):
    the run retries it after a short backoff, on the worker's sleep, and repairs every copy
    of the thread in that run."""
    settings = _settings(make_settings, fake, batch_size=3)
    flusher, said = await _late_copies(settings, fake, clock, redis, 3)
    fake.inject(Fault(match=REPAIR_CALLS[failing], status=503))
    fake.inject(Fault(match=REPAIR_CALLS[failing], drop=True))
    began = clock.now
    stats = await flusher.repair_late(now_ms=_wall_ms(60))
    assert stats["copies_marked"] == 3 and not stats["unread"], stats
    assert not stats["copies_left"], stats
    assert fake.injected["503"] == fake.injected["drop"] == 1
    assert 0 < clock.now - began <= 2 * 5.0  # backed off, boundedly, on the injected sleep
    assert _verdict(fake, said) == {"lost": 0, "duplicated": 0, "reordered": 0, "raw": 3}
    assert (await flusher.repair_late(now_ms=_wall_ms(60)))["copies_marked"] == 0  # once


async def test_a_copy_that_keeps_failing_is_left_counted_and_repaired_at_the_next_run(
    make_settings: Callable[..., Settings], fake: ZepFake, clock: Clock, redis: aioredis.Redis
) -> None:
    """The first copy's mark fails at every attempt of a run: the other copies of its
    thread are still repaired, the one left is counted and its thread stays watched, and
    the next run repairs it."""
    settings = _settings(make_settings, fake, batch_size=3)
    flusher, said = await _late_copies(settings, fake, clock, redis, 3)
    (thread,) = fake.threads()
    stored = fake.messages(thread["uuid"])
    first_copy = stored[len(said["s1"])]["uuid"]  # the oldest copy: the first repaired
    fake.inject(Fault(match=f"PATCH /threads/.*/messages/{first_copy}", status=503, times=3))
    late = Keys.of(settings).late
    await redis.pexpire(late, 1000)  # noted long ago: the watch was about to end
    stats = await flusher.repair_late(now_ms=_wall_ms(60))
    assert stats["copies_marked"] == 2 and stats["copies_left"] == 1, stats
    assert (await snapshot(redis, settings)).late_watched == 1
    assert await redis.pttl(late) > settings.late_commit_seconds * 1000  # kept for it
    again = await flusher.repair_late(now_ms=_wall_ms(60))
    assert again["copies_marked"] == 1 and not again["copies_left"], again
    assert _verdict(fake, said) == {"lost": 0, "duplicated": 0, "reordered": 0, "raw": 3}
    assert (await snapshot(redis, settings)).late_copies == 3


async def test_two_runs_repairing_one_thread_at_once_count_each_copy_once(
    make_settings: Callable[..., Settings],
    fake: ZepFake,
    clock: Clock,
    redis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One worker's run has read the thread's copies and is paused before it marks them;
    another worker's run reads, marks and counts them meanwhile; the first then marks them
    too (a mark is a metadata merge: it succeeds again). Each copy is counted once."""
    settings = _settings(make_settings, fake, batch_size=3)
    first, said = await _late_copies(settings, fake, clock, redis, 3)
    other = _flusher(settings, redis, clock)
    repair = first._repair_copies

    async def paused_before_marking(*args: Any, **kwargs: Any) -> tuple[int, int]:
        assert (await other.repair_late(now_ms=_wall_ms(60)))["copies_marked"] == 3
        return await repair(*args, **kwargs)

    monkeypatch.setattr(first, "_repair_copies", paused_before_marking)
    assert (await first.repair_late(now_ms=_wall_ms(60)))["copies_marked"] == 3
    assert _verdict(fake, said) == {"lost": 0, "duplicated": 0, "reordered": 0, "raw": 3}
    assert (await snapshot(redis, settings)).late_copies == 3


async def test_a_copy_marked_by_a_run_whose_replies_were_lost_is_counted_by_the_next(
    make_settings: Callable[..., Settings], fake: ZepFake, clock: Clock, redis: aioredis.Redis
) -> None:
    """Every mark of a run lands and its reply is lost, at each attempt: the run counts
    the copies left. The next run finds them marked, and counts them repaired, once."""
    settings = _settings(make_settings, fake, batch_size=3)
    flusher, said = await _late_copies(settings, fake, clock, redis, 3)
    mark = REPAIR_CALLS["mark"]
    fake.inject(Fault(match=mark, drop=True, after_commit=True, times=100))
    stats = await flusher.repair_late(now_ms=_wall_ms(60))
    assert stats["copies_left"] == 3 and not stats["copies_marked"], stats
    fake.faults.clear()
    assert (await flusher.repair_late(now_ms=_wall_ms(60)))["copies_marked"] == 0
    assert _verdict(fake, said) == {"lost": 0, "duplicated": 0, "reordered": 0, "raw": 3}
    assert (await snapshot(redis, settings)).late_copies == 3
    await flusher.repair_late(now_ms=_wall_ms(60))
    assert (await snapshot(redis, settings)).late_copies == 3


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_with_a_tenth_of_the_calls_failing_one_run_repairs_every_copy(
    seed: int,
    make_settings: Callable[..., Settings],
    fake: ZepFake,
    clock: Clock,
    redis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10 % of Zep's answers fail (refusals, dropped connections, lost replies; drawn from
    a seeded generator, no hangs, so nothing waits on the wall clock): ten copies in a
    thread are all repaired in one run, where a run used to end at its first failure."""
    settings = _settings(make_settings, fake, batch_size=10)
    flusher, said = await _late_copies(settings, fake, clock, redis, 10)
    monkeypatch.setattr(
        fake_module, "RANDOM_FAULTS", tuple(f for f in fake_module.RANDOM_FAULTS if not f.hang)
    )
    fake._random.seed(seed)
    fake.fault_rate = 0.1
    stats = await flusher.repair_late(now_ms=_wall_ms(60))
    fake.fault_rate = 0.0
    assert stats["copies_marked"] == 10 and not stats["copies_left"], stats
    assert sum(fake.injected.values()) > 1 + 1, fake.injected  # faults beside the late add
    assert _verdict(fake, said) == {"lost": 0, "duplicated": 0, "reordered": 0, "raw": 10}


# --- a worker paused past its lease -----------------------------------------------------------
class _Paused:
    """A backend whose next write stops until told to go on (a SIGSTOP inside the send):
    ``before`` the last check of the lease, as the request leaves (the SDK building it),
    or ``after`` it (the request taken by httpx: a stop the worker cannot see)."""

    def __init__(self, backend: ZepBackend, where: str) -> None:
        self._backend = backend
        self.stopped = asyncio.Event()
        self.go_on = asyncio.Event()
        self.armed = True
        self.where = where

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def _stop(self, *_: object) -> None:
        if self.armed:
            self.armed = False
            self.stopped.set()
            await self.go_on.wait()

    async def add_messages(self, **kwargs: Any) -> str | None:
        if self.where == "before":
            await self._stop()
        else:  # after the adapter's own request hook, which makes the last check
            http = self._backend._clients.get()[1]
            if self._stop not in http.event_hooks["request"]:
                http.event_hooks = {"request": [*http.event_hooks["request"], self._stop]}
        return await self._backend.add_messages(**kwargs)


@pytest.mark.parametrize("where", ["before", "after"], ids=lambda w: f"stopped-{w}-last-check")
@pytest.mark.parametrize("honor", [True, False], ids=["keys-honoured", "keys-ignored"])
async def test_a_worker_paused_past_its_lease_doubles_and_reorders_nothing(
    honor: bool,
    where: str,
    make_settings: Callable[..., Settings],
    fake: ZepFake,
    clock: Clock,
    redis: aioredis.Redis,
) -> None:
    fake.honor_idempotency = honor
    settings = _settings(make_settings, fake)
    keys = Keys.of(settings)
    said = [queued("I live in Lisbon.", 1), queued("I like tea.", 2)]
    await enqueue(settings, *said)
    zep = open_backend(settings)
    assert isinstance(zep, ZepBackend)
    paused = _Paused(zep, where)
    stalled = _flusher(settings, redis, clock, backend=paused)
    first = asyncio.create_task(stalled.drain(budget=30))
    await asyncio.wait_for(paused.stopped.wait(), timeout=30)  # a guard only

    # Its lease runs out (on its clock, and in Redis); another worker takes the thread over.
    clock.now += settings.lease_seconds + 1
    tk = said[0].thread_key
    await redis.delete(keys.lease(tk))
    await _due_again(redis, settings, tk)
    other = _flusher(settings, redis, clock)
    await other.drain(budget=30)
    later = [queued("I moved to Porto.", 3), queued("I like coffee now.", 4)]
    await enqueue(settings, *later)
    await other.drain(budget=30)

    paused.go_on.set()  # SIGCONT: its call goes out, after the messages said since
    stats = await asyncio.wait_for(first, timeout=30)
    assert stats["lease_lost"] == 1
    sent = len(_adds_of(fake, "I live in Lisbon."))
    assert sent == (2 if where == "after" else 1)  # before: refused by the last check
    await other.repair_late(now_ms=_wall_ms(60))
    everything = {"s1": [m.content for m in said + later]}
    # Stopped before the last check: its call never left. After it, honoured: the call
    # carried the takeover's key (the cut was recorded), so it stored nothing; ignored:
    # its two copies were stored, and are repaired.
    raw = 2 if where == "after" and not honor else 0
    assert _verdict(fake, everything) == {"lost": 0, "duplicated": 0, "reordered": 0, "raw": raw}
    assert not await redis.llen(keys.pending(tk))
    backend = open_backend(settings)
    assert await _seen_by_readers(backend, await _user(backend, settings), everything["s1"]) == {
        "context": 0,
        "edges": 0,
        "episodes": 0,
    }
    await backend.aclose()


async def _seen_by_readers(
    backend: MemoryBackend, user: Any, said: Sequence[str]
) -> dict[str, int]:
    """How many said sentences a reader meets more than once, per surface: the context
    block the agent is given, and the search tool's facts and episodes (Zep's graph
    took in whatever the thread stored, copies too)."""
    context = await backend.get_context(user=user, query="", max_chars=50_000, timeout=5)
    found = {"context": [line for line in context.splitlines() for s in said if s in line]}
    for scope in ("edges", "episodes"):
        hits = await backend.search(
            graph_uuid=user.graph_uuid,
            request=SearchRequest(query=" ".join(said), scope=scope, limit=50),
            timeout=5,
        )
        found[scope] = [s for hit in hits for s in said if s in hit.text]
    return {surface: len(texts) - len(set(texts)) for surface, texts in found.items()}


# --- many threads, any request served up to minutes late -------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("honor", [True, False], ids=["keys-honoured", "keys-ignored"])
async def test_traffic_with_requests_served_up_to_minutes_late_loses_doubles_reorders_nothing(
    honor: bool,
    seed: int,
    make_settings: Callable[..., Settings],
    fake: ZepFake,
    clock: Clock,
    redis: aioredis.Redis,
) -> None:
    """Three sessions, two workers taking turns, a third of the writes (provisioning
    included) served 0-300 s late, time moving in steps of seconds to minutes. At the end
    every late request has landed and the repair has run: per thread nothing lost,
    doubled or out of order; with keys honoured nothing was even stored twice."""
    rng = random.Random(seed)
    fake.honor_idempotency = honor
    fake.late_commit_rate = 0.3
    fake.late_commit_max_seconds = 300.0
    fake._random.seed(seed)
    settings = _settings(make_settings, fake)
    flushers = [_flusher(settings, redis, clock) for _ in range(2)]
    said: dict[str, list[str]] = {f"s{n}": [] for n in range(3)}
    refs = [queued("-", 0, session=s).thread_key for s in said]
    for step in range(40):
        session = rng.choice(list(said))
        text = f"{session} says {step}."
        said[session].append(text)
        await enqueue(settings, queued(text, step, session=session))
        await rng.choice(flushers).drain(budget=30)
        await _due_again(redis, settings, *refs)
        clock.now += rng.choice([1.0, 5.0, 30.0, 90.0])
        if step % 10 == 9:
            await flushers[0].repair_late(now_ms=_wall_ms(60))
    # Healed: nothing is served late any more, and every request held lands.
    fake.late_commit_rate = 0.0
    keys = Keys.of(settings)
    for _ in range(20):
        clock.now += 301.0
        await flushers[0].drain(budget=60)
        await _due_again(redis, settings, *refs)
        if not fake.held() and not any([await redis.llen(keys.pending(r)) for r in refs]):
            break
    assert (await flushers[0].repair_late(now_ms=_wall_ms(60)))["unread"] == 0
    assert not any([await redis.llen(keys.dead(s)) for s in keys.shard_ids])
    verdict = _verdict(fake, said)
    assert {k: verdict[k] for k in ("lost", "duplicated", "reordered")} == {
        "lost": 0,
        "duplicated": 0,
        "reordered": 0,
    }, verdict
    if honor:  # every resend carried its first attempt's key: no copy was ever stored
        assert verdict["raw"] == 0, verdict
    backend = open_backend(settings)
    texts = [text for wanted in said.values() for text in wanted]
    seen = await _seen_by_readers(backend, await _user(backend, settings), texts)
    assert seen == {"context": 0, "edges": 0, "episodes": 0}, (seen, verdict)
    await backend.aclose()


def test_every_worker_runs_the_repair_each_minute(make_settings: Callable[..., Settings]) -> None:
    from afterthought.worker.jobs import repair_late, worker_settings

    crons = worker_settings(make_settings())["cron_jobs"]
    (late,) = [c for c in crons if c.name.endswith(":cron:late")]
    assert late.coroutine is repair_late and late.minute is None and late.second == 0
