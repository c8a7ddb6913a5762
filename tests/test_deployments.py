"""Deployments never share users by accident, and one user id is one person in every app.

Two deployments (two ``key_prefix``) on one Redis and one Zep project (the fake, through
the real zep-cloud SDK), or one local store file: by default each names its backend users
for itself, so neither sees the other's; they share when the operator says so (a template
without ``{deployment}``); a deployment that had users before keeps them. Within one
deployment, a user id is one person in every app: the first turn in a second app, the
plugin, and ``search_memory`` under either app's name all give the same memory."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import redis.asyncio as aioredis
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService

from afterthought.agent_hooks import MemoryPlugin, ZepMemoryService, create_callbacks
from afterthought.agent_hooks.provisioning import ensure_thread, ensure_user
from afterthought.backends import open_backend
from afterthought.backends.base import BackendError, MemoryBackend
from afterthought.dead_letters import DeadLetters
from afterthought.forget_marks import person_key
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.settings import Settings
from afterthought.shared_store import UnsaidSharing, store_name
from afterthought.status import snapshot
from afterthought.testing.cli import run_cli_here
from afterthought.testing.stand_in_model import StandInLlm, memory_lines
from afterthought.worker.flush import Flusher
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


async def _no_user(backend: MemoryBackend, *named: str) -> None:
    """The backend holds none of these users (by the ``user_id`` each is named)."""
    for name in named:
        assert await backend.find_user(zep_user_id=name) is None, name


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


async def test_a_second_deployment_that_would_share_users_by_its_default_is_refused(
    two_deployments: Callable[..., tuple[Settings, Settings]],
    redis: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two deployments from before the default was recorded (each named its users
    ``{user_id}``: both keep it) on one backend. The first keeps its users; the second's
    worker is refused at start in one line (the CLI exits 2), and its agent does not read
    the backend user its default names: its ada never sees the first's ada's secret. Said
    (an explicit ``{user_id}``), the second shares them."""
    first, second = two_deployments()
    for settings in (first, second):
        await redis.set(Keys.of(settings).user_ids, "{user_id}")
    await _turn(first, APP, "ada", SECRET)

    with pytest.raises(UnsaidSharing) as refused:
        await drain(second)
    reason = (
        f"deployment {second.key_prefix} names its backend users {{user_id}} by its default (it"
        f" had users before deployments were told apart), as deployment(s) {first.key_prefix}"
        " on the same store do: they would share users without saying so; set"
        " AFTERTHOUGHT_ZEP_USER_ID_TEMPLATE={user_id} to share them, or {deployment}:{user_id}"
        " to part this one (README, Identity)"
    )
    assert str(refused.value) == reason
    ran = run_cli_here(second, "worker", "--burst")
    assert ran.returncode == 2 and ran.stderr.strip().splitlines() == [f"afterthought: {reason}"]
    assert not _told(await _turn(second, APP, "ada", "What is my locker code?", drained=False))
    assert not _told(await _found(second, APP, "ada", "locker code"))
    assert [r.getMessage() for r in caplog.records if r.getMessage() == reason] == [reason]
    assert _told(await _turn(first, APP, "ada", "What is my locker code?"))  # still runs

    said = second.model_copy(update={"zep_user_id_template": "{user_id}"})
    await drain(said)
    assert _told(await _turn(said, APP, "ada", "What is my locker code?"))


@BOTH_LAYOUTS
async def test_an_explicit_template_moves_a_deployment_apart_and_says_how_many_moved(
    two_deployments: Callable[..., tuple[Settings, Settings]],
    redis: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two deployments upgraded from before the default, both ``{user_id}``, the second
    saying so to share users as they did (README, Upgrading). The operator parts it with an
    explicit template: its registry entries named the shared backend users and won over the
    template, so its ada still read the other deployment's ada's secrets. Now each entry
    recorded under another backend user id is re-derived at the user's next turn (a new
    memory), and the first worker says how many users moved, in one line without ids."""
    old, other = two_deployments()
    for settings in (old, other):  # as their first worker of this version recorded it
        await redis.set(Keys.of(settings).user_ids, "{user_id}")
    await _turn(other, APP, "ada", SECRET)
    old = old.model_copy(update={"zep_user_id_template": "{user_id}"})
    await _turn(old, APP, "ada", "Hello")
    await _turn(old, APP, "bob", "Hello")
    assert _told(await _turn(old, APP, "ada", "What is my locker code?"))  # shared, as before
    # An entry written before entries said what named their user says nothing.
    await redis.hdel(Keys.of(old).user(APP, "bob"), "default", "template")

    apart = old.model_copy(update={"zep_user_id_template": "{deployment}:{user_id}"})
    caplog.set_level(logging.WARNING)
    await drain(apart)  # its workers start first (README, Identity)
    # bob's entry now says the template it was named by (the one settled before).
    assert await redis.hget(Keys.of(old).user(APP, "bob"), "template") == b"{user_id}"
    assert not _told(await _turn(apart, APP, "ada", "What is my locker code?"))
    assert not _told(await _turn(apart, APP, "ada", "And now?"))
    assert not _told(await _found(apart, APP, "ada", "locker code"))
    assert not _told(await _turn(apart, "preload_agent", "ada", "Hi", drained=False))
    registry = IdentityRegistry(redis, apart)
    user = await registry.lookup_user(app=APP, user_id="ada")
    backend = open_backend(apart)
    try:
        named = await backend.find_user(zep_user_id=f"{old.key_prefix}:ada")
        assert user is not None and named is not None and user.user_uuid == named.user_uuid
        assert (await backend.find_user(zep_user_id="ada")) is not None  # the old memory stays
    finally:
        await backend.aclose()
    assert _told(await _turn(other, APP, "ada", "What is my locker code?"))  # untouched
    # Said once, by the first worker with the new template (each turn ran one more).
    said = [r.getMessage() for r in caplog.records if "zep_user_id_template" in r.getMessage()]
    assert said == [
        "zep_user_id_template: 2 users recorded under another backend user id move to the "
        "one it names at their next turn (a new memory each; see README, Identity)"
    ]


async def test_a_forget_after_the_template_changed_deletes_the_user_their_entry_names(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    """Forgotten before they came back under the new template: the backend user their
    entry records (the memory they have) goes, and so does one the new template names."""
    await redis.set(Keys.of(any_settings).user_ids, "{user_id}")
    await _turn(any_settings, APP, "ada", SECRET)
    apart = any_settings.model_copy(update={"zep_user_id_template": "{deployment}:{user_id}"})
    await drain(apart)
    backend = open_backend(apart)
    try:
        await backend.ensure_user(zep_user_id=f"{apart.key_prefix}:ada")  # made meanwhile
        done = await Forgetter(apart, redis, backend).forget_user(app=APP, user_id="ada")
        assert not done.pending
        await _no_user(backend, "ada", f"{apart.key_prefix}:ada")
    finally:
        await backend.aclose()


async def test_a_forget_after_the_user_came_back_under_a_new_template_deletes_both_users(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    """Ada came back after the template changed: her entry names the new backend user and
    keeps the one it was re-derived away from (ids only), whose memory holds her secret; a
    forget deletes both, and says how many former ones it deleted."""
    await redis.set(Keys.of(any_settings).user_ids, "{user_id}")
    await _turn(any_settings, APP, "ada", SECRET)
    apart = any_settings.model_copy(update={"zep_user_id_template": "{deployment}:{user_id}"})
    await drain(apart)  # its workers start first (README, Identity)
    assert not _told(await _turn(apart, APP, "ada", "Hello again"))  # re-derived: came back
    backend = open_backend(apart)
    try:
        assert await backend.find_user(zep_user_id="ada") is not None  # her old memory
        done = await Forgetter(apart, redis, backend).forget_user(app=APP, user_id="ada")
        await _no_user(backend, "ada", f"{apart.key_prefix}:ada")
        assert not done.pending and done.former_users == 1
    finally:
        await backend.aclose()
    assert not _told(await _found(apart, APP, "ada", "locker code"))


async def _idle_out(redis: aioredis.Redis, settings: Settings) -> None:
    """What Redis does once ``idle_ttl_seconds`` pass with nothing written: every key of
    the deployment that expires within them is gone (the user's registry entry, which
    recorded their backend users, with it)."""
    keys, idle_ms = Keys.of(settings), int(settings.idle_ttl_seconds * 1000)
    for pattern in (f"{keys.prefix}:*", f"{{{keys.prefix}:*"):
        async for key in redis.scan_iter(match=pattern, count=1000):
            if 0 < await redis.pttl(key) <= idle_ms:
                await redis.delete(key)


@pytest.mark.parametrize("came_back", [True, False], ids=["came-back", "stayed-away"])
async def test_a_forget_after_the_template_changed_and_the_user_idled_deletes_every_user(
    any_settings: Settings, redis: aioredis.Redis, came_back: bool
) -> None:
    """Whether or not ada came back after the template changed, once her entry has idled
    out only the deployment's history of templates ties her to the backend user the old
    one named (her words are there): the forget finds it by rendering each, deletes every
    backend user of hers, and never says nothing was stored."""
    from afterthought.testing.cli import run_cli_here

    await redis.set(Keys.of(any_settings).user_ids, "{user_id}")
    await _turn(any_settings, APP, "ada", SECRET)
    apart = any_settings.model_copy(update={"zep_user_id_template": "{deployment}:{user_id}"})
    await drain(apart)  # its workers start first (README, Identity)
    if came_back:
        assert not _told(await _turn(apart, APP, "ada", "Hello again"))
    await _idle_out(redis, apart)
    assert not await redis.exists(Keys.of(apart).user(APP, "ada"))
    done = run_cli_here(apart, "forget", "--app", APP, "--user", "ada", "--yes")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["users"] == 1 and report["former_users"] == 1 and not report["pending"]
    backend = open_backend(apart)
    try:
        await _no_user(backend, "ada", f"{apart.key_prefix}:ada")
    finally:
        await backend.aclose()


async def test_a_forget_after_a_move_to_a_deployment_template_leaves_another_deployments_user(
    two_deployments: Callable[..., tuple[Settings, Settings]], redis: aioredis.Redis
) -> None:
    """Deployment ``old`` named its users ``{user_id}``, then moved to
    ``{deployment}:{user_id}`` as README says; deployment ``shop`` (the default) stores
    ``ada``, whose backend user id is ``shop:ada``. ``old``'s operator forgets old's ADK user
    ``shop:ada``: the old template renders shop's ada, which old never made; she keeps
    her memory."""
    old, shop = two_deployments(zep_user_id_template="{user_id}")
    await _turn(old, APP, "bob", "Hello there")  # old's history holds {user_id}
    old = old.model_copy(update={"zep_user_id_template": "{deployment}:{user_id}"})
    shop = shop.model_copy(update={"zep_user_id_template": None})
    await drain(old)
    await _turn(shop, APP, "ada", SECRET)
    theirs = f"{shop.key_prefix}:ada"
    backend = open_backend(old)
    try:
        done = await Forgetter(old, redis, backend).forget_user(app=APP, user_id=theirs)
        assert not done.pending and done.former_users == 0
        assert await backend.find_user(zep_user_id=theirs) is not None
    finally:
        await backend.aclose()
    assert _told(await _turn(shop, APP, "ada", "What is my locker code?"))


async def test_a_user_id_deployments_forget_of_an_id_shaped_like_anothers_leaves_that_user(
    two_deployments: Callable[..., tuple[Settings, Settings]],
    redis: aioredis.Redis,
) -> None:
    """Deployment ``old`` names its users ``{user_id}`` (it had users before the default
    was recorded); deployment ``shop`` beside it stores ``ada`` as ``shop:ada``. ``old``'s
    operator forgets old's ADK user ``shop:ada``, whom old never stored: that id renders
    shop's ada, which proves nothing of old's user, so she keeps her memory; the forget
    says so in one line and exits 1. Once old has stored its own ``shop:ada`` (its
    registry records them), the forget deletes that backend user: old's user wrote there."""
    # No margin: old's own turn right after its forget is not taken for one said before.
    old, shop = two_deployments(zep_user_id_template="{user_id}", forget_clock_margin_seconds=0)
    shop = shop.model_copy(update={"zep_user_id_template": None})
    await _turn(shop, APP, "ada", SECRET)
    theirs = f"{shop.key_prefix}:ada"
    backend = open_backend(old)
    try:
        done = await Forgetter(old, redis, backend).forget_user(app=APP, user_id=theirs)
        assert done.left == [theirs] and done.users == 0
        assert await backend.find_user(zep_user_id=theirs) is not None
        assert _told(await _turn(shop, APP, "ada", "What is my locker code?"))

        argv = ["forget", "--app", APP, "--user", theirs]
        ran = run_cli_here(old, *argv, "--yes")
        err = ran.stderr.strip().splitlines()
        assert ran.returncode == 1 and len(err) == 1, ran.stderr
        assert "may be another deployment's" in err[0] and SECRET not in ran.stdout
        assert await backend.find_user(zep_user_id=theirs) is not None
        ran = run_cli_here(old, *argv)  # the dry run says it too
        assert ran.returncode == 1 and "may be another deployment's" in ran.stderr

        await redis.delete(Keys.of(old).forgetting(APP, theirs))  # the cool-down ended
        await _turn(old, APP, theirs, "Hello")  # old's own shop:ada: recorded by old
        done = await Forgetter(old, redis, backend).forget_user(app=APP, user_id=theirs)
        assert done.users == 1 and not done.left
        assert await backend.find_user(zep_user_id=theirs) is None
    finally:
        await backend.aclose()


async def test_the_history_of_templates_keeps_the_ones_in_effect_most_lately(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """Durable, so bounded: the :data:`MAX_TEMPLATES` in effect most lately, newest first;
    one in effect again moves to the front."""
    from afterthought.identity import MAX_TEMPLATES, note_templates, templates

    keys = Keys.of(local_settings)
    named = [f"{{user_id}}-{n}" for n in range(MAX_TEMPLATES + 4)]
    for template in named:
        await note_templates(redis, keys, [template])
    assert await templates(redis, local_settings) == named[::-1][:MAX_TEMPLATES]
    await note_templates(redis, keys, [named[0]])  # in effect again: the least lately goes
    assert await templates(redis, local_settings) == [named[0], *named[::-1][: MAX_TEMPLATES - 1]]


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


# --- a forget in one of two deployments that share their users ------------------------


def _events(event: str) -> float:
    from afterthought.worker.metrics import JOB_EVENTS

    return float(JOB_EVENTS.labels("flush", event)._value.get())  # type: ignore[attr-defined]


async def test_a_forget_in_a_sharing_deployment_reaches_the_other_and_dead_letters_none(
    two_deployments: Callable[..., tuple[Settings, Settings]], redis: aioredis.Redis
) -> None:
    """Two deployments that share users (a template without ``{deployment}``): a forget of
    ada in the first deletes the backend user the second's registry still maps her to.
    The second's worker must not write her back from what she said there before the
    forget, must store what she says after it (provisioned afresh, counted), and must
    dead-letter nothing, hers or bob's. On the code before, every batch of hers there went
    to the deleted thread (404) and was dead-lettered, for as long as her entry lived."""
    first, second = two_deployments(zep_user_id_template="{user_id}", forget_clock_margin_seconds=0)
    await _turn(second, APP, "ada", SECRET)  # the second deployment maps her
    await _turn(second, APP, "bob", "I play the oboe.")
    # Said in the second deployment before the forget, not stored yet (no worker ran).
    runner, _ = make_runner(create_callbacks(settings=second), app=APP)
    session = await runner.session_service.create_session(app_name=APP, user_id="ada")
    await say(runner, "ada", session.id, "My bike lock is Zorbleflex.")
    bob = await runner.session_service.create_session(app_name=APP, user_id="bob")
    await say(runner, "bob", bob.id, "I live in Tromso.")

    # The second deployment is not listed as sharing (as after 30 days without a worker):
    # the forget does not sweep it, and its worker meets the deletion.
    await redis.zrem(Keys.sharing(store_name(second)), second.key_prefix)
    forgetter = Forgetter(first, redis, open_backend(first))
    done = await forgetter.forget_user(app=APP, user_id="ada")
    assert not done.pending
    reprovisioned = _events("reprovisioned")
    # Before the second deployment's worker meets the deletion: its agent's registry
    # still names the deleted user, and its cache what she said before.
    assert not _told(await _turn(second, APP, "ada", "What is my locker code?", drained=False))

    await say(runner, "ada", session.id, "I moved to Lisbon.")  # after the forget
    await runner.close()
    await drain(second)

    assert await redis.llen(Keys.of(second).dead()) == 0
    assert _events("reprovisioned") >= reprovisioned + 1
    assert any("Lisbon" in hit for hit in await _found(second, APP, "ada", "Lisbon"))
    assert any("Tromso" in hit for hit in await _found(second, APP, "bob", "Tromso"))
    for settings in (first, second):
        hits = await _found(settings, APP, "ada", "Zorbleflex bike lock")
        assert not [hit for hit in hits if "Zorbleflex" in hit], settings.key_prefix
        assert not _told(await _found(settings, APP, "ada", "locker code"))
    assert not _told(await _turn(second, APP, "ada", "What is my locker code?"))
    shared = person_key(first, app=APP, user_id="ada")
    assert shared == person_key(second, app=APP, user_id="ada")  # one key for both
    assert shared is not None and await redis.delete(shared) == 1  # not under a prefix


async def test_a_dead_letter_of_a_user_forgotten_by_a_sharing_deployment_is_not_replayed(
    two_deployments: Callable[..., tuple[Settings, Settings]], redis: aioredis.Redis
) -> None:
    """Ada's words in the second deployment are a dead letter; the first (sharing users)
    forgets her. The second's `dlq replay --all` drops the letter and counts it forgotten,
    as its worker would: not `replayed=1` for a letter the worker then drops."""
    from tests.test_forget_final import _drain, _no_sleep, _Refusing

    first, second = two_deployments(zep_user_id_template="{user_id}", forget_clock_margin_seconds=0)
    await _turn(second, APP, "ada", "My bike lock is Zorbleflex.", drained=False)
    backend = open_backend(second)
    refusing = cast(MemoryBackend, _Refusing(backend, "Zorbleflex"))
    await _drain(Flusher(second, redis, refusing, sleep=_no_sleep))
    dead = await redis.llen(Keys.of(second).dead())
    assert dead >= 1
    # Not listed as sharing (no worker of it announced): the forget leaves its letters.
    await redis.zrem(Keys.sharing(store_name(second)), second.key_prefix)
    done = await Forgetter(first, redis, open_backend(first)).forget_user(app=APP, user_id="ada")
    assert not done.pending
    replayed = await DeadLetters(redis, second).replay()
    assert (replayed.replayed, replayed.forgotten) == (0, dead)
    assert await redis.llen(Keys.of(second).dead()) == 0
    await backend.aclose()
    shared = person_key(first, app=APP, user_id="ada")
    assert shared is not None and await redis.delete(shared) == 1  # not under a prefix


async def test_a_forget_in_a_sharing_deployment_sweeps_what_the_other_holds_in_redis(
    two_deployments: Callable[..., tuple[Settings, Settings]], redis: aioredis.Redis
) -> None:
    """Ada spoke only in the second deployment (sharing users): its cached block of her
    memory, a dead letter of hers and her registry entry are in Redis. A forget in the
    first sweeps them at once (the second's workers announced it shares users on the
    store), not when the second's worker meets the deletion, which may never come."""
    from tests.sweep import redis_hits
    from tests.test_forget_final import _drain, _no_sleep, _Refusing

    first, second = two_deployments(zep_user_id_template="{user_id}", forget_clock_margin_seconds=0)
    words = ["Quuxblorf", "Zorbleflex"]
    await _turn(second, APP, "ada", SECRET)
    assert _told(await _turn(second, APP, "ada", "What is my locker code?"))  # cached there
    await _turn(second, APP, "ada", "My bike lock is Zorbleflex.", drained=False)
    backend = open_backend(second)
    refusing = cast(MemoryBackend, _Refusing(backend, "Zorbleflex"))
    await _drain(Flusher(second, redis, refusing, sleep=_no_sleep))
    assert await redis.llen(Keys.of(second).dead()) >= 1
    assert set(await redis_hits(redis, second.key_prefix, words)) != set()

    done = await Forgetter(first, redis, open_backend(first)).forget_user(app=APP, user_id="ada")
    assert not done.pending
    assert await redis_hits(redis, second.key_prefix, words) == {}
    assert await redis.llen(Keys.of(second).dead()) == 0
    assert not await redis.exists(Keys.of(second).user(APP, "ada"))
    await backend.aclose()
    shared = person_key(first, app=APP, user_id="ada")
    assert shared is not None
    await redis.zrem(Keys.sharing(store_name(second)), second.key_prefix)
    await redis.delete(shared)  # not under a prefix


async def test_a_user_deleted_in_the_backend_with_no_time_known_is_forgotten_when_found(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    """The backend user is deleted where no deployment on this Redis recorded when (by
    hand in Zep, or by a sharing deployment on another Redis): the worker that meets the
    404 takes it for a forget from then on — what was queued before it is dropped, not
    written back or dead-lettered — and what the user says after it is stored."""
    settings = any_settings.model_copy(update={"forget_clock_margin_seconds": 0})
    await _turn(settings, APP, "ada", SECRET)
    backend = open_backend(settings)
    user = await IdentityRegistry(redis, settings).lookup_user(app=APP, user_id="ada")
    assert user is not None
    await backend.delete_user(user=user)
    runner, _ = make_runner(create_callbacks(settings=settings), app=APP)
    session = await runner.session_service.create_session(app_name=APP, user_id="ada")
    await say(runner, "ada", session.id, "My bike lock is Zorbleflex.")
    await drain(settings)  # meets the 404
    await say(runner, "ada", session.id, "I moved to Lisbon.")
    await runner.close()
    await drain(settings)

    assert await redis.llen(Keys.of(settings).dead()) == 0
    assert any("Lisbon" in hit for hit in await _found(settings, APP, "ada", "Lisbon"))
    hits = await _found(settings, APP, "ada", "Zorbleflex bike lock")
    assert not [hit for hit in hits if "Zorbleflex" in hit]
    assert not _told(await _turn(settings, APP, "ada", "What is my locker code?"))
    await backend.aclose()


async def _forget_in_first_sweeps_second(
    first: Settings, second: Settings, redis: aioredis.Redis, *, idle: bool = False
) -> None:
    """Ada tells the second deployment a secret and it caches her block; (``idle``: her
    registry entries there idle out, the block stays) the first forgets her: nothing of
    her is left under the second's prefix, and its next session is served nothing."""
    from tests.sweep import redis_hits

    await _turn(second, APP, "ada", SECRET)
    assert _told(await _turn(second, APP, "ada", "What is my locker code?"))  # cached there
    await drain(first)  # the first's worker announces too
    if idle:  # as after idle_ttl_seconds: the registry forgets her, the cache keeps her
        stale = [k async for k in redis.scan_iter(match=f"{second.key_prefix}:id:*")]
        assert stale and await redis.delete(*stale)
    assert await redis_hits(redis, second.key_prefix, ["Quuxblorf"]) != {}
    try:
        done = await Forgetter(first, redis, open_backend(first)).forget_user(
            app=APP, user_id="ada"
        )
        assert not done.pending
        assert await redis_hits(redis, second.key_prefix, ["Quuxblorf"]) == {}
        assert not _told(await _turn(second, APP, "ada", "What is my locker code?"))
    finally:
        for settings in (first, second):
            shared = person_key(settings, app=APP, user_id="ada")
            assert shared is not None
            await redis.delete(shared)  # not under a prefix
            await redis.zrem(Keys.sharing(store_name(settings)), settings.key_prefix)


async def test_a_forget_reaches_a_sharing_deployment_with_another_api_key_of_the_project(
    make_settings: Callable[..., Settings], zep_fake: Any, second_prefix: str, redis: aioredis.Redis
) -> None:
    """Two deployments share users on one Zep project, each with its own API key (Zep
    reports no project id; one key per deployment is usual): they share one store name,
    so a forget in one sweeps the other's cached blocks. On the code before the name held
    a digest of the key: the second was never swept and served the secret after."""
    common: dict[str, Any] = {
        "backend": "zep",
        "zep_base_url": zep_fake.base_url,
        "zep_user_id_template": "{user_id}",
        "context_mode": "cached",
    }
    first = make_settings(zep_api_key="key-of-first", **common)
    second = make_settings(key_prefix=second_prefix, zep_api_key="key-of-second", **common)
    await _forget_in_first_sweeps_second(first, second, redis)
    assert store_name(first) == store_name(second)


async def test_a_forget_sweeps_a_sharing_deployments_blocks_after_its_registry_idled_out(
    two_deployments: Callable[..., tuple[Settings, Settings]], redis: aioredis.Redis
) -> None:
    """The second deployment's registry entries of ada idled out (``idle_ttl_seconds``)
    while its cached blocks of her live on (``context_ttl_seconds``): a forget in the
    first still drops them (found by her graph, not the registry). On the code before
    they stayed, and the second's next session was served the forgotten secret."""
    first, second = two_deployments(zep_user_id_template="{user_id}", context_mode="cached")
    await _forget_in_first_sweeps_second(first, second, redis, idle=True)


def test_one_local_store_named_through_a_symlink_is_one_store(
    make_settings: Callable[..., Settings], tmp_path: Any
) -> None:
    """One file, one deployment naming it through a symlink (as one volume at two paths):
    one store name, so the deployments that share users on it are linked. On the code
    before, the path as spelled: two names. ``shared_store`` names it outright."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    first = make_settings(local_db_path=tmp_path / "real" / "m.sqlite3")
    second = make_settings(local_db_path=tmp_path / "link" / "m.sqlite3")
    assert store_name(first) == store_name(second)
    named = make_settings(shared_store="volume-1")
    assert store_name(named) == "named:volume-1" != store_name(first)


async def test_sharing_deployments_that_name_one_store_differently_are_told(
    two_deployments: Callable[..., tuple[Settings, Settings]],
    redis: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two deployments share users on one store (the same file, or one Zep address) but
    one names it with ``shared_store`` and the other not: their forgets would miss each
    other, and each worker logs it (an error naming the setting), until they agree."""
    from afterthought.shared_store import announce

    first, second = two_deployments(zep_user_id_template="{user_id}")
    second = second.model_copy(update={"shared_store": "one-store"})
    backend = open_backend(first)
    try:
        await announce(redis, first, backend, worker="w1")
        with caplog.at_level(logging.ERROR, logger="afterthought.store"):
            await announce(redis, second, backend, worker="w2")
        told = [r.getMessage() for r in caplog.records if "name it differently" in r.message]
        assert told and "AFTERTHOUGHT_SHARED_STORE" in told[0]
        assert first.key_prefix in told[0]
        caplog.clear()
        agreed = first.model_copy(update={"shared_store": "one-store"})
        await announce(redis, agreed, backend, worker="w1")
        with caplog.at_level(logging.ERROR, logger="afterthought.store"):
            await announce(redis, second, backend, worker="w2")
        assert not [r for r in caplog.records if "name it differently" in r.getMessage()]
    finally:
        await backend.aclose()
        for settings in (first, second):
            await redis.zrem(Keys.sharing(store_name(settings)), settings.key_prefix)
