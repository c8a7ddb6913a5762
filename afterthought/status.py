"""A deployment's state, read from Redis alone: what ``afterthought status`` prints and
what the worker exports as gauges. Counts, ages and ids only, never content.

The JSON shape is versioned (``version``); fields are added, never renamed or dropped."""

from __future__ import annotations

import json
import time

import redis.asyncio as aioredis
from pydantic import BaseModel, Field, computed_field

from afterthought.keys import Keys
from afterthought.settings import Settings

#: Bumped only if a field changes meaning or goes away.
STATUS_VERSION = 1
#: How often each worker reports its health (arq's health line); a report expires a second
#: after the next one is due.
HEALTH_INTERVAL_SECONDS = 10
# Per thread (KEYS: lease, pending, lease, pending, ...): is it leased, and when was its
# head queued (-1: nothing queued, or an item from before ``queued_ms``). Read here, so
# the payloads themselves, up to a megabyte each, never cross the wire.
THREADS_LUA = """
local out = {}
for i = 1, #KEYS, 2 do
  out[#out + 1] = redis.call('EXISTS', KEYS[i])
  local head = redis.call('LINDEX', KEYS[i + 1], 0)
  local at = head and string.match(head, '^{"seq":%d+,"epoch":%d+,"queued_ms":(%d+),')
  out[#out + 1] = tonumber(at or '-1')
end
return out
"""
#: Threads read per script call.
CHUNK = 1000


class QueueStatus(BaseModel):
    messages: int
    """Messages queued across all threads (the global cap counts these)."""
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
    oldest_age_seconds: float | None
    """How long the oldest queued message has waited; None when the queue is empty."""
    jobs_waiting: int
    """arq jobs queued (flush, synthesis, crons), including deferred ones."""


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


class SynthesisStatus(BaseModel):
    pending_users: int
    """Users with a synthesis job queued (debounced after their last message)."""
    lag_seconds: float | None
    """How long the most overdue of those jobs has been due; None when none is queued."""


class Status(BaseModel):
    version: int = STATUS_VERSION
    prefix: str
    """The deployment's key prefix."""
    at: float
    """Unix time of the snapshot."""
    queue: QueueStatus
    dead_letters: int
    """Items the workers gave up on (``afterthought dlq list``)."""
    pause: PauseStatus
    workers: list[WorkerStatus] = Field(default_factory=list)
    """Live worker processes (their health reports have not expired)."""
    synthesis: SynthesisStatus

    @computed_field  # type: ignore[prop-decorator]
    @property
    def problems(self) -> list[str]:
        """What needs an operator, by stable name: ``no_workers``, ``paused``,
        ``stranded_threads``, ``dead_letters``. Empty: ``status`` exits 0."""
        found = {
            "no_workers": not self.workers,
            "paused": self.pause.paused,
            "stranded_threads": self.queue.stranded > 0,
            "dead_letters": self.dead_letters > 0,
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


async def snapshot(redis: aioredis.Redis, settings: Settings) -> Status:
    """The deployment now: a handful of round trips, plus one per thousand queued threads."""
    keys = Keys(settings.key_prefix)
    now = time.time()
    now_ms = int(now * 1000)
    lease_ms = int(settings.lease_seconds * 1000)

    async with redis.pipeline(transaction=False) as pipe:
        pipe.get(keys.depth)
        pipe.zrange(keys.ready, 0, -1, withscores=True)
        pipe.llen(keys.dead)
        pipe.get(keys.paused)
        pipe.pttl(keys.paused)
        pipe.get(keys.rate_limit)
        pipe.zrangebyscore(keys.queue, "-inf", "+inf", withscores=True)
        depth, ready, dead, paused, paused_ttl, rate, arq_queue = await pipe.execute()

    due = leased = deferred = stranded = 0
    oldest: int | None = None
    heads = redis.register_script(THREADS_LUA)
    for start in range(0, len(ready), CHUNK):
        chunk = ready[start : start + CHUNK]
        thread_keys = [(keys.lease(m.decode()), keys.pending(m.decode())) for m, _ in chunk]
        replies = await heads(keys=[k for pair in thread_keys for k in pair])
        for (_, score), held, queued_ms in zip(chunk, replies[::2], replies[1::2], strict=True):
            if held:
                leased += 1
            elif score <= now_ms:
                due += 1
                stranded += now_ms - score > lease_ms
            else:
                deferred += 1
            if queued_ms >= 0:
                oldest = queued_ms if oldest is None else min(oldest, queued_ms)

    pause = PauseStatus(paused=paused is not None)
    if paused is not None:
        pause.reason = str(json.loads(paused).get("reason", "")) or None
        pause.resumes_in_seconds = max(0.0, paused_ttl / 1000) if paused_ttl > 0 else None
    if rate is not None and int(rate) > now_ms:
        pause.rate_limited_for_seconds = (int(rate) - now_ms) / 1000

    synth_prefix = keys.job_id("synth", "").encode()
    synth_due = [score for job, score in arq_queue if job.startswith(synth_prefix)]
    overdue = [now_ms - score for score in synth_due if score <= now_ms]

    return Status(
        prefix=settings.key_prefix,
        at=now,
        queue=QueueStatus(
            messages=int(depth or 0),
            threads=len(ready),
            due=due,
            leased=leased,
            deferred=deferred,
            stranded=stranded,
            oldest_age_seconds=None if oldest is None else max(0.0, (now_ms - oldest) / 1000),
            jobs_waiting=len(arq_queue),
        ),
        dead_letters=int(dead),
        pause=pause,
        workers=await _workers(redis, keys),
        synthesis=SynthesisStatus(
            pending_users=len(synth_due),
            lag_seconds=(max(overdue) / 1000 if overdue else 0.0) if synth_due else None,
        ),
    )


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
