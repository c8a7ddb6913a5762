"""What memory adds to an ADK turn: afterthought's hooks vs zep-adk 1.0.0, same scripted
agent, same Zep fake answering in 150 ms.

    pip install -e '.[bench]'   # zep-adk, for the comparison only
    python bench/hook_latency.py [--turns 300]

Added latency = a percentile of turns with memory minus the same percentile of a bare
agent. afterthought warm: ``context_mode="cached"``, the context cache holds the user's
block; cold: the same, every turn missing it and reading through; default: the default
``context_mode`` (``query``), the block retrieved for each message — from the local store
(SQLite in this process, the user holding ``--history`` messages) and from the Zep fake.
Prints one JSON object. Uses REDIS_URL or 127.0.0.1:6379.

    python bench/hook_latency.py --hang 150

measures a backend hang instead: the fake stops answering (requests wait, as behind a
stalled load balancer) while every turn misses the cache; reported are the turns that
waited out the budget before the read breaker opened, the added latency of the turns
after it opened, and the half-open probes among them."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from google.adk.agents import LlmAgent
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought.agent_hooks import create_callbacks  # noqa: E402
from afterthought.backends import open_backend  # noqa: E402
from afterthought.backends.base import OutgoingMessage  # noqa: E402
from afterthought.identity import IdentityRegistry  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.testing import ZepFake  # noqa: E402
from afterthought.testing.processes import cleanup, spawn_worker, wait_settled  # noqa: E402
from afterthought.testing.stand_in_model import StandInLlm  # noqa: E402

APP = "latency"


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000, 3),
    }


QUESTIONS = [
    "what was the name of that ramen place we talked about?",
    "remind me when my sister's wedding is",
    "any ideas for a weekend trip, nothing too far from home",
    "what did I say my knee injury was again?",
    "can you suggest dinner, keeping my allergies in mind",
]
PLACES = ["Porto", "Leeds", "Osaka", "Tucson", "Gdansk", "Accra", "Lyon", "Quito"]
THINGS = ["ramen", "the wedding", "my knee", "peanuts", "the garden", "a new job", "the dog"]


def _history(n: int) -> list[str]:
    """``n`` varied things a user said (for the store's size, not for quality)."""
    return [
        f"Message {i}: talked about {THINGS[i % len(THINGS)]} near {PLACES[i % len(PLACES)]}"
        f" on day {i % 365}, and {THINGS[(i * 3) % len(THINGS)]} again."
        for i in range(n)
    ]


async def _turns(
    runner: Runner,
    user: str,
    n: int,
    *,
    state: dict[str, Any] | None = None,
    before_each: Callable[[], Any] | None = None,
) -> list[float]:
    """``n`` timed turns, each the first of a new session (equal history for everyone)."""
    took = []
    for i in range(n):
        session = await runner.session_service.create_session(
            app_name=APP, user_id=user, state=state or {}
        )
        if before_each is not None:
            await before_each()
        started = time.perf_counter()
        async for _ in runner.run_async(
            user_id=user,
            session_id=session.id,
            new_message=types.UserContent(QUESTIONS[i % len(QUESTIONS)]),
        ):
            pass
        took.append(time.perf_counter() - started)
    return took


def _runner(**callbacks: Any) -> Runner:
    agent = LlmAgent(name="helper", model=StandInLlm(), instruction="Be brief.", **callbacks)
    return Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())


async def bare(n: int) -> list[float]:
    runner = _runner()
    await _turns(runner, "u", 5)
    return await _turns(runner, "u", n)


async def _fill(settings: Settings, user: str, history: int) -> None:
    """Store ``history`` more messages of the user in their thread (the local store)."""
    client = aioredis.Redis.from_url(settings.redis_url)
    registry = IdentityRegistry(client, settings)
    known = await registry.lookup_user(app=APP, user_id=user)
    await client.aclose()
    assert known is not None
    backend = open_backend(settings)
    thread = await backend.create_thread(user=known, idempotency_key=f"history-{user}")
    lines = _history(history)
    for start in range(0, len(lines), 500):
        await backend.add_messages(
            thread_uuid=thread,
            messages=[
                OutgoingMessage(
                    role="user", content=text, reference_time=f"2026-{1 + i % 12:02d}-01"
                )
                for i, text in enumerate(lines[start : start + 500])
            ],
            idempotency_key=f"history-{user}-{start}",
        )
    await backend.aclose()


async def _provisioned(settings: Settings, history: int = 0) -> tuple[Runner, str]:
    """A runner with our hooks, and a user the worker provisioned (its block cached),
    connections and scripts warmed."""
    memory = create_callbacks(settings=settings)
    runner = _runner(
        before_model_callback=memory.before_model_callback,
        after_model_callback=memory.after_model_callback,
    )
    user = f"user-{uuid.uuid4().hex[:6]}"
    await _turns(runner, user, 1)  # the worker provisions and fills the cache
    worker = spawn_worker(settings)
    try:
        assert await wait_settled(settings, 60)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    if history:
        await _fill(settings, user, history)
    await _turns(runner, user, 5)
    return runner, user


def _forgetting(settings: Settings, client: aioredis.Redis) -> Callable[[], Any]:
    """Drops every cached block: the next turn misses the cache."""

    async def forget_block() -> None:
        async for key in client.scan_iter(match=f"{settings.key_prefix}:ctx:*"):
            await client.delete(key)

    return forget_block


async def ours(settings: Settings, n: int, *, warm: bool, history: int = 0) -> list[float]:
    runner, user = await _provisioned(settings, history)
    client = aioredis.Redis.from_url(settings.redis_url)
    forget = None if warm else _forgetting(settings, client)
    took = await _turns(runner, user, n, before_each=forget)
    await client.aclose()
    return took


async def hung(
    settings: Settings, fake: ZepFake, seconds: float
) -> tuple[list[float], list[float]]:
    """Cache-missing turns for ``seconds`` while the fake hangs (it answers nothing), and
    bare turns between them: the machine's load then is the baseline's too."""
    runner, user = await _provisioned(settings)
    plain = _runner()
    await _turns(plain, "u", 5)
    client = aioredis.Redis.from_url(settings.redis_url)
    forget = _forgetting(settings, client)
    fake.latency = 24 * 3600.0  # requests wait, unanswered, until the client gives up
    baseline: list[float] = []
    took: list[float] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        took += await _turns(runner, user, 10, before_each=forget)
        baseline += await _turns(plain, "u", 10)
    await client.aclose()
    return baseline, took


def _hang_report(baseline: list[float], took: list[float], budget: float) -> dict[str, Any]:
    """Turns that waited out the budget before the breaker opened, then the others."""
    waited = [t >= budget for t in took]
    opened = waited.index(False) if False in waited else len(took)
    after = took[opened:]
    base = _percentiles(baseline)
    got = _percentiles(after) if after else {"p50_ms": 0.0, "p99_ms": 0.0}
    return {
        "turns": len(took),
        "budget_s": budget,
        "turns_before_breaker_opened": opened,
        "after_open": {
            "turns": len(after),
            "added": {k: round(got[k] - base[k], 3) for k in got},
            "probes": sum(waited[opened:]),
        },
    }


async def zep_adk(base_url: str, n: int) -> list[float]:
    from zep_adk import ZepContextTool, create_after_model_callback
    from zep_cloud import AsyncZep

    zep = AsyncZep(api_key="bench", base_url=base_url)
    user = await zep.user.create(user_id=f"adk-{uuid.uuid4().hex[:6]}", first_name="Bench")
    thread = await zep.thread.create(user_uuid=str(user.uuid_))
    runner = _runner(
        tools=[ZepContextTool(zep_client=zep)],
        after_model_callback=create_after_model_callback(zep),
    )
    state = {"zep_user_uuid": str(user.uuid_), "zep_thread_uuid": str(thread.uuid_)}
    await _turns(runner, "adk", 3, state=state)
    return await _turns(runner, "adk", n, state=state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--latency", type=float, default=0.15)
    parser.add_argument("--history", type=int, default=10_000, help="local default's store")
    parser.add_argument(
        "--zep-budget", type=float, default=0.25, help="the default's budget on Zep"
    )
    parser.add_argument(
        "--hang", type=float, metavar="SECONDS", help="measure a backend hang this long instead"
    )
    args = parser.parse_args()
    few = max(20, args.turns // 10)
    with ZepFake(latency=args.latency) as fake, tempfile.TemporaryDirectory() as tmp:
        default = Settings(
            redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            key_prefix=f"latency-{uuid.uuid4().hex[:8]}",
            zep_api_key="bench",
            zep_base_url=fake.base_url,
        )
        settings = default.model_copy(update={"context_mode": "cached"})
        # The local store's deployment is a deployment of its own: a worker serves one
        # store, and the Zep worker would dead-letter the local store's users.
        local = default.model_copy(
            update={
                "backend": "local",
                "local_db_path": Path(tmp) / "memory.sqlite3",
                "key_prefix": f"{default.key_prefix}-local",
            }
        )
        if args.hang:
            try:
                baseline, took = asyncio.run(hung(settings, fake, args.hang))
            finally:
                asyncio.run(cleanup(settings))
            report = _hang_report(baseline, took, settings.retrieval_budget)
            print(json.dumps({"hang_s": args.hang, "bare_turn": _percentiles(baseline), **report}))
            return
        try:
            baseline = asyncio.run(bare(args.turns))
            warm = asyncio.run(ours(settings, args.turns, warm=True))
            cold = asyncio.run(ours(settings, few, warm=False))
            default_local = asyncio.run(ours(local, args.turns, warm=True, history=args.history))
            default_zep = asyncio.run(
                ours(
                    default.model_copy(update={"retrieval_budget": args.zep_budget}),
                    few,
                    warm=True,
                )
            )
            theirs = asyncio.run(zep_adk(fake.base_url, few))
        finally:
            asyncio.run(cleanup(settings))
            asyncio.run(cleanup(local))
    base = _percentiles(baseline)

    def added(samples: list[float]) -> dict[str, float]:
        got = _percentiles(samples)
        return {k: round(got[k] - base[k], 3) for k in got}

    result: dict[str, Any] = {
        "zep_latency_s": args.latency,
        "bare_turn": base,
        "afterthought_warm_added": added(warm),
        "afterthought_cold_added": added(cold),
        "afterthought_default_local_added": added(default_local),
        "default_local_history_messages": args.history,
        "afterthought_default_zep_added": added(default_zep),
        "default_zep_budget_s": args.zep_budget,
        "zep_adk_added": added(theirs),
    }
    for mode in ("warm", "default_local"):
        ours_p50 = max(result[f"afterthought_{mode}_added"]["p50_ms"], 0.001)
        result[f"zep_adk_over_afterthought_{mode}_p50"] = round(
            result["zep_adk_added"]["p50_ms"] / ours_p50, 1
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
