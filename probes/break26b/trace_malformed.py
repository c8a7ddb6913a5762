"""Messages whose `trace` field is malformed in ways a producer (another version, another
integration, a bug) may send, queued through the real Enqueuer (no tracer provider here,
so the field goes as given) to the running worker: which of them are stored, and which
become dead letters. The promise: a malformed trace context never costs the message."""

import asyncio
import uuid

from afterthought.backends import open_backend
from afterthought.connections import connect
from afterthought.contract import QueuedMessage
from afterthought.dead_letters import DeadLetters
from afterthought.enqueue import Enqueuer
from afterthought.settings import Settings

CASES = {
    "garbage string": {"traceparent": "garbage"},
    "all-zero ids": {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"},
    "100 kB traceparent": {"traceparent": "00-" + "a" * 100_000},
    "NUL and newline": {"traceparent": "00-\x00\n-01"},
    "number value": {"traceparent": 5},
    "null value": {"traceparent": None},
    "nested value": {"traceparent": {"a": "b"}},
    "a string, not a map": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "a list": ["x"],
}


async def main() -> None:
    settings = Settings()
    redis = connect(settings.redis_url)
    letters = DeadLetters(redis, settings)
    dead_before = await letters.count()
    enq = Enqueuer(settings)
    user = "trace" + uuid.uuid4().hex[:6]
    texts = {}
    for i, (name, trace) in enumerate(CASES.items()):
        text = f"case {i} {name}: I like tram number {i}"
        texts[name] = text
        m = QueuedMessage.build(
            app="traceapp",
            user_id=user,
            session_id=f"s{i}",
            invocation_id=f"inv{i}",
            role="user",
            ordinal=0,
            content=text,
        )
        queued = await enq.enqueue([m.model_copy(update={"trace": trace})])
        print(f"{name:24} queued={queued}")
    await asyncio.sleep(6)
    backend = open_backend(settings)
    stored: set[str] = set()
    from afterthought.identity import IdentityRegistry

    reg = IdentityRegistry(redis, settings)
    ref = await reg.recorded_user(app="traceapp", user_id=user)
    if ref is not None:
        page, _ = await backend.user_messages(user=ref, after=None, limit=100)
        stored = {m.content for m in page}
    lost = 0
    for name, text in texts.items():
        ok = text in stored
        lost += not ok
        print(f"{'stored ' if ok else 'LOST   '} {name}")
    print(
        "dead letters added:", await letters.count() - dead_before, "lost:", lost, "of", len(texts)
    )
    await backend.aclose()
    await redis.aclose()


asyncio.run(main())
