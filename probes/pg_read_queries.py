"""Throwaway: how many statements one PostgreSQL get_context sends, and their time."""

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg

from afterthought.backends.postgres import PostgresBackend
from tests.test_postgres import FIXTURE, fill

URL = "postgresql://postgres@127.0.0.1:5432/test"


async def main() -> None:
    schema = f"probe_{uuid.uuid4().hex[:12]}"
    store = PostgresBackend(URL, schema=schema)
    try:
        people = [json.loads(p.read_text()) for p in sorted(FIXTURE.glob("*.json"))[:2]]
        users = await fill(store, people)
        name = str(people[0]["user"])
        pool = await store._pool()
        seen: list[float] = []
        for con in pool._holders:
            if con._con is not None:
                con._con.add_query_logger(lambda r: seen.append(r.elapsed))
        query = people[0]["questions"][0]["text"]
        started = time.perf_counter()
        await store.get_context(user=users[name], query=query, max_chars=4000, timeout=30)
        total = time.perf_counter() - started
        print(
            {
                "statements": len(seen),
                "server_ms": round(sum(seen) * 1000, 1),
                "total_ms": round(total * 1000, 1),
            }
        )
    finally:
        await store.aclose()
        db = await asyncpg.connect(URL)
        await db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await db.close()


asyncio.run(main())
