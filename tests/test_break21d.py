"""Break-it round 21d: conditions nobody chose for the spool and the worker."""

from __future__ import annotations

import time
from pathlib import Path
from unittest import mock

from afterthought.contract import QueuedMessage
from afterthought.spool import Sent, Spool


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
