"""One trace per message: the agent's enqueue span puts its W3C Trace Context into each
queued message (``QueuedMessage.trace``), and the worker's persist span links to the
contexts of the batch it writes (a link, not a parent: one flush writes many turns'
messages). A trace viewer then goes from the turn's callback to its enqueue, and from
there to the write that stored it, with how long it waited in the queue.

OpenTelemetry's API is a no-op until the application installs a tracer provider (the SDK,
the ``tracing`` extra): then no span is recorded, no context is valid, and no message
carries one (its JSON is byte for byte what it was without tracing). Attributes are ids,
counts, lengths and ages, never content."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from afterthought.contract import QueuedMessage

log = logging.getLogger("afterthought.tracing")
_tracer = trace.get_tracer("afterthought")
#: W3C Trace Context whatever propagators the application set globally: the worker that
#: reads it may be another application's process.
_W3C = TraceContextTextMapPropagator()

ENQUEUE_SPAN = "afterthought.enqueue"
PERSIST_SPAN = "afterthought.persist"


def _sizes(messages: Sequence[QueuedMessage]) -> dict[str, str | int]:
    return {
        "afterthought.thread": messages[0].thread_key,
        "afterthought.messages": len(messages),
        "afterthought.chars": sum(len(m.content) for m in messages),
    }


@contextmanager
def enqueue_span(messages: Sequence[QueuedMessage]) -> Iterator[tuple[Span, list[QueuedMessage]]]:
    """The span of one enqueue (a child of the caller's: ADK's span of the turn), and the
    messages to queue: each carrying its context when it is valid (a tracer provider is
    installed), else as they were."""
    with _tracer.start_as_current_span(
        ENQUEUE_SPAN,
        kind=SpanKind.PRODUCER,
        attributes=_sizes(messages),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        traced = list(messages)
        if carrier:
            traced = [m.model_copy(update={"trace": carrier}) for m in messages]
        try:
            yield span, traced
        except BaseException as exc:
            _ended(span, exc)
            raise


def _link(message: QueuedMessage, now_ms: int) -> Link | None:
    """The link to the enqueue of a message that carries a context; None without one, or
    for one that names no span (malformed: said by the message's key alone)."""
    if message.trace is None:
        return None
    found = trace.get_current_span(_W3C.extract(message.trace)).get_span_context()
    if not found.is_valid:
        log.warning("trace context ignored: not a W3C traceparent key=%s", message.key)
        return None
    attributes: dict[str, int] = {"afterthought.seq": message.seq or 0}
    if message.queued_ms is not None:
        attributes["afterthought.queue_wait_ms"] = max(0, now_ms - message.queued_ms)
    return Link(found, attributes)


@contextmanager
def persist_span(
    batch: Sequence[QueuedMessage],
    *,
    backend: str,
    clock: float | None = None,
    flow: type[Exception] | tuple[type[Exception], ...] = (),
    ignored: Callable[[int], object] | None = None,
) -> Iterator[Span]:
    """The span of one batch's write to the backend, linked to the enqueue of each of its
    messages that carries a context. ``clock``: now (seconds), for the queue waits;
    ``flow``: the caller's exceptions that steer it rather than fail (a lease lost, a
    forget meanwhile), which end the span unmarked, as a cancellation does; ``ignored``:
    told how many contexts named no span, when some did."""
    now_ms = int((time.time() if clock is None else clock) * 1000)
    traced = [(m, _link(m, now_ms)) for m in batch if m.trace is not None]
    links = [link for _, link in traced if link is not None]
    waits = [m.queued_ms for m in batch if m.queued_ms is not None]
    attributes = _sizes(batch) | {
        "afterthought.backend": backend,
        "afterthought.kind": batch[0].kind,
        "afterthought.seq.first": batch[0].seq or 0,
        "afterthought.seq.last": batch[-1].seq or 0,
    }
    if len(links) < len(traced):
        attributes["afterthought.trace_contexts_ignored"] = len(traced) - len(links)
        if ignored is not None:
            ignored(len(traced) - len(links))
    if waits:
        attributes["afterthought.queue_wait_ms.max"] = max(0, now_ms - min(waits))
    with _tracer.start_as_current_span(
        PERSIST_SPAN,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            _ended(span, exc, flow)
            raise


def _ended(
    span: Span, exc: BaseException, flow: type[Exception] | tuple[type[Exception], ...] = ()
) -> None:
    """What a span that an exception ended records: its type alone (the SDK's own
    recording would add its text and traceback, which may quote content). Only a failure
    is an error: an alert on a trace's error rate must not fire for a turn or a worker
    that stops (a cancellation) or a batch read again (``flow``)."""
    if isinstance(exc, Exception) and not isinstance(exc, flow):
        span.set_status(StatusCode.ERROR, type(exc).__name__)
    else:
        span.set_attribute("afterthought.ended_by", type(exc).__name__)
