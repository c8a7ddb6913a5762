"""Nothing lost at exit (W7): what Redis has not taken when an agent process exits, or
while its buffer is full, is spooled to a private local file and replayed, once, by the
next agent process or a worker of the machine."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from afterthought.connections import connect
from afterthought.contract import QueuedMessage
from afterthought.enqueue import SPOOL_FULL, Enqueuer
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.spool import APPEND_LOCK, LIVE, Spool, frame, replay_into, unframe
from afterthought.testing import RedisServer, ZepFake
from afterthought.worker import metrics
from afterthought.worker.jobs import replay_spool
from tests.conftest import drain, queued, run_cli, where
from tests.one_shot_agent import one_shot

#: Generous for a loaded machine, far below what exit took before the spool (the drain's
#: fixed 5 s plus a second): the bound is ``exit_flush_seconds`` plus the interpreter's exit.
EXIT_SLACK_SECONDS = 4.0


async def _pending(settings: Settings, message: QueuedMessage) -> list[str]:
    keys, ref, _ = where(settings, message)
    client = connect(settings.redis_url)
    try:
        raw = await client.lrange(keys.pending(ref), 0, -1)
    finally:
        await client.aclose()
    return [QueuedMessage.decode(r).content for r in raw]


def _stored(zep_fake: ZepFake) -> list[str]:
    return [str(m["content"]) for m in zep_fake.messages()]


@pytest.mark.parametrize("outage", ["stopped", "paused"])
async def test_a_one_shot_agent_with_redis_down_exits_in_time_and_its_turn_is_stored_once(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, outage: str
) -> None:
    """Redis refusing connections (stopped) or taking them but never answering (paused,
    SIGSTOP: every call's outcome unknown). The process exits ``exit_flush_seconds`` after
    its turn, its two messages in the spool; with Redis back a worker stores each once,
    though Zep ignores idempotency keys."""
    zep_fake.honor_idempotency = False
    server = RedisServer()
    url = server.start()
    settings = make_settings(
        redis_url=url,
        backend="zep",
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
        enqueue_timeout=0.2,
        retrieval_budget=0.5,
        exit_flush_seconds=0.5,
        breaker_seconds=300,  # the breaker stays open through the exit
    )
    spool = Spool.of(settings)
    pid = server._proc.pid if server._proc else 0
    try:
        if outage == "stopped":
            server.stop()
        else:
            os.kill(pid, signal.SIGSTOP)
        took, code = one_shot(settings, "ada", "I keep bees in Porto")
        assert code == 0
        assert took < settings.exit_flush_seconds + EXIT_SLACK_SECONDS
        assert spool.waiting() == 2  # the user's message and the reply

        if outage == "stopped":
            server = RedisServer(port=server.port)
            server.start()
        else:
            os.kill(pid, signal.SIGCONT)
        await drain(settings)  # a worker replays the spool as it starts, then drains
        stored = _stored(zep_fake)
        assert stored.count("I keep bees in Porto") == 1 and len(stored) == 2
        assert spool.empty()
    finally:
        if outage == "paused":
            os.kill(pid, signal.SIGCONT)
        server.close()


async def test_the_next_agent_process_replays_the_spool_once_it_reaches_redis(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    zep_fake.honor_idempotency = False
    server = RedisServer()
    url = server.start()
    settings = make_settings(
        redis_url=url,
        backend="zep",
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
        enqueue_timeout=0.2,
        exit_flush_seconds=0.5,
    )
    spool = Spool.of(settings)
    try:
        server.stop()
        assert one_shot(settings, "ada", "first, while Redis is down")[1] == 0
        assert spool.waiting() == 2
        server = RedisServer(port=server.port)
        server.start()
        # Long enough for the replay on any machine: the exit ends as soon as it is done.
        later = settings.model_copy(update={"exit_flush_seconds": 60.0})
        assert one_shot(later, "ada", "second, Redis is back")[1] == 0
        assert spool.empty()  # replayed by the agent: no worker has run yet
        await drain(settings)
        stored = _stored(zep_fake)
        assert sorted(stored).count("first, while Redis is down") == 1
        assert stored.count("second, Redis is back") == 1 and len(stored) == 4
    finally:
        server.close()


async def test_a_torn_or_damaged_record_is_skipped_and_counted(
    make_settings: Callable[..., Settings],
) -> None:
    """A process killed as it wrote leaves half a line; a byte may rot. Both are skipped,
    counted, and never swallow the records around them (one appended after a torn line
    starts a line of its own)."""
    settings = make_settings()
    spool = Spool.of(settings)
    m = [queued(f"m{i}", i) for i in range(4)]
    spool.append(m[:2])
    live = spool.directory / LIVE
    data = bytearray(live.read_bytes())
    at = data.rindex(b'"m1"') + 2
    data[at : at + 1] = b"X"  # m1's text changed: its checksum fails
    live.write_bytes(bytes(data) + frame(m[2])[:-9])  # m2 torn: half written
    spool.append([m[3]])

    enqueuer = Enqueuer(settings)
    queue = ThreadQueue(enqueuer.redis(), settings)
    assert await enqueuer.replay_step(queue, backoff=0.05) == 0.0
    assert await _pending(settings, m[0]) == ["m0", "m3"]
    assert (enqueuer.replayed, enqueuer.dropped) == (2, 2)  # counted as SPOOL_DAMAGED
    assert spool.empty()
    await enqueuer.aclose()


def test_a_torn_or_damaged_line_is_never_read_as_a_message() -> None:
    message = queued("hello", 1)
    record = frame(message)
    assert unframe(record) == message
    assert unframe(record[:-1]) is None  # torn: no line end
    assert unframe(record[:-5] + b"\n") is None  # torn: cut short
    assert unframe(record.replace(b"hello", b"hellO")) is None  # checksum
    assert unframe(b"5:00000000:hello\n") is None


async def test_two_replayers_at_once_queue_everything_once_in_order(
    make_settings: Callable[..., Settings],
) -> None:
    """Two processes' replays at the same time, appends going on meanwhile: the second
    finds the spool being replayed and leaves it; nothing is doubled, even in a thread
    longer than the queue's memory of recent keys (128)."""
    settings = make_settings()
    a, b = Spool.of(settings), Spool.of(settings)
    long = [queued(f"a{i}", i, session="long") for i in range(300)]
    short = [queued(f"b{i}", i, session="short") for i in range(20)]
    a.append(long[:150] + short + long[150:])
    first_sent = threading.Event()
    go_on = threading.Event()

    async def replay(spool: Spool, *, pause: bool) -> int:
        client = connect(settings.redis_url)
        queue = ThreadQueue(client, settings)
        sent = 0

        async def send(messages: list[QueuedMessage]) -> bool:
            nonlocal sent
            assert await queue.enqueue(messages, now_ms=1) >= 0
            sent += len(messages)
            if pause and not first_sent.is_set():
                first_sent.set()
                await asyncio.to_thread(go_on.wait, 60)
            return True

        try:
            result = await spool.replay(send)
            assert result.busy != pause
        finally:
            await client.aclose()
        return sent

    first = threading.Thread(target=lambda: asyncio.run(replay(a, pause=True)))
    first.start()
    assert await asyncio.to_thread(first_sent.wait, 60)
    late = queued("a300", 300, session="long")
    b.append([late])  # into a new file: the one being replayed was renamed away
    assert await replay(b, pause=False) == 0  # busy: it sent nothing
    go_on.set()
    await asyncio.to_thread(first.join, 60)
    assert await _pending(settings, long[0]) == [f"a{i}" for i in range(301)]
    assert await _pending(settings, short[0]) == [f"b{i}" for i in range(20)]
    assert a.empty()


_REPLAY_THEN_HANG = """
import asyncio, os, sys
from afterthought.connections import connect
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.spool import Spool

async def main():
    settings = Settings()
    queue = ThreadQueue(connect(settings.redis_url), settings)
    async def send(messages):
        await queue.enqueue(messages, now_ms=1)
        print("sent", flush=True)
        await asyncio.sleep(3600)  # killed here, its batch queued but not marked done
    await Spool.of(settings).replay(send)

asyncio.run(main())
"""


async def test_a_replayer_killed_mid_replay_is_followed_from_where_it_got_to(
    make_settings: Callable[..., Settings],
) -> None:
    """SIGKILL frees its lock; the next replayer goes on from the last batch it recorded
    as queued, and the batch it sent but never recorded is skipped by its keys."""
    settings = make_settings()
    spool = Spool.of(settings)
    messages = [queued(f"m{i}", i) for i in range(250)]
    spool.append(messages)
    proc = subprocess.Popen(
        [sys.executable, "-c", _REPLAY_THEN_HANG],
        env={**os.environ, **settings.as_env()},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "sent"
    finally:
        proc.kill()
        proc.wait()
    assert not spool.empty()
    client = connect(settings.redis_url)
    try:
        result = await replay_into(spool, ThreadQueue(client, settings))
    finally:
        await client.aclose()
    assert result.finished and spool.empty()
    assert await _pending(settings, messages[0]) == [f"m{i}" for i in range(250)]


async def test_a_full_buffer_spills_to_the_spool_in_order(
    make_settings: Callable[..., Settings],
) -> None:
    """Past ``buffer_size`` a thread goes on in the spool, its buffered messages first;
    other threads still buffer. Redis back, the drain thread replays it in order."""
    server = RedisServer()
    url = server.start()
    settings = make_settings(redis_url=url, buffer_size=2, breaker_failures=1, breaker_seconds=0.05)
    server.stop()
    enqueuer = Enqueuer(settings)
    try:
        for i in range(5):
            assert not await enqueuer.enqueue([queued(f"m{i}", i)])
        assert not await enqueuer.enqueue([queued("other", 0, session="s2")])
        assert (enqueuer.buffered, enqueuer.spooled, enqueuer.dropped) == (1, 5, 0)
        server = RedisServer(port=server.port)
        server.start()
        deadline = time.monotonic() + 60
        while enqueuer.buffered or not enqueuer.spool.empty() or enqueuer._replay_due:
            assert time.monotonic() < deadline, "the spool was not replayed"
            await asyncio.sleep(0.05)
        assert await _pending(settings, queued("x", 0)) == [f"m{i}" for i in range(5)]
        assert await _pending(settings, queued("x", 0, session="s2")) == ["other"]
        assert enqueuer.replayed == 5 and enqueuer.dropped == 0
        assert await enqueuer.enqueue([queued("m5", 5)])  # queued at once again
    finally:
        await enqueuer.aclose()
        server.close()


async def test_close_spools_what_redis_did_not_take_and_ends_its_drain_thread(
    make_settings: Callable[..., Settings],
) -> None:
    """``aclose`` waits ``exit_flush_seconds`` (none here), spools the rest, and its drain
    thread ends although it was waiting out an open breaker (or Redis)."""
    settings = make_settings(
        redis_url="redis://127.0.0.1:1/0",
        exit_flush_seconds=0,
        breaker_failures=1,
        breaker_seconds=300,
    )
    enqueuer = Enqueuer(settings)
    assert not await enqueuer.enqueue([queued("m0", 0), queued("m1", 1)])
    assert enqueuer._drainer.alive
    await enqueuer.aclose()
    assert (enqueuer.buffered, enqueuer.spooled, enqueuer.dropped) == (0, 2, 0)
    assert enqueuer.spool.waiting() == 2
    assert not enqueuer._drainer.alive


async def test_a_full_spool_drops_and_counts(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(redis_url="redis://127.0.0.1:1/0", buffer_size=0, spool_max_bytes=4096)
    enqueuer = Enqueuer(settings)
    for i in range(20):
        assert not await enqueuer.enqueue([queued("x" * 500 + str(i), i)])
    assert enqueuer.spooled + enqueuer.dropped == 20
    assert enqueuer.spooled == enqueuer.spool.waiting() > 0 and enqueuer.dropped > 0
    assert enqueuer.spool.size() <= 4096
    assert f"reason={SPOOL_FULL}" in caplog.text and "x" * 50 not in caplog.text
    await enqueuer.aclose()


def test_the_spool_is_private_whatever_the_umask(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()
    spool = Spool.of(settings)
    spool.directory.mkdir(parents=True, mode=0o755)
    spool.directory.chmod(0o755)  # made by someone else, readable by all
    old = os.umask(0)
    try:
        spool.append([queued("private words", 0)])
        asyncio.run(spool.replay(_refuse))  # a claim and its lock
    finally:
        os.umask(old)
    assert stat.S_IMODE(spool.directory.stat().st_mode) == 0o700
    files = list(spool.directory.iterdir())
    assert {p.name for p in files} >= {APPEND_LOCK, "replay.lock"}
    assert any(p.name.startswith("claimed-") for p in files)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)


async def _refuse(messages: list[QueuedMessage]) -> bool:
    return False


def test_each_deployment_and_redis_has_its_own_spool() -> None:
    base = Settings()
    assert base.spool_path.parent.parent.name == "afterthought"  # the user data directory
    assert (
        len(
            {
                base.spool_path,
                Settings(key_prefix="shop").spool_path,
                Settings(redis_url="redis://10.0.0.2:6379/0").spool_path,
                Settings(redis_url="redis://127.0.0.1:6379/1").spool_path,
            }
        )
        == 4
    )
    # A password is not part of what names it (nor written into the path).
    with_password = Settings(redis_url="redis://:secret@127.0.0.1:6379/0").spool_path
    assert with_password == base.spool_path and "secret" not in str(with_password)


async def test_a_worker_replays_and_counts_what_is_damaged(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    settings = make_settings()
    spool = Spool.of(settings)
    spool.append([queued("m0", 0)])
    with (spool.directory / LIVE).open("ab") as f:
        f.write(b"12:deadbeef:not a record\n")
    before = metrics.SPOOL_MESSAGES.labels("damaged")._value.get()
    await replay_spool(spool, ThreadQueue(redis, settings))
    assert metrics.SPOOL_MESSAGES.labels("damaged")._value.get() == before + 1
    assert await _pending(settings, queued("m0", 0)) == ["m0"]


def test_status_says_how_many_messages_wait_in_this_machines_spool(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    Spool.of(settings).append([queued("m0", 0), queued("m1", 1)])
    done = run_cli(settings, "status", "--json")
    assert json.loads(done.stdout)["spooled"] == 2, done.stderr
    assert "spool here    2 messages" in run_cli(settings, "status").stdout


async def test_a_session_the_next_process_goes_on_with_keeps_its_order(
    make_settings: Callable[..., Settings],
) -> None:
    """A one-shot agent spooled turn 1 of a session; the next process says turn 2 with
    Redis up. Turn 2 waits for turn 1's replay: queued after it, never before. Another
    session's message is queued at once."""
    settings = make_settings()
    Spool.of(settings).append([queued("turn 1", 1), queued("reply 1", 1, role="assistant")])
    enqueuer = Enqueuer(settings)
    try:
        assert await enqueuer.enqueue([queued("elsewhere", 0, session="s2")])
        assert not await enqueuer.enqueue([queued("turn 2", 2)])
        deadline = time.monotonic() + 60
        while enqueuer.buffered or enqueuer._replay_due:
            assert time.monotonic() < deadline, "the spool was not replayed"
            await asyncio.sleep(0.02)
        assert await _pending(settings, queued("x", 0)) == ["turn 1", "reply 1", "turn 2"]
        assert await enqueuer.enqueue([queued("turn 3", 3)])  # straight into Redis again
    finally:
        await enqueuer.aclose()


async def test_a_message_redis_may_hold_already_is_spooled_unsure(
    make_settings: Callable[..., Settings],
) -> None:
    """Its enqueue's reply was lost: when it is replayed after the thread's queue has
    forgotten its key (128 keys, a day), the worker still checks the backend first."""
    settings = make_settings(redis_url="redis://127.0.0.1:1/0", exit_flush_seconds=0)
    enqueuer = Enqueuer(settings)
    enqueuer._hold([queued("maybe queued", 0)], maybe_queued=True)
    enqueuer._hold([queued("surely not", 0, session="s2")])
    await enqueuer.aclose()
    spooled = {m.content: m.unsure for m in enqueuer.spool.messages()}
    assert spooled == {"maybe queued": True, "surely not": False}


async def test_a_spooled_message_said_before_its_users_forget_is_dropped_on_replay(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    """The spool keeps when a message was said: a worker replaying it after the user was
    forgotten drops it, counted, and the replay goes on with what came after the forget
    (in the same run of the thread: each is sent alone to find which)."""
    from afterthought.backends import open_backend
    from afterthought.worker.forget import Forgetter

    settings = make_settings(forget_clock_margin_seconds=0)
    spool = Spool.of(settings)
    spool.append([queued("said before the forget", 0)])
    backend = open_backend(settings)
    await Forgetter(settings, redis, backend).forget_user(app="memtest", user_id="alice")
    await backend.aclose()
    await asyncio.sleep(0.01)  # said_ms has milliseconds: the next message is later
    spool.append([queued("said after the forget", 1)])
    before = metrics.SPOOL_MESSAGES.labels("forgotten")._value.get()
    result = await replay_into(spool, ThreadQueue(redis, settings))
    assert result.finished and result.forgotten == 1
    assert await _pending(settings, queued("x", 0)) == ["said after the forget"]
    assert spool.empty()
    await replay_spool(spool, ThreadQueue(redis, settings))  # nothing left: nothing counted
    assert metrics.SPOOL_MESSAGES.labels("forgotten")._value.get() == before
