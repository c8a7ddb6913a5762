"""An agent that lives for one turn (a CLI, a cron job): a real ADK Runner with the stand-in
model and the memory callbacks, settings from the environment. Prints ``turn done`` once
the turn has ended, then exits. ``python -m tests.one_shot_agent USER TEXT``"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from afterthought.agent_hooks import create_callbacks
from afterthought.settings import Settings
from tests.adk_support import make_runner, new_session, say

ROOT = Path(__file__).resolve().parent.parent


async def main(user_id: str, text: str) -> None:
    runner, _ = make_runner(create_callbacks())
    session = await new_session(runner, user_id)
    await say(runner, user_id, session, text)
    print("turn done", flush=True)


def one_shot(settings: Settings, user: str, text: str) -> tuple[float, int]:
    """Run one turn in a process of its own, configured like ``settings``; (seconds from
    the end of its turn to its exit, exit code)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.one_shot_agent", user, text],
        cwd=ROOT,
        env={**os.environ, **settings.as_env()},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.strip() == "turn done":
                break
        ended = time.monotonic()
        code = proc.wait(timeout=120)
        return time.monotonic() - ended, code
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
