"""A forgotten fact's tombstone: synthesis never writes the fact back, and whoever reads
Redis cannot confirm a guess of it (the tombstone is keyed with a secret kept elsewhere)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from afterthought.backends import open_backend
from afterthought.backends.base import MemoryBackend
from afterthought.facts import StoredFact
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.status import snapshot
from afterthought.testing import ZepFake
from afterthought.tombstones import STORE_SECRET, Tombstones, derive, reads_as
from afterthought.worker.flush import Flusher
from afterthought.worker.forget import Forgetter
from afterthought.worker.synthesize import Synthesizer
from tests.adk_support import APP
from tests.conftest import enqueue, queued
from tests.sweep import redis_hits

PEANUTS = "I'm allergic to peanuts."


@pytest.fixture(params=["local", "zep"])
def settings(request: pytest.FixtureRequest, make_settings: Callable[..., Settings]) -> Settings:
    """The two paths synthesis writes facts on: the local store, and Zep in managed mode."""
    if request.param == "local":
        return make_settings()
    zep_fake: ZepFake = request.getfixturevalue("zep_fake")
    return make_settings(
        backend="zep", zep_api_key="k", zep_base_url=zep_fake.base_url, memory_mode="managed"
    )


async def _say(
    settings: Settings, redis: aioredis.Redis, backend: MemoryBackend, text: str, n: int
) -> Any:
    # The cool-down after a forget ended (its mark expires; new messages wait meanwhile).
    await redis.delete(Keys.of(settings).forgetting(APP, "alice"))
    await enqueue(settings, queued(text, n, session=f"s{n}"))
    await Flusher(settings, redis, backend).drain(budget=10)
    return await Synthesizer(settings, redis, backend).run(app=APP, user_id="alice")


async def _facts(settings: Settings, redis: aioredis.Redis, backend: MemoryBackend) -> list[str]:
    return [f.value for f in await _current(settings, redis, backend)]


async def _current(
    settings: Settings, redis: aioredis.Redis, backend: MemoryBackend
) -> list[StoredFact]:
    user = await IdentityRegistry(redis, settings).lookup_user(app=APP, user_id="alice")
    assert user is not None
    return [f for f in await backend.list_facts(user=user) if f.invalid_at is None]


async def _peanuts(settings: Settings, redis: aioredis.Redis, backend: MemoryBackend) -> StoredFact:
    await _say(settings, redis, backend, PEANUTS, 1)
    (fact,) = [f for f in await _current(settings, redis, backend) if f.value == "peanuts"]
    return fact


async def test_a_forgotten_fact_leaves_nothing_in_redis_that_confirms_a_guess_of_it(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """After the forget, no value in Redis equals the fact's bare signature (what anyone
    computes from the guess "user allergic_to peanuts"), nor the key that digests it; and
    said again, the fact is still never written back."""
    backend = open_backend(settings)
    fact = await _peanuts(settings, redis, backend)
    forgetter = Forgetter(settings, redis, backend, poll_seconds=0.02)
    assert (await forgetter.forget_fact(app=APP, user_id="alice", fact_uuid=fact.uuid)).facts
    person = forgetter.tombstones.person(APP, "alice")  # one person in every app
    assert person is not None and await redis.scard(person[0]) == 1
    secret = (await forgetter.tombstones.key()).hex()
    assert await redis_hits(redis, settings.key_prefix, [fact.signature, secret]) == {}

    stats = await _say(settings, redis, backend, PEANUTS, 3)
    assert stats["forgotten"] == 1 and stats["written"] == 0
    assert "peanuts" not in await _facts(settings, redis, backend)
    assert await redis_hits(redis, settings.key_prefix, [fact.signature, secret]) == {}
    await backend.aclose()


async def test_tombstones_left_before_they_were_keyed_still_block_and_are_rekeyed(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """An upgraded deployment's tombstone holds the bare signature: the fact still stays
    forgotten, and the member met is replaced by its keyed form."""
    backend = open_backend(settings)
    fact = await _peanuts(settings, redis, backend)
    tombs = Keys.of(settings).tombstones(APP, "alice")
    await backend.delete_memory(
        user=(await IdentityRegistry(redis, settings).lookup_user(app=APP, user_id="alice"))
        or pytest.fail("alice is not provisioned"),
        memory_uuid=fact.uuid,
    )
    await redis.sadd(tombs, fact.signature, "0" * 32)  # and another forgotten fact's

    stats = await _say(settings, redis, backend, PEANUTS, 3)
    assert stats["forgotten"] == 1 and stats["written"] == 0
    assert "peanuts" not in await _facts(settings, redis, backend)
    mark = await Tombstones(settings, redis, backend).mark(
        app=APP, user_id="alice", signature=fact.signature
    )
    assert await redis.smembers(tombs) == {mark.encode(), b"0" * 32}
    stats = await _say(settings, redis, backend, PEANUTS, 4)
    assert stats["forgotten"] == 1 and stats["written"] == 0
    await backend.aclose()


async def test_the_tombstone_key_comes_from_the_setting_the_store_or_the_zep_key(
    make_settings: Callable[..., Settings], redis: aioredis.Redis, zep_fake: ZepFake
) -> None:
    """The local store keeps one random key (the same for every process that opens it,
    never in Redis); ``tombstone_key`` overrides it; Zep's is derived from its API key."""
    local = make_settings()
    backend = open_backend(local)
    kept = await backend.kept_secret(STORE_SECRET)
    assert kept is not None and len(kept) == 64
    again = open_backend(local)
    assert await again.kept_secret(STORE_SECRET) == kept
    assert await Tombstones(local, redis, again).key() == derive(kept.encode())

    given = make_settings(tombstone_key="a key of the operator")
    assert await Tombstones(given, redis, backend).key() == derive(b"a key of the operator")
    assert "a key of the operator" not in repr(given)

    zep = make_settings(backend="zep", zep_api_key="zk", zep_base_url=zep_fake.base_url)
    zep_backend = open_backend(zep)
    assert await zep_backend.kept_secret(STORE_SECRET) is None
    assert await Tombstones(zep, redis, zep_backend).key() == derive(b"zk")
    assert derive(b"zk") != b"zk" and len({derive(kept.encode()), derive(b"zk")}) == 2
    for opened in (backend, again, zep_backend):
        await opened.aclose()


async def test_the_postgres_store_keeps_one_tombstone_key_for_every_process(
    postgres_settings: Settings,
) -> None:
    first, second = open_backend(postgres_settings), open_backend(postgres_settings)
    kept = await first.kept_secret(STORE_SECRET)
    assert kept is not None and len(kept) == 64
    assert await second.kept_secret(STORE_SECRET) == kept
    for opened in (first, second):
        await opened.aclose()


async def _rotated(settings: Settings, backend: MemoryBackend, *, keep_previous: bool) -> Settings:
    """The deployment after its tombstone key changed: on Zep the API key rotated (the
    tombstone key was derived from it), on the local store a ``tombstone_key`` set where
    the store's own was used; with the secret used before in ``tombstone_previous_keys``
    when ``keep_previous``."""
    if settings.zep_api_key is not None:
        before = settings.zep_api_key.get_secret_value()
        update: dict[str, Any] = {"zep_api_key": SecretStr(before + "-rotated")}
    else:
        before = await backend.kept_secret(STORE_SECRET) or pytest.fail("no key kept")
        update = {"tombstone_key": SecretStr("a key of the operator")}
    if keep_previous:
        update["tombstone_previous_keys"] = [SecretStr(before)]
    return settings.model_copy(update=update)


async def _forget_peanuts(
    settings: Settings, redis: aioredis.Redis, backend: MemoryBackend
) -> StoredFact:
    fact = await _peanuts(settings, redis, backend)
    forgetter = Forgetter(settings, redis, backend, poll_seconds=0.02)
    assert (await forgetter.forget_fact(app=APP, user_id="alice", fact_uuid=fact.uuid)).facts
    return fact


async def test_a_forgotten_fact_stays_forgotten_across_a_rotation_with_the_previous_key(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """The tombstone made under the key before still blocks the fact said again, and is
    made again under the key in use; ``status`` sees nothing wrong."""
    backend = open_backend(settings)
    fact = await _forget_peanuts(settings, redis, backend)
    rotated = await _rotated(settings, backend, keep_previous=True)

    stats = await _say(rotated, redis, backend, PEANUTS, 2)
    assert stats["forgotten"] == 1 and stats["written"] == 0
    assert "peanuts" not in await _facts(rotated, redis, backend)
    tombstones = Tombstones(rotated, redis, backend)
    person = tombstones.person(APP, "alice")  # one person in every app
    assert person is not None
    mark = await tombstones.mark(app="", user_id=person[1], signature=reads_as(fact))
    assert await redis.smembers(person[0]) == {mark.encode()}
    assert "tombstone_key_changed" not in (await snapshot(redis, rotated)).problems
    await backend.aclose()


async def test_a_rotation_without_the_previous_key_is_said_by_the_worker_and_status(
    settings: Settings, redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Without it, the old tombstones keep nothing forgotten: a worker says so in one line
    (never a key, nor its fingerprint) and ``status`` reports it until the key used before
    is given."""
    backend = open_backend(settings)
    await _forget_peanuts(settings, redis, backend)
    assert "tombstone_key_changed" not in (await snapshot(redis, settings)).problems
    rotated = await _rotated(settings, backend, keep_previous=False)

    await Tombstones(rotated, redis, backend).key()
    await Tombstones(rotated, redis, backend).key()
    said = [r.getMessage() for r in caplog.records if "tombstone key changed" in r.getMessage()]
    assert said == [
        "tombstone key changed: the tombstones of 1 key(s) used before keep nothing forgotten;"
        " set tombstone_previous_keys to the key(s) used before (README, Forgetting)"
    ]
    status = await snapshot(redis, rotated)
    assert "tombstone_key_changed" in status.problems and status.tombstone_keys_unchecked == 1

    fixed = await _rotated(settings, backend, keep_previous=True)
    await Tombstones(fixed, redis, backend).key()  # the next worker started with it
    assert "tombstone_key_changed" not in (await snapshot(redis, fixed)).problems
    await backend.aclose()
