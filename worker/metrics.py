"""The worker's Prometheus metrics and its ``/metrics`` + ``/healthz`` endpoint.

Labels are job names, outcomes and backend operations, all fixed in code: never ids or
content. Queue gauges describe the whole deployment (every worker exports the same
values: aggregate them with ``max``); with ``redis_shards`` the ``afterthought_shard_*``
gauges break them down by virtual shard (label ``shard``; absent in the flat layout)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, ParamSpec, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis.asyncio as aioredis
from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app

from afterthought.backends.base import BackendError, MemoryBackend
from afterthought.connections import FAILURES
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.status import Status, snapshot

log = logging.getLogger("afterthought.worker")

P = ParamSpec("P")

#: Queue gauges are refreshed this often; /healthz fails after three missed refreshes.
REFRESH_SECONDS = 5.0

JOBS = Counter("afterthought_jobs", "Jobs run, by function and outcome.", ["function", "outcome"])
JOB_SECONDS = Histogram(
    "afterthought_job_seconds",
    "Job durations.",
    ["function"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 20, 60, 300),
)
JOB_EVENTS = Counter(
    "afterthought_job_events",
    "What jobs did (flush: messages, calls, dead, forgotten, deferred...; synthesis: "
    "written, superseded, quarantined...; prune: pruned).",
    ["function", "event"],
)
RETRIES = Counter(
    "afterthought_retries",
    "Backend retries: in_job (the batch is retried at once) or deferred (the thread later).",
    ["kind"],
)
LATE_COPIES = Counter(
    "afterthought_late_copies",
    "Copies of stored messages a late commit made, found and repaired: deleted, or marked"
    " where the backend deletes no single message.",
    ["action"],
)
THREAD_PINS_IGNORED = Counter(
    "afterthought_thread_pins_ignored",
    "Messages whose thread, pinned without its user (untrusted session state), is another"
    " user's: written to the user's own thread instead.",
)
TRACE_CONTEXTS_IGNORED = Counter(
    "afterthought_trace_contexts_ignored",
    "Queued messages whose trace context named no span (malformed): stored without the"
    " link to their enqueue.",
)
SIDE_EFFECT_FAILURES = Counter(
    "afterthought_side_effect_failures",
    "Writes that follow a stored batch and were skipped (audit, cache, synthesis scheduling), "
    "e.g. refused at maxmemory: draining goes on without them.",
    ["what"],
)
BATCH_SIZE = Histogram(
    "afterthought_batch_size",
    "Messages per add_messages call.",
    buckets=(1, 2, 5, 10, 15, 20, 25, 30),
)
BACKEND_SECONDS = Histogram(
    "afterthought_backend_seconds",
    "Backend call latency, by operation and outcome (ok or the error kind).",
    ["operation", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
THREAD_MAP_REBUILDS = Counter(
    "afterthought_thread_map_rebuilds",
    "Users whose map of sessions to backend threads was rebuilt from the backend (Redis "
    "lost it or went back): whole, or truncated at identity.MAP_REBUILD_THREADS threads.",
    ["outcome"],
)
SPOOL_MESSAGES = Counter(
    "afterthought_spool_messages",
    "Messages of this machine's spool (what its agents could not queue) the worker queued "
    "(replayed), skipped as torn or damaged (damaged), or dropped as made before their "
    "user's forget (forgotten, counted among replayed too).",
    ["event"],
)
QUEUE_MESSAGES = Gauge("afterthought_queue_messages", "Messages queued across all threads.")
QUEUE_THREADS = Gauge(
    "afterthought_queue_threads",
    "Threads with messages queued, by state: due, leased, deferred, stranded.",
    ["state"],
)
QUEUE_OLDEST = Gauge(
    "afterthought_queue_oldest_seconds", "How long the oldest queued message has waited."
)
DEAD_LETTERS = Gauge("afterthought_dead_letters", "Items in the dead-letter list.")
LOST = Gauge(
    "afterthought_lost_messages",
    "Messages Redis lost after accepting them (sequence gaps: eviction, a lossy failover).",
)
REDIS_DATA_LOST = Counter(
    "afterthought_redis_data_lost",
    "Times this worker found that Redis had lost a shard's data (its marker gone: a restart "
    "without persistence, a flush); what was queued there is lost, uncounted.",
)
PAUSED = Gauge("afterthought_paused", "1 while consumption is paused after a 401/403.")
FORGETS_PENDING = Gauge(
    "afterthought_forgets_pending", "Users being forgotten whose deletion is not confirmed yet."
)
SYNTHESIS_LAG = Gauge(
    "afterthought_synthesis_lag_seconds", "How long the most overdue synthesis job has been due."
)
SHARD_MESSAGES = Gauge(
    "afterthought_shard_queue_messages", "Messages queued in one shard's threads.", ["shard"]
)
SHARD_THREADS = Gauge(
    "afterthought_shard_queue_threads",
    "One shard's threads with messages queued, by state: due, leased, deferred, stranded.",
    ["shard", "state"],
)
SHARD_DEAD_LETTERS = Gauge(
    "afterthought_shard_dead_letters", "Items in one shard's dead-letter list.", ["shard"]
)
SHARD_LOST = Gauge(
    "afterthought_shard_lost_messages", "Messages Redis lost in one shard.", ["shard"]
)
WORKERS = Gauge("afterthought_workers", "Worker processes whose health reports are live.")
LOCAL_STORES = Gauge(
    "afterthought_local_stores",
    "Stores (local files, Zep projects) the workers announced lately (over 1: split).",
)


def metered(
    job: Callable[P, Coroutine[Any, Any, dict[str, int]]],
) -> Callable[P, Coroutine[Any, Any, dict[str, int]]]:
    """Count a job's outcome, time it, and add up the counts it returns."""
    name = job.__name__

    @functools.wraps(job)
    async def run(*args: P.args, **kwargs: P.kwargs) -> dict[str, int]:
        start = time.perf_counter()
        outcome = "failed"
        try:
            result = await job(*args, **kwargs)
            outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"  # arq's timeout, or the worker shutting down
            raise
        finally:
            JOBS.labels(name, outcome).inc()
            JOB_SECONDS.labels(name).observe(time.perf_counter() - start)
        for event, count in result.items():
            if count > 0:
                JOB_EVENTS.labels(name, event).inc(count)
        return result

    return run


class _Metered:
    """Times every coroutine method of a backend; everything else passes through."""

    def __init__(self, backend: MemoryBackend) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        if not inspect.iscoroutinefunction(attr) or name == "aclose":
            return attr

        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            outcome = "ok"
            try:
                return await attr(*args, **kwargs)
            except BackendError as exc:
                outcome = exc.kind
                raise
            except BaseException:
                outcome = "error"
                raise
            finally:
                BACKEND_SECONDS.labels(name, outcome).observe(time.perf_counter() - start)

        return timed


def metered_backend(backend: MemoryBackend) -> MemoryBackend:
    return cast(MemoryBackend, _Metered(backend))


def record(status: Status) -> None:
    queue = status.queue
    QUEUE_MESSAGES.set(queue.messages)
    for state in ("due", "leased", "deferred", "stranded"):
        QUEUE_THREADS.labels(state).set(getattr(queue, state))
    QUEUE_OLDEST.set(queue.oldest_age_seconds or 0.0)
    DEAD_LETTERS.set(status.dead_letters)
    LOST.set(status.lost_messages)
    PAUSED.set(int(status.pause.paused))
    FORGETS_PENDING.set(status.forgets.pending)
    SYNTHESIS_LAG.set(status.synthesis.lag_seconds or 0.0)
    WORKERS.set(len(status.workers))
    LOCAL_STORES.set(status.local_stores)
    for part in status.shards:
        shard = str(part.shard)
        SHARD_MESSAGES.labels(shard).set(part.messages)
        for state in ("due", "leased", "deferred", "stranded"):
            SHARD_THREADS.labels(shard, state).set(getattr(part, state))
        SHARD_DEAD_LETTERS.labels(shard).set(part.dead_letters)
        SHARD_LOST.labels(shard).set(part.lost_messages)


class Health:
    """What ``/healthz`` answers: healthy while the refresh loop reaches Redis."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.last_ok = 0.0

    def report(self) -> tuple[bool, dict[str, Any]]:
        age = time.monotonic() - self.last_ok if self.last_ok else None
        ok = age is not None and age < 3 * REFRESH_SECONDS
        return ok, {"ok": ok, "worker": self.worker_id, "last_refresh_seconds": age}


async def shared_snapshot(
    redis: aioredis.Redis,
    settings: Settings,
    worker_id: str,
    *,
    jobs: aioredis.Redis | None = None,
) -> Status:
    """One worker takes the snapshot each period and shares it; the others read it (one
    GET), so a deployment pays for one snapshot however many workers it runs. ``jobs``:
    arq's Redis, when another one."""
    keys = Keys.of(settings)
    period_ms = int(REFRESH_SECONDS * 1000)
    if not await redis.set(keys.lock("status"), worker_id, nx=True, px=period_ms - 100):
        shared = await redis.get(keys.status)
        if shared is not None:
            return Status.model_validate_json(shared)
    status = await snapshot(redis, settings, jobs=jobs)
    await redis.set(keys.status, status.model_dump_json(), px=3 * period_ms)
    return status


async def refresh_forever(
    redis: aioredis.Redis, jobs: aioredis.Redis, settings: Settings, health: Health
) -> None:
    while True:
        try:
            record(await shared_snapshot(redis, settings, health.worker_id, jobs=jobs))
            health.last_ok = time.monotonic()
        except FAILURES as exc:
            log.warning("metrics refresh failed error=%s", type(exc).__name__)
        await asyncio.sleep(REFRESH_SECONDS)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


def serve(host: str, port: int, health: Health) -> WSGIServer:
    """``/metrics`` and ``/healthz`` on a daemon thread (scrapes never touch the loop)."""
    metrics_app = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            ok, body = health.report()
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "application/json")],
            )
            return [json.dumps(body).encode()]
        return cast(Iterable[bytes], metrics_app(environ, start_response))

    try:
        server = make_server(host, port, app, handler_class=_Quiet)
    except OSError as exc:  # in use, or not an address of this host: the operator's to fix
        raise RuntimeError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    threading.Thread(target=server.serve_forever, name="afterthought-metrics", daemon=True).start()
    log.info("metrics serving host=%s port=%d", host, server.server_port)
    return server


REDIS_SERVER_UNNAMED = Gauge(
    "afterthought_redis_server_unnamed",
    "Shards whose Redis does not say which server it is (INFO refused or renamed): a rollback"
    " there cannot be found, so every batch is reconciled against its whole thread.",
)
