"""After `afterthought forget --query WORD --yes` (one fact), whoever reads Redis can
confirm what was forgotten: the tombstone is an unkeyed sha256 of (subject, predicate,
value) in a set named by an unkeyed digest of (app, user id). A dictionary of guesses
finds the forgotten value.

    python probes/break22/p11_tombstone_confirms.py
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))
import common

from afterthought.facts import fact_signature
from afterthought.keys import Keys
from afterthought.settings import Settings

env = common.deployment("p11")
APP, USER = "shopapp", "ada"
common.apply(env)
worker = common.spawn_worker(env)
try:

    async def session() -> None:
        runner, memory = common.make_runner(APP)
        await common.talk(runner, APP, USER, "I'm allergic to brindleshank, nothing with it")
        await memory.aclose()

    asyncio.run(session())
    assert common.wait_settled(env, 60)
    time.sleep(3)
    assert common.wait_settled(env, 60)
    done = common.cli(
        env, "forget", "--app", APP, "--user", USER, "--query", "brindleshank", "--yes"
    )
    print("forget rc", done.returncode, done.stdout.strip()[:160])
    key = Keys.of(Settings()).tombstones(APP, USER)  # computable from the ids alone
    r = redis.Redis.from_url(common.REDIS_URL)
    print("tombstone key", key, "members", r.scard(key))
    for guess in ("peanuts", "gluten", "brindleshank", "shellfish"):
        hit = r.sismember(key, fact_signature("user", "allergic_to", guess))
        print(f"  is ada allergic to {guess}? {'YES (forgotten fact confirmed)' if hit else 'no'}")
finally:
    common.stop(worker)
