"""OpenTelemetry instruments of the agent process (a no-op unless the application sets up
a meter provider). Attributes are outcomes only: never ids, never content."""

from __future__ import annotations

from opentelemetry import metrics

_meter = metrics.get_meter("afterthought")

retrieval_duration = _meter.create_histogram(
    "afterthought.retrieval.duration",
    unit="s",
    description="Time the turn path spent reading memory (cache and backend).",
)
context_cache_reads = _meter.create_counter(
    "afterthought.context_cache.reads",
    description="Context-block cache reads by result: hit, stale, miss.",
)
memory_read_failures = _meter.create_counter(
    "afterthought.retrieval.failures",
    description="Memory reads that failed or ran out of budget (the turn went on without).",
)
queue_failures = _meter.create_counter(
    "afterthought.queue.failures",
    description="Writes not queued at once, by outcome: buffered, dropped, refused.",
)
