"""An agent that lives for one turn (a CLI, a cron job): a real ADK Runner with the stand-in
model and the memory callbacks, settings from the environment. Prints ``turn done`` once
the turn has ended, then exits. ``python -m tests.one_shot_agent USER TEXT``"""

from __future__ import annotations

import asyncio
import sys

from afterthought.agent_hooks import create_callbacks
from tests.adk_support import make_runner, new_session, say


async def main(user_id: str, text: str) -> None:
    runner, _ = make_runner(create_callbacks())
    session = await new_session(runner, user_id)
    await say(runner, user_id, session, text)
    print("turn done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
