"""Writes tests/fixtures/local_store_v6.sqlite3 with the release of schema 6 (run with
PYTHONPATH=/work/main at 13f35fb): alice said three things, with vectors of the model
"test-words" (tests.test_local_retrieval._model), and the newest ("I keep bees", id 3)
was then forgotten, so version 6 would give id 3 again."""

import asyncio
import sqlite3
import sys
from pathlib import Path

from afterthought.backends.base import OutgoingMessage
from afterthought.backends.embeddings import Model2VecEmbedder
from afterthought.backends.local import SCHEMA_VERSION, LocalBackend
from tests.test_local_retrieval import _model

DAY = "2025-03-01T10:00:00+00:00"


async def main(path: Path) -> None:
    assert SCHEMA_VERSION == 6
    path.unlink(missing_ok=True)
    store = LocalBackend(path, Model2VecEmbedder.from_model(_model(), name="test-words"))
    alice, _ = await store.ensure_user(zep_user_id="alice")
    thread = await store.create_thread(user=alice, idempotency_key="thread:alice")
    for i, text in enumerate(["I adopted a puppy", "my car is red", "I keep bees"]):
        await store.add_messages(
            thread_uuid=thread,
            messages=[OutgoingMessage("user", text, reference_time=DAY)],
            idempotency_key=f"fixture:{i}",
        )
    with sqlite3.connect(path) as db:
        (newest,) = db.execute("SELECT uuid FROM messages WHERE id = 3").fetchone()
    assert await store.delete_memory(user=alice, memory_uuid=newest)
    await store.aclose()


asyncio.run(main(Path(sys.argv[1])))
