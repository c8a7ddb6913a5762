"""Chaos run of the write path: worker processes SIGKILLed at random while a faulty Zep
fake answers; then every message must be in the fake exactly once, in order per thread.

    python bench/chaos.py --messages 10000 --workers 4 --kills 20 --fault-rate 0.2

Prints one JSON object: {messages, workers, kills, fault_rate, honor_idempotency, lost,
duplicated, out_of_order, seconds}. Uses REDIS_URL or 127.0.0.1:6379 (keys under a
fresh prefix, removed afterwards)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought.contract import QueuedMessage  # noqa: E402
from afterthought.enqueue import Enqueuer  # noqa: E402
from afterthought.identity import IdentityRegistry  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.testing import ZepFake  # noqa: E402
from afterthought.testing.processes import cleanup, spawn_worker, wait_settled  # noqa: E402

APP = "chaos"


async def _produce(settings: Settings, messages: int, threads: int, seconds: float) -> None:
    """Each thread says its numbered lines in order, spread over ``seconds``."""
    enqueuer = Enqueuer(settings)
    pause = seconds / max(1, messages)
    for n in range(messages):
        thread = n % threads
        message = QueuedMessage.build(
            app=APP,
            user_id=f"user{thread % 5}",
            session_id=f"session{thread}",
            invocation_id=f"inv{n}",
            role="user",
            ordinal=0,
            content=f"thread {thread} line {n // threads}",
        )
        while not await enqueuer.enqueue([message]):  # never give up on the producer side
            await asyncio.sleep(0.05)
        if pause:
            await asyncio.sleep(pause)
    await enqueuer.aclose()


async def _verify(settings: Settings, fake: ZepFake, messages: int, threads: int) -> Counter[str]:
    client = aioredis.Redis.from_url(settings.redis_url)
    registry = IdentityRegistry(client, settings)
    result: Counter[str] = Counter()
    stored_total = 0
    for thread in range(threads):
        expected = [
            f"thread {thread} line {i}" for i in range(len(range(thread, messages, threads)))
        ]
        known = await registry.lookup(
            app=APP, user_id=f"user{thread % 5}", session_id=f"session{thread}"
        )
        got = [m["content"] for m in fake.messages(known.thread_uuid)] if known.thread_uuid else []
        stored_total += len(got)
        counts = Counter(got)
        result["lost"] += sum(1 for line in expected if line not in counts)
        result["duplicated"] += sum(n - 1 for n in counts.values() if n > 1)
        firsts = list(dict.fromkeys(got))
        result["out_of_order"] += int(firsts != [line for line in expected if line in counts])
    result["stray"] = len(fake.messages()) - stored_total  # stored under no session's thread
    await client.aclose()
    return result


def run(
    *,
    messages: int = 500,
    workers: int = 3,
    kills: int = 2,
    fault_rate: float = 0.1,
    honor_idempotency: bool = True,
    threads: int = 20,
    seed: int | None = None,
    redis_url: str | None = None,
    timeout: float = 120.0,
) -> dict[str, object]:
    rng = random.Random(seed)
    fake = ZepFake(
        latency=0.01, fault_rate=fault_rate, honor_idempotency=honor_idempotency, seed=seed
    ).start()
    settings = Settings(
        redis_url=redis_url or os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        key_prefix=f"chaos-{uuid.uuid4().hex[:8]}",
        zep_api_key="chaos",
        zep_base_url=fake.base_url,
        lease_seconds=2.0,
        backend_settle_seconds=0.5,
    )
    env = {
        "AFTERTHOUGHT_LEASE_SECONDS": "2",
        "AFTERTHOUGHT_PAUSE_SECONDS": "1",
        "AFTERTHOUGHT_BACKEND_SETTLE_SECONDS": "0.5",
    }
    started = time.monotonic()
    pool = [spawn_worker(settings, **env) for _ in range(workers)]
    produce_seconds = max(3.0, messages / 400)
    try:
        kill_times = sorted(rng.uniform(0.5, produce_seconds + 2) for _ in range(kills))

        async def chaos() -> bool:
            producing = asyncio.create_task(_produce(settings, messages, threads, produce_seconds))
            for at in kill_times:
                await asyncio.sleep(max(0.0, at - (time.monotonic() - started)))
                victim = rng.randrange(len(pool))
                pool[victim].send_signal(signal.SIGKILL)
                pool[victim].wait()
                pool[victim] = spawn_worker(settings, **env)
            await producing
            return await wait_settled(settings, timeout)

        settled = asyncio.run(chaos())
        seconds = time.monotonic() - started
        found = asyncio.run(_verify(settings, fake, messages, threads))
    finally:
        for proc in pool:
            proc.terminate()
        for proc in pool:
            proc.wait(timeout=30)
        asyncio.run(cleanup(settings))
        fake.stop()
    return {
        "messages": messages,
        "workers": workers,
        "kills": kills,
        "fault_rate": fault_rate,
        "honor_idempotency": honor_idempotency,
        "lost": found["lost"],
        "duplicated": found["duplicated"],
        "out_of_order": found["out_of_order"],
        "stray": found["stray"],
        "settled": settled,
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=20)
    parser.add_argument("--ignore-idempotency", action="store_true")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    print(
        json.dumps(
            run(
                messages=args.messages,
                workers=args.workers,
                kills=args.kills,
                fault_rate=args.fault_rate,
                honor_idempotency=not args.ignore_idempotency,
                threads=args.threads,
                seed=args.seed,
                timeout=600,
            )
        )
    )


if __name__ == "__main__":
    main()
