# ruff: noqa
"""Probe: zep mode (Zep extracts); a fact (an edge Zep extracted) forgotten while a message
that says it again, said before the forget, is still queued."""

import asyncio, sys, uuid, tempfile
from pathlib import Path

sys.path.insert(0, "/work/wt/break22d/tests")
from conftest import enqueue, drain, remove_prefix, REDIS_URL  # type: ignore
from afterthought.settings import Settings
from afterthought.queue import QueuedMessage
from afterthought.connections import connect
from afterthought.backends import open_backend
from afterthought.identity import IdentityRegistry
from afterthought.testing import ZepFake
from worker.forget import Forgetter


def msg(text, n, s):
    return QueuedMessage.build(
        app="app",
        user_id="alice",
        session_id=s,
        invocation_id=f"inv-{n}",
        role="user",
        ordinal=0,
        content=text,
    )


async def main(mode):
    tmp = Path(tempfile.mkdtemp())
    p = f"t{uuid.uuid4().hex[:12]}"
    with ZepFake() as fake:
        s = Settings(
            redis_url=REDIS_URL,
            key_prefix=p,
            spool_path=tmp / "spool",
            backend="zep",
            zep_api_key="test-key",
            zep_base_url=fake.base_url,
            synthesis_idle_seconds=0,
            context_settle_seconds=0,
            audit_key="k" * 20,
            memory_mode=mode,
        )
        try:
            await enqueue(s, msg("I'm allergic to peanuts.", 1, "s1"))
            await drain(s)
            r = connect(REDIS_URL)
            b = open_backend(s)
            user = await IdentityRegistry(r, s).lookup_user(app="app", user_id="alice")
            facts = [f for f in await b.list_facts(user=user) if f.invalid_at is None]
            print(mode, "facts", [(f.predicate, f.value) for f in facts])
            await enqueue(s, msg("I'm allergic to peanuts.", 2, "s2"))
            target = next(f for f in facts if "peanut" in f.value)
            await Forgetter(s, r, b).forget_fact(app="app", user_id="alice", fact_uuid=target.uuid)
            await drain(s)
            facts = [f for f in await b.list_facts(user=user) if f.invalid_at is None]
            print(mode, "after forget + drain", [(f.predicate, f.value) for f in facts])
            await r.aclose()
        finally:
            remove_prefix(p)


asyncio.run(main(sys.argv[1]))
