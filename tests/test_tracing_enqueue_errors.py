"""An enqueue that raises records the error's type alone on its span, as the persist span
does (README: "an error records its type only"): the SDK's own recording would add the
exception's text and traceback, which may quote what the user said; a cancellation (a
turn that stops) is no error."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from afterthought import tracing
from afterthought.contract import QueuedMessage

SAID = "my pin is 4711"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("afterthought"))
    return exporter


def _message() -> QueuedMessage:
    return QueuedMessage.build(
        app="app",
        user_id="ada",
        session_id="s",
        invocation_id="i",
        role="user",
        ordinal=0,
        content=SAID,
    )


@pytest.mark.parametrize("error", [ValueError(SAID), RuntimeError(f"refused: {SAID}")])
def test_a_failed_enqueue_records_the_type_alone(
    exporter: InMemorySpanExporter, error: Exception
) -> None:
    with pytest.raises(type(error)), tracing.enqueue_span([_message()]):
        raise error
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == type(error).__name__
    assert not span.events
    assert SAID not in repr(span.to_json())


def test_a_cancelled_enqueue_is_no_error(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(asyncio.CancelledError), tracing.enqueue_span([_message()]):
        raise asyncio.CancelledError
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.UNSET
    assert span.attributes is not None
    assert span.attributes["afterthought.ended_by"] == "CancelledError"
    assert not span.events
