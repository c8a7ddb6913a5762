"""Write-path throughput of ONE worker process against the Zep fake answering in 100 ms.

    python bench/throughput.py [--threads 200 --per-thread 50] [--rate 500 --seconds 10]

(a) backlog: threads x per-thread messages queued first, then the worker drains them:
    persisted msg/s and backend calls per message.
(b) steady chat: a turn (user + assistant message, queued separately as the hooks do) at
    a fixed offered rate: enqueue -> stored lag p50/p99.
Prints one JSON object. Uses REDIS_URL or 127.0.0.1:6379 under a fresh key prefix; with
``--topology standalone`` or ``sentinel`` a private Redis (or Sentinel set) started for the
run instead, whose counters also give Redis commands per message: ``client`` (what the
processes sent) and ``executed`` (including the commands scripts ran), and what one Redis
core could carry at the measured cost (``ceiling_msg_per_s``, from ``--core-ops``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought.backends import open_backend  # noqa: E402
from afterthought.connections import connect, connect_sync  # noqa: E402
from afterthought.contract import QueuedMessage  # noqa: E402
from afterthought.enqueue import Enqueuer  # noqa: E402
from afterthought.identity import IdentityRegistry  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.testing import RedisServer, ZepFake  # noqa: E402
from afterthought.testing.processes import cleanup, spawn_worker, wait_settled  # noqa: E402
from afterthought.testing.topologies import SentinelSet  # noqa: E402

APP = "bench"


def _settings(fake: ZepFake, redis_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        key_prefix=f"bench-{uuid.uuid4().hex[:8]}",
        zep_api_key="bench",
        zep_base_url=fake.base_url,
    )


class _Commands:
    """Counts what Redis runs while it is open (``MONITOR``, on the server the URL names):
    ``client`` commands the processes sent, ``executed`` including those scripts ran, and
    the client commands by name."""

    def __init__(self, url: str) -> None:
        self._client = connect_sync(url)
        self.client = self.executed = 0
        self.by_name: Counter[str] = Counter()
        self._monitor = self._client.monitor()
        self._conn = self._monitor.__enter__()
        self._thread = threading.Thread(target=self._count, daemon=True)
        self._thread.start()

    def _count(self) -> None:
        with contextlib.suppress(Exception):  # ends when the connection is closed
            while True:
                command = self._conn.next_command()
                self.executed += 1
                if command.get("client_type") != "lua":
                    self.client += 1
                    self.by_name[str(command["command"]).split(" ", 1)[0].upper()] += 1

    def close(self) -> None:
        self._client.connection_pool.disconnect()
        self._thread.join(5)


def _message(thread: int, n: int, role: str = "user") -> QueuedMessage:
    return QueuedMessage.build(
        app=APP,
        user_id=f"user{thread % 20}",
        session_id=f"session{thread}",
        invocation_id=f"inv{n}",
        role=role,  # type: ignore[arg-type]
        ordinal=0,
        content=f"thread {thread} message {n}: I like tea, and I live near the sea.",
    )


async def _provision(settings: Settings, threads: int) -> None:
    """Identities exist before the clock starts, as they do for returning users."""
    client = connect(settings.redis_url)
    backend = open_backend(settings)
    registry = IdentityRegistry(client, settings)
    gate = asyncio.Semaphore(20)

    async def one(t: int) -> None:
        async with gate:
            await registry.ensure(
                backend, app=APP, user_id=f"user{t % 20}", session_id=f"session{t}"
            )

    await asyncio.gather(*(one(t) for t in range(threads)))
    await backend.aclose()
    await client.aclose()


def _adds(fake: ZepFake) -> list[float]:
    return [
        r.at
        for r in fake.requests
        if r.method == "POST" and r.path.endswith("/messages") and r.status == 202
    ]


def backlog(redis_url: str, threads: int, per_thread: int, latency: float) -> dict[str, object]:
    with ZepFake(latency=latency) as fake:
        settings = _settings(fake, redis_url)
        asyncio.run(_provision(settings, threads))
        fake.requests.clear()

        async def fill() -> None:
            enqueuer = Enqueuer(settings)
            for n in range(per_thread):
                for t in range(threads):
                    assert await enqueuer.enqueue([_message(t, n)])
            await enqueuer.aclose()

        asyncio.run(fill())
        total = threads * per_thread
        started = time.monotonic()
        worker = spawn_worker(settings)
        try:
            assert asyncio.run(wait_settled(settings, 600)), "not drained"
            wall = time.monotonic() - started
        finally:
            worker.terminate()
            worker.wait(timeout=30)
            asyncio.run(cleanup(settings))
        adds = _adds(fake)
        stored = len(fake.messages())
        active = max(adds) - min(adds) + latency
        return {
            "messages": total,
            "stored": stored,
            "threads": threads,
            "latency_s": latency,
            "msg_per_s": round(total / active),
            "msg_per_s_incl_worker_start": round(total / wall),
            "add_messages_calls": len(adds),
            "calls_per_msg": round(len(adds) / total, 4),
            "seconds": round(active, 2),
        }


def steady(
    redis_url: str, rate: float, seconds: float, threads: int, latency: float
) -> dict[str, object]:
    with ZepFake(latency=latency) as fake:
        settings = _settings(fake, redis_url)
        asyncio.run(_provision(settings, threads))
        worker = spawn_worker(settings)
        try:
            time.sleep(2.0)  # the worker is up before the clock starts

            async def offer() -> float:
                enqueuer = Enqueuer(settings)
                turns = int(rate * seconds / 2)
                interval = 2 / rate
                begin = time.monotonic()
                for n in range(turns):
                    t = n % threads
                    # the hooks queue the user's message, then the reply a moment later
                    await enqueuer.enqueue([_message(t, n, "user")])
                    await enqueuer.enqueue([_message(t, n, "assistant")])
                    delay = begin + (n + 1) * interval - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                await enqueuer.aclose()
                return time.monotonic() - begin

            counted = _Commands(settings.redis_url)
            offered_for = asyncio.run(offer())
            assert asyncio.run(wait_settled(settings, 600)), "not drained"
            counted.close()
        finally:
            worker.terminate()
            worker.wait(timeout=30)
            asyncio.run(cleanup(settings))
        lags = sorted(
            (
                datetime.fromisoformat(m["created_at"])
                - datetime.fromisoformat(m["reference_time"])
            ).total_seconds()
            for m in fake.messages()
        )
        adds = _adds(fake)
        return {
            "offered_msg_per_s": round(len(lags) / offered_for),
            "messages": len(lags),
            "threads": threads,
            "latency_s": latency,
            "lag_p50_s": round(statistics.median(lags), 3),
            "lag_p99_s": round(lags[int(len(lags) * 0.99) - 1], 3),
            "lag_max_s": round(lags[-1], 3),
            "calls_per_msg": round(len(adds) / len(lags), 4),
            # Idle polling while the queue settles is in these too: an upper bound.
            "redis_client_commands_per_msg": round(counted.client / len(lags), 2),
            "redis_executed_commands_per_msg": round(counted.executed / len(lags), 2),
            "redis_client_commands_by_name": dict(counted.by_name.most_common()),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--per-thread", type=int, default=50)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--chat-threads", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument(
        "--topology",
        choices=["env", "standalone", "sentinel"],
        default="env",
        help="env: REDIS_URL; else a private Redis or Sentinel set, for clean counters",
    )
    parser.add_argument(
        "--core-ops",
        type=float,
        default=100_000,
        help="commands one Redis core executes a second (for the projected ceiling)",
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
        if args.topology == "standalone":
            url = stack.enter_context(RedisServer())
        elif args.topology == "sentinel":
            url = stack.enter_context(SentinelSet()).url
        steady_chat = steady(url, args.rate, args.seconds, args.chat_threads, args.latency)
        result = {
            "topology": args.topology,
            "backlog": backlog(url, args.threads, args.per_thread, args.latency),
            "steady": steady_chat,
        }
    executed = float(steady_chat["redis_executed_commands_per_msg"])  # type: ignore[arg-type]
    result["ceiling_msg_per_s_per_core"] = round(args.core_ops / executed) if executed else None
    print(json.dumps(result))


if __name__ == "__main__":
    main()
