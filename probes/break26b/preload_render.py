"""What ADK's PreloadMemoryTool / load_memory show for one user over the real api
server: a statement said in three sessions (same words, then different case/spacing),
a fact synthesised from it; counts how often each text shows in the stand-in's reply
(what PreloadMemoryTool put in the request), and calls search_memory through
ZepMemoryService (load_memory's path) to check author/time/text of each entry."""

import asyncio
import os
import sys
import time
import uuid

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from two_users_api import turn

user = "carol" + uuid.uuid4().hex[:6]
said = [
    "I am allergic to peanuts and I live in Porto",
    "I am allergic to peanuts and I live in Porto",
    "i am  allergic to peanuts and i live in porto!",
]
with httpx.Client(timeout=60) as c:
    for s in said:
        turn(c, user, s)
    time.sleep(6)  # flush + synthesis
    reply = turn(c, user, "what am I allergic to, peanuts?")
print(reply)
lines = [x for x in reply.splitlines() if x.startswith(("user:", "fact"))]
print("statement lines:", len(lines), "distinct:", len(set(lines)))


async def main() -> None:
    from afterthought.agent_hooks.memory_service import ZepMemoryService

    svc = ZepMemoryService()
    r = await svc.search_memory(app_name="memory_tools", user_id=user, query="allergic peanuts")
    for m in r.memories:
        text = " ".join(p.text or "" for p in m.content.parts)
        print(repr(m.author), m.timestamp, repr(text), m.custom_metadata)
    texts = [" ".join(p.text or "" for p in m.content.parts) for m in r.memories]
    print("entries", len(texts), "distinct", len(set(texts)))
    await svc.aclose() if hasattr(svc, "aclose") else None


asyncio.run(main())
