"""The slot check (W10, issue 14): every operation of the product, run in the sharded
layout on a standalone Redis under MONITOR, sends no command Redis Cluster would refuse
(``tests/slot_check.py`` says what counts). arq runs on a Redis of its own (database 1
here), as it must beside a cluster, so its commands are not ours to check. Each offence
is listed with its call site (a script by the module constant that holds it)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import redis as syncredis
from google.adk.agents.callback_context import CallbackContext
from google.adk.events import Event
from google.adk.sessions import Session
from google.genai import types

from afterthought.agent_hooks.backfill import Backfill, jsonl_source
from afterthought.agent_hooks.context_reader import ContextReader
from afterthought.agent_hooks.identity import Pins, Who
from afterthought.audit import AuditLog, Entry
from afterthought.backends import open_backend
from afterthought.backends.base import MemoryBackend, OutgoingMessage
from afterthought.backends.local import LocalBackend
from afterthought.connections import connect
from afterthought.context_cache import ContextCache, now_version
from afterthought.contract import QueuedMessage
from afterthought.dead_letters import DeadLetters
from afterthought.enqueue import Enqueuer
from afterthought.fence import Fence
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.quarantine import Entry as QuarantineEntry
from afterthought.quarantine import Quarantine
from afterthought.settings import Settings
from afterthought.shared_store import announce, elsewhere
from afterthought.status import snapshot
from afterthought.worker.forget import Forgetter
from afterthought.worker.jobs import resume_forgets
from afterthought.worker.prune import Pruner
from afterthought.worker.synthesize import Synthesizer
from tests.conftest import REDIS_URL, run_worker_once
from tests.slot_check import Checker, Offence, Recorder

APP = "slots"
SHARDS = 8
#: Every operation the scenario runs, each in its own phase of the MONITOR stream.
PHASES = [
    "agent write",
    "worker drain",
    "dlq list and replay",
    "status",
    "identity",
    "cache write and read",
    "cache invalidate",
    "cache read-through",
    "synthesis",
    "quarantine add, list, release",
    "prune",
    "backfill",
    "audit",
    "store announcement",
    "forget dry run",
    "forget a fact",
    "forget --yes",
    "resume forgets",
]


def _arq_url() -> str:
    """arq's own Redis: the same server, database 1."""
    return REDIS_URL.rsplit("/", 1)[0] + "/1"


def _message(user_id: str, session_id: str, n: int, text: str) -> QueuedMessage:
    return QueuedMessage.build(
        app=APP,
        user_id=user_id,
        session_id=session_id,
        invocation_id=f"inv-{n}",
        role="user",
        ordinal=0,
        content=text,
    )


def _export(path: Path) -> Path:
    events = [
        Event(
            author="user",
            invocation_id="old-1",
            content=types.UserContent("I grew up in Porto."),
            timestamp=1_700_000_000.0,
        ),
        Event(
            author="assistant",
            invocation_id="old-1",
            content=types.ModelContent("Nice."),
            timestamp=1_700_000_000.5,
        ),
    ]
    session = Session(
        id="old", app_name=APP, user_id="dora", events=events, last_update_time=1_700_000_001.0
    )
    path.write_text(session.model_dump_json() + "\n")
    return path


async def _stored(backend: MemoryBackend, registry: IdentityRegistry, user_id: str) -> int:
    user = await registry.lookup_user(app=APP, user_id=user_id)
    if user is None:
        return 0
    return len((await backend.user_messages(user=user, after=None, limit=100))[0])


async def _until(check: Any, what: str, settings: Settings) -> None:
    """Run the worker (burst) until ``check`` holds."""
    for _ in range(20):
        if await check():
            return
        await run_worker_once(settings)
    raise AssertionError(f"the worker did not get {what} done")


async def _scenario(settings: Settings, recorder: Recorder, tmp: Path) -> None:
    redis = connect(settings.redis_url)
    jobs = connect(settings.jobs_redis_url)
    backend = open_backend(settings, upgrade=True)
    assert isinstance(backend, LocalBackend)
    registry = IdentityRegistry(redis, settings)
    cache = ContextCache(settings)
    reader = ContextReader(settings, redis=lambda: redis, backend=lambda: backend)
    forgetter = Forgetter(settings, redis, backend)
    no_ctx = cast(CallbackContext, None)
    try:
        recorder.phase("agent write")
        enqueuer = Enqueuer(settings, redis=redis)
        said = [
            _message("alice", "s1", 1, "I live in Lisbon."),
            _message("alice", "s1", 2, "I love green tea."),
            _message("alice", "s2", 3, "I work at Kontor."),
            _message("bob", "s1", 4, "I live in Leeds."),
        ]
        for message in said:
            assert await enqueuer.send([message]) is None

        recorder.phase("worker drain")

        async def drained() -> bool:
            return (
                await _stored(backend, registry, "alice") == 3
                and await _stored(backend, registry, "bob") == 1
            )

        await _until(drained, "the messages stored", settings)
        # A message the worker may not provision for: dead-lettered, for the dlq below.
        assert await enqueuer.send([_message("nobody", "s1", 5, "hello")]) is None
        unprovisioned = settings.model_copy(update={"provision_on_worker": False})
        letters = DeadLetters(redis, settings)

        async def dead() -> bool:
            return await letters.count() > 0

        await _until(dead, "a dead letter", unprovisioned)

        recorder.phase("identity")
        _, _, created = await registry.ensure_thread(
            backend, app=APP, user_id="erin", session_id="s1"
        )
        assert created
        await registry.lookup(app=APP, user_id="erin", session_id="s1")

        alice = await registry.lookup_user(app=APP, user_id="alice")
        assert alice is not None
        recorder.phase("cache write and read")
        epoch = await cache.epoch(redis, app=APP, user_id="alice")
        for user_block in ("write", "keep", "drop"):
            await cache.write(
                redis,
                app=APP,
                user_id="alice",
                session_id="s1",
                graph_uuid=alice.graph_uuid,
                block="lives in: Lisbon",
                version=now_version(),
                epoch=epoch,
                user_block=user_block,  # type: ignore[arg-type]
            )
        await cache.read(redis, app=APP, user_id="alice", session_id="s1")
        who = Who(APP, "alice", "s1", "inv-read")
        assert await reader.read(who, no_ctx, None, Pins(), "where do I live?")

        recorder.phase("cache invalidate")
        await cache.invalidate(redis, app=APP, user_id="alice", graph_uuid=alice.graph_uuid)

        recorder.phase("cache read-through")
        fresh = Who(APP, "alice", "s9", "inv-miss")
        assert await reader.read(fresh, no_ctx, None, Pins(), "where do I live?")

        # Said since the worker synthesized what it stored, so there is something to write.
        thread = (await registry.lookup(app=APP, user_id="alice", session_id="s1")).thread_uuid
        assert thread is not None
        await backend.add_messages(
            thread_uuid=thread,
            messages=[OutgoingMessage("user", "I moved to Porto.", datetime.now(UTC).isoformat())],
            idempotency_key="slots:later",
        )
        recorder.phase("synthesis")
        synthesizer = Synthesizer(settings, redis, backend)
        assert (await synthesizer.run(app=APP, user_id="alice"))["written"]
        await synthesizer.run_all()

        recorder.phase("quarantine add, list, release")
        quarantine = Quarantine(redis, settings)
        entry = QuarantineEntry(
            app=APP, user_id="bob", text="likes: rain", reason="test", trust="model"
        )
        keys = Keys.of(settings)  # a job's hold: the quarantine is written under one
        await redis.set(keys.synthesizing(APP, "bob"), "tok", px=60_000)
        fence = Fence(keys.epoch(APP, "bob"), keys.synthesizing(APP, "bob"), 0, "tok")
        assert await quarantine.add([entry], fence=fence)
        assert [e.id for e in await quarantine.entries(app=APP, user_id="bob")] == [entry.id]
        assert await quarantine.release(entry.id) is not None

        recorder.phase("prune")
        pruner = Pruner(settings, redis, backend)
        await pruner.prune_all(dry_run=True)
        assert (await pruner.prune_all(dry_run=False)).pruned

        recorder.phase("backfill")
        report = await Backfill(settings, redis, jsonl_source(_export(tmp / "s.jsonl"))).run()
        assert report.sessions == 1

        recorder.phase("audit")
        await AuditLog(redis, settings).record(
            [Entry("test", "write_fact", "u", "written", thread="t", content="c")] * 2
        )

        recorder.phase("store announcement")
        await announce(redis, settings, backend, worker="slot-check")
        assert await elsewhere(redis, settings, backend) == []

        facts = await backend.list_facts(user=alice)
        assert facts
        recorder.phase("forget dry run")
        await forgetter.aliases(APP, "alice")
        await forgetter.held(APP, "alice")
        await forgetter.forget_fact(
            app=APP, user_id="alice", fact_uuid=facts[0].uuid, confirm=False
        )
        await forgetter.forget_matching(app=APP, user_id="alice", query="tea", confirm=False)

        recorder.phase("forget a fact")
        done = await forgetter.forget_fact(app=APP, user_id="alice", fact_uuid=facts[0].uuid)
        assert done.facts == [facts[0].uuid]

        recorder.phase("forget --yes")
        assert not (await forgetter.forget_user(app=APP, user_id="alice")).pending

        recorder.phase("resume forgets")
        record = {"app": APP, "user_id": "erin", "since": 0, "epoch": 1}
        await redis.hset(forgetter.keys.forgets, digest(APP, "erin"), json.dumps(record))
        assert await resume_forgets({"forgetter": forgetter}) == {"resumed": 1, "pending": 0}
        assert await registry.lookup_user(app=APP, user_id="erin") is None

        recorder.phase("dlq list and replay")
        assert await letters.listing()
        assert (await letters.replay()).replayed == 1

        recorder.phase("status")
        await snapshot(redis, settings, jobs=jobs)
    finally:
        await backend.aclose()
        await redis.aclose()
        await jobs.aclose()


def _sweep(url: str, prefix: str) -> None:
    client = syncredis.Redis.from_url(url)
    for pattern in (f"{prefix}:*", f"arq:*{prefix}:*", f"{{{prefix}:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    client.close()


@pytest.fixture(scope="module")
def offences(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[Offence]]]:
    """The whole scenario, once, under MONITOR; the offences of each phase."""
    prefix = f"t{uuid.uuid4().hex[:12]}"
    tmp = tmp_path_factory.mktemp("slots")
    settings = Settings(
        redis_url=REDIS_URL,
        arq_redis_url=_arq_url(),
        key_prefix=prefix,
        redis_shards=SHARDS,
        backend="local",
        local_db_path=tmp / "memory.sqlite3",
        synthesis_idle_seconds=0,  # a burst worker waits for deferred jobs
        max_facts_per_user=1,  # so pruning deletes something
        retrieval_budget=10.0,
        enqueue_timeout=5.0,
        audit_key="audit-key-of-the-tests",
    )
    recorder = Recorder(REDIS_URL)
    recorder.start()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.delenv("ZEP_API_KEY", raising=False)
            asyncio.run(_scenario(settings, recorder, tmp))
    finally:
        phases = recorder.stop()
        _sweep(REDIS_URL, prefix)
        _sweep(_arq_url(), prefix)
    checker = Checker(REDIS_URL, prefix)
    try:
        yield {name: checker.offences(name, commands) for name, commands in phases.items()}
    finally:
        checker.close()


@pytest.mark.parametrize("phase", PHASES)
def test_every_operation_stays_in_one_slot(offences: dict[str, list[Offence]], phase: str) -> None:
    assert phase in offences, "the phase sent no command: the scenario skipped it"
    assert not offences[phase], "\n".join(map(str, offences[phase]))


def test_the_check_finds_what_a_cluster_refuses(prefix: str) -> None:
    """Cross-slot script keys, a script touching a key of another slot than it declares,
    a cross-slot MGET and any MULTI are offences; a one-slot script and MGET are not."""
    one, other = f"{{{prefix}:a}}:x", f"{{{prefix}:b}}:y"
    same = f"{{{prefix}:a}}:z"
    recorder = Recorder(REDIS_URL)
    client = syncredis.Redis.from_url(REDIS_URL)
    touch = client.register_script("for _, k in ipairs(KEYS) do redis.call('GET', k) end")
    reach = client.register_script("return redis.call('GET', ARGV[1])")
    for script in (touch, reach):  # known to Redis first: a NOSCRIPT retry would count twice
        client.script_load(script.script)
    recorder.start()
    try:
        recorder.phase("check")
        touch(keys=[one, other])
        touch(keys=[one, same])
        reach(keys=[one], args=[other])
        client.mget(one, other)
        client.mget(one, same)
        with client.pipeline(transaction=True) as pipe:
            pipe.get(one).get(same).execute()
    finally:
        phases = recorder.stop()
        client.close()
    checker = Checker(REDIS_URL, prefix)
    try:
        found = checker.offences("check", phases["check"])
    finally:
        checker.close()
    whys = sorted((o.site.split(" ")[0], o.why) for o in found)
    assert whys == [
        ("EVALSHA", "keys in 2 slots"),
        ("EVALSHA", "keys in 2 slots"),
        ("MGET", "keys in 2 slots"),
        ("MULTI", "a transaction, one slot (a cluster client refuses MULTI)"),
    ], "\n".join(map(str, found))
    assert all("a script of no module" in o.site for o in found if o.site.startswith("EVALSHA"))
