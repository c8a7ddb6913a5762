"""A deployment's state, read from Redis alone: what ``afterthought status`` prints and
what the worker exports as gauges. Counts, ages and ids only, never content.

The JSON shape is versioned (``version``); fields are added, never renamed or dropped."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import redis.asyncio as aioredis
from pydantic import BaseModel, Field, computed_field
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from afterthought.connections import is_cluster
from afterthought.keys import Keys
from afterthought.queue import ThreadQueue
from afterthought.settings import Settings
from afterthought.shared_store import announced_stores
from afterthought.tombstones import unchecked

#: Bumped only if a field changes meaning or goes away.
STATUS_VERSION = 1
#: How often each worker reports its health (arq's health line); a report expires a second
#: after the next one is due.
HEALTH_INTERVAL_SECONDS = 10
#: A forget pending this long needs an operator (the backend keeps refusing to delete).
FORGET_STUCK_SECONDS = 3600
#: Threads read per script call.
CHUNK = 1000


class _Threads(BaseModel):
    messages: int
    """Messages queued across the threads (the cap counts these: the deployment's, or with
    ``redis_shards`` each shard's)."""
    threads: int
    """Threads with something queued."""
    due: int
    """Threads waiting for a worker to take them."""
    leased: int
    """Threads a worker is flushing now."""
    deferred: int
    """Threads backing off after a failure (or a 429), due again later."""
    stranded: int
    """Due threads nobody took for longer than a lease: no worker is consuming."""


class QueueStatus(_Threads):
    oldest_age_seconds: float | None
    """How long the oldest queued message has waited; None when the queue is empty."""
    jobs_waiting: int
    """arq jobs queued (flush, synthesis, crons), including deferred ones."""


class ShardStatus(_Threads):
    """One virtual shard's part of the queue (``redis_shards``)."""

    shard: int
    dead_letters: int
    lost_messages: int
    lost_unverified: int = 0


class PauseStatus(BaseModel):
    paused: bool
    """True while every worker holds off after the backend refused the key (401/403)."""
    reason: str | None = None
    """The error kind that paused consumption."""
    resumes_in_seconds: float | None = None
    """When one worker probes the backend again."""
    rate_limited_for_seconds: float | None = None
    """Left of a 429's hold on every worker; None when there is none."""


class WorkerStatus(BaseModel):
    id: str
    """``host:pid`` of the worker process."""
    last_seen_seconds: float
    """Since its last health report; a worker not seen for 2 intervals is gone."""
    jobs_complete: int | None = None
    jobs_failed: int | None = None
    jobs_retried: int | None = None
    jobs_ongoing: int | None = None


class RedisStatus(BaseModel):
    maxmemory_policy: str | None
    """Anything but ``noeviction`` may evict queued messages; None when CONFIG is refused."""
    persistence: str | None
    """``aof``, ``rdb``, ``aof+rdb`` or ``none`` (a restart loses the queue); None unknown."""
    used_memory: int | None
    """Bytes in use."""
    maxmemory: int | None
    """The limit in bytes; 0 for none."""

    @property
    def full(self) -> bool:
        return bool(self.maxmemory and self.used_memory and self.used_memory >= self.maxmemory)


class SynthesisStatus(BaseModel):
    pending_users: int
    """Users with a synthesis job queued (debounced after their last message)."""
    lag_seconds: float | None
    """How long the most overdue of those jobs has been due; None when none is queued."""


class ForgetStatus(BaseModel):
    pending: int
    """Users being forgotten whose deletion is not confirmed yet (a worker resumes them
    every minute); their new messages wait meanwhile."""
    oldest_age_seconds: float | None
    """Since the oldest pending forget began; None when there is none."""


class Status(BaseModel):
    version: int = STATUS_VERSION
    prefix: str
    """The deployment's key prefix."""
    at: float
    """Unix time of the snapshot."""
    queue: QueueStatus
    dead_letters: int
    """Items the workers gave up on (``afterthought dlq list``)."""
    lost_messages: int = 0
    """Messages Redis lost after accepting them (sequence gaps: eviction, a failover
    without persistence, a counter gone back that a thread's next enqueue found), found
    by workers or in queued threads now."""
    lost_unverified: int = 0
    """Gaps in queued threads' numbering that no worker has checked against the backend
    yet (a Redis gone back in time; the thread's next enqueue went on past them): lost,
    unless they were stored before Redis lost them. The worker that takes the thread
    counts in ``lost_messages`` only those the backend lacks."""
    redis_lost_data_at: float | None = None
    """Unix time a worker last found that Redis had lost a shard's data (its marker gone:
    a restart without persistence, a flush), within the last week: what was queued there
    before then is lost, and not in ``lost_messages`` (nothing is left to count)."""
    late_copies: int = 0
    """Copies of stored messages that calls committing late made (a backend that ignores
    idempotency keys, or a worker paused past its lease), found and repaired: deleted,
    or on Zep marked (``afterthought_copy_of``: skipped by every read of history, still
    in Zep's own listing of the thread) with the episode Zep's graph made of it deleted."""
    late_watched: int = 0
    """Backend threads read back about once a minute for such copies, until no call of
    theirs can commit any more (``late_commit_seconds``)."""
    pause: PauseStatus
    workers: list[WorkerStatus] = Field(default_factory=list)
    """Live worker processes (their health reports have not expired)."""
    synthesis: SynthesisStatus
    redis: RedisStatus | None = None
    """The server's memory and persistence settings, as far as it tells."""
    forgets: ForgetStatus = ForgetStatus(pending=0, oldest_age_seconds=None)
    local_stores: int = 0
    """Local stores (SQLite files) the workers announced lately: more than one splits the
    deployment's memory between files."""
    redis_shards: int = 0
    """The virtual shards the queue is laid out in; 0: the flat layout of one Redis."""
    spooled: int = 0
    """Messages waiting in the spool of the machine ``afterthought status`` runs on (what
    its agents could not queue; its workers replay them); 0 in a worker's gauges."""
    tombstone_keys_unchecked: int = 0
    """Tombstone keys used before that the key the workers last started with does not check
    (not in its ``tombstone_previous_keys``): the facts forgotten under them may be written
    again (see README, "Forgetting")."""
    shards: list[ShardStatus] = Field(default_factory=list)
    """Each shard's part of ``queue``, ``dead_letters`` and ``lost_messages`` (which are
    their totals); empty in the flat layout."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def problems(self) -> list[str]:
        """What needs an operator, by stable name: ``no_workers``, ``paused``,
        ``stranded_threads``, ``dead_letters``, ``lost_messages``, ``redis_lost_data``
        (Redis came back without the data it held, in the last week), ``eviction_policy``
        (Redis may evict queued messages), ``redis_full``, ``forget_stuck`` (a forget
        pending for over an hour), ``split_store`` (workers write different stores),
        ``tombstone_key_changed`` (tombstones of an earlier key block nothing now).
        Empty: ``status`` exits 0."""
        policy = self.redis.maxmemory_policy if self.redis else None
        found = {
            "no_workers": not self.workers,
            "paused": self.pause.paused,
            "stranded_threads": self.queue.stranded > 0,
            "dead_letters": self.dead_letters > 0,
            "lost_messages": self.lost_messages > 0,
            "redis_lost_data": self.redis_lost_data_at is not None,
            "eviction_policy": policy is not None and policy != "noeviction",
            "redis_full": self.redis is not None and self.redis.full,
            "forget_stuck": (self.forgets.oldest_age_seconds or 0) > FORGET_STUCK_SECONDS,
            "split_store": self.local_stores > 1,
            "tombstone_key_changed": self.tombstone_keys_unchecked > 0,
        }
        return [name for name, present in found.items() if present]


def _health_fields(line: bytes | None) -> dict[str, int]:
    """arq's health line: ``<time> j_complete=1 j_failed=0 ... queued=3``."""
    fields = {}
    for word in (line or b"").decode(errors="replace").split():
        name, _, value = word.partition("=")
        if name.startswith("j_") and value.isdigit():
            fields[f"jobs_{name[2:]}"] = int(value)
    return fields


async def snapshot(
    redis: aioredis.Redis, settings: Settings, *, jobs: aioredis.Redis | None = None
) -> Status:
    """The deployment now: a handful of round trips, plus one per thousand queued threads
    of a shard. ``jobs``: arq's Redis, when it is another one (``arq_redis_url``)."""
    keys = Keys.of(settings)
    jobs = jobs or redis
    now = time.time()
    now_ms = int(now * 1000)

    async with redis.pipeline(transaction=False) as pipe:
        for shard in keys.shard_ids:
            pipe.get(keys.depth(shard))
            pipe.zrange(keys.ready(shard), 0, -1, withscores=True)
            pipe.llen(keys.dead(shard))
            pipe.get(keys.lost(shard))
        for shard in keys.shard_ids:
            pipe.hvals(keys.data_lost(shard))
        pipe.get(keys.paused)
        pipe.pttl(keys.paused)
        pipe.get(keys.rate_limit)
        pipe.hvals(keys.forgets)
        pipe.hgetall(keys.stores)
        pipe.zcard(keys.late_repaired)
        pipe.zcard(keys.late)
        pipe.hgetall(keys.tombstone_keys)
        replies = await pipe.execute()
    per_shard = len(keys.shard_ids) * 4
    lost_at = [int(at) for found in replies[per_shard:-8] for at in found]
    paused, paused_ttl, rate, forgets, stores, late_copies, late_watched = replies[-8:-1]
    tombstone_keys = replies[-1]
    arq_queue = await jobs.zrangebyscore(keys.queue, "-inf", "+inf", withscores=True)

    queue = ThreadQueue(redis, settings)
    shards = await asyncio.gather(
        *(
            _shard(queue, settings, shard, replies[i * 4 : i * 4 + 4], now_ms)
            for i, shard in enumerate(keys.shard_ids)
        )
    )
    oldest = min((at for _, at in shards if at is not None), default=None)

    pause = PauseStatus(paused=paused is not None)
    if paused is not None:
        pause.reason = str(json.loads(paused).get("reason", "")) or None
        pause.resumes_in_seconds = max(0.0, paused_ttl / 1000) if paused_ttl > 0 else None
    if rate is not None and int(rate) > now_ms:
        pause.rate_limited_for_seconds = (int(rate) - now_ms) / 1000

    synth_prefix = keys.job_id("synth", "").encode()
    synth_due = [score for job, score in arq_queue if job.startswith(synth_prefix)]
    overdue = [now_ms - score for score in synth_due if score <= now_ms]

    def total(field: str) -> int:
        return sum(int(getattr(part, field)) for part, _ in shards)

    return Status(
        prefix=settings.key_prefix,
        at=now,
        queue=QueueStatus(
            messages=total("messages"),
            threads=total("threads"),
            due=total("due"),
            leased=total("leased"),
            deferred=total("deferred"),
            stranded=total("stranded"),
            oldest_age_seconds=None if oldest is None else max(0.0, (now_ms - oldest) / 1000),
            jobs_waiting=len(arq_queue),
        ),
        dead_letters=total("dead_letters"),
        lost_messages=total("lost_messages"),
        lost_unverified=total("lost_unverified"),
        redis_lost_data_at=max(lost_at) / 1000 if lost_at else None,
        late_copies=int(late_copies or 0),
        late_watched=int(late_watched),
        pause=pause,
        workers=await _workers(jobs, keys),
        synthesis=SynthesisStatus(
            pending_users=len(synth_due),
            lag_seconds=(max(overdue) / 1000 if overdue else 0.0) if synth_due else None,
        ),
        redis=await redis_status(redis),
        forgets=_forgets(forgets, now_ms),
        local_stores=len(announced_stores(stores, now=now)),
        redis_shards=settings.redis_shards,
        tombstone_keys_unchecked=len(unchecked(tombstone_keys)),
        shards=[part for part, _ in shards] if settings.redis_shards else [],
    )


async def _shard(
    queue: ThreadQueue, settings: Settings, shard: int | None, replies: list[Any], now_ms: int
) -> tuple[ShardStatus, int | None]:
    """One shard's counts, from its depth, ready set, dead and lost replies; and when its
    oldest queued message was queued."""
    depth, ready, dead, lost = replies
    lease_ms = int(settings.lease_seconds * 1000)
    due = leased = deferred = stranded = missing = 0
    oldest: int | None = None
    for start in range(0, len(ready), CHUNK):
        chunk = ready[start : start + CHUNK]
        states = await queue.thread_states([m.decode() for m, _ in chunk])
        for (_, score), state in zip(chunk, states, strict=True):
            if state.leased:
                leased += 1
            elif score <= now_ms:
                due += 1
                stranded += now_ms - score > lease_ms
            else:
                deferred += 1
            missing += state.missing
            if state.head_queued_ms is not None:
                at = state.head_queued_ms
                oldest = at if oldest is None else min(oldest, at)
    part = ShardStatus(
        shard=shard or 0,
        messages=int(depth or 0),
        threads=len(ready),
        due=due,
        leased=leased,
        deferred=deferred,
        stranded=stranded,
        dead_letters=int(dead),
        lost_messages=int(lost or 0),
        lost_unverified=missing,
    )
    return part, oldest


def _forgets(records: list[bytes], now_ms: int) -> ForgetStatus:
    since = [int(json.loads(r).get("since", now_ms)) for r in records]
    return ForgetStatus(
        pending=len(since),
        oldest_age_seconds=max(0.0, (now_ms - min(since)) / 1000) if since else None,
    )


async def redis_status(redis: aioredis.Redis) -> RedisStatus:
    """What the server says of its memory and persistence (managed services may refuse
    CONFIG: those fields are then None). On a cluster, its masters' worst: a policy that
    evicts, no persistence, and the memory of the master nearest its limit."""
    if not is_cluster(redis):
        return await _server_status(redis.info, redis.config_get)
    cluster = cast(RedisCluster, redis)
    await cluster.initialize()
    found = [
        await _server_status(
            functools.partial(cluster.info, target_nodes=node),
            functools.partial(cluster.config_get, target_nodes=node),
        )
        for node in cluster.get_primaries()
    ]
    evicting = [f.maxmemory_policy for f in found if f.maxmemory_policy != "noeviction"]
    weakest = [f.persistence for f in found if f.persistence in (None, "none")]
    fullest = max(found, key=lambda f: (f.used_memory or 0) / (f.maxmemory or float("inf")))
    return RedisStatus(
        maxmemory_policy=(evicting or [found[0].maxmemory_policy])[0],
        persistence=(weakest or [found[0].persistence])[0],
        used_memory=fullest.used_memory,
        maxmemory=fullest.maxmemory,
    )


async def _server_status(
    info: Callable[[], Awaitable[dict[str, Any]]],
    config_get: Callable[[str], Awaitable[dict[str, Any]]],
) -> RedisStatus:
    found = await info()
    policy = found.get("maxmemory_policy")
    aof = bool(found.get("aof_enabled"))
    try:
        save = (await config_get("save")).get("save")
    except RedisError:
        save = None
    if save is None:  # unknown: only AOF can be told from INFO
        persistence = "aof" if aof else None
    else:
        on = [name for name, enabled in (("aof", aof), ("rdb", bool(save))) if enabled]
        persistence = "+".join(on) or "none"
    return RedisStatus(
        maxmemory_policy=str(policy) if policy is not None else None,
        persistence=persistence,
        used_memory=_int(found.get("used_memory")),
        maxmemory=_int(found.get("maxmemory")),
    )


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else None


async def _workers(redis: aioredis.Redis, keys: Keys) -> list[WorkerStatus]:
    found = [k async for k in redis.scan_iter(match=keys.health("*"), count=1000)]
    if not found:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for key in found:
            pipe.get(key)
            pipe.pttl(key)
        replies = await pipe.execute()
    workers = []
    cut = len(keys.health(""))
    expiry_ms = (HEALTH_INTERVAL_SECONDS + 1) * 1000
    for key, line, ttl in zip(found, replies[::2], replies[1::2], strict=True):
        if line is None or ttl < 0:
            continue  # expired between SCAN and GET
        workers.append(
            WorkerStatus(
                id=key.decode()[cut:],
                last_seen_seconds=max(0.0, (expiry_ms - ttl) / 1000),
                **_health_fields(line),
            )
        )
    return sorted(workers, key=lambda w: w.id)
