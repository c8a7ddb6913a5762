"""A stop signal's flush (what ``_on_stop_signal`` runs) spools every message handed to the
recorder: one whose enqueue task has not begun yet (the loop busy elsewhere), and every
chunk of a long record (``add_session_to_memory``) behind the one Redis has not answered."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from afterthought.agent_hooks.turn_recorder import TurnRecorder
from afterthought.contract import QueuedMessage
from afterthought.settings import Settings


@pytest.fixture
def silent_redis() -> Iterator[int]:
    """A port that takes connections and never answers (a Redis hung, a blackholed LB)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def _settings(port: int, spool: Path) -> Settings:
    return Settings(
        redis_url=f"redis://127.0.0.1:{port}/0",
        key_prefix="b21c",
        enqueue_timeout=5,
        exit_flush_seconds=0.2,
        spool_path=spool,
        spool_on_signals=False,
    )


def _messages(count: int) -> list[QueuedMessage]:
    return [
        QueuedMessage.build(
            app="app",
            user_id="u1",
            session_id="s1",
            invocation_id=f"inv{i:04d}",
            role="user",
            ordinal=0,
            content=f"message {i}",
        )
        for i in range(count)
    ]


async def _stop_signal_flush(recorder: TurnRecorder) -> None:
    """What a stop signal's flush does with an enqueuer (``enqueue._spool_held``)."""
    await asyncio.to_thread(recorder.enqueuer._spool_all, 0.2, in_flight=True)


async def test_a_record_not_begun_is_spooled_by_a_stop_signal(
    silent_redis: int, tmp_path: Path
) -> None:
    recorder = TurnRecorder(_settings(silent_redis, tmp_path / "spool"))
    write = recorder.record(_messages(1))
    # The loop has not run the write's task yet (busy with another task, or the signal
    # came at once): the flush runs on a thread of its own, as the signal's does.
    recorder.enqueuer._spool_all(0.2, in_flight=True)
    assert recorder.enqueuer.spooled == 1
    write.cancel()
    await asyncio.gather(write, return_exceptions=True)
    assert recorder.enqueuer.spooled + recorder.enqueuer.buffered == 1


async def test_every_chunk_of_a_long_record_is_spooled_by_a_stop_signal(
    silent_redis: int, tmp_path: Path
) -> None:
    count = 250  # two and a half round trips' worth (100 a round trip)
    recorder = TurnRecorder(_settings(silent_redis, tmp_path / "spool"))
    write = recorder.record(_messages(count))
    while not recorder.enqueuer._in_flight:  # the first chunk is on its way
        await asyncio.sleep(0.01)
    await _stop_signal_flush(recorder)
    assert recorder.enqueuer.spooled == count
    write.cancel()
    await asyncio.gather(write, return_exceptions=True)
    assert recorder.enqueuer.spooled + recorder.enqueuer.buffered == count
