"""Drains ready threads: claim each under a lease, send its queued messages in order,
acknowledge by sequence number. Every multi-key change is one Lua script."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_random_exponential

from afterthought.audit import AuditLog, Entry
from afterthought.backend import (
    BackendError,
    MemoryBackend,
    StoredMessage,
    UserRef,
    ignored_roles,
)
from afterthought.batching import Call, missing, pack, parts
from afterthought.context_cache import ContextCache, now_version
from afterthought.contract import MalformedPayload, QueuedMessage, split_content
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.settings import Settings
from worker import metrics
from worker.forget import Forgetter
from worker.pacing import MAX_IN_JOB_WAIT, Pacing

log = logging.getLogger("afterthought.worker")

# Take the thread if nobody holds it; its ready score moves a lease out, so if this worker
# dies the thread becomes due again by itself (W4) without any recovery scan.
CLAIM_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[4])
  return 1
end
return 0
"""

# The holder's heartbeat: keep the lease and keep the thread from falling due.
RENEW_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[4])
return 1
"""

# Record the batch about to be sent, so a retry after a crash rebuilds exactly it.
BEGIN_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], 'inflight', ARGV[2])
return 1
"""

# Pop every message up to the sent sequence number and advance the high-water mark.
ACK_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local last = tonumber(ARGV[2])
local popped = 0
while true do
  local head = redis.call('LINDEX', KEYS[2], 0)
  if not head then break end
  local seq = tonumber(string.match(head, '^{"seq":(%d+)'))
  if seq == nil or seq > last then break end
  redis.call('LPOP', KEYS[2])
  popped = popped + 1
end
if last > tonumber(redis.call('HGET', KEYS[3], 'persisted') or '0') then
  redis.call('HSET', KEYS[3], 'persisted', last)
end
redis.call('HDEL', KEYS[3], 'inflight', 'attempts')
if redis.call('DECRBY', KEYS[4], popped) < 0 then redis.call('SET', KEYS[4], 0) end
return redis.call('LLEN', KEYS[2])
"""

# Move the first N queued items to the dead letters: a JSON header line, then the item's
# bytes untouched (a malformed item may not even be UTF-8).
DEAD_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local moved = 0
for i = 1, tonumber(ARGV[2]) do
  local item = redis.call('LPOP', KEYS[2])
  if not item then break end
  redis.call('RPUSH', KEYS[3], cjson.encode({
    thread = ARGV[3], reason = ARGV[4], attempts = tonumber(ARGV[5]), at = tonumber(ARGV[6])
  }) .. '\\n' .. item)
  moved = moved + 1
end
redis.call('HDEL', KEYS[4], 'inflight', 'attempts')
if redis.call('DECRBY', KEYS[5], moved) < 0 then redis.call('SET', KEYS[5], 0) end
return redis.call('LLEN', KEYS[2])
"""

# Give the thread back: ready again at next_ms if anything is still queued.
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('LLEN', KEYS[2]) > 0 then
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
else
  redis.call('ZREM', KEYS[3], ARGV[2])
end
return 1
"""

#: In-job attempts for a transient failure before the thread is deferred.
IN_JOB_ATTEMPTS = 3
#: Deferred retries back off up to this many seconds.
MAX_DEFER_SECONDS = 300.0
#: A too-large reply halves the parts down to this size before giving up.
MIN_PART_CHARS = 100
#: How far back a replayed session is reconciled against the backend.
REPLAY_LOOKBACK = 5000
#: How often a job looks for more due threads while it has free slots.
CLAIM_INTERVAL = 0.05


def _now_ms() -> int:
    return int(time.time() * 1000)


def _wait(state: RetryCallState) -> float:
    """Full jitter, but never sooner than the server's ``Retry-After``."""
    backoff = wait_random_exponential(multiplier=0.2, max=5)(state)
    exc = state.outcome.exception() if state.outcome else None
    retry_after = exc.retry_after if isinstance(exc, BackendError) else None
    return max(backoff, retry_after or 0.0)


def _retry_in_job(exc: BaseException) -> bool:
    """Transient, and not asking to wait longer than a job should sleep: a long
    ``Retry-After`` defers the thread instead, freeing the slot."""
    return (
        isinstance(exc, BackendError)
        and exc.transient
        and (exc.retry_after or 0.0) <= MAX_IN_JOB_WAIT
    )


class _LeaseLost(Exception):
    """Another worker holds the thread now; stop touching it."""


@dataclass
class _History:
    """A replayed thread's stored messages: read once per lease, then kept up to date with
    each call that succeeds, so reconciling a long replay is not quadratic."""

    stored: list[StoredMessage] | None = None

    def sent(self, call: Call) -> None:
        """Record what a call that succeeded stored (once the thread has been read)."""
        if self.stored is not None:
            self.stored.extend(
                StoredMessage(uuid="", role=m.role or "", content=m.content, metadata=m.metadata)
                for m in call.messages
            )


@dataclass
class _Sending:
    """One batch of messages on its way to one thread."""

    thread_uuid: str
    stats: Counter[str]
    history: _History
    reconcile: bool
    """Check the backend first: an earlier attempt may have stored part of it."""
    fresh: bool
    """Read the backend itself, not ``history``: a call may have landed unseen."""
    replay: bool
    """A replayed session: reconciled by key and by role and text."""


class Flusher:
    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        backend: MemoryBackend,
        *,
        after_flush: Callable[[QueuedMessage], Awaitable[None]] | None = None,
    ) -> None:
        """``after_flush`` runs after each batch of messages reached the backend."""
        self.after_flush = after_flush
        self.settings = settings
        self.redis = redis
        self.backend = backend
        self.keys = Keys(settings.key_prefix)
        self.registry = IdentityRegistry(redis, settings)
        self.pacing = Pacing(redis, self.keys, pause_seconds=settings.pause_seconds)
        self._claim = redis.register_script(CLAIM_LUA)
        self._renew = redis.register_script(RENEW_LUA)
        self._begin = redis.register_script(BEGIN_LUA)
        self._ack = redis.register_script(ACK_LUA)
        self._dead = redis.register_script(DEAD_LUA)
        self._release = redis.register_script(RELEASE_LUA)
        self.ignore_roles = ignored_roles(settings, backend)
        self.cache = ContextCache(settings)
        self.forgetter = Forgetter(settings, redis, backend)
        self.audit = AuditLog(redis, settings)

    @property
    def lease_ms(self) -> int:
        return int(self.settings.lease_seconds * 1000)

    async def drain(self, *, budget: float) -> Counter[str]:
        """Flush due threads, ``worker_concurrency`` at a time, claiming more as slots free
        up, until none is due or ``budget`` seconds have passed."""
        stats: Counter[str] = Counter()
        end = time.monotonic() + budget
        token = secrets.token_hex(8)
        running: set[asyncio.Task[Counter[str]]] = set()
        while True:
            free = self.settings.worker_concurrency - len(running)
            if free > 0 and time.monotonic() < end and not await self.pacing.paused():
                claimed = await self.claim(token, limit=free)
                running |= {
                    asyncio.create_task(self.flush_thread(tk, token, until=end)) for tk in claimed
                }
                if not claimed and not running:
                    break
            elif not running:
                break
            done, running = await asyncio.wait(
                running, timeout=CLAIM_INTERVAL, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task.exception() is None:
                    stats.update(task.result())
                else:  # e.g. Redis failed at release: the lease expires, the thread recovers
                    stats["errors"] += 1
                    log.error("flush task failed error=%s", type(task.exception()).__name__)
        return stats

    async def claim(self, token: str, *, limit: int) -> list[str]:
        now = _now_ms()
        due = await self.redis.zrangebyscore(self.keys.ready, "-inf", now, start=0, num=limit)
        if not due:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for raw in due:
                tk = raw.decode()
                await self._claim(
                    keys=[self.keys.lease(tk), self.keys.ready],
                    args=[token, self.lease_ms, now + self.lease_ms, tk],
                    client=pipe,
                )
            won = await pipe.execute()
        return [raw.decode() for raw, ok in zip(due, won, strict=True) if ok]

    async def flush_thread(
        self, tk: str, token: str, *, until: float = float("inf")
    ) -> Counter[str]:
        """Send what is queued on one claimed thread, batch after batch, until it is empty
        or the job's time is up (``until``, monotonic); always gives the lease back."""
        stats: Counter[str] = Counter()
        next_ms = _now_ms()
        heartbeat = asyncio.create_task(self._heartbeat(tk, token))
        history = _History()
        try:
            while await self._flush_batch(tk, token, stats, history) and time.monotonic() < until:
                pass
        except _LeaseLost:
            stats["lease_lost"] += 1
            log.warning("lease lost thread=%s", tk)
        except BackendError as exc:
            next_ms = await self._failed(tk, token, exc, stats)
        except Exception as exc:  # never lose the lease to a bug: defer and say so
            stats["errors"] += 1
            next_ms += 5000
            # The type only: an exception's text may quote content. The trace is for DEBUG.
            log.error("flush failed thread=%s error=%s", tk, type(exc).__name__)
            log.debug("flush failure trace thread=%s", tk, exc_info=True)
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            await self._release(
                keys=[self.keys.lease(tk), self.keys.pending(tk), self.keys.ready],
                args=[token, tk, next_ms],
            )
        return stats

    async def _heartbeat(self, tk: str, token: str) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_seconds / 3)
            held = await self._renew(
                keys=[self.keys.lease(tk), self.keys.ready],
                args=[token, self.lease_ms, _now_ms() + self.lease_ms, tk],
            )
            if not held:
                return

    async def _failed(self, tk: str, token: str, exc: BackendError, stats: Counter[str]) -> int:
        """Classify a failure the job could not absorb; returns when to try the thread next."""
        now = _now_ms()
        if exc.kind == "unauthorized":
            await self.pacing.pause(exc)
            stats["paused"] += 1
            return now + int(self.settings.pause_seconds * 1000)
        attempts = await self.redis.hincrby(self.keys.thread(tk), "attempts", 1)
        if exc.transient:
            delay = min(MAX_DEFER_SECONDS, 2.0**attempts) * random.uniform(0.5, 1.0)
            delay = max(delay, exc.retry_after or 0.0)
            stats["deferred"] += 1
            metrics.RETRIES.labels("deferred").inc()
            log.warning(
                "flush deferred thread=%s error=%s attempts=%d in=%.1fs", tk, exc, attempts, delay
            )
            return now + int(delay * 1000)
        count = await self._pending_batch_size(tk)
        await self._dead_letter(tk, token, count, reason=str(exc), attempts=attempts)
        stats["dead"] += count
        return now

    async def _flush_batch(
        self, tk: str, token: str, stats: Counter[str], history: _History
    ) -> bool:
        """One batch from the head of the thread; False when nothing is left."""
        raw_items = await self.redis.lrange(self.keys.pending(tk), 0, self.settings.batch_size - 1)
        if not raw_items:
            return False
        inflight = await self.redis.hget(self.keys.thread(tk), "inflight")
        try:
            batch = self._decode_head(raw_items, inflight)
        except MalformedPayload as exc:
            await self._dead_letter(tk, token, 1, reason=f"malformed: {exc}", attempts=0)
            stats["dead"] += 1
            return True
        first, last = batch[0].seq or 0, batch[-1].seq or 0
        epoch = int(await self.redis.get(self.keys.epoch(batch[0].app, batch[0].user_id)) or 0)
        forgotten = [m for m in batch if m.epoch < epoch]
        if forgotten:  # queued before the user was forgotten: dropped, never sent
            if await self._acknowledge(tk, token, forgotten[-1].seq or 0) == -1:
                raise _LeaseLost
            stats["forgotten"] += len(forgotten)
            await self._audit(tk, forgotten, op="add_message", outcome="forgotten")
            return True
        if inflight is None:
            ok = await self._begin(
                keys=[self.keys.lease(tk), self.keys.thread(tk)],
                args=[token, f"{first}:{last}"],
            )
            if not ok:
                raise _LeaseLost
        context = None
        if batch[0].kind == "message":
            user, thread_uuid = await self._identity(batch[0])
            replay = any(m.replay for m in batch)
            sending = _Sending(
                thread_uuid=thread_uuid,
                stats=stats,
                history=history,
                reconcile=inflight is not None or replay,
                fresh=inflight is not None,
                replay=replay,
            )
            context = await self._send_resplitting(sending, batch)
            template = self.settings.context_template_uuid
            if template and user.graph_uuid:  # return_context knows no templates
                said = " ".join(m.content for m in batch if m.role == "user")
                context = await self.backend.get_context(
                    user=user,
                    query=said,
                    max_chars=self.settings.context_max_chars,
                    timeout=self.settings.backend_timeout,
                    template_uuid=template,
                )
        else:
            await self._apply_memory_changes(batch, stats)
        left = await self._acknowledge(tk, token, last)
        if left == -1:
            raise _LeaseLost
        stats["messages"] += len(batch)
        log.info("flushed thread=%s seq=%s..%s", tk, first, last)
        if batch[0].kind == "message":
            await self._audit(tk, batch, op="add_message", outcome="sent")
        if self.after_flush is not None and batch[0].kind == "message":
            await self.after_flush(batch[0])
        if context is not None:  # R2: the next turn reads what Zep now knows
            head = batch[0]
            await self.cache.write(
                self.redis,
                app=head.app,
                user_id=head.user_id,
                session_id=head.session_id,
                block=context,
                version=now_version(),
            )
        return bool(left)

    async def _audit(
        self, tk: str, items: Sequence[QueuedMessage], *, op: str, outcome: str
    ) -> None:
        await self.audit.record(
            [
                Entry(
                    job="flush",
                    op=op,
                    user=digest(m.app, m.user_id),
                    thread=tk,
                    key=m.key,
                    content=m.content,
                    trust=m.trust or m.role or "",
                    outcome=outcome,
                )
                for m in items
            ]
        )

    async def _acknowledge(self, tk: str, token: str, last: int) -> int:
        """Pop what is done up to ``last``; the messages left, or -1 if the lease is lost."""
        return int(
            await self._ack(
                keys=[
                    self.keys.lease(tk),
                    self.keys.pending(tk),
                    self.keys.thread(tk),
                    self.keys.depth,
                ],
                args=[token, last],
            )
        )

    def _decode_head(
        self, raw_items: Sequence[bytes], inflight: bytes | None
    ) -> list[QueuedMessage]:
        """The batch at the head: the recorded in-flight one, else whole messages that fit."""
        messages: list[QueuedMessage] = []
        for raw in raw_items:
            try:
                messages.append(QueuedMessage.decode(raw))
            except MalformedPayload:
                if messages:  # send what precedes it; the bad one is dead-lettered next
                    break
                raise
        if any(m.thread_key != messages[0].thread_key for m in messages):
            raise MalformedPayload("payload of another thread")
        if inflight is not None:
            first, last = (int(x) for x in inflight.decode().split(":"))
            pinned = [m for m in messages if m.seq is not None and first <= m.seq <= last]
            if pinned and pinned[0] is messages[0]:
                return pinned
        return self._fit(messages)

    def _fit(self, messages: list[QueuedMessage]) -> list[QueuedMessage]:
        """Whole messages of one kind whose parts fit one call; a lone huge one goes alone."""
        limit, size = self.settings.batch_size, 0
        fitted: list[QueuedMessage] = []
        for m in messages:
            if m.kind != messages[0].kind:
                break
            parts = len(split_content(m.content, self.settings.max_message_chars))
            if fitted and size + parts > limit:
                break
            fitted.append(m)
            size += parts
        return fitted

    async def _send_resplitting(self, sending: _Sending, batch: list[QueuedMessage]) -> str | None:
        """Send the batch; when the backend says too large, send fewer messages per call,
        then smaller parts, before giving up (413 / 400 too long). Returns the context
        block the last call brought back."""
        per_call, part_chars = self.settings.batch_size, self.settings.max_message_chars
        while True:
            calls = pack(parts(batch, part_chars), per_call)
            try:
                return await self._send_all(sending, calls)
            except BackendError as exc:
                if exc.kind != "too_large":
                    raise
                if per_call > 1:
                    per_call = max(1, per_call // 2)
                elif part_chars // 2 >= MIN_PART_CHARS:
                    part_chars //= 2
                else:
                    raise
                sending.reconcile = True  # the calls before the refused one were stored
                sending.stats["resplit"] += 1
                log.warning(
                    "too large: resending thread_uuid=%s per_call=%d part_chars=%d",
                    sending.thread_uuid,
                    per_call,
                    part_chars,
                )

    async def _send_all(self, sending: _Sending, calls: list[Call]) -> str | None:
        """Send with in-job retries. Whenever an earlier attempt may have reached the
        backend (a crash, a timeout, a lost reply) or the batch replays a session, send
        only what it lacks (W2): this holds whether or not the backend honours keys."""
        templated = self.settings.context_template_uuid is not None
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_retry_in_job),
            wait=_wait,
            stop=stop_after_attempt(IN_JOB_ATTEMPTS),
            reraise=True,
        ):
            with attempt:
                todo = calls
                retrying = attempt.retry_state.attempt_number > 1
                if retrying:
                    metrics.RETRIES.labels("in_job").inc()
                if sending.reconcile or retrying:
                    todo = await self._missing(sending, calls, fresh=sending.fresh or retrying)
                context = None
                for call in todo:
                    await self.pacing.wait()
                    try:
                        context = await self.backend.add_messages(
                            thread_uuid=sending.thread_uuid,
                            messages=call.messages,
                            idempotency_key=call.idempotency_key,
                            ignore_roles=self.ignore_roles,
                            return_context=call is todo[-1] and not templated,
                        )
                    except BackendError as exc:
                        if exc.kind == "rate_limited":
                            await self.pacing.hold(exc.retry_after or 1.0)
                        raise
                    sending.history.sent(call)
                    sending.stats["calls"] += 1
                    sending.stats["parts"] += len(call.messages)
                    metrics.BATCH_SIZE.observe(len(call.messages))
                return context
        return None

    async def _missing(self, sending: _Sending, calls: list[Call], *, fresh: bool) -> list[Call]:
        """What the backend lacks of ``calls``; a replay reads the thread once per lease
        (``fresh``: again, as a call may have landed unseen)."""
        wanted = [m for c in calls for m in c.messages]
        history, replay = sending.history, sending.replay
        stored = history.stored if replay and not fresh else None
        if stored is None:
            limit = REPLAY_LOOKBACK if replay else len(wanted) + 30
            stored = await self.backend.recent_messages(
                thread_uuid=sending.thread_uuid, limit=limit
            )
            if replay:
                history.stored = stored
        per_call = max(len(c.messages) for c in calls)  # as resplitting left it
        return pack(missing(wanted, stored, replay=replay), per_call)

    async def _apply_memory_changes(self, batch: list[QueuedMessage], stats: Counter[str]) -> None:
        """Facts to store and memories to forget, in queue order. Both are idempotent by
        key at the backend; the user's cached block is dropped so the next turn rereads."""
        head = batch[0]
        if head.zep_graph_uuid:
            user = UserRef(head.zep_user_uuid or "", head.zep_graph_uuid)
        else:
            user, _ = await self.registry.ensure_user(
                self.backend, app=head.app, user_id=head.user_id
            )
        for item in batch:
            await self.pacing.wait()
            if item.kind == "fact":
                await self.backend.add_fact(
                    user=user,
                    text=item.content,
                    key=item.key,
                    trust=item.trust or "app",
                    reference_time=item.reference_time,
                )
            else:
                await self.forgetter.forget_fact(
                    app=item.app, user_id=item.user_id, fact_uuid=item.content
                )
            stats[item.kind] += 1
        await self.cache.delete(self.redis, app=head.app, user_id=head.user_id)
        await self._audit(
            head.thread_key,
            [i for i in batch if i.kind == "fact"],
            op="write_fact",
            outcome="written",
        )
        await self._audit(
            head.thread_key,
            [i for i in batch if i.kind == "forget"],
            op="delete_fact",
            outcome="deleted",
        )

    async def _identity(self, message: QueuedMessage) -> tuple[UserRef, str]:
        if message.zep_thread_uuid:  # pinned by the application: nothing to provision
            user = UserRef(message.zep_user_uuid or "", message.zep_graph_uuid or "")
            return user, message.zep_thread_uuid
        if self.settings.provision_on_worker:
            return await self.registry.ensure(
                self.backend,
                app=message.app,
                user_id=message.user_id,
                session_id=message.session_id,
            )
        known = await self.registry.lookup(
            app=message.app, user_id=message.user_id, session_id=message.session_id
        )
        if known.user is None or known.thread_uuid is None:
            raise BackendError("not_found", code="unprovisioned")
        return known.user, known.thread_uuid

    async def _pending_batch_size(self, tk: str) -> int:
        raw_items = await self.redis.lrange(self.keys.pending(tk), 0, self.settings.batch_size - 1)
        inflight = await self.redis.hget(self.keys.thread(tk), "inflight")
        try:
            return len(self._decode_head(raw_items, inflight))
        except MalformedPayload:
            return 1

    async def _dead_letter(
        self, tk: str, token: str, count: int, *, reason: str, attempts: int
    ) -> None:
        await self._dead(
            keys=[
                self.keys.lease(tk),
                self.keys.pending(tk),
                self.keys.dead,
                self.keys.thread(tk),
                self.keys.depth,
            ],
            args=[token, count, tk, reason, attempts, _now_ms()],
        )
        log.error("dead-lettered thread=%s messages=%d reason=%s", tk, count, reason)
        await self.audit.record(
            [Entry(job="flush", op="dead_letter", user="", thread=tk, outcome=reason)]
        )
