"""Nothing lost at exit (W7): what Redis has not taken when an agent process exits, or
while its buffer is full, is spooled to a private local file and replayed, once, by the
next agent process or a worker of the machine."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from afterthought.agent_hooks.turn_recorder import TurnRecorder
from afterthought.backends import open_backend
from afterthought.connections import connect
from afterthought.contract import QueuedMessage
from afterthought.enqueue import SPOOL_FULL, Enqueuer
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.spool import (
    APPEND_LOCK,
    LIVE,
    LOCKED,
    REFUSED_DIRECTORY,
    UNWRITABLE,
    Appended,
    Sent,
    Spool,
    _mark,
    frame,
    replay_into,
    unframe,
)
from afterthought.testing import RedisServer, ZepFake
from afterthought.testing.cli import run_cli_here
from afterthought.worker import metrics
from afterthought.worker.forget import Forgetter
from afterthought.worker.jobs import replay_spool
from tests.conftest import REDIS_URL, drain, enqueue, queued, where
from tests.one_shot_agent import ROOT, one_shot

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


def _stopped_agent(
    settings: Settings, mode: str, sig: signal.Signals, *, times: int = 1
) -> tuple[int, float]:
    """The one-shot agent in ``mode`` (``stay``: stopped once its turn is done; ``sending``:
    while its user's message is being enqueued), sent ``sig`` (``times`` 2: again, well
    inside the flush, as a supervisor's retry); its exit code and how long it took to end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.one_shot_agent", "ada", "I keep bees in Porto", mode],
        cwd=ROOT,
        env={**os.environ, **settings.as_env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    awaited = "turn done" if mode == "stay" else "sending"
    try:
        assert proc.stdout is not None and awaited in proc.stdout.readline()
        signalled = time.monotonic()
        proc.send_signal(sig)
        if times == 2:
            # Well inside the flush: its drain threads get exit_flush_seconds first.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(settings.exit_flush_seconds / 5)
            if proc.poll() is None:
                proc.send_signal(sig)
        proc.wait(60)
        return proc.returncode, time.monotonic() - signalled
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("sig", "times"),
    [("SIGTERM", 1), ("SIGINT", 1), ("SIGTERM", 2)],
    ids=["SIGTERM", "SIGINT", "SIGTERM-twice"],
)
async def test_an_agent_stopped_by_a_signal_with_redis_down_spools_its_turn_then_ends_by_it(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, sig: str, times: int
) -> None:
    """``docker stop`` and Kubernetes (SIGTERM), Ctrl-C (SIGINT), sent to an agent that
    waits for its next request with its turn buffered (Redis refusing connections): the
    turn is spooled within ``exit_flush_seconds`` (SIGTERM's handler; SIGINT's
    KeyboardInterrupt exits through the exit hook), then the signal ends the process as
    it would have (killed by SIGTERM, 143 to a shell); with Redis back a worker stores
    the turn once. A second SIGTERM during the flush (a supervisor's retry) waits for the
    same flush: passed on at once, it ended the process before anything was spooled."""
    zep_fake.honor_idempotency = False
    server = RedisServer()
    url = server.start()
    server.stop()
    settings = make_settings(
        redis_url=url,
        backend="zep",
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
        enqueue_timeout=0.2,
        retrieval_budget=0.5,
        exit_flush_seconds=0.5,
        breaker_seconds=300,
    )
    code, took = _stopped_agent(settings, "stay", getattr(signal, sig), times=times)
    assert code == -getattr(signal, sig)
    assert took < settings.exit_flush_seconds + EXIT_SLACK_SECONDS
    spool = Spool.of(settings)
    assert spool.waiting() == 2
    server = RedisServer(port=server.port)
    server.start()
    try:
        await drain(settings)
        stored = _stored(zep_fake)
        assert stored.count("I keep bees in Porto") == 1 and len(stored) == 2
        assert spool.empty()
    finally:
        server.close()


async def test_a_signal_while_the_users_message_is_being_enqueued_spools_it(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    """SIGTERM while the turn's enqueue waits on a Redis that took the connection but does
    not answer (paused): the message in flight is spooled (unsure: Redis may have taken
    it), the process ends by the signal within ``exit_flush_seconds``, not after the
    enqueue's own timeout, and with Redis back a worker stores the message once."""
    zep_fake.honor_idempotency = False
    server = RedisServer()
    url = server.start()
    settings = make_settings(
        redis_url=url,
        backend="zep",
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
        enqueue_timeout=5.0,  # ten times the exit's bound: only the spool can keep it
        retrieval_budget=0.5,
        exit_flush_seconds=0.5,
    )
    pid = server._proc.pid if server._proc else 0
    os.kill(pid, signal.SIGSTOP)
    try:
        code, took = _stopped_agent(settings, "sending", signal.SIGTERM)
        assert code == -signal.SIGTERM
        assert took < settings.exit_flush_seconds + EXIT_SLACK_SECONDS
        spool = Spool.of(settings)
        assert spool.waiting() >= 1
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        await drain(settings)
        assert _stored(zep_fake).count("I keep bees in Porto") == 1
        assert spool.empty()
    finally:
        server.close()


_HANDLERS_SET = """
import signal, threading
from afterthought import enqueue
from afterthought.settings import Settings

def caught():
    return [signal.getsignal(s) is enqueue._on_stop_signal for s in enqueue.STOP_SIGNALS]

thread = threading.Thread(target=enqueue.Enqueuer, args=(Settings(),))
thread.start()
thread.join()
print(*caught())
signal.signal(signal.SIGTERM, signal.SIG_IGN)
enqueue.Enqueuer(Settings())
print(*caught(), signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGINT, signal.SIG_DFL)
enqueue.Enqueuer(Settings())
print(*caught())
"""


def test_stop_signals_are_caught_from_the_main_thread_where_they_would_skip_the_exit_hook(
    make_settings: Callable[..., Settings],
) -> None:
    """Python lets only the main thread set a handler: a memory made on another sets none
    (and does not fail). A signal the application ignores is left ignored; SIGINT is left
    to Python's KeyboardInterrupt (which exits through the exit hook) and caught only
    under its default action, which would kill the process."""
    settings = make_settings(redis_url="redis://127.0.0.1:1/0")
    done = subprocess.run(
        [sys.executable, "-c", _HANDLERS_SET],
        cwd=ROOT,
        env={**os.environ, **settings.as_env()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.splitlines() == ["False False", "False False True", "True True"], done.stderr


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

        async def send(messages: list[QueuedMessage]) -> Sent:
            nonlocal sent
            assert await queue.enqueue(messages, now_ms=1) >= 0
            sent += len(messages)
            if pause and not first_sent.is_set():
                first_sent.set()
                await asyncio.to_thread(go_on.wait, 60)
            return Sent.QUEUED

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


def _kill_a_replayer_after_it_sent(settings: Settings) -> None:
    """Runs a replayer in another process and SIGKILLs it once Redis took its first batch,
    before it recorded so."""
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


async def test_a_replayer_killed_mid_replay_is_followed_from_where_it_got_to(
    make_settings: Callable[..., Settings],
) -> None:
    """SIGKILL frees its lock; the next replayer goes on from the last batch it recorded
    as queued, and the batch it sent but never recorded is skipped by its keys."""
    settings = make_settings()
    spool = Spool.of(settings)
    messages = [queued(f"m{i}", i) for i in range(250)]
    spool.append(messages)
    _kill_a_replayer_after_it_sent(settings)
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


async def _refuse(messages: list[QueuedMessage]) -> Sent:
    return Sent.FAILED


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


async def test_a_spool_replay_only_a_master_holds_is_not_counted_and_stays_spooled(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    """With ``redis_wait_replicas``, a replay goes through the enqueue's check: one no
    replica confirms (the test's Redis has none) is a failed replay, its messages kept in
    the spool for the next (the key check makes sending them again a no-op)."""
    settings = make_settings(redis_wait_replicas=1)
    spool = Spool.of(settings)
    spool.append([queued("m0", 0)])
    result = await replay_into(spool, ThreadQueue(redis, settings))
    assert result.replayed == 0 and not result.finished
    assert spool.waiting() == 1
    again = await replay_into(spool, ThreadQueue(redis, make_settings()))
    assert again.replayed == 1 and spool.empty()
    assert await _pending(settings, queued("m0", 0)) == ["m0"]  # once


def test_status_says_how_many_messages_wait_in_this_machines_spool(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    Spool.of(settings).append([queued("m0", 0), queued("m1", 1)])
    done = run_cli_here(settings, "status", "--json")
    assert json.loads(done.stdout)["spooled"] == 2, done.stderr
    assert "spool here    2 messages" in run_cli_here(settings, "status").stdout


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


_SHORT_WRITE = """
import resource, sys
from pathlib import Path
from afterthought.spool import Spool
from tests.conftest import queued
spool = Spool(Path(sys.argv[1]), max_bytes=1 << 26)
messages = [queued("x" * 500 + str(i), i) for i in range(3)]
# The file may grow to 1000 bytes, as a disk with 1000 bytes free: write() is cut short.
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
appended = spool.append(messages)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(appended.spooled, appended.full, appended.failed, len(spool.messages()), spool.waiting())
print(appended.why)
"""


def test_a_write_cut_short_by_a_full_disk_keeps_whole_records_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    """A disk that fills during an append: ``os.write`` writes part of the records. The
    whole records written are spooled, the torn tail is cut off (nothing damaged is left
    to replay), the rest is counted not written, never spooled."""
    done = subprocess.run(
        [sys.executable, "-c", _SHORT_WRITE, str(tmp_path / "spool")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    numbers, why = done.stdout.splitlines()
    spooled, full, failed, readable, lines = map(int, numbers.split())
    assert (spooled, full, failed) == (1, 0, 2) and why == UNWRITABLE
    assert readable == lines == spooled


async def test_a_spool_write_whose_fsync_fails_is_dropped_whole_and_order_holds(
    make_settings: Callable[..., Settings],
) -> None:
    """``fsync`` fails after the write (EIO; ENOSPC on delayed allocation): the records
    are cut off again, so what is counted dropped is never stored later, behind the
    thread's next message."""
    settings = make_settings(buffer_size=0)
    enqueuer = Enqueuer(settings)
    failed = False

    def fsync_once_failing(fd: int) -> None:
        nonlocal failed
        if not failed and os.readlink(f"/proc/self/fd/{fd}").endswith(LIVE):
            failed = True
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    # Redis was down as it spooled: no replay before turn 2 (held off by the replay lock).
    enqueuer.spool._ready()
    lock = os.open(enqueuer.spool.directory / "replay.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        enqueuer.spool.fsync = fsync_once_failing
        enqueuer._hold([queued("turn 1", 1)])  # a full buffer: into the spool
        assert (enqueuer.dropped, enqueuer.spooled) == (1, 0)
        assert enqueuer.spool.waiting() == 0
        assert await enqueuer.enqueue([queued("turn 2", 2)])  # Redis is back
        os.close(lock)
        client = connect(settings.redis_url)
        try:
            await replay_into(enqueuer.spool, ThreadQueue(client, settings))
        finally:
            await client.aclose()
    finally:
        enqueuer._drainer.stop()
    assert await _pending(settings, queued("x", 0)) == ["turn 2"]


async def test_a_batch_a_killed_replayer_sent_is_not_stored_twice_after_its_keys_expired(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    """A replayer is killed after Redis took a batch, before it recorded so; the batch is
    stored. The next replay comes after the thread's memory of keys expired (a daily cron
    agent, no worker on its machine): a resumed claim's messages go ``unsure``, so the
    worker finds them stored and stores none twice, though Zep ignores idempotency."""
    zep_fake.honor_idempotency = False
    settings = make_settings(backend="zep", zep_api_key="test-key", zep_base_url=zep_fake.base_url)
    spool = Spool.of(settings)
    # The workers run on another machine: their spool is not this one.
    elsewhere = settings.model_copy(update={"spool_path": spool.directory.parent / "elsewhere"})
    spool.append([queued(f"m{i}", i) for i in range(3)])
    _kill_a_replayer_after_it_sent(settings)
    await drain(elsewhere)
    assert sorted(_stored(zep_fake)) == ["m0", "m1", "m2"]
    keys, ref, _ = where(settings, queued("x", 0))
    client = connect(settings.redis_url)
    try:
        await client.delete(keys.seen(ref))  # what its PEXPIRE does a day later
        result = await replay_into(spool, ThreadQueue(client, settings))
    finally:
        await client.aclose()
    assert result.finished and result.replayed == 3
    await drain(elsewhere)
    assert sorted(_stored(zep_fake)) == ["m0", "m1", "m2"]


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's directory needs root")
def test_a_spool_directory_of_another_users_is_refused_and_its_symlinks_never_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Agents running as root. Another user made the spool directory first (a shared
    volume, a path under /tmp) and planted ``spool.log`` as a symlink to a file of root's:
    the directory is refused (said once, counted not writable), nothing written through
    the link."""
    directory = tmp_path / "shared" / "spool"
    directory.mkdir(parents=True)
    os.chown(directory, 65534, 65534)
    directory.chmod(0o777)
    victim = tmp_path / "root-only.conf"
    victim.write_text("secret=1\n")
    victim.chmod(0o600)
    (directory / LIVE).symlink_to(victim)
    os.lchown(directory / LIVE, 65534, 65534)
    spool = Spool(directory, max_bytes=1 << 20)
    for _ in range(2):
        assert spool.append([queued("words of alice", 0)]) == Appended(0, 0, 1, REFUSED_DIRECTORY)
    assert victim.read_text() == "secret=1\n"
    assert caplog.text.count("spool directory refused") == 1


def test_spool_files_are_never_opened_through_a_symlink(tmp_path: Path) -> None:
    """In a directory of this user's own, a symlink where a spool file goes (planted
    before the directory was made private) is not followed: the write fails, counted."""
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    spool._ready()
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    (spool.directory / LIVE).symlink_to(victim)
    assert spool.append([queued("m0", 0)]) == Appended(0, 0, 1, UNWRITABLE)
    (spool.directory / LIVE).unlink()
    spool.append([queued("m0", 0)])
    claim = spool.directory / "claimed-00000000000000000001-1.log"
    os.rename(spool.directory / LIVE, claim)
    claim.with_suffix(".done-new").symlink_to(victim)
    with pytest.raises(OSError):
        _mark(claim, 1, spool.fsync)
    assert victim.read_text() == "kept\n"


_HOLD_APPEND_LOCK = """
import fcntl, os, sys, time
from pathlib import Path
directory = Path(sys.argv[1])
directory.mkdir(mode=0o700, parents=True, exist_ok=True)
fd = os.open(directory / "append.lock", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(3600)  # as a process stopped (SIGSTOP, a frozen container) as it appended
"""


def test_a_one_shot_agent_exits_in_time_while_another_process_holds_the_append_lock(
    make_settings: Callable[..., Settings],
) -> None:
    """Another agent process of the deployment was stopped while it appended to the spool
    (its flock held): the exit gives up on the lock within ``exit_flush_seconds``."""
    settings = make_settings(
        redis_url="redis://127.0.0.1:1/0",
        enqueue_timeout=0.2,
        retrieval_budget=0.5,
        exit_flush_seconds=0.5,
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_APPEND_LOCK, str(settings.spool_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        took, code = one_shot(settings, "ada", "a turn while Redis is down")
    finally:
        holder.kill()
        holder.wait()
    assert code == 0 and took < settings.exit_flush_seconds + EXIT_SLACK_SECONDS


def test_an_append_gives_up_on_a_held_lock_at_its_deadline(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    spool._ready()
    fd = os.open(spool.directory / APPEND_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert spool.append([queued("m0", 0)], wait=0) == Appended(0, 0, 1, LOCKED)
    finally:
        os.close(fd)
    assert spool.append([queued("m0", 0)], wait=0) == Appended(1, 0)


async def test_a_thread_whose_queue_is_full_does_not_hold_up_the_rest_of_the_spool(
    make_settings: Callable[..., Settings],
) -> None:
    """A spooled thread whose queue is full waits, with its later records (in this file
    and later ones); every other thread's records go on."""
    settings = make_settings(thread_queue_cap=2)
    await enqueue(settings, queued("a", 0, session="busy"), queued("b", 1, session="busy"))
    spool = Spool.of(settings)
    spool.append([queued("c", 2, session="busy"), queued("another user's turn", 0)])
    spool.append([queued("d", 3, session="busy"), queued("and the next", 1)])
    client = connect(settings.redis_url)
    queue = ThreadQueue(client, settings)
    try:
        for _ in range(3):  # three replays (a worker's every 10 s)
            result = await replay_into(spool, queue)
            assert not result.finished
        assert await _pending(settings, queued("x", 0)) == ["another user's turn", "and the next"]
        assert [m.content for m in spool.messages()] == ["c", "d"]
        busy = queued("x", 0, session="busy")
        keys, ref, _ = where(settings, busy)
        await client.delete(keys.pending(ref))  # the worker took its two
        result = await replay_into(spool, queue)
    finally:
        await client.aclose()
    assert result.finished and spool.empty()
    assert await _pending(settings, busy) == ["c", "d"]


async def test_a_spooled_run_fits_a_shards_cap(make_settings: Callable[..., Settings]) -> None:
    """With ``redis_shards`` each shard holds ``ceil(queue_cap / redis_shards)``: a run
    is never longer, or an empty queue would refuse it at every replay. The shard full,
    the rest waits for the worker to take some."""
    settings = make_settings(redis_shards=4, queue_cap=100)
    spool = Spool.of(settings)
    spool.append([queued(f"m{i}", i) for i in range(30)])
    client = connect(settings.redis_url)
    try:
        result = await replay_into(spool, ThreadQueue(client, settings))
        assert (result.replayed, result.finished) == (25, False)
        await drain(settings)  # a worker takes them
        result = await replay_into(spool, ThreadQueue(client, settings))
    finally:
        await client.aclose()
    assert result.finished and result.replayed == 5, result
    assert spool.empty()


async def test_a_damaged_record_is_counted_once_across_replays(tmp_path: Path) -> None:
    """A damaged record behind a run not yet sent is counted once the replay is past it,
    not at each replay that stops short of it."""
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    spool.append([queued("m0", 0)])
    with (spool.directory / LIVE).open("ab") as f:
        f.write(b"12:deadbeef:not a record\n")
    spool.append([queued("m1", 1, session="s2")])
    calls = 0

    async def send(messages: list[QueuedMessage]) -> Sent:
        nonlocal calls
        calls += 1
        return Sent.QUEUED if calls in (1, 4) else Sent.FAILED  # Redis fails, then is back

    results = [await spool.replay(send) for _ in range(3)]
    assert sum(r.damaged for r in results) == 1 and results[-1].finished


async def test_messages_dropped_as_forgotten_are_not_counted_replayed(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(forget_clock_margin_seconds=0)
    spool = Spool.of(settings)
    spool.append([queued("said before the forget", 0)])
    redis = aioredis.Redis.from_url(REDIS_URL)
    backend = open_backend(settings)
    try:
        await Forgetter(settings, redis, backend).forget_user(app="memtest", user_id="alice")
    finally:
        await backend.aclose()
        await redis.aclose()
    client = connect(settings.redis_url)
    try:
        result = await replay_into(spool, ThreadQueue(client, settings))
    finally:
        await client.aclose()
    assert (result.replayed, result.forgotten) == (0, 1)


async def test_a_session_goes_on_in_order_when_a_worker_claims_the_spool_as_the_agent_starts(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-shot agent spooled turn 1; the next process goes on with the session. As it
    looks into the spool, a worker's replay renames ``spool.log`` into a claim: the agent
    still finds the session spooled, and its turn 2 goes behind turn 1."""
    settings = make_settings()
    spool = Spool.of(settings)
    spool.append([queued("turn 1", 1)])
    listed = Spool._claimed
    raced = False

    def worker_claims_after_the_listing(self: Spool) -> list[Path]:
        nonlocal raced
        found = listed(self)
        if not raced:  # the worker's _claim, just after this listing
            raced = True
            os.rename(self.directory / LIVE, self.directory / "claimed-00000000000000000001-1.log")
        return found

    monkeypatch.setattr(Spool, "_claimed", worker_claims_after_the_listing)
    enqueuer = Enqueuer(settings)
    monkeypatch.setattr(Spool, "_claimed", listed)
    try:
        assert not await enqueuer.enqueue([queued("turn 2", 2)])  # behind turn 1: spooled
        assert enqueuer.spool.waiting() == 2
        await asyncio.to_thread(enqueuer._drainer.stop)  # it may replay meanwhile: or a worker
        client = connect(settings.redis_url)
        try:
            assert (await replay_into(spool, ThreadQueue(client, settings))).finished
        finally:
            await client.aclose()
    finally:
        enqueuer._drainer.stop()
    assert await _pending(settings, queued("x", 0)) == ["turn 1", "turn 2"]


async def test_closing_the_memory_waits_at_most_exit_flush_seconds(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buffer gets ``exit_flush_seconds`` at ``aclose()``, once: then it is spooled,
    within what is left of that time. The waits handed out are what is measured: a loaded
    machine's wall clock says nothing of them."""
    settings = make_settings(
        redis_url="redis://127.0.0.1:1/0",
        exit_flush_seconds=0.2,
        breaker_failures=1,
        breaker_seconds=300,
    )
    recorder = TurnRecorder(settings)
    assert not await recorder.enqueuer.enqueue([queued("held", 0)])
    waits: list[tuple[str, float]] = []
    wait_empty, spool_all = Enqueuer.wait_empty, Enqueuer._spool_all

    def waited(self: Enqueuer, timeout: float) -> bool:
        waits.append(("drain", timeout))
        return wait_empty(self, timeout)

    def spooled(self: Enqueuer, wait: float) -> None:
        waits.append(("spool", wait))
        spool_all(self, wait)

    monkeypatch.setattr(Enqueuer, "wait_empty", waited)
    monkeypatch.setattr(Enqueuer, "_spool_all", spooled)
    await recorder.aclose()
    assert recorder.enqueuer.spool.waiting() == 1
    assert [what for what, _ in waits] == ["drain", "spool"]
    assert waits[0][1] == settings.exit_flush_seconds
    assert waits[1][1] < settings.exit_flush_seconds  # what the drain left of it


_UVICORN_APP = """
import sys
import uvicorn
from afterthought.enqueue import Enqueuer
from afterthought.settings import Settings
from tests.conftest import queued

made = []

def memory():
    if not made:
        made.append(Enqueuer(Settings()))
    return made[0]

if sys.argv[2] == "before uvicorn starts":
    memory()

async def app(scope, receive, send):
    if scope["type"] != "lifespan":
        return
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            # A turn served while Redis is down: its message waits in the buffer.
            await memory().enqueue([queued("said while Redis was down", 0)])
            print("buffered", memory().buffered, flush=True)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            # A turn of another session that ends during the graceful shutdown.
            await memory().enqueue([queued("said as the server stopped", 0, session="s2")])
            await send({"type": "lifespan.shutdown.complete"})
            return

# What ``adk api_server`` does (google/adk/cli/cli_tools_click.py).
uvicorn.Server(uvicorn.Config(app, port=int(sys.argv[1]), log_level="error")).run()
"""


@pytest.mark.parametrize(
    ("sig", "made", "spool_on_signals", "spooled"),
    [
        ("SIGTERM", "before uvicorn starts", True, 2),
        ("SIGTERM", "as the app starts", True, 2),
        ("SIGINT", "as the app starts", True, 2),
        ("SIGTERM", "as the app starts", False, 0),
    ],
)
def test_an_api_server_stopped_by_a_signal_spools_what_it_buffered_and_ends_by_it(
    make_settings: Callable[..., Settings],
    sig: str,
    made: str,
    spool_on_signals: bool,
    spooled: int,
) -> None:
    """uvicorn (serving ADK's API server) shuts down gracefully on SIGINT and SIGTERM,
    then puts back the handler it found and raises the signal again: for SIGTERM the
    memory's when the memory was made before uvicorn started, else the default one (it
    kills the process, no exit hook run); for SIGINT Python's KeyboardInterrupt (the exit
    hook runs). Either way what was buffered, and what a turn ending in the graceful
    shutdown holds, is spooled, and the process ends by the signal. Opted out, SIGTERM
    spools nothing (as before the handler)."""
    settings = make_settings(
        redis_url="redis://127.0.0.1:1/0",
        exit_flush_seconds=0.5,
        spool_on_signals=spool_on_signals,
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", _UVICORN_APP, str(port), made],
        cwd=ROOT,
        env={**os.environ, **settings.as_env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("buffered 1")
        proc.send_signal(getattr(signal, sig))
        proc.wait(60)
    finally:
        proc.kill()
        proc.wait()
    assert Spool.of(settings).waiting() == spooled
    assert proc.returncode == -getattr(signal, sig)
