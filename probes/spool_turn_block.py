# ruff: noqa
"""Redis down, this machine's spool holding SIZE MiB (other processes' turns): how long each
enqueue of this agent blocks its event loop (a ticker's longest gap), per turn."""

import asyncio, sys, tempfile, time, uuid
from pathlib import Path

from afterthought.contract import QueuedMessage
from afterthought.enqueue import Enqueuer
from afterthought.settings import Settings
from afterthought.spool import Spool
from afterthought.testing.redis_server import free_port

MIB = int(sys.argv[1])


def m(i, thread="other"):
    return QueuedMessage.build(
        app="a",
        user_id=thread,
        session_id="s",
        invocation_id=f"i{i}",
        role="user",
        ordinal=0,
        content="x" * 800,
    )


async def main():
    tmp = Path(tempfile.mkdtemp())
    s = Settings(
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        key_prefix="r21dblk",
        spool_path=tmp / "spool",
        local_db_path=tmp / "m",
        buffer_size=int(sys.argv[2]),
    )
    other = Spool.of(s)
    other.fsync = lambda fd: None
    i = 0
    while other.size() < MIB << 20:
        other.append([m(i + k, f"u{(i + k) % 300}") for k in range(1000)])
        i += 1000
    e = Enqueuer(s)
    gaps = []

    async def ticker():
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    t = asyncio.ensure_future(ticker())
    per_turn = []
    for turn in range(8):
        other.append([m(10**7 + turn, "another-process")])  # another agent of the machine spools
        gaps.clear()
        started = time.perf_counter()
        await e.enqueue([m(10**8 + turn, "this-session")])
        await asyncio.sleep(0.02)
        per_turn.append((round(time.perf_counter() - started, 3), round(max(gaps), 3)))
    t.cancel()
    print(
        f"spool={other.size() >> 20} MiB records={other.waiting()} per turn (enqueue s, longest loop block s): {per_turn}"
    )
    print(f"buffered={e.buffered} spooled={e.spooled} dropped={e.dropped}")


asyncio.run(main())
