"""Probe: SIGTERM to a process whose add_session_to_memory (N events, > RECORD_CHUNK=100)
is in flight against a Redis that never answers. How many of its messages are spooled?
Child mode: ``python probes/sigterm_add_session.py child N``.
Parent: ``python probes/sigterm_add_session.py N [runs]``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sigterm_blackhole import GOT, blackhole  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


async def child(n: int) -> None:
    from google.adk.events.event import Event
    from google.adk.sessions.session import Session
    from google.genai import types

    from afterthought.agent_hooks.memory_service import ZepMemoryService

    events = [
        Event(
            invocation_id=f"inv-{i // 2}",
            author="user" if i % 2 == 0 else "helper",
            content=types.Content(
                role="user" if i % 2 == 0 else "model", parts=[types.Part(text=f"m{i:05d} said")]
            ),
            timestamp=1_700_000_000 + i,
        )
        for i in range(n)
    ]
    session = Session(id="s-long", app_name="app", user_id="u1", events=events)
    service = ZepMemoryService()
    print("adding", flush=True)
    await service.add_session_to_memory(session)
    print("added", flush=True)


def run(port: int, n: int) -> tuple[float, int, int, str]:
    spool = tempfile.mkdtemp(prefix="spool21c-")
    os.chmod(spool, 0o700)
    env = {
        **os.environ,
        "REDIS_URL": f"redis://127.0.0.1:{port}/0",
        "AFTERTHOUGHT_KEY_PREFIX": "b21c",
        "AFTERTHOUGHT_ENQUEUE_TIMEOUT": "5",
        "AFTERTHOUGHT_EXIT_FLUSH_SECONDS": "0.3",
        "AFTERTHOUGHT_SPOOL_PATH": spool,
        "PYTHONPATH": str(ROOT),
    }
    p = subprocess.Popen(
        [sys.executable, __file__, "child", str(n)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    GOT.clear()
    while not GOT:
        time.sleep(0.005)
        assert p.poll() is None, p.communicate()
    time.sleep(0.5)
    t0 = time.monotonic()
    p.send_signal(15)
    out, err = p.communicate(timeout=60)
    took = time.monotonic() - t0
    lines = sum(
        len(f.read_text(errors="replace").splitlines()) for f in Path(spool).rglob("*") if f.is_file()
    )
    return took, p.returncode, lines, err[-300:]


if __name__ == "__main__":
    if sys.argv[1] == "child":
        asyncio.run(child(int(sys.argv[2])))
        sys.exit(0)
    n = int(sys.argv[1])
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    port, _ = blackhole()
    for i in range(runs):
        took, rc, lines, err = run(port, n)
        print(f"run {i}: {n} messages, exit {rc} after {took:.2f}s, spooled {lines}, lost {n - lines}")
        print("  stderr:", err.replace("\n", " | "))
