"""Probe: late commits with keys IGNORED, then the late-copy repair (``repair_late``) under
faults of its own (5xx, lost replies, hangs, late commits of its own PATCH/DELETE), runs cut
short (cancelled mid-run: a killed worker) and two runs at once (a paused worker resuming).
Measures, per thread: messages lost, duplicated (unmarked copies), reordered, and graph
episodes per message key (0: lost from the graph, >1: doubled).
Usage: .venv/bin/python probes/repair_chaos.py SEED [messages] [mode]
mode: faults | cut | concurrent | all (default all)."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter

from afterthought.backends import open_backend
from afterthought.contract import QueuedMessage
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.testing import RedisServer
from afterthought.testing.zep_fake import Fault, ZepFake
from afterthought.worker.flush import Flusher

T = [1000.0]


def clock() -> float:
    return T[0]


async def settle_queue(flusher: Flusher, r: object) -> None:
    """Drain until nothing is pending (deferred threads wait on the real clock)."""
    for _ in range(200):
        await flusher.drain(budget=5)
        pending = 0
        async for k in r.scan_iter(match=f"{flusher.keys.prefix}*pending*"):  # type: ignore[attr-defined]
            pending += await r.llen(k)  # type: ignore[attr-defined]
        if not pending:
            return
        await asyncio.sleep(0.3)
    raise RuntimeError("queue never drained")


async def main(seed: int, n: int, mode: str) -> dict[str, int]:
    rnd = random.Random(seed)
    fake = ZepFake(honor_idempotency=False, clock=clock, client_timeout=1.0, seed=seed,
                   ingestion_lag_calls=1, hang_overshoot=0.2)
    fake.start()
    redis_server = RedisServer()
    url = redis_server.start()
    try:
        s = Settings(
            redis_url=url, zep_api_key="k", zep_base_url=fake.base_url,
            key_prefix=f"b21c{seed}", late_commit_seconds=600, backend_settle_seconds=0.1,
            backend_timeout=1.0, lease_seconds=10,
        )
        backend = open_backend(s, upgrade=True)
        await backend.prepare()
        import redis.asyncio as aioredis
        r = aioredis.from_url(url)
        flusher = Flusher(s, r, backend, sleep=lambda _s: asyncio.sleep(0))
        queue = ThreadQueue(r, s)
        sent: list[str] = []
        for i in range(0, n, 2):
            msgs = [
                QueuedMessage.build(app="app", user_id="u1", session_id="s1",
                                    invocation_id=f"inv{i:04d}", role=role, ordinal=0,
                                    content=f"message {i + j:04d} words here")
                for j, role in enumerate(("user", "assistant"))
            ]
            await queue.enqueue(msgs, now_ms=int(time.time() * 1000))
            sent += [m.key for m in msgs]
            if rnd.random() < 0.35:  # this flush's call is served late: 5..300 s
                fake.inject(Fault(match=r"POST .*/threads/.*/messages", late=rnd.uniform(5, 300)))
            await settle_queue(flusher, r)
            T[0] += rnd.uniform(0.5, 3)
        await settle_queue(flusher, r)
        T[0] += 400  # everything held lands at the next request
        fake.threads()  # settle
        # --- the repair, under faults of its own --------------------------------------
        if mode in ("faults", "all"):
            fake.fault_rate = 0.3
            fake.late_commit_rate = 0.2
            fake.late_commit_max_seconds = 60
        now_ms = int(time.time() * 1000)
        step = 0
        stats_total: Counter[str] = Counter()
        while step < 40:
            step += 1
            now_ms += 61_000
            T[0] += 61
            if mode in ("cut", "all") and rnd.random() < 0.5:
                task = asyncio.create_task(flusher.repair_late(now_ms=now_ms))
                await asyncio.sleep(rnd.uniform(0.01, 0.5))
                task.cancel()
                try:
                    stats_total.update(await task)
                except (asyncio.CancelledError, Exception) as exc:
                    stats_total[f"run_{type(exc).__name__}"] += 1
            elif mode in ("concurrent", "all") and rnd.random() < 0.5:
                a, b = await asyncio.gather(
                    flusher.repair_late(now_ms=now_ms),
                    Flusher(s, r, backend).repair_late(now_ms=now_ms),
                    return_exceptions=True,
                )
                for x in (a, b):
                    if isinstance(x, BaseException):
                        stats_total[f"run_{type(x).__name__}"] += 1
                    else:
                        stats_total.update(x)
            else:
                try:
                    stats_total.update(await flusher.repair_late(now_ms=now_ms))
                except Exception as exc:
                    stats_total[f"run_{type(exc).__name__}"] += 1
            if step > 25:  # faults off: let it finish
                fake.fault_rate = fake.late_commit_rate = 0.0
            if step > 25 and not await queue.expected_late(limit=10):
                break
        T[0] += 1000
        fake.threads()
        watched = len(await queue.expected_late(limit=1000))
        # --- measure ------------------------------------------------------------------
        (thread,) = fake.threads()
        msgs = fake.messages(thread["uuid"])
        live = [m for m in msgs if "afterthought_copy_of" not in (m.get("metadata") or {})]
        keys = [m["metadata"].get("afterthought_key") for m in live]
        c = Counter(keys)
        lost = sum(1 for k in sent if k not in c)
        dup = sum(v - 1 for v in c.values())
        order = [sent.index(k) for k in keys if k in sent]
        reordered = sum(1 for a, b in zip(order, order[1:]) if b < a)
        eps = Counter((e.get("metadata") or {}).get("afterthought_key")
                      for e in fake.episodes(of_messages=True))
        users = sent[0::2]  # assistant replies are ignored roles: Zep makes no episode
        ep_missing = sum(1 for k in users if eps[k] == 0)
        ep_doubled = sum(1 for k in sent if eps[k] > 1)
        out = dict(sent=len(sent), stored=len(msgs), lost=lost, duplicated=dup,
                   reordered=reordered, episodes_missing=ep_missing,
                   episodes_doubled=ep_doubled, still_watched=watched,
                   late_injected=fake.injected["late"], ambiguous_late=fake.ambiguous["late"])
        print(seed, mode, out, dict(stats_total))
        return out
    finally:
        fake.stop()
        redis_server.stop()


if __name__ == "__main__":
    seed = int(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    mode = sys.argv[3] if len(sys.argv) > 3 else "all"
    asyncio.run(main(seed, n, mode))
