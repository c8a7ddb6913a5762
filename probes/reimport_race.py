# ruff: noqa
"""A 5,400-event session backfilled, then re-imported while live turns of the same session
are queued and a worker drains; then imported once more. Lost / duplicated / reordered."""

import asyncio, sqlite3, sys, tempfile, time, uuid
from pathlib import Path

sys.path.insert(0, "tests")
import redis.asyncio as aioredis
from google.adk.events import Event
from google.adk.sessions import Session
from google.genai import types
from afterthought.agent_hooks.backfill import Backfill, jsonl_source
from afterthought.contract import QueuedMessage
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from conftest import drain, run_worker_once

T0 = time.time() - 30_000


def events_for(i):
    ts = T0 + i * 10
    inv = f"inv-{i:05d}"
    return [
        Event(
            id=str(uuid.uuid4()),
            invocation_id=inv,
            author="user",
            timestamp=ts,
            content=types.Content(role="user", parts=[types.Part(text=f"u{i:05d} hello")]),
        ),
        Event(
            id=str(uuid.uuid4()),
            invocation_id=inv,
            author="agent",
            timestamp=ts + 1,
            content=types.Content(role="model", parts=[types.Part(text=f"a{i:05d} reply")]),
        ),
    ]


def live_messages(i):
    ts = T0 + i * 10
    return [
        QueuedMessage.build(
            app="app",
            user_id="alice",
            session_id="s1",
            invocation_id=f"inv-{i:05d}",
            role="user",
            ordinal=0,
            content=f"u{i:05d} hello",
            at=ts,
        ),
        QueuedMessage.build(
            app="app",
            user_id="alice",
            session_id="s1",
            invocation_id=f"inv-{i:05d}",
            role="assistant",
            ordinal=0,
            content=f"a{i:05d} reply",
            at=ts + 1,
            began=ts,
        ),
    ]


def export(path, n):
    evs = [e for i in range(n) for e in events_for(i)]
    s = Session(
        id="s1", app_name="app", user_id="alice", state={}, events=evs, last_update_time=T0 + n * 10
    )
    path.write_text(s.model_dump_json() + "\n")


ZEP = len(sys.argv) > 1
from afterthought.testing import ZepFake


async def main():
    tmp = Path(tempfile.mkdtemp())
    fake = (
        ZepFake(
            honor_idempotency=False,
            fault_rate=float(sys.argv[1]) if ZEP else 0,
            seed=5,
            client_timeout=3,
        ).start()
        if ZEP
        else None
    )
    extra = (
        dict(
            backend="zep",
            zep_api_key="k",
            zep_base_url=fake.base_url,
            backend_timeout=3,
            backend_settle_seconds=0.5,
        )
        if ZEP
        else dict(backend="local")
    )
    s = Settings(
        redis_url="redis://127.0.0.1:6379/0",
        key_prefix=f"r21d{uuid.uuid4().hex[:6]}",
        local_db_path=tmp / "m.sqlite3",
        spool_path=tmp / "spool",
        **extra,
        synthesis_idle_seconds=0,
        context_settle_seconds=0,
        audit_key="k" * 20,
        thread_queue_cap=20000,
        queue_cap=100000,
    )
    r = aioredis.Redis.from_url(s.redis_url)
    N0, LIVE = 2700, 150
    f1 = tmp / "a.jsonl"
    export(f1, N0)
    t = time.monotonic()
    print("backfill1", await Backfill(s, r, jsonl_source(f1)).run(), time.monotonic() - t)
    await drain(s, timeout=1500)
    print("drained1", time.monotonic() - t)
    q = ThreadQueue(r, s)
    stop = False

    async def live():
        for i in range(N0, N0 + LIVE):
            while (res := await q.enqueue(live_messages(i), now_ms=int(time.time() * 1000))) < 0:
                print("live refused", res)
                await asyncio.sleep(0.5)
            await asyncio.sleep(0.02)

    async def worker():
        while not stop:
            await run_worker_once(s)
            await asyncio.sleep(0.05)

    f2 = tmp / "b.jsonl"
    export(f2, N0 + LIVE // 2)
    w = asyncio.create_task(worker())
    src2 = jsonl_source(f2)
    await asyncio.gather(live(), Backfill(s, r, src2).run())
    stop = True
    await w
    f3 = tmp / "c.jsonl"
    export(f3, N0 + LIVE)
    print("backfill3", await Backfill(s, r, jsonl_source(f3)).run())
    await drain(s, timeout=1500)
    if ZEP:
        rows = [m["content"] for m in fake.messages()]
        print("fake injected", dict(fake.injected), "ambiguous", dict(fake.ambiguous))
    else:
        db = sqlite3.connect(tmp / "m.sqlite3")
        rows = [c for (c,) in db.execute("select content from messages order by id")]
    want = [x for i in range(N0 + LIVE) for x in (f"u{i:05d} hello", f"a{i:05d} reply")]
    dup = len(rows) - len(set(rows))
    lost = len(set(want) - set(rows))
    firsts = []
    seen = set()
    for c in rows:
        if c not in seen:
            seen.add(c)
            firsts.append(c)
    reord = sum(1 for a, b in zip(firsts, firsts[1:]) if b[1:6] < a[1:6])
    print(
        f"stored={len(rows)} expected={len(want)} lost={lost} dup={dup} reordered={reord} t={time.monotonic() - t:.0f}s"
    )
    keys = [k async for k in r.scan_iter(match=s.key_prefix + "*")]
    for k in keys:
        await r.delete(k)
    await r.aclose()


asyncio.run(main())
