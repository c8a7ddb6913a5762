"""OpenTelemetry instruments of the agent process (a no-op unless the application sets up
a meter provider). Attributes are outcomes only: never ids, never content."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

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
context_queries = _meter.create_counter(
    "afterthought.context.queries",
    description="Query-mode retrievals by result: ok, timeout, error, no_time (the cached"
    " block is served for all but ok).",
)
memory_read_failures = _meter.create_counter(
    "afterthought.retrieval.failures",
    description="Memory reads that failed or ran out of budget (the turn went on without).",
)
text_repaired = _meter.create_counter(
    "afterthought.queue.repaired",
    description="Code points of invalid Unicode (lone surrogates) replaced by U+FFFD before "
    "a message was queued.",
)
identity_pins_ignored = _meter.create_counter(
    "afterthought.identity.pins_ignored",
    description="Zep user or graph UUIDs found in session state that are not the ADK user's "
    "(set trust_state_identity if only your code writes them).",
)
queue_failures = _meter.create_counter(
    "afterthought.queue.failures",
    description="Writes not queued at once, by outcome: buffered, spooled, dropped, refused.",
)
lost_messages = _meter.create_counter(
    "afterthought.queue.lost",
    description="Messages a worker found lost from the queue as it took a gap in a thread's"
    " numbers (an evicted payload; a counter gone back: a failover to a replica that"
    " lagged, a restart without its last writes), less those the backend holds.",
)
clock_skewed = _meter.create_counter(
    "afterthought.clock.skewed",
    description="Enqueues whose process clock was off Redis' by more than"
    " forget_clock_margin_seconds (reported only: the queue compares on Redis' clock).",
)
spool_events = _meter.create_counter(
    "afterthought.queue.spool",
    description="Messages this process wrote to the machine's spool (spooled) and replayed"
    " from it into Redis (replayed).",
)
store_problems = _meter.create_counter(
    "afterthought.store.problems",
    description="Times the agent found, by problem: no_workers (none announced lately: its"
    " messages wait in Redis), other_store (the workers write another store than it reads).",
)

_buffer_readers: list[Callable[[], int]] = []


def watch_buffer(read: Callable[[], int]) -> None:
    """Report what ``read`` returns as the gauge ``afterthought.queue.buffered``."""
    _buffer_readers.append(read)


def _observe_buffered(options: CallbackOptions) -> Iterable[Observation]:
    yield Observation(sum(read() for read in _buffer_readers))


_meter.create_observable_gauge(
    "afterthought.queue.buffered",
    callbacks=[_observe_buffered],
    description="Messages waiting in the agent's in-process buffer for Redis to answer.",
)
