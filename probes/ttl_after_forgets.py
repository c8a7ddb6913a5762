# ruff: noqa
import asyncio, sys, uuid, tempfile
from pathlib import Path

sys.path.insert(0, "/work/wt/break22d/tests")
from conftest import enqueue, drain, remove_prefix, REDIS_URL  # type: ignore
from afterthought.settings import Settings
from afterthought.queue import QueuedMessage
from afterthought.connections import connect
from afterthought.backends import open_backend
from afterthought.identity import IdentityRegistry
from worker.forget import Forgetter


def msg(app, user, text, n, s="s1"):
    return QueuedMessage.build(
        app=app,
        user_id=user,
        session_id=s,
        invocation_id=f"inv-{n}",
        role="user",
        ordinal=0,
        content=text,
    )


async def dump(r, prefix, label):
    print("--", label)
    async for k in r.scan_iter(match=f"*{prefix}*", count=1000):
        ttl = await r.ttl(k)
        if ttl == -1:
            print("  no TTL:", k.decode().replace(prefix, "P"), (await r.type(k)).decode())


async def main():
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
        await enqueue(s, msg("appA", "alice", "I'm allergic to peanuts.", 1))
        await enqueue(s, msg("appB", "alice", "I live in Lisbon.", 2, "s2"))
        await enqueue(s, msg("appA", "bob", "I'm allergic to cats.", 3))
        await drain(s)
        r = connect(s.redis_url)
        b = open_backend(s)
        f = Forgetter(s, r, b)
        await dump(r, prefix, "after traffic")
        user = await IdentityRegistry(r, s).lookup_user(app="appA", user_id="bob")
        fact = [x for x in await b.list_facts(user=user) if x.predicate == "allergic_to"][0]
        await f.forget_fact(app="appA", user_id="bob", fact_uuid=fact.uuid)
        await f.forget_user(app="appA", user_id="alice") if hasattr(f, "forget_user") else None
        await drain(s)
        await dump(r, prefix, "after fact forget (bob) + user forget (alice)")
        await r.aclose()
    finally:
        remove_prefix(prefix)


asyncio.run(main())
