"""Drains ready threads: claim each under a lease, send its queued messages in order,
acknowledge by sequence number. Every multi-key change is one Lua script."""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_random_exponential

from afterthought.backend import (
    MESSAGE_KEY_FIELD,
    BackendError,
    MemoryBackend,
    OutgoingMessage,
    UserRef,
)
from afterthought.contract import MalformedPayload, QueuedMessage, split_content
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.settings import Settings

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

# Record the batch about to be sent, so a retry after a crash rebuilds exactly it.
BEGIN_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], 'inflight', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# Pop every message up to the sent sequence number and advance the high-water mark.
ACK_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local last = tonumber(ARGV[2])
while true do
  local head = redis.call('LINDEX', KEYS[2], 0)
  if not head then break end
  local seq = tonumber(string.match(head, '^{"seq":(%d+)'))
  if seq == nil or seq > last then break end
  redis.call('LPOP', KEYS[2])
end
if last > tonumber(redis.call('HGET', KEYS[3], 'persisted') or '0') then
  redis.call('HSET', KEYS[3], 'persisted', last)
end
redis.call('HDEL', KEYS[3], 'inflight', 'attempts')
return redis.call('LLEN', KEYS[2])
"""

# Move the first N queued items to the dead letters: a JSON header line, then the item's
# bytes untouched (a malformed item may not even be UTF-8).
DEAD_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
for i = 1, tonumber(ARGV[2]) do
  local item = redis.call('LPOP', KEYS[2])
  if not item then break end
  redis.call('RPUSH', KEYS[3], cjson.encode({
    thread = ARGV[3], reason = ARGV[4], attempts = tonumber(ARGV[5]), at = tonumber(ARGV[6])
  }) .. '\\n' .. item)
end
redis.call('HDEL', KEYS[4], 'inflight', 'attempts')
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


def _now_ms() -> int:
    return int(time.time() * 1000)


def _wait(state: RetryCallState) -> float:
    """Full jitter, but never sooner than the server's ``Retry-After``."""
    backoff = wait_random_exponential(multiplier=0.2, max=5)(state)
    exc = state.outcome.exception() if state.outcome else None
    retry_after = exc.retry_after if isinstance(exc, BackendError) else None
    return max(backoff, retry_after or 0.0)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, BackendError) and exc.transient


@dataclass(frozen=True, slots=True)
class _Send:
    """One backend call: up to ``batch_size`` parts, keyed by what it carries."""

    messages: list[OutgoingMessage]

    @property
    def idempotency_key(self) -> str:
        return "batch:" + digest(*(str(m.metadata[MESSAGE_KEY_FIELD]) for m in self.messages))


class Flusher:
    def __init__(self, settings: Settings, redis: aioredis.Redis, backend: MemoryBackend) -> None:
        self.settings = settings
        self.redis = redis
        self.backend = backend
        self.keys = Keys(settings.key_prefix)
        self.registry = IdentityRegistry(redis, settings)
        self._claim = redis.register_script(CLAIM_LUA)
        self._begin = redis.register_script(BEGIN_LUA)
        self._ack = redis.register_script(ACK_LUA)
        self._dead = redis.register_script(DEAD_LUA)
        self._release = redis.register_script(RELEASE_LUA)
        self.ignore_roles: tuple[str, ...] = (
            ("assistant",) if settings.memory_mode == "zep" else ("user", "assistant")
        )
        if backend.name == "local":
            self.ignore_roles = ()

    @property
    def lease_ms(self) -> int:
        return int(self.settings.lease_seconds * 1000)

    async def drain(self, *, budget: float) -> Counter[str]:
        """Flush due threads until none is left or ``budget`` seconds have passed."""
        stats: Counter[str] = Counter()
        end = time.monotonic() + budget
        while time.monotonic() < end:
            token = secrets.token_hex(8)
            claimed = await self.claim(token, limit=self.settings.worker_concurrency)
            if not claimed:
                break
            results = await asyncio.gather(*(self.flush_thread(tk, token) for tk in claimed))
            for result in results:
                stats.update(result)
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

    async def flush_thread(self, tk: str, token: str) -> Counter[str]:
        """Send everything queued on one claimed thread; always gives the lease back."""
        stats: Counter[str] = Counter()
        next_ms = _now_ms()
        try:
            while await self._flush_batch(tk, token, stats):
                pass
        except _LeaseLost:
            stats["lease_lost"] += 1
            log.warning("lease lost thread=%s", tk)
        except BackendError as exc:
            attempts = await self.redis.hincrby(self.keys.thread(tk), "attempts", 1)
            if exc.transient or exc.kind == "unauthorized":
                delay = min(MAX_DEFER_SECONDS, 2.0**attempts) * random.uniform(0.5, 1.0)
                next_ms += int(max(delay, exc.retry_after or 0.0) * 1000)
                stats["deferred"] += 1
                log.warning(
                    "flush deferred thread=%s error=%s attempts=%d in=%.1fs",
                    tk,
                    exc,
                    attempts,
                    (next_ms - _now_ms()) / 1000,
                )
            else:
                count = await self._pending_batch_size(tk)
                await self._dead_letter(tk, token, count, reason=str(exc), attempts=attempts)
                stats["dead"] += count
        except Exception as exc:  # never lose the lease to a bug: defer and say so
            stats["errors"] += 1
            next_ms += 5000
            # The type only: an exception's text may quote content. The trace is for DEBUG.
            log.error("flush failed thread=%s error=%s", tk, type(exc).__name__)
            log.debug("flush failure trace thread=%s", tk, exc_info=True)
        finally:
            await self._release(
                keys=[self.keys.lease(tk), self.keys.pending(tk), self.keys.ready],
                args=[token, tk, next_ms],
            )
        return stats

    async def _flush_batch(self, tk: str, token: str, stats: Counter[str]) -> bool:
        """One batch from the head of the thread; False when nothing is left."""
        window = self.settings.batch_size
        raw_items = await self.redis.lrange(self.keys.pending(tk), 0, window - 1)
        if not raw_items:
            return False
        inflight = await self.redis.hget(self.keys.thread(tk), "inflight")
        try:
            batch = self._decode_head(raw_items, inflight)
        except MalformedPayload as exc:
            await self._dead_letter(tk, token, 1, reason=f"malformed: {exc}", attempts=0)
            stats["dead"] += 1
            return True
        head = batch[0]
        _, thread_uuid = await self._identity(head)
        sends = self._sends(batch)
        first, last = batch[0].seq or 0, batch[-1].seq or 0
        if inflight is None:
            ok = await self._begin(
                keys=[self.keys.lease(tk), self.keys.thread(tk)],
                args=[token, f"{first}:{last}", self.lease_ms],
            )
            if not ok:
                raise _LeaseLost
        await self._send_all(thread_uuid, sends, stats, reconcile=inflight is not None)
        left = await self._ack(
            keys=[self.keys.lease(tk), self.keys.pending(tk), self.keys.thread(tk)],
            args=[token, last],
        )
        if left == -1:
            raise _LeaseLost
        stats["messages"] += len(batch)
        log.info("flushed thread=%s seq=%s..%s", tk, first, last)
        return bool(left)

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
        """Whole messages whose parts fit one call; a lone huge message goes alone."""
        limit, size = self.settings.batch_size, 0
        fitted: list[QueuedMessage] = []
        for m in messages:
            parts = len(split_content(m.content, self.settings.max_message_chars))
            if fitted and size + parts > limit:
                break
            fitted.append(m)
            size += parts
        return fitted

    def _sends(self, batch: list[QueuedMessage]) -> list[_Send]:
        """Each message as ordered parts (W6: split, never cut), packed into calls."""
        parts: list[OutgoingMessage] = []
        for m in batch:
            pieces = split_content(m.content, self.settings.max_message_chars)
            for i, piece in enumerate(pieces):
                metadata: dict[str, str | int] = {
                    MESSAGE_KEY_FIELD: m.key if len(pieces) == 1 else f"{m.key}:{i}",
                    "afterthought_seq": m.seq or 0,
                }
                if len(pieces) > 1:
                    metadata["afterthought_part"] = f"{i + 1}/{len(pieces)}"
                parts.append(
                    OutgoingMessage(
                        role=m.role,
                        content=piece,
                        reference_time=m.reference_time,
                        name=m.name,
                        metadata=metadata,
                    )
                )
        size = self.settings.batch_size
        return [_Send(parts[i : i + size]) for i in range(0, len(parts), size)]

    async def _missing(self, thread_uuid: str, sends: list[_Send]) -> list[_Send]:
        wanted = sum(len(s.messages) for s in sends)
        stored = await self.backend.recent_messages(
            thread_uuid=thread_uuid, limit=min(100, wanted + 30)
        )
        present = {m.key for m in stored if m.key}
        missing = [
            m for s in sends for m in s.messages if m.metadata[MESSAGE_KEY_FIELD] not in present
        ]
        size = self.settings.batch_size
        return [_Send(missing[i : i + size]) for i in range(0, len(missing), size)]

    async def _send_all(
        self, thread_uuid: str, sends: list[_Send], stats: Counter[str], *, reconcile: bool
    ) -> None:
        """Send with in-job retries. Whenever an earlier attempt may have reached the
        backend (a crash, a timeout, a lost reply), send only what it lacks (W2): this
        holds whether or not the backend honours idempotency keys."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_transient),
            wait=_wait,
            stop=stop_after_attempt(IN_JOB_ATTEMPTS),
            reraise=True,
        ):
            with attempt:
                todo = sends
                if reconcile or attempt.retry_state.attempt_number > 1:
                    todo = await self._missing(thread_uuid, sends)
                for send in todo:
                    await self.backend.add_messages(
                        thread_uuid=thread_uuid,
                        messages=send.messages,
                        idempotency_key=send.idempotency_key,
                        ignore_roles=self.ignore_roles,
                    )
                    stats["calls"] += 1
                    stats["parts"] += len(send.messages)

    async def _identity(self, message: QueuedMessage) -> tuple[UserRef, str]:
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
            keys=[self.keys.lease(tk), self.keys.pending(tk), self.keys.dead, self.keys.thread(tk)],
            args=[token, count, tk, reason, attempts, _now_ms()],
        )
        log.error("dead-lettered thread=%s messages=%d reason=%s", tk, count, reason)


class _LeaseLost(Exception):
    """Another worker holds the thread now; stop touching it."""
