# ruff: noqa
"""Spool claims named by wall clock: a clock stepped back between two replays that hold a
thread back sorts its later records first."""

import asyncio, sys, tempfile, time
from pathlib import Path
from unittest import mock

sys.path.insert(0, "tests")
from afterthought.contract import QueuedMessage
from afterthought.spool import Sent, Spool


def msg(n):
    return QueuedMessage.build(
        app="a",
        user_id="u",
        session_id="s",
        invocation_id=f"i{n}",
        role="user",
        ordinal=0,
        content=f"m{n}",
    )


async def main():
    d = Path(tempfile.mkdtemp()) / "spool"
    sp = Spool(d, max_bytes=1 << 20, fsync=lambda fd: None)
    sp.append([msg(1), msg(2)])

    async def held(batch):
        return Sent.HELD

    base = time.time_ns()
    with mock.patch("afterthought.spool.time.time_ns", return_value=base):
        print(await sp.replay(held))
    sp.append([msg(3)])
    with mock.patch("afterthought.spool.time.time_ns", return_value=base - 3600 * 10**9):
        print(await sp.replay(held))
    print(sorted(p.name for p in d.iterdir()))
    got = []

    async def ok(batch):
        got.extend(m.content for m in batch)
        return Sent.QUEUED

    print(await sp.replay(ok))
    print("order", got)


asyncio.run(main())
