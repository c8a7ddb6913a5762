"""Forgetting: a user, a fact, a query (dry run first); forgotten stays forgotten."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from afterthought.agent_hooks import create_callbacks
from afterthought.backends import open_backend
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.testing import ZepFake
from afterthought.testing.cli import run_cli_here
from afterthought.testing.stand_in_model import memory_lines
from afterthought.worker.forget import Forgetter
from afterthought.worker.synthesize import Synthesizer
from tests.adk_support import APP, make_runner, new_session, say
from tests.conftest import backend_user_id, drain, enqueue, queued


async def _session(settings: Settings, *lines: str, user: str = "alice") -> list[str]:
    runner, model = make_runner(create_callbacks(settings=settings))
    session = await new_session(runner, user)
    for line in lines:
        await say(runner, user, session, line)
    await drain(settings)
    return memory_lines(model.requests[-1])


def _forgetter(settings: Settings, redis: aioredis.Redis) -> Forgetter:
    return Forgetter(settings, redis, open_backend(settings))


async def test_a_forgotten_fact_stays_gone_when_synthesis_runs_again(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    await _session(local_settings, "I live in Lisbon.", "I'm allergic to peanuts.")
    forgetter = _forgetter(local_settings, redis)
    dry = await forgetter.forget_matching(app=APP, user_id="alice", query="peanuts")
    assert dry.dry_run and len(dry.facts) == 1 and "peanuts" in dry.texts[0]
    for part_of_a_word in ("pea", "lis", "all"):  # whole words only
        assert not (
            await forgetter.forget_matching(app=APP, user_id="alice", query=part_of_a_word)
        ).facts
    for form in ("peanut", "Peanut allergic"):  # by stem, as search_memory finds it
        assert (await forgetter.forget_matching(app=APP, user_id="alice", query=form)).facts == (
            dry.facts
        )
    assert "peanuts" in "\n".join(await _session(local_settings, "Hi"))  # a dry run changed nothing

    done = await forgetter.forget_matching(app=APP, user_id="alice", query="peanuts", confirm=True)
    assert done.facts == dry.facts
    await redis.delete(Keys(local_settings.key_prefix).synthesized(APP, "alice"))
    await Synthesizer(local_settings, redis, forgetter.backend).run(app=APP, user_id="alice")
    block = "\n".join(await _session(local_settings, "What do you know?"))
    assert "peanuts" not in block and "Lisbon" in block


async def test_forgetting_a_user_leaves_nothing_queued_stored_or_cached(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    await _session(local_settings, "I live in Lisbon.")
    await _session(local_settings, "I live in Oslo.", user="bob")
    await enqueue(local_settings, queued("I work at Acme.", 99))  # queued, not yet sent
    keys = Keys(local_settings.key_prefix)

    done = await _forgetter(local_settings, redis).forget_user(app=APP, user_id="alice")
    assert done.queued == 1
    await drain(local_settings)
    for key in (
        keys.user(APP, "alice"),
        keys.user_threads(APP, "alice"),
        keys.context_user(APP, "alice"),
        keys.synthesized(APP, "alice"),
    ):
        assert not await redis.exists(key), key
    assert not [
        k
        async for k in redis.scan_iter(match=f"{keys.prefix}:ctx:thread:*")
        if k.decode().startswith(keys.context_thread(APP, "alice", "x")[:-33])
    ]
    assert await _session(local_settings, "Hello") == []  # nothing of alice comes back
    assert any("Oslo" in line for line in await _session(local_settings, "Hi", user="bob"))


async def test_messages_queued_before_a_forget_are_dropped_not_sent(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """The deletion epoch: what a worker picks up after the forget was queued before it."""
    await enqueue(local_settings, queued("I live in Lisbon.", 1))
    await redis.incr(Keys(local_settings.key_prefix).epoch(APP, "alice"))  # forgotten meanwhile
    await enqueue(local_settings, queued("I live in Oslo.", 2))  # said after the forget
    await drain(local_settings)
    block = "\n".join(await _session(local_settings, "Hi"))
    assert "Oslo" in block and "Lisbon" not in block


@pytest.mark.parametrize("backend", ["local", "zep"])
def test_prune_and_forget_commands_dry_run_first(
    backend: str, make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    import asyncio
    import json
    from functools import partial

    settings = make_settings()
    if backend == "zep":  # managed: the facts are our synthesis' edges in Zep's graph
        settings = make_settings(
            backend="zep",
            memory_mode="managed",
            zep_api_key="test-key",
            zep_base_url=zep_fake.base_url,
        )
    story = "Last summer I walked " + "for miles and miles " * 10 + "along the coast."
    asyncio.run(_session(settings, "I live in Lisbon.", "I'm allergic to peanuts.", story))
    cli = partial(run_cli_here, settings)

    pruned = cli("prune")  # a dry run, like every one: exit 2, nothing changed
    assert pruned.returncode == 2 and json.loads(pruned.stdout)["dry_run"] is True
    listed = cli("forget", "--app", APP, "--user", "alice", "--query", "peanuts")
    found = json.loads(listed.stdout)
    assert found["dry_run"] and len(found["facts"]) == 1
    # The whole user: what --yes deletes, counted, a sample of each shown and shortened.
    whole = cli("forget", "--app", APP, "--user", "alice")
    assert whole.returncode == 2  # needs --yes
    held = json.loads(whole.stdout)
    assert held["fact_count"] == 2 and len(held["facts"]) == 2
    assert held["statement_count"] == 6  # and 3 replies
    assert "2 facts, 6 statements" in whole.stderr
    # Counts and ids only: a report lands in job logs, the user's words must not.
    shown = cli("forget", "--app", APP, "--user", "alice", "--show")  # no terminal here
    for said in (whole, listed, shown):
        assert not {"texts", "statements"} & set(json.loads(said.stdout))
        assert not any(w in said.stdout + said.stderr for w in ("peanuts", "Lisbon", "miles"))
    assert "a terminal only" in shown.stderr
    done = cli("forget", "--app", APP, "--user", "alice", "--query", "peanuts", "--yes")
    assert json.loads(done.stdout)["facts"] == found["facts"]
    block = "\n".join(asyncio.run(_session(settings, "Hi")))
    assert "peanuts" not in block and "Lisbon" in block
    # Refused (nothing of that name): said on stderr, and no report a script reads as done.
    for refused in (
        cli("forget", "--app", APP, "--user", "alice", "--fact", "does-not-exist", "--yes"),
        cli("forget", "--app", APP, "--user", "alice", "--query", "zebras", "--yes"),
        cli("forget", "--app", APP, "--user", "nobody", "--yes"),
    ):
        assert refused.returncode == 1 and refused.stdout == "", refused.stdout
        assert refused.stderr.startswith("afterthought: no"), refused.stderr
    dry = cli("prune", "--dry-run", "--yes")
    assert (
        dry.returncode == 2 and "as --dry-run asks" in dry.stderr and "add --yes" not in dry.stderr
    )
    # Done, the whole user is reported as the dry run listed them: counted, sampled.
    listed = json.loads(cli("forget", "--app", APP, "--user", "alice").stdout)
    gone = cli("forget", "--app", APP, "--user", "alice", "--yes")
    report = json.loads(gone.stdout)
    assert gone.returncode == 0 and report["users"] == 1 and not report["dry_run"]
    assert report["fact_count"] == 1 and "Lisbon" not in gone.stdout + gone.stderr
    for counted in ("fact_count", "statement_count", "facts"):
        assert report[counted] == listed[counted], counted
    assert asyncio.run(_session(settings, "Hi again")) == []


async def test_a_user_the_registry_lost_is_still_forgotten(
    any_settings: Settings, redis: aioredis.Redis
) -> None:
    """Redis lost the registry's record (a restart without persistence, an evicted key):
    the forget finds the user in the backend itself, and deletes them there."""
    await _session(any_settings, "My locker code is Quuxblorf")
    keys = Keys(any_settings.key_prefix)
    await redis.delete(keys.user(APP, "alice"), keys.person("alice"))
    backend = open_backend(any_settings)
    zep_id = await backend_user_id(any_settings, app=APP, user_id="alice")
    assert await backend.find_user(zep_user_id=zep_id) is not None
    done = await _forgetter(any_settings, redis).forget_user(app=APP, user_id="alice")
    assert done.users == 1 and not done.pending
    assert await backend.find_user(zep_user_id=zep_id) is None
    await backend.aclose()


async def test_forgetting_a_fact_takes_what_says_it_again_and_nothing_else(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """The user said it twice (synthesis linked the first only); other statements share a
    word with it ("run", "34") without saying it, and stay."""
    said = [
        "I'm 34 years old",
        "I love running",
        "my daughter turns 34 months old next week",
        "I run a small bakery in Leeds with my brother Tom",
        "honestly I love running, best part of my day",
    ]
    await _session(local_settings, *said)
    forgetter = _forgetter(local_settings, redis)
    await Synthesizer(local_settings, redis, forgetter.backend).run(app=APP, user_id="alice")
    found = await forgetter.forget_matching(app=APP, user_id="alice", query="running")
    assert len(found.facts) == 1, found
    # The dry run lists what --yes deletes: the fact and every statement that says it.
    assert sorted(found.statements) == sorted([said[1], said[4]])
    done = await forgetter.forget_fact(app=APP, user_id="alice", fact_uuid=found.facts[0])
    assert sorted(done.statements) == sorted(found.statements)
    block = "\n".join(await _session(local_settings, "hi"))
    assert "love running" not in block
    for kept in said[0], said[2], said[3]:
        assert kept in block, kept
