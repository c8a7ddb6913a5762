"""Write-path throughput of ONE worker process against the Zep fake answering in 100 ms.

    python bench/throughput.py [--threads 200 --per-thread 50] [--rate 500 --seconds 10]
    python bench/throughput.py --topology standalone|sentinel|cluster|all [--users 10000]

(a) backlog: threads x per-thread messages queued first, then the worker drains them:
    persisted msg/s and backend calls per message.
(b) steady chat: a turn (user + assistant message, queued separately as the hooks do) at
    a fixed offered rate: enqueue -> stored lag p50/p99.
(c) on a cluster, spread: ``--users`` users (10,000) say one thing each and the worker
    drains them into the local backend: each master's share of the commands executed.
Prints one JSON object. Uses REDIS_URL or 127.0.0.1:6379 under a fresh key prefix; with
``--topology standalone``, ``sentinel`` or ``cluster`` a private Redis, Sentinel set or
six-node cluster (three masters; ``--shards`` virtual shards, arq's jobs on a private
Redis of their own) started for the run instead, whose counters also give Redis commands
per message: ``client`` (what the processes sent, arq's share included) and ``executed``
(including the commands scripts ran), and what one Redis core could carry at the
measured cost (``ceiling_msg_per_s_per_core``, from ``--core-ops``; on a cluster, each
master is a core)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
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
from afterthought.testing.topologies import HOUSEKEEPING, ClusterSet, SentinelSet  # noqa: E402

APP = "bench"


class _Place:
    """Where the run's Redis is: the data's URL, arq's (None: the same), the shards, and
    every server whose commands count (the masters, and arq's own Redis)."""

    def __init__(
        self, url: str, *, counted: list[str], arq_url: str | None = None, shards: int = 0
    ) -> None:
        self.url, self.arq_url, self.shards, self.counted = url, arq_url, shards, counted

    def settings(self, **values: object) -> Settings:
        return Settings(
            redis_url=self.url,
            arq_redis_url=self.arq_url,
            redis_shards=self.shards,
            key_prefix=f"bench-{uuid.uuid4().hex[:8]}",
            **values,  # type: ignore[arg-type]
        )


def _settings(fake: ZepFake, place: _Place) -> Settings:
    return place.settings(zep_api_key="bench", zep_base_url=fake.base_url)


class _Commands:
    """Counts what Redis runs while it is open (``MONITOR``, on each server named):
    ``client`` commands the processes sent, ``executed`` including those scripts ran, the
    client commands by name, and what each server executed."""

    def __init__(self, urls: list[str]) -> None:
        self.client = self.executed = 0
        self.by_name: Counter[str] = Counter()
        self.by_server: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._clients = [connect_sync(url) for url in urls]
        self._threads = [
            threading.Thread(target=self._count, args=(url, client), daemon=True)
            for url, client in zip(urls, self._clients, strict=True)
        ]
        for thread in self._threads:
            thread.start()

    def _count(self, url: str, client: object) -> None:
        with contextlib.suppress(Exception), client.monitor() as monitor:  # type: ignore[attr-defined]
            while True:  # ends when the connection is closed
                command = monitor.next_command()
                name = str(command["command"]).split(" ", 1)[0].upper()
                if name.lower() in HOUSEKEEPING:
                    continue
                with self._lock:
                    self.executed += 1
                    self.by_server[url] += 1
                    if command.get("client_type") != "lua":
                        self.client += 1
                        self.by_name[name] += 1

    def close(self) -> None:
        for client in self._clients:
            client.connection_pool.disconnect()
        for thread in self._threads:
            thread.join(5)


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


def backlog(place: _Place, threads: int, per_thread: int, latency: float) -> dict[str, object]:
    with ZepFake(latency=latency) as fake:
        settings = _settings(fake, place)
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
    place: _Place, rate: float, seconds: float, threads: int, latency: float
) -> dict[str, object]:
    with ZepFake(latency=latency) as fake:
        settings = _settings(fake, place)
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

            counted = _Commands(place.counted)
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
            "redis_executed_commands_per_msg_by_server": {
                url: round(n / len(lags), 2) for url, n in counted.by_server.items()
            },
        }


def spread(place: _Place, users: int) -> dict[str, object]:
    """Each of ``users`` users says one thing; one worker drains them into the local
    backend (no backend latency: Redis is what is measured). Each master's share of the
    commands executed (arq's own Redis apart), and how far the largest and smallest share
    are from an even one."""
    with tempfile.TemporaryDirectory(prefix="afterthought-bench-") as tmp:
        settings = place.settings(backend="local", local_db_path=Path(tmp) / "memory.sqlite3")
        masters = [url for url in place.counted if url != place.arq_url]
        counted = _Commands(masters)

        async def fill() -> None:
            enqueuer = Enqueuer(settings)
            for u in range(users):
                message = QueuedMessage.build(
                    app=APP,
                    user_id=f"person{u}",
                    session_id="first",
                    invocation_id="inv0",
                    role="user",
                    ordinal=0,
                    content=f"person {u}: I moved to Porto last spring.",
                )
                assert await enqueuer.enqueue([message])
            await enqueuer.aclose()

        worker = spawn_worker(settings)
        try:
            asyncio.run(fill())
            assert asyncio.run(wait_settled(settings, 900)), "not drained"
        finally:
            worker.terminate()
            worker.wait(timeout=30)
            counted.close()
            asyncio.run(cleanup(settings))
    total = sum(counted.by_server[url] for url in masters)
    shares = [counted.by_server[url] / total for url in masters]
    even = 1 / len(masters)
    return {
        "users": users,
        "masters": len(masters),
        "executed_share_by_master": [round(share, 4) for share in shares],
        "max_deviation_from_even": round(max(abs(share - even) for share in shares) / even, 4),
    }


def run(topology: str, args: argparse.Namespace) -> dict[str, object]:
    """Both phases (and, on a cluster, the spread) on one topology."""
    with contextlib.ExitStack() as stack:
        url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
        place = _Place(url, counted=[url])
        if topology == "standalone":
            url = stack.enter_context(RedisServer())
            place = _Place(url, counted=[url])
        elif topology == "sentinel":
            sentinels = stack.enter_context(SentinelSet())
            host, port = sentinels.master_address()
            place = _Place(sentinels.url, counted=[f"redis://{host}:{port}/0"])
        elif topology == "cluster":
            cluster = stack.enter_context(ClusterSet())
            jobs = stack.enter_context(RedisServer())
            masters = [f"redis://127.0.0.1:{port}/0" for port in cluster.masters()]
            place = _Place(cluster.url, counted=[*masters, jobs], arq_url=jobs, shards=args.shards)
        steady_chat = steady(place, args.rate, args.seconds, args.chat_threads, args.latency)
        result: dict[str, object] = {
            "topology": topology,
            "redis_shards": place.shards,
            "backlog": backlog(place, args.threads, args.per_thread, args.latency),
            "steady": steady_chat,
        }
        if topology == "cluster":
            result["spread"] = spread(place, args.users)
    executed = float(steady_chat["redis_executed_commands_per_msg"])  # type: ignore[arg-type]
    result["ceiling_msg_per_s_per_core"] = round(args.core_ops / executed) if executed else None
    if topology == "cluster":
        # Each master is a core of its own, and the shards spread the data's load evenly
        # over them; arq's jobs are on a Redis of their own, a core apart.
        by_server: dict[str, float] = steady_chat["redis_executed_commands_per_msg_by_server"]  # type: ignore[assignment]
        data = sum(n for url, n in by_server.items() if url != place.arq_url)
        masters = len(place.counted) - 1
        result["ceiling_msg_per_s_cluster"] = round(args.core_ops * masters / data)
        arq = by_server.get(str(place.arq_url), 0.0)
        result["ceiling_msg_per_s_arq_redis"] = round(args.core_ops / arq) if arq else None
    return result


def _side_by_side(results: list[dict[str, object]]) -> dict[str, object]:
    """The figures that compare topologies, one row each."""
    rows = {}
    for result in results:
        backlog_, steady_ = result["backlog"], result["steady"]
        assert isinstance(backlog_, dict) and isinstance(steady_, dict)
        rows[str(result["topology"])] = {
            "backlog_msg_per_s": backlog_["msg_per_s"],
            "chat_lag_p50_s": steady_["lag_p50_s"],
            "client_commands_per_msg": steady_["redis_client_commands_per_msg"],
            "executed_commands_per_msg": steady_["redis_executed_commands_per_msg"],
        }
    return rows


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
        choices=["env", "standalone", "sentinel", "cluster", "all"],
        default="env",
        help="env: REDIS_URL; else a private Redis, Sentinel set or cluster, for clean "
        "counters; all: the three in turn, side by side",
    )
    parser.add_argument("--shards", type=int, default=24, help="cluster: virtual shards")
    parser.add_argument("--users", type=int, default=10_000, help="cluster: users of the spread")
    parser.add_argument(
        "--core-ops",
        type=float,
        default=100_000,
        help="commands one Redis core executes a second (for the projected ceiling)",
    )
    args = parser.parse_args()
    if args.topology != "all":
        print(json.dumps(run(args.topology, args)))
        return
    results = [run(topology, args) for topology in ("standalone", "sentinel", "cluster")]
    print(json.dumps({"side_by_side": _side_by_side(results), "runs": results}))


if __name__ == "__main__":
    main()
