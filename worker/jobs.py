"""The arq worker's jobs and wiring: the job functions, crons, start-up checks and the
dispatcher that turns ready threads into flush jobs (scheduling is ours; arq runs them)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

from arq import ArqRedis, cron
from arq.cron import CronJob
from arq.worker import Worker, func
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError, RedisError

from afterthought.backends import open_backend
from afterthought.backends.base import MemoryBackend, synthesizes
from afterthought.connections import FAILURES, connect
from afterthought.contract import QueuedMessage
from afterthought.identity import default_template, settle_template
from afterthought.keys import Keys, digest
from afterthought.layout import check_layout
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.shared_store import announce, announce_forever, check_sharing, withdraw
from afterthought.spool import Spool, replay_into
from afterthought.status import HEALTH_INTERVAL_SECONDS, RedisStatus, redis_status
from afterthought.tombstones import Tombstones
from afterthought.worker import metrics
from afterthought.worker.flush import Flusher
from afterthought.worker.forget import Forgetter
from afterthought.worker.pacing import Pacing
from afterthought.worker.prune import Pruner
from afterthought.worker.synthesize import Synthesizer

log = logging.getLogger("afterthought.worker")

#: One flush job drains for at most this long, then yields its slot to the next job.
FLUSH_BUDGET_SECONDS = 20.0
FLUSH_TIMEOUT_SECONDS = 60
# arq waits out the longest function timeout (+10 s) before re-running a SIGKILLed job, so
# no function gets a long one: the crons do their sweeps within ten flush timeouts.
#: How often each worker looks for due threads with no job queued to drain them.
DISPATCH_INTERVAL_SECONDS = 0.05
#: How long a worker waits after a poll that failed (Redis away) before the next one.
POLL_RETRY_SECONDS = 0.5
#: How often a worker checks that Redis still holds the deployment's data: one small
#: script call per shard (a GET, while nothing is lost), as often as the metrics refresh.
MARKER_CHECK_SECONDS = 5.0
#: While Redis stays away, the failure is logged again this often.
OUTAGE_LOG_SECONDS = 60.0
#: How long a stopping worker waits for its own background loops to end.
SHUTDOWN_WAIT_SECONDS = 5.0
#: A queued job that no worker starts within this long no longer blocks a new one.
DISPATCH_MARK_MS = 2000
#: Jobs asked for after users' batches that a process remembers before it forgets those due.
MAX_REMEMBERED_JOBS = 10_000
#: How often a worker replays its machine's spool (what agents here could not queue).
SPOOL_REPLAY_SECONDS = 10.0


def json_dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=_failure_name).encode()


def _failure_name(value: Any) -> str:
    """A failed job's result is its exception: kept by class name only (its text may quote
    content), where arq would log that it cannot be serialized on every failed job."""
    if isinstance(value, BaseException):
        return type(value).__name__
    raise TypeError(f"not JSON: {type(value).__name__}")


def json_loads(raw: bytes) -> Any:
    return json.loads(raw)


@metrics.metered
async def flush(ctx: dict[str, Any]) -> dict[str, int]:
    """The job: drain due threads (any of them) for up to a budget."""
    flusher: Flusher = ctx["flusher"]
    await flusher.redis.delete(flusher.keys.dispatch)  # started: the next one may be queued
    stats: Counter[str] = await flusher.drain(budget=FLUSH_BUDGET_SECONDS)
    return dict(stats)


@metrics.metered
async def synthesize(ctx: dict[str, Any], app: str, user_id: str) -> dict[str, int]:
    """The job: synthesize one user's new messages into facts."""
    synthesizer: Synthesizer = ctx["synthesizer"]
    return dict(await synthesizer.run(app=app, user_id=user_id))


@metrics.metered
async def synthesize_all(ctx: dict[str, Any]) -> dict[str, int]:
    """The cron behind the debounced runs: any user with unsynthesized messages."""
    synthesizer: Synthesizer | None = ctx.get("synthesizer")
    return dict(await synthesizer.run_all()) if synthesizer else {}


@metrics.metered
async def prune(ctx: dict[str, Any]) -> dict[str, int]:
    """The daily cron: prune every user's facts (for real; the CLI dry-runs by default)."""
    pruner: Pruner = ctx["pruner"]
    report = await pruner.prune_all(dry_run=False)
    return {"pruned": len(report.pruned), "kept": report.kept}


@metrics.metered
async def resume_forgets(ctx: dict[str, Any]) -> dict[str, int]:
    """Every minute: finish forgets left pending (the backend's deletion unconfirmed, or
    the process that began them stopped)."""
    forgetter: Forgetter = ctx["forgetter"]
    done = await forgetter.resume_pending()
    return {"resumed": len(done), "pending": sum(d.pending for d in done)}


@metrics.metered
async def repair_late(ctx: dict[str, Any]) -> dict[str, int]:
    """Every minute: read back the threads a call may still commit to late, and repair
    the copies such calls made (``Flusher.repair_late``)."""
    flusher: Flusher = ctx["flusher"]
    return dict(await flusher.repair_late())


async def dispatch_once(
    redis: Redis, jobs: ArqRedis, keys: Keys, pacing: Pacing | None = None
) -> bool:
    """Queue a flush job (on arq's Redis, ``jobs``) when unclaimed threads are due and no
    job waits to start.

    A job waiting is marked by a short-lived key that the job deletes when it starts, so
    neither a running job nor one stuck on a killed worker holds dispatching back. Every
    shard is polled in one batch (a cluster client sends each master its own). ``pacing``:
    the process's view of a pause (read at most every ``pacing.READ_SECONDS``)."""
    now = int(time.time() * 1000)
    async with redis.pipeline(transaction=False) as pipe:
        for shard in keys.shard_ids:
            pipe.zcount(keys.ready(shard), "-inf", now)
        due = await pipe.execute()
    if not any(due):
        return False
    if await pacing.paused() if pacing else await redis.exists(keys.paused):
        return False
    if not await redis.set(keys.dispatch, "1", nx=True, px=DISPATCH_MARK_MS):
        return False
    job = await jobs.enqueue_job(
        "flush", _job_id=keys.job_id("flush", uuid.uuid4().hex), _queue_name=keys.queue
    )
    return job is not None


async def dispatch_or_drain(jobs: ArqRedis, keys: Keys, flusher: Flusher) -> None:
    """Dispatch a flush job; when Redis is at ``maxmemory`` arq cannot queue one, so drain
    in this process instead (draining is what frees memory, and its scripts may run)."""
    if flusher.claiming:
        # A flush job of this process has free slots: it claims what is due itself within
        # ``CLAIM_INTERVAL``. Another job would only poll beside it (each running job costs
        # arq four commands a poll, and its own claim loop), so none is queued meanwhile;
        # one is as soon as the job is full or ends. Other workers' dispatchers go on.
        return
    try:
        await dispatch_once(flusher.redis, jobs, keys, flusher.pacing)
    except RedisError as exc:
        if not isinstance(exc, OutOfMemoryError):
            raise
        log.warning("redis full: draining in the dispatcher (arq cannot queue jobs)")
        await flusher.drain(budget=FLUSH_BUDGET_SECONDS)


class AfterBatches:
    """Jobs run a while after a user's batch, one per user while it waits (debounced: arq
    refuses a second job of the same id). Asking arq costs commands at every batch, so a
    process remembers when the job it asked for is due and asks again only after."""

    def __init__(self, jobs: ArqRedis, keys: Keys, *, clock: Callable[[], float] = time.monotonic):
        self._arq, self._keys, self._clock = jobs, keys, clock
        self.jobs: list[tuple[str, str, float]] = []
        """(function, job id tag, seconds after the batch) of each job."""
        self._due: dict[str, float] = {}
        """Job id -> when the job last asked for runs (this process's clock)."""

    def add(self, function: str, tag: str, seconds: float) -> None:
        self.jobs.append((function, tag, seconds))

    async def __call__(self, message: QueuedMessage) -> None:
        user, now = digest(message.app, message.user_id), self._clock()
        if len(self._due) > MAX_REMEMBERED_JOBS:
            self._due = {job: at for job, at in self._due.items() if at > now}
        for function, tag, seconds in self.jobs:
            job_id = self._keys.job_id(tag, user)
            if self._due.get(job_id, -math.inf) > now:
                continue  # queued, and it will read this batch too
            await self._arq.enqueue_job(
                function,
                message.app,
                message.user_id,
                _job_id=job_id,
                _queue_name=self._keys.queue,
                _defer_by=seconds,
            )
            self._due[job_id] = now + seconds


class _Outage:
    """Redis failing a loop that retries every fraction of a second: logged as it begins,
    once a minute while it lasts, and as it ends, not at every try."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._since: float | None = None
        self._told = -OUTAGE_LOG_SECONDS

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        if now - self._told >= OUTAGE_LOG_SECONDS:
            log.warning("%s failed, retrying error=%s", self.what, type(exc).__name__)
            self._told = now

    def ended(self) -> None:
        if self._since is not None:
            log.info("%s resumed after=%.1fs", self.what, time.monotonic() - self._since)
            self._since, self._told = None, -OUTAGE_LOG_SECONDS


async def _dispatch_forever(jobs: ArqRedis, keys: Keys, flusher: Flusher) -> None:
    outage = _Outage("dispatch")
    while True:
        try:
            await dispatch_or_drain(jobs, keys, flusher)
            outage.ended()
        except FAILURES as exc:
            outage.failed(exc)
            await asyncio.sleep(POLL_RETRY_SECONDS)
        await asyncio.sleep(DISPATCH_INTERVAL_SECONDS)


class Markers:
    """W9 for a loss that leaves no gap: Redis restarted without persistence (or flushed,
    or failed over to an empty replica) comes back empty, with no sequence number left to
    show what went. Each shard holds a marker (durable); a worker remembers the ones it
    found, and one gone or replaced since means the shard's data went: logged, counted
    (``afterthought_redis_data_lost``) and recorded for ``status`` (``redis_lost_data``).
    A worker started after the loss has nothing to compare: the workers that ran through
    it report it."""

    def __init__(self, queue: ThreadQueue) -> None:
        self._queue = queue
        self._known: dict[int | None, str] = {}

    async def check(self) -> int:
        """Check every shard's marker (writing one where there is none); how many shards
        were found to have lost their data."""
        shards = self._queue.keys.shard_ids
        now_ms = int(time.time() * 1000)
        found = await asyncio.gather(
            *(self._queue.keep_marker(s, self._known.get(s, ""), now_ms=now_ms) for s in shards)
        )
        lost = 0
        for shard, (gone, marker) in zip(shards, found, strict=True):
            self._known[shard] = marker
            if gone:
                lost += 1
                metrics.REDIS_DATA_LOST.inc()
                log.error(
                    "redis lost its data shard=%s: its marker is gone (a restart without "
                    "persistence, a flush, a failover to an empty replica); what was queued "
                    "there before is lost, uncounted",
                    0 if shard is None else shard,
                )
        return lost


async def _check_markers_forever(markers: Markers) -> None:
    outage = _Outage("redis data check")
    while True:
        await asyncio.sleep(MARKER_CHECK_SECONDS)
        try:
            await markers.check()
            outage.ended()
        except FAILURES as exc:
            outage.failed(exc)


async def replay_spool(spool: Spool, queue: ThreadQueue) -> None:
    """Queue what the machine's agents spooled (W7); a file that cannot be read is logged,
    and tried again at the next replay."""
    try:
        result = await replay_into(spool, queue)
    except OSError as exc:
        log.error("spool replay failed error=%s errno=%s", type(exc).__name__, exc.errno)
        return
    metrics.SPOOL_MESSAGES.labels("replayed").inc(result.replayed)
    metrics.SPOOL_MESSAGES.labels("damaged").inc(result.damaged)
    metrics.SPOOL_MESSAGES.labels("forgotten").inc(result.forgotten)
    if result.replayed or result.damaged or result.forgotten:
        log.info(
            "spool replayed=%d damaged=%d forgotten=%d",
            result.replayed,
            result.damaged,
            result.forgotten,
        )


async def _replay_spool_forever(spool: Spool, queue: ThreadQueue) -> None:
    while True:
        await asyncio.sleep(SPOOL_REPLAY_SECONDS)
        await replay_spool(spool, queue)


async def check_redis(redis: Redis) -> RedisStatus:
    """W9: queued messages must never be evicted, and should survive a restart; warn
    when either is not so. Draining goes on at ``maxmemory``."""
    found = await redis_status(redis)
    if found.maxmemory_policy != "noeviction":
        log.warning(
            "maxmemory-policy=%s may evict queued messages; use noeviction",
            found.maxmemory_policy,
        )
    if found.persistence == "none":
        log.warning("redis persists nothing (no AOF, no snapshots): a restart loses the queue")
    if found.full:
        log.warning("redis is at maxmemory: draining, new messages are held by the agents")
    return found


async def supports_script_flags(redis: Redis) -> bool:
    """Redis 7 reads ``#!lua flags=...``: the drain scripts then run at ``maxmemory``."""
    version = str((await redis.info("server")).get("redis_version", "0"))
    supported = int(version.split(".")[0] or 0) >= 7
    if not supported:
        log.warning("redis %s: draining at maxmemory needs Redis 7 or later", version)
    return supported


class MemoryWorker(Worker):
    """arq's worker, but one that stays up while Redis is away (restarting, failing over
    to a replica, or at ``maxmemory``, where its health line and cron enqueues are refused):
    arq would exit on the first error, and a worker that exits cannot drain. It polls
    again; the threads it held fall due by themselves (W4)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.interrupted = False
        """Stopped by SIGINT (Ctrl-C), which the command reports as such (exit 130)."""
        self.stopping = False
        """A signal asked it to stop."""
        self._outage = _Outage("poll")

    async def _poll_iteration(self) -> None:
        if self.stopping:
            raise asyncio.CancelledError  # a stop the poll below may have swallowed
        try:
            await super()._poll_iteration()
            self._outage.ended()
        except FAILURES as exc:
            if self.stopping:
                # The stop's cancellation can surface as the client's timeout (it raced
                # the command's own): retrying would keep the worker up for good.
                raise asyncio.CancelledError from exc
            self._outage.failed(exc)
            await asyncio.sleep(POLL_RETRY_SECONDS)

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        # arq takes a job slot (its semaphore and counter) before it marks the job in
        # progress, and gives it back only on a Redis *reply* it expects: a connection
        # error there (a failover) kept the slot for good, and after ``max_jobs`` of them
        # the worker polled on but never started a job again. The failing job is always
        # the one whose slot was taken: it is given back, and the job is polled again.
        try:
            await super().start_jobs(job_ids)
        except FAILURES:
            self.job_counter -= 1
            self.sem.release()
            raise

    def handle_sig(self, signum: signal.Signals) -> None:
        self.interrupted = self.interrupted or signum == signal.SIGINT
        self.stopping = True
        super().handle_sig(signum)

    async def close(self) -> None:
        # arq's close gathers the jobs the stop cancelled, and one that ends cancelled (as
        # a flush stopped mid-call does) raised out of it: the command exited 1 and
        # on_shutdown never ran (the backend left open, the announcement not withdrawn).
        running = list(self.tasks.values())
        await asyncio.gather(*running, return_exceptions=True)
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
        await super().close()


class _WithoutJobArguments(logging.Filter):
    """arq logs a job's arguments as it starts it; ours hold ADK user ids (often e-mail
    addresses), which no log line may keep, so they are left out."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "%6.2fs → %s(%s)%s" and isinstance(record.args, tuple):
            record.args = (*record.args[:2], "…", *record.args[3:])
        return True


logging.getLogger("arq.worker").addFilter(_WithoutJobArguments())


def _prune_cron(keys: Keys, at: str) -> CronJob:
    hour, minute = at.split(":")
    # keep_result: a late re-enqueue of the same tick is refused (arq #196).
    return cron(
        prune,
        name=keys.job_id("cron", "prune"),
        hour={int(hour)},
        minute={int(minute)},
        keep_result=3600,
        timeout=FLUSH_TIMEOUT_SECONDS * 10,
    )


def _jobs_pool(settings: Settings, keys: Keys) -> ArqRedis:
    """arq's Redis client, from our factory: arq's own gives its commands no timeout (a
    worker would hang on a partitioned master) and reads no Sentinel URL."""
    pool = cast(ArqRedis, connect(settings.jobs_redis_url, client_class=ArqRedis))
    pool.job_serializer = json_dumps
    pool.job_deserializer = json_loads
    pool.default_queue_name = keys.queue
    return pool


def worker_settings(
    settings: Settings | None = None,
    *,
    burst: bool = False,
    opened_backend: MemoryBackend | None = None,
    **arq_overrides: Any,
) -> dict[str, Any]:
    """Keyword arguments for ``arq.Worker`` (arq takes a dict as settings too).
    ``opened_backend``: one already opened (the command opens it before arq starts, so that a
    backend that cannot work is reported alone); else the worker opens its own."""
    s = settings or Settings()
    keys = Keys.of(s)
    worker_id = f"{socket.gethostname()}:{os.getpid()}"

    async def on_startup(ctx: dict[str, Any]) -> None:
        jobs: ArqRedis = ctx["redis"]  # arq's, for jobs only
        redis = ctx["data"] = connect(s.redis_url)  # the queue, registry and cache
        await check_layout(redis, s)  # before anything is written in the wrong place
        await check_redis(redis)
        # Recorded (once per deployment, its users indexed by person then) before this
        # worker provisions anyone: users named for the deployment, or as before.
        default = await default_template(redis, s)
        user_ids = s.zep_user_id_template or default
        await check_sharing(redis, s)  # no user shared by accident with another deployment
        moved = await settle_template(redis, s)
        if moved:
            log.warning(
                "zep_user_id_template: %d users recorded under another backend user id move "
                "to the one it names at their next turn (a new memory each; see README, "
                "Identity)",
                moved,
            )
        allow_oom = await supports_script_flags(redis)
        if s.metrics_port is not None:  # first: a port in use stops the worker before it works
            health = metrics.Health(worker_id)
            ctx["metrics_server"] = metrics.serve(s.metrics_host, s.metrics_port, health)
        opened = opened_backend or open_backend(s, upgrade=True)
        await opened.prepare()
        tasks = ctx["tasks"] = []
        await announce(redis, s, opened, worker=worker_id)
        if not burst:
            tasks.append(asyncio.create_task(announce_forever(redis, s, opened, worker=worker_id)))
        await Tombstones(s, redis, opened).key()  # a key changed without the one before: said now
        backend = metrics.metered_backend(opened)
        ctx["backend"] = backend
        ctx["pruner"] = Pruner(s, redis, backend)
        ctx["forgetter"] = Forgetter(s, redis, backend)
        later = AfterBatches(jobs, keys)
        if synthesizes(s, backend):
            ctx["synthesizer"] = Synthesizer(s, redis, backend)
            later.add("synthesize", "synth", s.synthesis_idle_seconds)

        flusher = ctx["flusher"] = Flusher(
            s, redis, backend, after_flush=later if later.jobs else None, allow_oom=allow_oom
        )
        markers = Markers(flusher.queue)
        await markers.check()  # before this worker's first batch: what it found is known

        spool, queue = Spool.of(s), flusher.queue
        await replay_spool(spool, queue)  # before the first drain: a burst sends it too
        if not burst:
            tasks.append(asyncio.create_task(_replay_spool_forever(spool, queue)))
        await dispatch_or_drain(jobs, keys, flusher)
        if not burst:
            tasks.append(asyncio.create_task(_dispatch_forever(jobs, keys, flusher)))
            tasks.append(asyncio.create_task(_check_markers_forever(markers)))
        if s.metrics_port is not None:
            tasks.append(asyncio.create_task(metrics.refresh_forever(redis, jobs, s, health)))
        log.info(
            "worker ready id=%s backend=%s prefix=%s user_ids=%s",
            *(worker_id, backend.name, s.key_prefix, user_ids),
        )
        if s.audit_key is None:
            log.warning("audit log off: set AFTERTHOUGHT_AUDIT_KEY to keep one")

    async def on_shutdown(ctx: dict[str, Any]) -> None:
        tasks = ctx.get("tasks", [])
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a cancellation a Redis call turned into its own error is lost
            await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT_SECONDS)
        if "metrics_server" in ctx:
            ctx["metrics_server"].shutdown()
        if "flusher" in ctx:
            await ctx["flusher"].settle(timeout=SHUTDOWN_WAIT_SECONDS)
        if "backend" in ctx:
            await ctx["backend"].aclose()
        if "data" in ctx:
            await withdraw(ctx["data"], s, worker=worker_id)
            await ctx["data"].aclose()

    return {
        "functions": [
            func(flush, name="flush", keep_result=0, timeout=FLUSH_TIMEOUT_SECONDS),
            func(synthesize, name="synthesize", keep_result=0, timeout=FLUSH_TIMEOUT_SECONDS),
        ],
        "cron_jobs": [
            cron(
                synthesize_all,
                name=keys.job_id("cron", "synthesize"),
                minute=set(range(0, 60, 10)),
                keep_result=600,
                timeout=FLUSH_TIMEOUT_SECONDS * 10,
            ),
            cron(
                resume_forgets,
                name=keys.job_id("cron", "forgets"),
                keep_result=60,
                timeout=FLUSH_TIMEOUT_SECONDS * 10,
            ),
            cron(
                repair_late,
                name=keys.job_id("cron", "late"),
                keep_result=60,
                timeout=FLUSH_TIMEOUT_SECONDS * 10,
            ),
            *([] if s.prune_at == "off" else [_prune_cron(keys, s.prune_at)]),
        ],
        "queue_name": keys.queue,
        "redis_pool": _jobs_pool(s, keys),
        "job_serializer": json_dumps,
        "job_deserializer": json_loads,
        "on_startup": on_startup,
        "on_shutdown": on_shutdown,
        "burst": burst,
        "poll_delay": DISPATCH_INTERVAL_SECONDS,
        "keep_result": 0,
        "max_jobs": 10,
        "health_check_interval": HEALTH_INTERVAL_SECONDS,
        "health_check_key": keys.health(worker_id),
        **arq_overrides,
    }


def create_worker(settings: Settings | None = None, **kwargs: Any) -> MemoryWorker:
    return MemoryWorker(**worker_settings(settings, **kwargs))
