"""How long the enqueue round trip takes in a loaded agent process: the facts behind the
default ``enqueue_timeout``.

    python bench/enqueue_deadline.py [--sessions 30 --seconds 10 --hogs 2]

One event loop runs ``--sessions`` producers, each queueing a turn (a user message, then a
reply) every ~50 ms through the real enqueue script, with no deadline, and records how long
each took as the coroutine saw it (loop delays included: that is what a deadline
measures). Three loads, each with ``--hogs`` CPU-bound processes beside it:

- ``quiet``: the loop does nothing else;
- ``busy``: a tool step burns 5-20 ms of CPU every ~50 ms (an agent doing real work);
- ``stalls``: the loop is blocked 150-300 ms every 300-600 ms (GC pauses, CPU-bound tools).

Prints one JSON object: per load, p50/p99/p99.9/max in ms and, per candidate deadline, the
share of enqueues that would have timed out (each such one is held and sent again by the
drain thread: harmless, as the script skips keys it holds, but it delays the message)."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import sys
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought.contract import QueuedMessage  # noqa: E402
from afterthought.queue import ThreadQueue  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.testing.processes import cleanup  # noqa: E402

DEADLINES = (0.025, 0.05, 0.1, 0.25, 0.5)


def _hog(stop_at: float) -> None:
    x = 0
    while time.monotonic() < stop_at:
        x += 1


async def _run(settings: Settings, load: str, sessions: int, seconds: float) -> list[float]:
    client = aioredis.Redis.from_url(settings.redis_url)
    queue = ThreadQueue(client, settings)
    rng = random.Random(7)
    took: list[float] = []
    end = time.monotonic() + seconds

    async def producer(n: int) -> None:
        turn = 0
        while time.monotonic() < end:
            for role in ("user", "assistant"):
                message = QueuedMessage.build(
                    app="deadline",
                    user_id=f"u{n}",
                    session_id=f"s{n}",
                    invocation_id=f"{load}-{turn}",
                    role=role,
                    ordinal=0,
                    content=f"turn {turn} of session {n}, as a person might say it",
                )
                started = time.perf_counter()
                await queue.enqueue([message], now_ms=int(time.time() * 1000))
                took.append(time.perf_counter() - started)
            turn += 1
            await asyncio.sleep(rng.uniform(0.03, 0.07))

    async def disturb() -> None:
        while time.monotonic() < end:
            if load == "busy":
                await asyncio.sleep(rng.uniform(0.03, 0.07))
                _spin(rng.uniform(0.005, 0.02))
            elif load == "stalls":
                await asyncio.sleep(rng.uniform(0.3, 0.6))
                time.sleep(rng.uniform(0.15, 0.3))
            else:
                await asyncio.sleep(0.1)

    await queue.enqueue(  # loads the script, so no sample pays for it
        [
            QueuedMessage.build(
                app="deadline",
                user_id="warm",
                session_id="up",
                invocation_id="0",
                role="user",
                ordinal=0,
                content="warm-up",
            )
        ],
        now_ms=0,
    )
    await asyncio.gather(disturb(), *(producer(n) for n in range(sessions)))
    await client.aclose()
    return took


def _spin(seconds: float) -> None:
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        pass


def _summary(took: list[float]) -> dict[str, object]:
    ordered = sorted(took)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {
        "enqueues": len(ordered),
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "p999_ms": at(0.999),
        "max_ms": round(ordered[-1] * 1000, 2),
        "timed_out_share": {
            f"{d:g}s": round(sum(t > d for t in ordered) / len(ordered), 4) for d in DEADLINES
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--hogs", type=int, default=2)
    args = parser.parse_args()
    settings = Settings(
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        key_prefix=f"deadline-{uuid.uuid4().hex[:8]}",
    )
    result: dict[str, object] = {"sessions": args.sessions, "hogs": args.hogs}
    try:
        for load in ("quiet", "busy", "stalls"):
            stop_at = time.monotonic() + args.seconds + 1
            hogs = [
                multiprocessing.Process(target=_hog, args=(stop_at,), daemon=True)
                for _ in range(args.hogs)
            ]
            for hog in hogs:
                hog.start()
            took = asyncio.run(_run(settings, load, args.sessions, args.seconds))
            for hog in hogs:
                hog.join()
            result[load] = _summary(took)
    finally:
        asyncio.run(cleanup(settings))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
