"""What the enqueue span records when the enqueue raises: the persist span records the
type only (README: "an error records its type only"); the enqueue span?"""

import asyncio
import contextlib

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from afterthought.contract import QueuedMessage  # noqa: E402
from afterthought.enqueue import Enqueuer  # noqa: E402
from afterthought.settings import Settings  # noqa: E402


async def main() -> None:
    enq = Enqueuer(Settings())
    a = QueuedMessage.build(
        app="x",
        user_id="u",
        session_id="s1",
        invocation_id="i",
        role="user",
        ordinal=0,
        content="SECRET one",
    )
    b = QueuedMessage.build(
        app="x",
        user_id="u",
        session_id="s2",
        invocation_id="i",
        role="user",
        ordinal=0,
        content="SECRET two",
    )
    with contextlib.suppress(ValueError):
        await enq.enqueue([a, b])
    task = asyncio.ensure_future(enq.enqueue([a]))
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    for s in exporter.get_finished_spans():
        print(
            s.name,
            s.status.status_code.name,
            repr(s.status.description),
            [(e.name, {k: str(v)[:80] for k, v in e.attributes.items()}) for e in s.events],
        )


asyncio.run(main())
