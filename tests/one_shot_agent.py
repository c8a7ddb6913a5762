"""An agent that lives for one turn (a CLI, a cron job): a real ADK Runner with the stand-in
model and the memory callbacks, settings from the environment. Prints ``turn done`` once
the turn has ended and, as its last exit hook, how long it took from then to that hook
(``exited after SECONDS``). ``python -m tests.one_shot_agent USER TEXT [stay]``: with
``stay`` it then waits, as a server between requests does, until a signal ends it; with
``sending`` it prints ``sending`` once its user's message is being enqueued (Redis has not
answered yet), then goes on with the turn."""

from __future__ import annotations

import asyncio
import atexit
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from afterthought.contract import QueuedMessage
from afterthought.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
EXITED = "exited after "


def _tell_sending(text: str) -> None:
    """Print ``sending`` as the enqueue of ``text`` goes to Redis."""
    from afterthought.enqueue import Enqueuer

    send = Enqueuer.send

    async def telling(self: Enqueuer, messages: Sequence[QueuedMessage]) -> str | None:
        if any(m.content == text for m in messages):
            print("sending", flush=True)
        return await send(self, messages)

    Enqueuer.send = telling  # type: ignore[method-assign]


async def main(user_id: str, text: str, *, stay: bool = False, sending: bool = False) -> float:
    """The turn; when it ended (monotonic)."""
    # Imported here, after the exit hook below is registered: the memory's exit hook is
    # registered as it is imported, so it runs first and ours measures it.
    from afterthought.agent_hooks import create_callbacks
    from tests.adk_support import make_runner, new_session, say

    if sending:
        _tell_sending(text)

    runner, _ = make_runner(create_callbacks())
    session = await new_session(runner, user_id)
    await say(runner, user_id, session, text)
    print("turn done", flush=True)
    if stay:
        await asyncio.Event().wait()
    return time.monotonic()


def one_shot(settings: Settings, user: str, text: str) -> tuple[float, int]:
    """Run one turn in a process of its own, configured like ``settings``; (seconds from
    the end of its turn to its last exit hook, on its own clock, exit code). The process's
    own clock: what a loaded machine adds to an interpreter's start and teardown is not the
    exit's to keep within ``exit_flush_seconds``."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.one_shot_agent", user, text],
        cwd=ROOT,
        env={**os.environ, **settings.as_env()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = [float(line[len(EXITED) :]) for line in done.stdout.splitlines() if EXITED in line]
    assert len(took) == 1 and "turn done" in done.stdout, (done.stdout, done.stderr)
    return took[0], done.returncode


if __name__ == "__main__":
    ended: list[float] = []
    atexit.register(
        lambda: ended and print(f"{EXITED}{time.monotonic() - ended[0]:.3f}", flush=True)
    )
    mode = sys.argv[3:]
    ended.append(
        asyncio.run(
            main(sys.argv[1], sys.argv[2], stay=mode == ["stay"], sending=mode == ["sending"])
        )
    )
