"""One trace per message: the enqueue span's context travels in the queued payload, and the
worker's persist span links to it; no content in any attribute; nothing changes without a
tracer provider."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY

from afterthought import tracing
from afterthought.agent_hooks import create_callbacks
from afterthought.backends import open_backend
from afterthought.backends.base import BackendError
from afterthought.contract import QueuedMessage
from afterthought.enqueue import Enqueuer
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.tracing import ENQUEUE_SPAN, PERSIST_SPAN
from afterthought.worker import flush
from afterthought.worker.forget import Forgetter
from tests.adk_support import make_runner, new_session, say
from tests.conftest import drain, enqueue, queued

SECRET = "my passport number is X1234567"
#: The worker's count of contexts it could not read (a Prometheus counter's sample).
IGNORED = "afterthought_trace_contexts_ignored_total"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """afterthought's spans, recorded by an SDK provider of the test's own: OpenTelemetry
    sets a global provider once a process, and the tests after this one must not trace."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("afterthought"))
    yield exporter
    provider.shutdown()


def _named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def _no_content(found: list[ReadableSpan], *texts: str) -> None:
    for span in found:
        values = [str(v) for v in (span.attributes or {}).values()]
        values += [str(v) for link in span.links for v in (link.attributes or {}).values()]
        for text in texts:
            assert not any(text in v for v in values), span.name


async def test_a_turn_is_one_trace_from_the_callback_through_the_queue_to_the_write(
    local_settings: Settings, spans: InMemorySpanExporter
) -> None:
    runner, _ = make_runner(create_callbacks(settings=local_settings))
    session = await new_session(runner, "alice")
    tracer = tracing._tracer
    with tracer.start_as_current_span("turn") as turn:  # the application's span of the turn
        await say(runner, "alice", session, SECRET)
    await drain(local_settings)

    enqueues = _named(spans, ENQUEUE_SPAN)  # the user's message, then the reply
    assert len(enqueues) == 2
    turn_id = turn.get_span_context().trace_id
    assert all(s.context is not None and s.context.trace_id == turn_id for s in enqueues)
    assert all(s.attributes is not None and s.attributes["afterthought.queued"] for s in enqueues)
    (persist,) = [
        s
        for s in _named(spans, PERSIST_SPAN)
        if (s.attributes or {}).get("afterthought.kind") == "message"
    ]
    assert persist.context is not None and persist.context.trace_id != turn_id  # its own trace
    assert {link.context.span_id for link in persist.links} == {
        s.context.span_id for s in enqueues if s.context
    }
    assert all((link.attributes or {})["afterthought.queue_wait_ms"] >= 0 for link in persist.links)
    assert persist.attributes is not None and persist.attributes["afterthought.messages"] == 2
    _no_content([*enqueues, persist], SECRET, "alice")


async def test_one_flush_of_several_turns_links_each_turns_enqueue(
    local_settings: Settings, spans: InMemorySpanExporter
) -> None:
    enqueuer = Enqueuer(local_settings)
    try:
        for n in range(3):
            assert await enqueuer.enqueue([queued(f"{SECRET} {n}", n)])
    finally:
        await enqueuer.aclose()
    await drain(local_settings)

    enqueues = _named(spans, ENQUEUE_SPAN)
    assert len({s.context.trace_id for s in enqueues if s.context}) == 3  # three turns
    (persist,) = _named(spans, PERSIST_SPAN)  # one batch
    assert {link.context.span_id for link in persist.links} == {
        s.context.span_id for s in enqueues if s.context
    }
    assert sorted((link.attributes or {})["afterthought.seq"] for link in persist.links) == [
        1,
        2,
        3,
    ]
    _no_content([*enqueues, persist], SECRET)


#: An agent process that does not trace: the API alone, no provider (a fresh interpreter,
#: as a provider once set stays for the process).
UNTRACED = """
import asyncio, sys
from afterthought.enqueue import Enqueuer
from afterthought.contract import QueuedMessage
from afterthought.settings import Settings

async def main():
    enqueuer = Enqueuer(Settings())
    said = dict(app="memtest", user_id="alice", session_id="s1", invocation_id="inv-1")
    try:
        message = QueuedMessage.build(**said, role="user", ordinal=0, content=sys.argv[1])
        assert await enqueuer.enqueue([message])
    finally:
        await enqueuer.aclose()

asyncio.run(main())
print(sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk")))
"""


async def test_without_a_tracer_provider_the_payload_is_what_it_was(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", UNTRACED, SECRET],
        env={**os.environ, **local_settings.as_env()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # the SDK is not imported
    message = queued(SECRET, 1)
    keys = Keys.of(local_settings)
    ref = keys.thread_ref(message.app, message.user_id, message.session_id)
    (raw,) = await redis.lrange(keys.pending(ref), 0, -1)
    assert b"trace" not in raw  # the JSON is what it was before the field
    assert raw.endswith(b'"zep_thread_uuid":null}')


def test_a_payload_with_a_context_is_read_by_a_worker_that_knows_none() -> None:
    """Backward compatible both ways: the field is ignored where unknown, absent is None."""
    message = queued(SECRET, 1).model_copy(
        update={"trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}}
    )
    data = json.loads(message.encode())
    assert list(data)[-1] == "trace"  # last: the enqueue script reads the JSON by position
    assert QueuedMessage.model_config["extra"] == "ignore"  # as it was: older workers skip it
    del data["trace"]  # an older agent's payload
    assert QueuedMessage.model_validate_json(json.dumps(data)).trace is None


# The hooks' script queues what ``encode`` makes of it, which warns of the bad field.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
@pytest.mark.parametrize(
    "context",
    ["00-not-a-mapping", {"traceparent": 7}, ["traceparent"], {"traceparent": "garbage"}],
)
async def test_a_bad_trace_context_is_ignored_and_its_message_stored(
    local_settings: Settings,
    redis: aioredis.Redis,
    spans: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
    context: object,
) -> None:
    """The context is the agent's to get right, the words the user's: a malformed one (by
    another integration, an edited payload) costs the link, never the message."""
    message = queued(SECRET, 1)
    payload = json.loads(message.encode()) | {"trace": context}
    caplog.set_level(logging.WARNING)
    ignored = REGISTRY.get_sample_value(IGNORED) or 0.0
    await enqueue(local_settings, QueuedMessage.model_construct(**payload))
    await drain(local_settings)

    keys = Keys.of(local_settings)
    assert await redis.llen(keys.dead(keys.shard_of(message.app, message.user_id))) == 0
    backend = open_backend(local_settings)
    try:
        (user,) = await Forgetter(local_settings, redis, backend).backend_users(
            message.app, message.user_id
        )
        stored, _ = await backend.user_messages(user=user, after=None, limit=10)
    finally:
        await backend.aclose()
    assert [m.content for m in stored] == [SECRET]
    (persist,) = _named(spans, PERSIST_SPAN)
    assert not persist.links and persist.attributes is not None
    assert persist.attributes["afterthought.trace_contexts_ignored"] == 1
    (said,) = [r.getMessage() for r in caplog.records if "trace context" in r.getMessage()]
    assert message.key in said and SECRET not in said and "garbage" not in said
    assert REGISTRY.get_sample_value(IGNORED) == ignored + 1


@pytest.mark.parametrize(
    ("raised", "error"),
    [
        (flush._Forgotten, False),  # a forget meanwhile: the flush drops what is left
        (flush._LeaseLost, False),
        (asyncio.CancelledError, False),  # the worker stops
        (flush._Provisioning(BackendError("unavailable")), True),
        (RuntimeError("my passport number"), True),
    ],
)
def test_the_persist_span_is_an_error_only_when_the_write_failed(
    spans: InMemorySpanExporter, raised: BaseException | type[BaseException], error: bool
) -> None:
    kind = raised if isinstance(raised, type) else type(raised)
    with (
        pytest.raises(kind),
        tracing.persist_span([queued(SECRET, 1)], backend="local", flow=flush._Flow),
    ):
        raise raised
    (persist,) = _named(spans, PERSIST_SPAN)
    assert (persist.status.status_code == StatusCode.ERROR) is error
    assert "passport" not in (persist.status.description or "")
