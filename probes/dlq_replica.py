"""Probe: ``dlq replay`` with redis_wait_replicas=1 and a real replica (replicaof),
the replica SIGSTOPped during replays, replays repeated, a replay while a worker drains.
Measures letters, reported replayed/unconfirmed, and the thread: lost / duplicated.
Usage: .venv/bin/python probes/dlq_replica.py SEED [letters]"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter

import redis.asyncio as aioredis

from afterthought.backends import open_backend
from afterthought.contract import QueuedMessage
from afterthought.dead_letters import DeadLetters
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.testing import RedisServer
from afterthought.testing.zep_fake import Fault, ZepFake
from afterthought.worker.flush import Flusher


async def drain_all(flusher: Flusher, r: aioredis.Redis, rounds: int = 100) -> None:
    for _ in range(rounds):
        await flusher.drain(budget=3)
        pending = 0
        async for k in r.scan_iter(match=f"{flusher.keys.prefix}*pending*"):
            pending += await r.llen(k)
        if not pending:
            return
        await asyncio.sleep(0.3)


async def main(seed: int, n: int) -> None:
    fake = ZepFake(client_timeout=2.0, seed=seed)
    fake.start()
    master = RedisServer()
    url = master.start()
    replica = RedisServer(args=["--replicaof", "127.0.0.1", str(master.port)])
    replica.start()
    assert replica._proc is not None
    rpid = replica._proc.pid
    try:
        s = Settings(redis_url=url, zep_api_key="k", zep_base_url=fake.base_url,
                     key_prefix=f"b21d{seed}", redis_wait_replicas=1,
                     backend_settle_seconds=0.1, backend_timeout=2.0, retry_max_attempts=1,
                     retry_max_age_seconds=1)
        r = aioredis.from_url(url)
        for _ in range(50):
            info = await r.info("replication")
            if info.get("connected_slaves") and info.get("slave0", {}).get("state") == "online":
                break
            await asyncio.sleep(0.1)
        backend = open_backend(s, upgrade=True)
        await backend.prepare()
        flusher = Flusher(s, r, backend, sleep=lambda _s: asyncio.sleep(0))
        queue = ThreadQueue(r, s)
        msgs = [QueuedMessage.build(app="app", user_id="u1", session_id="s1",
                                    invocation_id=f"inv{i:04d}", role="user", ordinal=0,
                                    content=f"letter {i:04d}") for i in range(n)]
        await queue.enqueue(msgs, now_ms=int(time.time() * 1000))
        fake.inject(Fault(match=r"POST .*/threads/.*/messages", status=422, times=10_000))
        await drain_all(flusher, r, rounds=30)
        fake.faults.clear()
        dl = DeadLetters(r, s)
        letters = await dl.count()
        print(f"seed {seed}: {letters} dead letters of {n}")
        reports = []
        # replica stopped: replay three times
        os.kill(rpid, signal.SIGSTOP)
        for _ in range(3):
            t0 = time.monotonic()
            rep = await dl.replay(None)
            reports.append(("stopped", rep, round(time.monotonic() - t0, 2), await dl.count()))
        os.kill(rpid, signal.SIGCONT)
        await asyncio.sleep(1.0)
        # replica back: replay while a worker drains, twice
        worker = asyncio.create_task(drain_all(Flusher(s, r, backend), r))
        rep1, rep2 = await asyncio.gather(dl.replay(None), dl.replay(None))
        reports.append(("concurrent", rep1, None, None))
        reports.append(("concurrent", rep2, None, await dl.count()))
        await worker
        await drain_all(flusher, r)
        for rep in reports:
            print("  ", rep)
        (thread,) = fake.threads()
        stored = [m["content"] for m in fake.messages(thread["uuid"])]
        c = Counter(stored)
        lost = sum(1 for m in msgs if c[m.content] == 0)
        dup = sum(v - 1 for v in c.values())
        replayed = sum(rep.replayed for _, rep, *_ in reports)
        print(f"  letters left {await dl.count()}, reported replayed {replayed} of {letters}, "
              f"stored {len(stored)}: lost {lost}, duplicated {dup}")
    finally:
        with __import__("contextlib").suppress(Exception):
            os.kill(rpid, signal.SIGCONT)
        fake.stop()
        replica.stop()
        master.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 10))
