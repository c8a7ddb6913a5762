"""Driving a deployment from outside, as the example, the benchmarks and tests do: worker
processes, waiting until the queue has settled, removing a run's keys."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import redis.asyncio as aioredis

from afterthought.keys import Keys
from afterthought.settings import Settings


def spawn_worker(settings: Settings, **extra_env: str) -> subprocess.Popen[bytes]:
    """``afterthought worker`` in its own process, configured like ``settings``."""
    env = {
        **os.environ,
        "REDIS_URL": settings.redis_url,
        "AFTERTHOUGHT_KEY_PREFIX": settings.key_prefix,
        "AFTERTHOUGHT_LOCAL_DB_PATH": str(settings.local_db_path),
        **extra_env,
    }
    if settings.zep_api_key is not None:
        env["ZEP_API_KEY"] = settings.zep_api_key.get_secret_value()
        env["ZEP_BASE_URL"] = str(settings.zep_base_url)
    return subprocess.Popen(
        [sys.executable, "-m", "afterthought.cli", "--log-level", "ERROR", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def wait_settled(settings: Settings, timeout: float) -> bool:
    """True once no thread is ready or deferred; False if ``timeout`` passes first."""
    keys = Keys(settings.key_prefix)
    client = aioredis.Redis.from_url(settings.redis_url)
    deadline = time.monotonic() + timeout
    try:
        while await client.zcard(keys.ready):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True
    finally:
        await client.aclose()


async def cleanup(settings: Settings) -> None:
    """Remove every key of the run (ours and arq's)."""
    client = aioredis.Redis.from_url(settings.redis_url)
    for pattern in (f"{settings.key_prefix}:*", f"arq:*{settings.key_prefix}:*"):
        async for key in client.scan_iter(match=pattern, count=1000):
            await client.delete(key)
    await client.aclose()
