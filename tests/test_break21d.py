"""Break-it round 21d: conditions nobody chose for the spool and the worker."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

from afterthought.contract import QueuedMessage
from afterthought.enqueue import Enqueuer
from afterthought.settings import Settings
from afterthought.spool import Sent, Spool, unframe
from afterthought.testing.redis_server import free_port


def _said(n: int) -> QueuedMessage:
    return QueuedMessage.build(
        app="memtest",
        user_id="alice",
        session_id="s1",
        invocation_id=f"inv-{n}",
        role="user",
        ordinal=0,
        content=f"message {n}",
    )


async def test_spool_order_survives_a_clock_stepped_back(tmp_path: Path) -> None:
    """A thread held back by two replays (its queue full), the machine's clock stepped back
    an hour between them (NTP correcting a clock that ran ahead): its records still reach
    Redis in the order they were said. Claims were named by the wall clock alone, so the
    later claim's held-back records sorted before the earlier one's: m3, m1, m2."""
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20, fsync=lambda fd: None)
    spool.append([_said(1), _said(2)])

    async def full(batch: list[QueuedMessage]) -> Sent:
        return Sent.HELD

    now = time.time_ns()
    with mock.patch("afterthought.spool.time.time_ns", return_value=now):
        assert not (await spool.replay(full)).finished
    spool.append([_said(3)])
    with mock.patch("afterthought.spool.time.time_ns", return_value=now - 3600 * 10**9):
        assert not (await spool.replay(full)).finished
    sent: list[str] = []

    async def room(batch: list[QueuedMessage]) -> Sent:
        sent.extend(m.content for m in batch)
        return Sent.QUEUED

    assert (await spool.replay(room)).finished
    assert sent == ["message 1", "message 2", "message 3"]


ONE_SHOT_WITH_SLOW_DNS = """
import asyncio, os, socket, sys, time

real = socket.getaddrinfo


def unanswered(host, *args, **kwargs):
    # A name server that does not answer: glibc gives up after its timeout and tries.
    if host == "redis.example.internal":
        time.sleep(float(os.environ["DNS_SECONDS"]))
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    return real(host, *args, **kwargs)


socket.getaddrinfo = unanswered
from google.adk.agents import LlmAgent
from google.adk.runners import InMemoryRunner
from google.genai import types

from afterthought.agent_hooks import create_callbacks
from afterthought.testing import StandInLlm

memory = create_callbacks()
agent = LlmAgent(
    name="assistant",
    model=StandInLlm(script=["hi there"]),
    before_model_callback=memory.before_model_callback,
    after_model_callback=memory.after_model_callback,
)


async def main():
    runner = InMemoryRunner(agent=agent, app_name="oneshot")
    session = await runner.session_service.create_session(app_name="oneshot", user_id="ada")
    async for _ in runner.run_async(
        user_id="ada", session_id=session.id, new_message=types.UserContent("hello")
    ):
        pass
    print("TURN_END", time.monotonic(), flush=True)


asyncio.run(main())
"""


def test_one_shot_agent_exits_in_its_bound_when_redis_name_does_not_resolve(
    tmp_path: Path,
) -> None:
    """Redis' host name unresolvable, the name server silent (each lookup 10 s, then a
    failure): the turn is spooled, and the process exits within ``exit_flush_seconds``
    (1 s, plus the interpreter's own exit). It took 20-26 s: asyncio.run's default
    executor, and the drain thread's loop's, waited for the lookups still blocked."""
    script = tmp_path / "one_shot.py"
    script.write_text(ONE_SHOT_WITH_SLOW_DNS)
    env = {
        **os.environ,
        "REDIS_URL": "redis://redis.example.internal:6379/0",
        "AFTERTHOUGHT_KEY_PREFIX": "break21d",
        "AFTERTHOUGHT_SPOOL_PATH": str(tmp_path / "spool"),
        "AFTERTHOUGHT_LOCAL_DB_PATH": str(tmp_path / "memory.sqlite3"),
        "AFTERTHOUGHT_EXIT_FLUSH_SECONDS": "1",
        "DNS_SECONDS": "10",
    }
    env.pop("ZEP_API_KEY", None)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    exited = time.monotonic()
    turn_end = [float(line.split()[1]) for line in done.stdout.splitlines() if "TURN_END" in line]
    assert done.returncode == 0 and turn_end, done.stderr[-2000:]
    settings = Settings(
        redis_url=env["REDIS_URL"],
        key_prefix="break21d",
        spool_path=tmp_path / "spool",
        local_db_path=tmp_path / "memory.sqlite3",
    )
    assert Spool.of(settings).waiting() == 2  # the user's message and the reply
    assert exited - turn_end[0] < 1 + 4


async def test_an_enqueue_reads_only_what_was_spooled_since_its_last_look(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process of the machine spools a turn while this one's spool holds 2,000
    records (64 MiB at most: ~55,000): this process's next enqueue learns the new thread
    from the new record alone. Each look parsed every record waiting, on the agent's event
    loop: 0.6-1.0 s a turn with 32 MiB spooled (probes/spool_turn_block.py)."""
    # Redis not answering: nothing replays the spool while the test looks at it.
    settings = make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    other = Spool.of(settings)
    other.append([_said(n).model_copy(update={"user_id": f"user-{n % 50}"}) for n in range(2000)])
    enqueuer = Enqueuer(settings)
    parsed = 0

    def counted(line: bytes) -> QueuedMessage | None:
        nonlocal parsed
        # The turn's own looks (the enqueuer's drain thread may look too, at any time).
        parsed += threading.current_thread() is threading.main_thread()
        return unframe(line)

    monkeypatch.setattr("afterthought.spool.unframe", counted)
    spooled_turn = QueuedMessage.build(
        app="memtest",
        user_id="bob",
        session_id="s9",
        invocation_id="i1",
        role="user",
        ordinal=0,
        content="said while Redis did not answer",
    )
    other.append([spooled_turn])
    next_turn = QueuedMessage.build(
        app="memtest",
        user_id="bob",
        session_id="s9",
        invocation_id="i2",
        role="user",
        ordinal=0,
        content="the turn after",
    )
    assert not await enqueuer.enqueue([next_turn])  # behind the spooled one, in the spool
    assert parsed <= 2
    assert enqueuer.spooled == 1
    assert [m.content for m in other.messages()][-2:] == [spooled_turn.content, next_turn.content]


def test_a_spool_file_written_anew_under_an_inode_read_before_is_read_whole(
    make_settings: Callable[..., Settings],
) -> None:
    """The live file was read (alice's thread), then replayed and deleted, and a new one
    made under the same inode (a file system hands a freed inode out again) holds other
    threads, as long as the old one to the byte and longer: the next look reads it whole,
    not from where it stopped in the old file."""
    settings = make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    spool = Spool.of(settings)

    def of(user: str, n: int) -> QueuedMessage:
        return _said(n).model_copy(update={"user_id": user})

    spool.append([of("alice", n) for n in range(3)])
    assert spool.threads() == {of("alice", 0).thread_key}
    live = next(spool.directory.glob("*.log"))
    elsewhere = Spool.of(make_settings(spool_path=settings.spool_path.parent / "other"))
    elsewhere.append([*(of("bobby", n) for n in range(3)), of("carol", 3)])
    written = next(elsewhere.directory.glob("*.log")).read_bytes()
    with live.open("r+b") as f:  # the same inode, what a new file would hold
        f.write(written)
        f.truncate()
    assert spool.threads() == {of("bobby", 0).thread_key, of("carol", 3).thread_key}
