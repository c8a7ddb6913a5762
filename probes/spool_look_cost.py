# ruff: noqa
"""What an enqueue pays on the turn path (on the agent's event loop) when the spool's stamp
changed: Spool.threads() reads and parses every record waiting."""

import tempfile, time
from pathlib import Path

from afterthought.contract import QueuedMessage
from afterthought.spool import Spool

sp = Spool(Path(tempfile.mkdtemp()) / "spool", max_bytes=64 << 20, fsync=lambda fd: None)
batch = [
    QueuedMessage.build(
        app="a",
        user_id=f"u{i % 500}",
        session_id="s",
        invocation_id=f"i{i}",
        role="user",
        ordinal=0,
        content="x" * 800,
    )
    for i in range(1000)
]
while True:
    r = sp.append(batch)
    if r.full:
        break
t = time.perf_counter()
threads = sp.threads()
print(
    f"spool bytes={sp.size()} records={sp.waiting()} threads={len(threads)} threads()_seconds={time.perf_counter() - t:.3f}"
)
t = time.perf_counter()
sp.stamp()
print(f"stamp()_seconds={time.perf_counter() - t:.6f}")
