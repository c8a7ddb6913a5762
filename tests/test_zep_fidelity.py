"""The Zep adapter against a fake that behaves like real Zep (``reference/zep_fidelity.md``),
through the real SDK over HTTP and, for the worker's side, real Redis.

Each probe of issue 11 has a test here; then the adapter's operations run once per
combination of the fake's switches for what is unknown of Zep (how long a repeated
Idempotency-Key is honoured, a repeated key with another body, a repeated key while the
first request runs) with and without a request that commits after its client timed out.
Nothing waits on the clock for an outcome: states are polled with generous bounds, and
lags and pending tasks are counted in calls where a test depends on them."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
import pytest
import redis.asyncio as aioredis
from zep_cloud import AddMessage, AsyncZep
from zep_cloud.core.api_error import ApiError

from afterthought.backends.base import BackendError, OutgoingMessage, UserRef
from afterthought.backends.local import LocalBackend
from afterthought.backends.zep import EPISODE_LIMIT, ZepBackend, split_text
from afterthought.contract import MEMORY_SESSION, DeadLetter, QueuedMessage
from afterthought.facts import Fact
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.testing import Fault, ZepFake
from afterthought.worker.prune import Pruner
from tests.conftest import drain, enqueue, queued

T = TypeVar("T")
ADDS = "POST /threads/.*/messages"
#: The matrix's settle time: longer than a hung call takes to commit after its timeout.
SETTLE = 0.2


async def _eventually(check: Callable[[], bool], within: float = 20.0) -> None:
    """Poll until ``check`` holds; the bound only stops a broken test."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def _answered(fake: ZepFake) -> bool:
    """No request of the fake's hangs or waits for its work: every late commit landed."""
    return fake.hanging == 0 and all(r.status for r in fake.requests)


async def _until_done(op: Callable[[], Awaitable[T]], fake: ZepFake, within: float = 20.0) -> T:
    """Call ``op`` until it succeeds, as the worker's retries would; a transient or
    conflicting outcome is retried, anything else fails the test. Before a retry the
    server settles, as the worker lets it: the retry comes after a late commit landed."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await op()
        except BackendError as exc:
            assert exc.kind in ("timeout", "conflict", "unavailable"), exc
            assert time.monotonic() < deadline, "never succeeded"
            await _eventually(lambda: _answered(fake))


def _message(text: str, key: str) -> OutgoingMessage:
    return OutgoingMessage(
        "user", text, "2026-01-01T00:00:00+00:00", None, {"afterthought_key": key}
    )


async def _dead(settings: Settings, redis: aioredis.Redis) -> list[DeadLetter]:
    raw = await redis.lrange(Keys(settings.key_prefix).dead(), 0, -1)
    return [DeadLetter.parse(r) for r in raw]


def _fact_item(text: str, n: int = 1) -> QueuedMessage:
    return QueuedMessage.build(
        app="memtest",
        user_id="alice",
        session_id=MEMORY_SESSION,
        invocation_id=f"fact:{n}",
        role="user",
        ordinal=0,
        content=text,
        kind="fact",
        trust="app",
    )


async def _named(settings: Settings, user_id: str = "alice") -> str:
    """The backend user id the deployment gives ``user_id`` of the test app."""
    client = aioredis.Redis.from_url(settings.redis_url)
    try:
        return await IdentityRegistry(client, settings).backend_user_id(
            app="memtest", user_id=user_id
        )
    finally:
        await client.aclose()


def _long_text(chars: int) -> str:
    """Sentences of words, longer than ``chars``."""
    sentence = "Alice keeps a detailed travel diary about every city she visits. "
    return (sentence * (chars // len(sentence) + 2)).strip()


@pytest.fixture
async def backend(zep_settings: Settings) -> AsyncIterator[ZepBackend]:
    made = ZepBackend(zep_settings)
    yield made
    await made.aclose()


def test_backends_and_their_loops_read_the_ca_bundle_once(
    zep_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the CA bundle takes ~50 ms of CPU: an agent opens a backend per memory and
    a client per loop, and each would pay it again."""
    made: list[object] = []
    create = httpx.create_ssl_context

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(True)
        return create(*args, **kwargs)

    monkeypatch.setattr(httpx, "create_ssl_context", counted)

    async def open_client() -> None:
        backend = ZepBackend(zep_settings)
        assert backend.zep is not None  # this loop's client
        await backend.aclose()

    for _ in range(3):
        asyncio.run(open_client())
    assert len(made) <= 1  # none once another test made the process's context


# --- the fake models real Zep --------------------------------------------------------------
async def test_the_fake_refuses_content_over_the_plan_limit_naming_the_length(
    zep_fake: ZepFake,
) -> None:
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    user = await zep.user.create(user_id="u1")
    thread = str((await zep.thread.create(user_uuid=str(user.uuid_))).uuid_)
    with pytest.raises(ApiError) as refused:
        await zep.thread.add_messages(
            thread, messages=[AddMessage(role="user", content="x" * 2501)]
        )
    assert refused.value.status_code == 400 and "2500" in refused.value.body.error.message
    zep_fake.configure({"plan": "paid", "too_long_status": 413})
    await zep.thread.add_messages(thread, messages=[AddMessage(role="user", content="x" * 14_000)])
    with pytest.raises(ApiError) as too_large:
        await zep.thread.add_messages(
            thread, messages=[AddMessage(role="user", content="x" * 14_001)]
        )
    assert too_large.value.status_code == 413
    with pytest.raises(ApiError) as episode:
        await zep.graph.episode.add(str(user.graph_uuid), data="x" * 10_001, type="text")
    assert episode.value.status_code == 400 and "10000" in episode.value.body.error.message


async def test_the_fake_deletes_later_through_a_task_and_extracts_edges_of_its_own(
    zep_fake: ZepFake,
) -> None:
    zep_fake.configure({"ingestion_lag_calls": 0})  # extraction is not the subject here
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    zep_fake.configure({"delete_pending_polls": 3, "delete_pending_seconds": 60})
    user = await zep.user.create(user_id="u1")
    thread = str((await zep.thread.create(user_uuid=str(user.uuid_))).uuid_)
    await zep.thread.add_messages(
        thread,
        messages=[
            AddMessage(role="user", content="I live in Lisbon. I like tea."),
            AddMessage(role="assistant", content="Noted."),
        ],
        ignore_roles=["assistant"],
    )
    edges = zep_fake.edges(extracted=True)
    assert [e["fact"] for e in edges] == ["I live in Lisbon.", "I like tea."]
    (episode,) = zep_fake.episodes(of_messages=True)  # the assistant's is ignored
    assert all(e["episode_uuids"] == [episode["uuid"]] and not e["attributes"] for e in edges)

    deleted = await zep.graph.edge.delete(str(user.graph_uuid), edges[0]["uuid"])
    assert deleted.task and deleted.task.status == "pending" and deleted.task.uuid_
    statuses = [(await zep.task.get(deleted.task.uuid_)).status for _ in range(3)]
    assert statuses == ["processing", "processing", "succeeded"]
    assert [e["fact"] for e in zep_fake.edges()] == ["I like tea."]
    # Deleting an edge leaves its episode, which the context still shows.
    context = await zep.thread.get_context(thread)
    assert "I live in Lisbon." in str(context.context)

    gone = await zep.user.delete(str(user.uuid_))
    assert gone.task and gone.task.uuid_
    assert zep_fake.users()  # still visible while its task is pending
    for _ in range(3):
        await zep.task.get(gone.task.uuid_)
    assert not zep_fake.users() and not zep_fake.threads() and not zep_fake.edges()


async def test_the_fake_lags_ingestion_so_return_context_lacks_what_was_just_sent(
    zep_fake: ZepFake,
) -> None:
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    zep_fake.configure({"ingestion_lag_calls": 1})
    user = await zep.user.create(user_id="u1")
    thread = str((await zep.thread.create(user_uuid=str(user.uuid_))).uuid_)
    sent = await zep.thread.add_messages(
        thread, messages=[AddMessage(role="user", content="I live in Lisbon.")], return_context=True
    )
    assert "Lisbon" not in str(sent.context or "")
    assert not zep_fake.edges()
    later = await zep.thread.get_context(thread)  # one call later, it is ingested
    assert "Lisbon" in str(later.context)


async def test_the_fake_pages_lists_with_a_maximum_page_size(zep_fake: ZepFake) -> None:
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    zep_fake.configure({"max_page_size": 7})
    user = await zep.user.create(user_id="u1")
    thread = str((await zep.thread.create(user_uuid=str(user.uuid_))).uuid_)
    for start in range(0, 20, 10):
        await zep.thread.add_messages(
            thread,
            messages=[AddMessage(role="user", content=f"m{i}") for i in range(start, start + 10)],
        )
    first = await zep.thread.list_messages(thread, page_size=100, order="desc")
    assert len(first.items or []) == 7
    assert [m.content async for m in first] == [f"m{i}" for i in reversed(range(20))]


async def test_the_fake_keeps_keys_per_project_or_per_path(zep_fake: ZepFake) -> None:
    """Whether Zep keeps a key per project or per request path is not documented: the
    default is the project (one key sent to two threads is one request, the second
    replayed and stored nowhere); ``key_scope`` ``path`` keeps it per path."""
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    user = await zep.user.create(user_id="u1")
    threads = [
        str((await zep.thread.create(user_uuid=str(user.uuid_), idempotency_key=k)).uuid_)
        for k in ("t1", "t2")
    ]
    one = [AddMessage(role="user", content="a")]
    for thread in threads:
        await zep.thread.add_messages(thread, messages=one, idempotency_key="k")
    assert [len(zep_fake.messages(t)) for t in threads] == [1, 0]
    zep_fake.configure({"key_scope": "path"})
    for thread in threads:
        await zep.thread.add_messages(thread, messages=one, idempotency_key="k2")
    assert [len(zep_fake.messages(t)) for t in threads] == [2, 1]


async def test_the_fake_scopes_keys_per_endpoint_and_compares_bodies(zep_fake: ZepFake) -> None:
    zep_fake.configure({"key_scope": "path"})
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0)
    user = await zep.user.create(user_id="u1")
    thread = str((await zep.thread.create(user_uuid=str(user.uuid_), idempotency_key="k")).uuid_)
    one = [AddMessage(role="user", content="a")]
    await zep.thread.add_messages(thread, messages=one, idempotency_key="k")  # another endpoint
    await zep.thread.add_messages(thread, messages=one, idempotency_key="k")  # a replay
    assert [m["content"] for m in zep_fake.messages(thread)] == ["a"]
    other = [AddMessage(role="user", content="b")]
    for reuse, status in (("422", 422), ("409", 409)):
        zep_fake.configure({"key_reuse": reuse})
        with pytest.raises(ApiError) as conflict:
            await zep.thread.add_messages(thread, messages=other, idempotency_key="k")
        assert conflict.value.status_code == status
    zep_fake.configure({"key_reuse": "replay"})
    await zep.thread.add_messages(thread, messages=other, idempotency_key="k")
    assert [m["content"] for m in zep_fake.messages(thread)] == ["a"]  # "b" silently dropped
    zep_fake.configure({"idempotency_window": 0.0})
    await zep.thread.add_messages(thread, messages=other, idempotency_key="k")
    assert [m["content"] for m in zep_fake.messages(thread)] == ["a", "b"]


@pytest.mark.parametrize("mode", ["wait", "409", "run_both"])
async def test_the_fake_offers_each_answer_to_a_key_still_in_flight(
    zep_fake: ZepFake, mode: str
) -> None:
    zep_fake.configure({"key_in_flight": mode})
    thread = await _thread(AsyncZep(api_key="k", base_url=zep_fake.base_url, timeout=30))
    zep = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0, timeout=0.3)
    released = threading.Event()  # the first hangs until the retry is answered
    zep_fake.inject(Fault(match=ADDS, hang=True, released=released))
    try:
        message = [AddMessage(role="user", content="a")]
        with pytest.raises(httpx.TimeoutException):
            await zep.thread.add_messages(thread, messages=message, idempotency_key="k1")
        await _eventually(lambda: zep_fake.hanging == 1)  # the first holds its key
        retry = AsyncZep(api_key="k", base_url=zep_fake.base_url, max_retries=0, timeout=10)
        again = retry.thread.add_messages(thread, messages=message, idempotency_key="k1")
        if mode == "409":
            with pytest.raises(ApiError) as busy:
                await again
            assert busy.value.status_code == 409
        elif mode == "run_both":
            await again
        else:  # the retry waits for the first: let the first go once the retry has arrived
            waiting = asyncio.ensure_future(again)

            def both_arrived() -> bool:
                return [r.idempotency_key for r in zep_fake.requests].count("k1") == 2

            await _eventually(both_arrived)
            released.set()
            await waiting
    finally:
        released.set()  # a failed test leaves no request hanging
    await _eventually(lambda: zep_fake.ambiguous == {"hang": 1})
    expected = ["a", "a"] if mode == "run_both" else ["a"]
    assert [m["content"] for m in zep_fake.messages(thread)] == expected


async def _thread(zep: AsyncZep) -> str:
    user = await zep.user.create(user_id="u1")
    return str((await zep.thread.create(user_uuid=str(user.uuid_))).uuid_)


def test_the_fake_refuses_unknown_switches_and_values(zep_fake: ZepFake) -> None:
    with pytest.raises(ValueError):
        zep_fake.configure({"key_reuse": "ignore"})
    with pytest.raises(ValueError):
        zep_fake.configure({"no_such_switch": 1})
    assert zep_fake.config()["duplicate_user_status"] == 400


# --- the adapter, probe by probe -------------------------------------------------------------
@pytest.mark.parametrize("status", [400, 409])
async def test_a_duplicate_user_is_looked_up_not_failed(
    backend: ZepBackend, zep_fake: ZepFake, status: int
) -> None:
    zep_fake.configure({"duplicate_user_status": status})
    first, created = await backend.ensure_user(zep_user_id="alice")
    assert created
    assert await backend.ensure_user(zep_user_id="alice") == (first, False)


async def test_a_user_created_elsewhere_does_not_dead_letter_their_messages(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    await AsyncZep(api_key="k", base_url=zep_fake.base_url).user.create(user_id="alice")
    await enqueue(zep_settings, queued("I live in Lisbon.", 1))
    await drain(zep_settings)
    assert [m["content"] for m in zep_fake.messages()] == ["I live in Lisbon."]
    assert not await _dead(zep_settings, redis)


async def test_a_409_on_add_messages_is_reconciled_not_dead_lettered(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    zep_fake.inject(Fault(match=ADDS, status=409, times=2))
    await enqueue(zep_settings, queued("I live in Lisbon.", 1), queued("I like tea.", 2))
    await drain(zep_settings)
    assert [m["content"] for m in zep_fake.messages()] == ["I live in Lisbon.", "I like tea."]
    assert not await _dead(zep_settings, redis)


@pytest.mark.parametrize("status", [400, 413])
async def test_content_over_the_plan_limit_is_resplit_not_dead_lettered(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, redis: aioredis.Redis, status: int
) -> None:
    """The up-front split follows ``max_message_chars``, set here for a paid plan the
    account does not have: Zep's refusal names the length, and the worker splits smaller."""
    zep_fake.configure({"too_long_status": status})
    settings = make_settings(
        backend="zep", zep_api_key="k", zep_base_url=zep_fake.base_url, max_message_chars=14_000
    )
    text = _long_text(6000)
    await enqueue(settings, queued(text, 1), queued("short", 2))
    await drain(settings)
    stored = [m["content"] for m in zep_fake.messages()]
    assert "".join(stored[:-1]) == text and stored[-1] == "short"
    assert all(len(part) <= 2500 for part in stored)
    assert not await _dead(settings, redis)


def test_long_text_is_split_between_sentences_or_words_never_inside_one() -> None:
    text = _long_text(25_000)
    parts = split_text(text, EPISODE_LIMIT)
    assert "".join(parts) == text and len(parts) == 3
    assert all(len(p) <= EPISODE_LIMIT and p.endswith(". ") for p in parts[:-1])
    words = "word " * 3000  # no sentence end: cut at a space
    assert all(p.endswith(" ") for p in split_text(words, 1000)[:-1])
    assert split_text("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]  # nothing else to do


async def test_app_memory_over_the_episode_limit_is_stored_in_parts(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    text = _long_text(25_000)
    await enqueue(zep_settings, _fact_item(text))
    await drain(zep_settings)
    episodes = zep_fake.episodes()
    assert "".join(e["content"] for e in episodes) == text
    assert all(len(e["content"]) <= EPISODE_LIMIT for e in episodes) and len(episodes) == 3
    assert [e["metadata"]["afterthought_part"] for e in episodes] == ["1/3", "2/3", "3/3"]
    assert not await _dead(zep_settings, redis)


async def test_managed_mode_writes_app_memory_as_edges_with_our_provenance(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    settings = make_settings(
        backend="zep", zep_api_key="k", zep_base_url=zep_fake.base_url, memory_mode="managed"
    )
    await enqueue(settings, _fact_item("Alice is allergic to peanuts."))
    await drain(settings)
    assert not zep_fake.episodes(of_messages=True)  # nothing for Zep to extract from
    (edge,) = zep_fake.edges()
    assert edge["fact"] == "Alice is allergic to peanuts."
    assert edge["attributes"]["trust"] == "app" and edge["attributes"]["source_keys"]
    backend = ZepBackend(settings)
    user, _ = await backend.ensure_user(zep_user_id=await _named(settings))
    (fact,) = await backend.list_facts(user=user)
    assert not fact.extracted
    await backend.aclose()


async def test_deletes_wait_for_their_task_and_say_whether_anything_was_deleted(
    backend: ZepBackend, zep_fake: ZepFake
) -> None:
    zep_fake.configure({"ingestion_lag_calls": 0})  # extraction is not the subject here
    user, thread = await _said(backend, "I live in Lisbon.")
    (edge,) = zep_fake.edges()
    assert await backend.delete_memory(user=user, memory_uuid=edge["uuid"]) is True
    # Done when it returns: the edge and its episode are gone; the message stays.
    assert not zep_fake.edges() and not zep_fake.episodes(of_messages=True)
    assert [m["content"] for m in zep_fake.messages(thread)] == ["I live in Lisbon."]
    assert await backend.delete_memory(user=user, memory_uuid=edge["uuid"]) is False
    assert await backend.delete_memory(user=user, memory_uuid=thread) is False  # not a memory
    await backend.delete_user(user=user)
    assert not zep_fake.users() and await backend.thread_owner(thread_uuid=thread) is None


async def test_a_delete_still_pending_or_failed_is_an_error_not_a_success(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    zep_fake.configure({"ingestion_lag_calls": 0})  # extraction is not the subject here
    settings = make_settings(
        backend="zep", zep_api_key="k", zep_base_url=zep_fake.base_url, zep_delete_wait_seconds=0.3
    )
    backend = ZepBackend(settings)
    user, _ = await _said(backend, "I live in Lisbon.")
    (edge,) = zep_fake.edges()
    zep_fake.configure({"delete_pending_polls": 10_000, "delete_pending_seconds": 600})
    with pytest.raises(BackendError) as pending:
        await backend.delete_memory(user=user, memory_uuid=edge["uuid"])
    assert (pending.value.kind, pending.value.code) == ("unavailable", "delete_pending")
    assert zep_fake.edges()  # not gone: nobody may report it forgotten
    zep_fake.configure({"delete_pending_polls": 1, "delete_outcome": "failed"})
    with pytest.raises(BackendError) as failed:
        await backend.delete_user(user=user)
    assert failed.value.code == "delete_failed" and zep_fake.users()
    await backend.aclose()


async def _said(backend: ZepBackend, text: str) -> tuple[UserRef, str]:
    user, _ = await backend.ensure_user(zep_user_id="alice")
    thread = await backend.create_thread(user=user, idempotency_key="t1")
    await backend.add_messages(
        thread_uuid=thread, messages=[_message(text, "k1")], idempotency_key="b1"
    )
    return user, thread


async def test_the_same_messages_with_other_options_are_another_request(
    backend: ZepBackend, zep_fake: ZepFake
) -> None:
    """A retry that has become the last call asks for context: same messages, another
    body. Under the same key Zep may refuse it (422) or replay a reply not meant for it."""
    user, _ = await backend.ensure_user(zep_user_id="alice")
    thread = await backend.create_thread(user=user, idempotency_key="t1")
    message = [_message("I live in Lisbon.", "k1")]
    await backend.add_messages(thread_uuid=thread, messages=message, idempotency_key="b1")
    context = await backend.add_messages(
        thread_uuid=thread, messages=message, idempotency_key="b1", return_context=True
    )
    assert context is not None and "Lisbon" in context


@pytest.mark.parametrize("reuse", ["replay", "409", "422"])
async def test_two_users_never_share_a_thread_through_a_reused_key(
    backend: ZepBackend, zep_fake: ZepFake, reuse: str
) -> None:
    zep_fake.configure({"key_reuse": reuse})
    alice, _ = await backend.ensure_user(zep_user_id="alice")
    bob, _ = await backend.ensure_user(zep_user_id="bob")
    for user in (alice, bob):
        thread = await backend.create_thread(user=user, idempotency_key="same-session")
        assert await backend.thread_owner(thread_uuid=thread) == user.user_uuid


async def test_importance_zero_is_read_back_as_zero(backend: ZepBackend, tmp_path: Any) -> None:
    fact = Fact(subject="user", predicate="likes", value="tea", importance=0, source_keys=["k"])
    local = LocalBackend(tmp_path / "m.sqlite3")
    for store in (backend, local):
        user, _ = await store.ensure_user(zep_user_id="alice")
        await store.write_facts(
            user=user, add=[fact], invalidate=[], at="2026-01-01T00:00:00+00:00"
        )
        (stored,) = [f for f in await store.list_facts(user=user) if not f.extracted]
        assert stored.importance == 0
    await local.aclose()


@pytest.mark.parametrize("opt_in", [False, True], ids=["ours-only", "prune_zep_edges"])
async def test_zep_mode_pruning_leaves_zep_extracted_edges_alone_unless_opted_in(
    make_settings: Callable[..., Settings],
    zep_fake: ZepFake,
    redis: aioredis.Redis,
    opt_in: bool,
) -> None:
    settings = make_settings(
        backend="zep",
        zep_api_key="k",
        zep_base_url=zep_fake.base_url,
        max_facts_per_user=1,
        prune_zep_edges=opt_in,
    )
    # Zep extracts three edges from what alice said, two of them the same fact.
    await enqueue(settings, queued("I like tea. I like tea.", 1), queued("I live in Porto.", 2))
    await drain(settings)
    backend = ZepBackend(settings)
    user, _ = await backend.ensure_user(zep_user_id=await _named(settings))
    ours = [
        Fact(subject="user", predicate="likes", value=v, importance=0.1, source_keys=[v])
        for v in ("coffee", "the coffee")
    ]
    await backend.write_facts(user=user, add=ours, invalidate=[], at=datetime.now(UTC).isoformat())
    extracted = {e["uuid"] for e in zep_fake.edges(extracted=True)}
    assert len(extracted) == 3

    report = await Pruner(settings, redis, backend).prune_user(
        app="memtest", user_id="alice", user=user, dry_run=False
    )
    pruned = {uuid for uuid, _ in report.pruned}
    left = {e["uuid"] for e in zep_fake.edges()}
    if opt_in:
        assert extracted & pruned and len(left) == 1
    else:  # only ours: the near-duplicate of ours goes, all of Zep's stay
        assert not extracted & pruned and len(pruned) == 1 and extracted <= left
    await backend.aclose()


async def test_forgetting_a_fact_through_the_worker_completes_zeps_async_delete(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    zep_fake.configure({"ingestion_lag_calls": 0})  # extraction is not the subject here
    await enqueue(zep_settings, queued("I live in Lisbon.", 1))
    await drain(zep_settings)
    (edge,) = zep_fake.edges()
    forget = QueuedMessage.build(
        app="memtest",
        user_id="alice",
        session_id=MEMORY_SESSION,
        invocation_id=f"forget:{edge['uuid']}",
        role="user",
        ordinal=0,
        content=edge["uuid"],
        kind="forget",
    )
    await enqueue(zep_settings, forget)
    await drain(zep_settings)
    assert not zep_fake.edges() and not zep_fake.episodes(of_messages=True)
    assert any(r.path.startswith("/tasks/") for r in zep_fake.requests)
    assert not await _dead(zep_settings, redis)


# --- every unknown of Zep, in every combination ----------------------------------------------
WINDOWS = {"forever": None, "window": 0.3}
COMBOS = [
    pytest.param(window, reuse, flight, hang, id=f"{window}-{reuse}-{flight}-{hang_id}")
    for window, reuse, flight in itertools.product(
        WINDOWS, ("replay", "409", "422"), ("wait", "409", "run_both")
    )
    for hang, hang_id in ((False, "answered"), (True, "commits-after-timeout"))
] + [
    pytest.param("never", "422", "409", hang, id=f"never-{hang_id}")
    for hang, hang_id in ((False, "answered"), (True, "commits-after-timeout"))
]


@pytest.mark.parametrize(("window", "reuse", "flight", "hang"), COMBOS)
async def test_the_adapter_survives_every_idempotency_behaviour(
    make_settings: Callable[..., Settings],
    zep_fake: ZepFake,
    redis: aioredis.Redis,
    window: str,
    reuse: str,
    flight: str,
    hang: bool,
) -> None:
    """ensure_user, create_thread, add_messages (with reconciliation after a timeout),
    paging, add_fact and deletes, against one setting of the fake's switches. With
    ``hang``, the first call of each kind commits after its client gave up."""
    zep_fake.configure(
        {
            "honor_idempotency": window != "never",
            "idempotency_window": WINDOWS.get(window),
            "key_reuse": reuse,
            "key_in_flight": flight,
            "client_timeout": 0.3,
            "hang_overshoot": 0.05,
            "max_page_size": 7,
            "ingestion_lag_calls": 1,
        }
    )
    settings = make_settings(
        backend="zep",
        zep_api_key="k",
        zep_base_url=zep_fake.base_url,
        backend_timeout=0.3,
        backend_settle_seconds=SETTLE,
    )
    backend = ZepBackend(settings)

    def maybe_hang(match: str) -> None:
        if hang:
            zep_fake.inject(Fault(match=match, hang=True))

    # ensure_user: a create whose reply was lost is found, not created twice.
    maybe_hang("POST /users$")
    user, _ = await _until_done(lambda: backend.ensure_user(zep_user_id="carol"), zep_fake)
    assert await backend.ensure_user(zep_user_id="carol") == (user, False)
    await _eventually(lambda: len(zep_fake.users()) == 1)

    # create_thread: whatever the retry meets, the thread it returns is the user's.
    maybe_hang("POST /threads$")
    thread = await _until_done(
        lambda: backend.create_thread(user=user, idempotency_key="s1"), zep_fake
    )
    assert await backend.thread_owner(thread_uuid=thread) == user.user_uuid

    # add_messages through the worker: every message once, in order, nothing dead.
    maybe_hang(ADDS)
    said = [queued(f"I like dish number {i}.", i) for i in range(40)]
    await enqueue(settings, *said)
    await drain(settings, timeout=60)
    await _eventually(lambda: all(r.status for r in zep_fake.requests))  # late commits landed
    (alice,) = [t["uuid"] for t in zep_fake.threads() if t["user_uuid"] != user.user_uuid]
    assert [m["content"] for m in zep_fake.messages(alice)] == [m.content for m in said]
    assert not await _dead(settings, redis)

    # Paging: the server's pages are smaller than asked for.
    recent = await backend.recent_messages(thread_uuid=alice, limit=40)
    assert [m.content for m in recent] == [m.content for m in reversed(said)]
    alice_ref, _ = await backend.ensure_user(zep_user_id=await _named(settings))
    history, cursor = await backend.user_messages(user=alice_ref, after=None, limit=100)
    assert [m.content for m in history] == [m.content for m in said] and cursor

    # add_fact: stored, in parts under the episode limit; at least once, once while keys hold.
    maybe_hang("POST /graphs/.*/episodes$")
    text = _long_text(12_000)
    await _until_done(
        lambda: backend.add_fact(
            user=user, text=text, key="f1", trust="app", reference_time="2026-01-01T00:00:00Z"
        ),
        zep_fake,
    )
    await _eventually(lambda: all(r.status for r in zep_fake.requests))
    stored = [e["content"] for e in zep_fake.episodes()]
    assert all(len(s) <= EPISODE_LIMIT for s in stored)
    if window == "forever":
        assert stored == split_text(text, EPISODE_LIMIT)
    else:  # a retry after the key expired adds a part again: facts are not reconciled
        assert set(stored) == set(split_text(text, EPISODE_LIMIT))

    # Deletes: done when they return (a retry after a lost reply included).
    await backend.get_context(user=alice_ref, query="dish", max_chars=4000, timeout=5)
    edge = zep_fake.edges(extracted=True)[0]["uuid"]
    maybe_hang("DELETE /graphs/.*/edges/")
    await _until_done(lambda: backend.delete_memory(user=alice_ref, memory_uuid=edge), zep_fake)
    await _eventually(lambda: edge not in {e["uuid"] for e in zep_fake.edges()})
    maybe_hang("DELETE /users/")
    await _until_done(lambda: backend.delete_user(user=user), zep_fake)
    await _eventually(lambda: user.user_uuid not in {u["uuid"] for u in zep_fake.users()})
    await backend.aclose()
