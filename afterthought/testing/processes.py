"""Driving a deployment from outside, as the example, the benchmarks and tests do: worker
processes, waiting until the queue has settled, removing a run's keys."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

from afterthought.connections import FAILURES, connect
from afterthought.keys import Keys
from afterthought.settings import Settings


def spawn_worker(settings: Settings, **extra_env: str) -> subprocess.Popen[bytes]:
    """``afterthought worker`` in its own process, configured like ``settings``."""
    env = {**os.environ, **settings.as_env(), **extra_env}
    return subprocess.Popen(
        [sys.executable, "-m", "afterthought.cli", "--log-level", "ERROR", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,  # errors still reach stderr: a crash is never silent
    )


async def wait_settled(settings: Settings, timeout: float) -> bool:
    """True once no thread is ready or deferred and no synthesis waits; False if
    ``timeout`` passes first. (A killed worker's own job may linger in arq's queue until
    arq's timeout; the threads it held are recovered without it, so it is not waited on.)"""
    keys = Keys.of(settings)
    synth = keys.job_id("synth", "").encode()
    client, jobs = connect(settings.redis_url), connect(settings.jobs_redis_url)
    deadline = time.monotonic() + timeout

    async def busy() -> bool:
        for shard in keys.shard_ids:
            if await client.zcard(keys.ready(shard)):
                return True
        return any(job.startswith(synth) for job in await jobs.zrange(keys.queue, 0, -1))

    async def settled() -> bool:
        try:
            return not await busy()
        except FAILURES:  # Redis away (failing over): not settled yet
            return False

    try:
        while not await settled():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True
    finally:
        await client.aclose()
        await jobs.aclose()


async def cleanup(settings: Settings) -> None:
    """Remove every key of the run (ours and arq's)."""
    for url, pattern in (
        (settings.redis_url, f"{settings.key_prefix}:*"),
        (settings.jobs_redis_url, f"arq:*{settings.key_prefix}:*"),
        (settings.jobs_redis_url, f"{settings.key_prefix}:*"),  # arq's queue and health
    ):
        client = connect(url)
        async for key in client.scan_iter(match=pattern, count=1000):
            await client.delete(key)
        await client.aclose()
