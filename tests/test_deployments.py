"""Deployments never share users by accident, and one user id is one person in every app.

Two deployments (two ``key_prefix``) on one Redis and one Zep project (the fake, through
the real zep-cloud SDK), or one local store file: by default each names its backend users
for itself, so neither sees the other's; they share when the operator says so (a template
without ``{deployment}``); a deployment that had users before keeps them. Within one
deployment, a user id is one person in every app: the first turn in a second app, the
plugin, and ``search_memory`` under either app's name all give the same memory."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService

from afterthought.agent_hooks import MemoryPlugin, ZepMemoryService, create_callbacks
from afterthought.agent_hooks.provisioning import ensure_thread, ensure_user
from afterthought.backends import open_backend
from afterthought.backends.base import BackendError
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.settings import Settings
from afterthought.status import snapshot
from afterthought.testing.stand_in_model import StandInLlm, memory_lines
from afterthought.worker.forget import Forgetter
from tests.adk_support import make_runner, say
from tests.conftest import BOTH_LAYOUTS, drain, remove_prefix

APP = "memtest"
SECRET = "My locker code is Quuxblorf."


@pytest.fixture
def second_prefix(prefix: str) -> Iterator[str]:
    """Another deployment's prefix on the same Redis, cleaned up as ``prefix`` is."""
    value = f"{prefix}x"
    yield value
    remove_prefix(value)


@pytest.fixture(params=["local", "zep"])
def two_deployments(
    request: pytest.FixtureRequest, make_settings: Callable[..., Settings], second_prefix: str
) -> Callable[..., tuple[Settings, Settings]]:
    """Two deployments on one Redis and one backend: the Zep fake's project, or one local
    store file (``make_settings`` names the same one for both)."""
    backend: dict[str, Any] = {}
    if request.param == "zep":
        fake = request.getfixturevalue("zep_fake")
        backend = {"backend": "zep", "zep_api_key": "test-key", "zep_base_url": fake.base_url}

    def make(**overrides: Any) -> tuple[Settings, Settings]:
        first = make_settings(**backend, **overrides)
        second = make_settings(
            key_prefix=second_prefix,
            spool_path=first.spool_path.with_name("spool-2"),
            **backend,
            **overrides,
        )
        assert first.local_db_path == second.local_db_path
        return first, second

    return make


async def _turn(  # type: ignore[no-untyped-def]
    settings: Settings,
    app: str,
    user: str,
    text: str,
    *,
    drained: bool = True,
    session_id: str | None = None,
):
    """One turn of ``user`` in ``app`` (a new session, or ``session_id``) through a real
    Runner (the callbacks); the lines of the memory block the model was shown. Drained
    after, unless ``drained`` is False."""
    runner, model = make_runner(create_callbacks(settings=settings), app=app)
    session = await runner.session_service.create_session(
        app_name=app, user_id=user, session_id=session_id
    )
    await say(runner, user, session.id, text)
    if drained:
        await drain(settings)
    return memory_lines(model.requests[-1])


async def _found(settings: Settings, app: str, user: str, query: str) -> list[str]:
    """What ``search_memory`` finds for the user under ``app``'s name: ids and texts."""
    service = ZepMemoryService(settings=settings)
    try:
        found = await service.search_memory(app_name=app, user_id=user, query=query)
    finally:
        await service.memory.aclose()
    return [f"{m.id} {(m.content.parts or [])[0].text}" for m in found.memories]


def _told(lines: list[str]) -> bool:
    return any("Quuxblorf" in line for line in lines)


# --- two deployments on one backend --------------------------------------------------


async def test_two_deployments_on_one_backend_share_no_user_by_default(
    two_deployments: Callable[..., tuple[Settings, Settings]], redis: aioredis.Redis
) -> None:
    first, second = two_deployments()
    await _turn(first, APP, "ada", SECRET)
    assert _told(await _found(first, APP, "ada", "locker code"))

    await _turn(second, APP, "ada", "Hello")
    assert not _told(await _turn(second, APP, "ada", "What is my locker code?"))
    assert not _told(await _found(second, APP, "ada", "locker code"))
    # Two backend users, each named for its deployment.
    ids = [
        await IdentityRegistry(redis, s).backend_user_id(app=APP, user_id="ada")
        for s in (first, second)
    ]
    assert ids == [f"{first.key_prefix}:ada", f"{second.key_prefix}:ada"]


async def test_two_deployments_with_one_session_id_each_store_their_own(
    two_deployments: Callable[..., tuple[Settings, Settings]], redis: aioredis.Redis
) -> None:
    """ADK's API server lets clients choose session ids: ``default`` is every deployment's.
    Each gets its own thread (the local store refuses one user's thread to another)."""
    first, second = two_deployments()
    await _turn(first, APP, "ada", SECRET, session_id="default")
    await _turn(second, APP, "ada", "I live in Oslo.", session_id="default")
    for settings in (first, second):
        assert await redis.llen(Keys.of(settings).dead()) == 0
    assert any("Oslo" in hit for hit in await _found(second, APP, "ada", "Oslo"))
    assert not _told(await _found(second, APP, "ada", "locker code"))
    assert _told(await _found(first, APP, "ada", "locker code"))


async def test_two_deployments_that_import_one_session_each_store_it(
    two_deployments: Callable[..., tuple[Settings, Settings]], redis: aioredis.Redis
) -> None:
    """A backfill (``add_session_to_memory``) of one ADK session into each of two
    deployments: the messages' and calls' keys are made from ADK's ids and the words, the
    same in both, and the second import was taken for a replay of the first and stored
    nowhere (the local store kept keys per file; Zep, the fake assumes, keeps them per
    project). Each deployment's ada holds it, with no dead letter."""
    from google.adk.events.event import Event
    from google.adk.memory.memory_entry import MemoryEntry
    from google.genai import types

    sessions = InMemorySessionService()
    session = await sessions.create_session(app_name=APP, user_id="ada", session_id="import1")
    for author, text in (("user", SECRET), ("assistant", "Noted.")):
        role = "user" if author == "user" else "model"
        content = types.Content(role=role, parts=[types.Part(text=text)])
        await sessions.append_event(
            session, Event(invocation_id="inv-1", author=author, content=content)
        )
    session = await sessions.get_session(app_name=APP, user_id="ada", session_id="import1")
    assert session is not None
    deployments = two_deployments()
    for settings in deployments:
        service = ZepMemoryService(settings=settings)
        try:
            await service.add_session_to_memory(session)
            note = types.Content(parts=[types.Part(text="I am allergic to peanuts.")])
            await service.add_memory(
                app_name=APP, user_id="ada", memories=[MemoryEntry(content=note)]
            )
        finally:
            await service.memory.aclose()
        await drain(settings)
    for settings in deployments:
        assert await redis.llen(Keys.of(settings).dead()) == 0
        assert _told(await _found(settings, APP, "ada", "locker code")), settings.key_prefix
        assert any("peanut" in hit for hit in await _found(settings, APP, "ada", "peanuts"))


async def test_two_deployments_that_say_they_share_users_share_them(
    two_deployments: Callable[..., tuple[Settings, Settings]],
) -> None:
    first, second = two_deployments(zep_user_id_template="{user_id}")
    await _turn(first, APP, "ada", SECRET)
    await _turn(second, APP, "ada", "Hello")
    assert _told(await _turn(second, APP, "ada", "What is my locker code?"))
    assert _told(await _found(second, APP, "ada", "locker code"))


@BOTH_LAYOUTS
async def test_a_deployment_with_users_from_before_keeps_them_and_a_new_one_shares_none(
    two_deployments: Callable[..., tuple[Settings, Settings]], redis: aioredis.Redis
) -> None:
    """A deployment from before the default was recorded named its users ``{user_id}``: it
    keeps them (and names new ones so too), while a new deployment beside it on the same
    backend names its own for itself."""
    old, new = two_deployments()
    before = old.model_copy(update={"zep_user_id_template": "{user_id}"})
    await _turn(before, APP, "ada", SECRET)
    # The version before recorded no default, and no one by person.
    await redis.delete(f"{old.key_prefix}:user-ids", f"{old.key_prefix}:id:person:{digest('ada')}")

    assert _told(await _turn(old, APP, "ada", "What is my locker code?"))  # upgraded
    assert _told(await _turn(old, "preload_agent", "ada", "Hi", drained=False))  # indexed
    await _turn(old, APP, "bob", "Hello")  # a new user is named as the others were
    backend = open_backend(old)
    try:
        assert await backend.find_user(zep_user_id="bob") is not None
    finally:
        await backend.aclose()

    await _turn(new, APP, "ada", "Hello")
    assert not _told(await _turn(new, APP, "ada", "What is my locker code?"))
    assert not _told(await _found(new, APP, "ada", "locker code"))
    assert await redis.get(Keys.of(old).user_ids) == b"{user_id}"


# --- one person in every app ---------------------------------------------------------


async def test_the_first_turn_in_another_app_has_the_users_memory(
    any_settings: Settings,
) -> None:
    await _turn(any_settings, "shop", "ada", SECRET)
    # Nothing drained between: the worker has not seen ada in the second app yet.
    assert _told(await _turn(any_settings, "preload_agent", "ada", "Hi", drained=False))
    assert _told(await _turn(any_settings, "preload_agent", "ada", "And now?"))


async def test_search_memory_under_either_apps_name_finds_the_same(
    any_settings: Settings,
) -> None:
    await _turn(any_settings, "shop", "ada", SECRET)
    shop = await _found(any_settings, "shop", "ada", "locker code")
    assert _told(shop)
    assert await _found(any_settings, "preload_agent", "ada", "locker code") == shop
    await _turn(any_settings, "preload_agent", "ada", "Hi")  # registered there too now
    shop = await _found(any_settings, "shop", "ada", "locker code")
    assert _told(shop)
    assert await _found(any_settings, "preload_agent", "ada", "locker code") == shop


async def test_the_plugin_in_another_app_has_the_users_memory_from_its_first_turn(
    any_settings: Settings,
) -> None:
    await _turn(any_settings, "shop", "ada", SECRET)
    model = StandInLlm()
    plugin = MemoryPlugin(settings=any_settings)
    app = App(name="preload_agent", root_agent=LlmAgent(name="a", model=model), plugins=[plugin])
    runner = Runner(app=app, session_service=InMemorySessionService())
    session = await runner.session_service.create_session(app_name="preload_agent", user_id="ada")
    await say(runner, "ada", session.id, "Hi")
    await runner.close()
    assert _told(memory_lines(model.requests[-1]))


async def test_forgetting_the_person_in_an_app_that_never_saw_them_forgets_them(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    """The person's entry lets an app the registry has not mapped them in read their
    memory; a forget from there finds them, and no app reads them afterwards."""
    await _turn(any_settings, "shop", "ada", SECRET)
    forgetter = Forgetter(any_settings, redis, open_backend(any_settings))
    done = await forgetter.forget_user(app="preload_agent", user_id="ada")
    assert done.users == 2 and not done.pending
    for app in ("shop", "preload_agent"):
        registry = IdentityRegistry(redis, any_settings)
        assert await registry.lookup_user(app=app, user_id="ada") is None
        assert not await _found(any_settings, app, "ada", "locker code")
    assert await redis.exists(Keys.of(any_settings).person("ada")) == 0


class _HeldProvisioning:
    """The backend as an app's provisioning meets it while a forget from another app runs:
    its reply held until the test lets it go, the user made before the hold or after it
    (the forget deleted them meanwhile), and the delete that would take them back refused
    or not."""

    def __init__(self, backend: Any, *, made_after: bool, refuse_delete: bool) -> None:
        self._backend, self._made_after, self._refuse_delete = backend, made_after, refuse_delete
        self.asked, self.answer = asyncio.Event(), asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def ensure_user(self, **kwargs: Any) -> Any:
        got = None if self._made_after else await self._backend.ensure_user(**kwargs)
        self.asked.set()
        await self.answer.wait()
        return await self._backend.ensure_user(**kwargs) if self._made_after else got

    async def delete_user(self, **kwargs: Any) -> None:
        if self._refuse_delete:
            raise BackendError("unavailable", code="test")
        await self._backend.delete_user(**kwargs)


async def _provision_through_a_forget(
    settings: Settings, redis: aioredis.Redis, held: _HeldProvisioning, backend: Any
) -> Forgetter:
    """App A knows ada; app B provisions her (her person entry expired: B asks the
    backend) through ``held`` while A forgets her; B's provisioning says it was raced."""
    await ensure_user(app="A", user_id="ada", settings=settings)
    await redis.delete(Keys.of(settings).person("ada"))
    provisioning = asyncio.create_task(
        ensure_thread(app="B", user_id="ada", session_id="s1", settings=settings, backend=held)
    )
    await asyncio.wait_for(held.asked.wait(), 30)
    forgetter = Forgetter(settings, redis, backend)
    assert not (await forgetter.forget_user(app="A", user_id="ada")).pending
    held.answer.set()
    with pytest.raises(BackendError, match="forgotten_meanwhile"):
        await provisioning
    return forgetter


async def test_provisioning_another_app_while_the_person_is_forgotten_leaves_nothing(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    """An app provisions the person (the backend slow to reply) while a forget from
    another app runs and ends: it takes back its entry and the person's, and says so."""
    backend = open_backend(any_settings)
    held = _HeldProvisioning(backend, made_after=False, refuse_delete=False)
    await _provision_through_a_forget(any_settings, redis, held, open_backend(any_settings))
    keys = Keys.of(any_settings)
    assert await redis.exists(keys.person("ada"), keys.user("B", "ada")) == 0
    await backend.aclose()


async def test_a_raced_provisioning_that_cannot_take_back_its_user_leaves_a_pending_forget(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    """The backend makes the person again after a forget from another app deleted them,
    and refuses the delete that would take them back: the forget is pending again
    (``status`` counts it), and a worker's resume deletes the user left behind."""
    backend = open_backend(any_settings)
    held = _HeldProvisioning(backend, made_after=True, refuse_delete=True)
    forgetter = await _provision_through_a_forget(any_settings, redis, held, backend)
    named = await IdentityRegistry(redis, any_settings).backend_user_id(app="B", user_id="ada")
    assert await backend.find_user(zep_user_id=named) is not None  # left behind
    assert await redis.hexists(Keys.of(any_settings).forgets, digest("B", "ada"))
    assert (await snapshot(redis, any_settings)).forgets.pending == 1
    await forgetter.resume_pending()
    assert await backend.find_user(zep_user_id=named) is None
    assert (await snapshot(redis, any_settings)).forgets.pending == 0
    await backend.aclose()


async def test_a_lost_default_record_is_read_back_from_the_registry(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    """Redis loses ``<prefix>:user-ids`` but keeps the registry: the entries say which
    default named their users, so the deployment keeps ``{deployment}:{user_id}`` (and its
    users' memory) instead of taking itself for one from before the default."""
    await _turn(any_settings, APP, "ada", SECRET)
    keys = Keys.of(any_settings)
    assert await redis.get(keys.user_ids) == b"{deployment}:{user_id}"
    await redis.delete(keys.user_ids)
    registry = IdentityRegistry(redis, any_settings)
    assert await registry.backend_user_id(app=APP, user_id="bob") == (
        f"{any_settings.key_prefix}:bob"
    )
    assert await redis.get(keys.user_ids) == b"{deployment}:{user_id}"
    assert _told(await _turn(any_settings, APP, "ada", "What is my locker code?"))
