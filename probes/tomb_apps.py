# ruff: noqa
"""Probe: a fact forgotten in one app of a person, re-stated (said before the forget) in
another app of the same person (default template: one person in every app)."""

import asyncio, sys, time, uuid, tempfile
from pathlib import Path

sys.path.insert(0, "/work/wt/break22d/tests")
from conftest import enqueue, drain, remove_prefix, REDIS_URL  # type: ignore
from afterthought.settings import Settings
from afterthought.queue import QueuedMessage
from afterthought.connections import connect
from afterthought.backends import open_backend as create_backend
from afterthought.identity import IdentityRegistry
from worker.forget import Forgetter


def msg(app, text, session, n):
    return QueuedMessage.build(
        app=app,
        user_id="alice",
        session_id=session,
        invocation_id=f"inv-{n}",
        role="user",
        ordinal=0,
        content=text,
    )


async def main(second_app: str):
    prefix = f"t{uuid.uuid4().hex[:12]}"
    tmp = Path(tempfile.mkdtemp())
    s = Settings(
        redis_url=REDIS_URL,
        key_prefix=prefix,
        local_db_path=tmp / "m.sqlite3",
        spool_path=tmp / "spool",
        backend="local",
        synthesis_idle_seconds=0,
        context_settle_seconds=0,
        audit_key="k" * 20,
    )
    try:
        await enqueue(s, msg("appA", "I'm allergic to peanuts.", "s1", 1))
        await drain(s)
        r = connect(s.redis_url)
        backend = create_backend(s)
        reg = IdentityRegistry(r, s)
        user = await reg.lookup_user(app="appA", user_id="alice")
        facts = await backend.list_facts(user=user)
        print("facts before", [(f.predicate, f.value) for f in facts if f.invalid_at is None])
        # said before the forget, in the second app; still queued
        await enqueue(s, msg(second_app, "As I said, I'm allergic to peanuts.", "s2", 2))
        f = Forgetter(s, r, backend)
        target = [x for x in facts if x.predicate == "allergic_to"][0]
        done = await f.forget_fact(app="appA", user_id="alice", fact_uuid=target.uuid)
        print("forgot", done.facts)
        await drain(s)
        user = await reg.lookup_user(app="appA", user_id="alice")
        facts = await backend.list_facts(user=user) if user else []
        print(
            second_app,
            "facts after",
            [(f.predicate, f.value) for f in facts if f.invalid_at is None],
        )
        await r.aclose()
    finally:
        remove_prefix(prefix)


asyncio.run(main(sys.argv[1]))
