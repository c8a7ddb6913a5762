"""The write half of the turn path: one Lua script, one Redis round trip, never raises.

When Redis is slow or down, a circuit breaker stops the turn from waiting on it and the
messages wait in a bounded in-process buffer, sent first (in order) once Redis answers
again; what overflows the buffer is dropped and counted (W7). Queue caps refuse growth
past a per-thread and a global limit (W9): that backpressure lands in the same buffer."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from afterthought.contract import QueuedMessage
from afterthought.direct_write import DirectWriter
from afterthought.keys import Keys
from afterthought.loops import PerLoop, redis_client
from afterthought.settings import Settings
from afterthought.telemetry import queue_failures

log = logging.getLogger("afterthought.enqueue")

# Shared by the enqueue and replay scripts: room checks the caps, push appends each payload
# with the thread's next sequence number, counts it, and marks the thread ready. ZADD NX
# keeps the score of a claimed or deferred thread: its lease holder re-checks the pending
# list on release, so nothing waits behind a claim.
APPEND_LUA = """
local function room(pending, depth, n, thread_cap, global_cap)
  if redis.call('LLEN', pending) + n > thread_cap then return -1 end
  if tonumber(redis.call('GET', depth) or '0') + n > global_cap then return -2 end
  return 0
end
local function push(pending, thread, ready, depth, tk, now, first, epoch_key, threads)
  local seq = tonumber(redis.call('HGET', thread, 'seq') or '0')
  local epoch = redis.call('GET', epoch_key) or '0'
  for i = first, #ARGV do
    seq = seq + 1
    redis.call('RPUSH', pending,
      '{"seq":' .. seq .. ',"epoch":' .. epoch .. ',"queued_ms":' .. now .. ','
        .. string.sub(ARGV[i], 2))
  end
  redis.call('SADD', threads, tk)
  redis.call('HSET', thread, 'seq', seq)
  redis.call('INCRBY', depth, #ARGV - first + 1)
  redis.call('ZADD', ready, 'NX', now, tk)
  return seq
end
"""

# KEYS pending, thread, ready, depth, epoch, user threads; ARGV tk, now_ms, thread_cap,
# global_cap, payloads...
ENQUEUE_LUA = (
    APPEND_LUA
    + """
local full = room(KEYS[1], KEYS[4], #ARGV - 4, tonumber(ARGV[3]), tonumber(ARGV[4]))
if full < 0 then return full end
return push(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], 5, KEYS[5], KEYS[6])
"""
)

#: Returned by the scripts when a cap refuses the messages.
REFUSED = {-1: "thread queue full", -2: "queue full"}
UNREACHABLE = "redis unreachable"


class Enqueuer:
    """Queues messages for the worker. Thread-safe; one per process is enough."""

    def __init__(
        self,
        settings: Settings,
        *,
        redis: aioredis.Redis | None = None,
        direct: DirectWriter | None = None,
    ) -> None:
        """``redis``: a client to use instead of one per event loop made from the settings.
        ``direct``: writes buffered messages to the backend while Redis is down."""
        self._settings = settings
        self.direct = direct
        self._direct_task: asyncio.Task[None] | None = None
        self._keys = Keys(settings.key_prefix)
        self._given = redis
        self._client = PerLoop(self._connect)
        self._buffer: deque[QueuedMessage] = deque()
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until = 0.0
        self.dropped = 0
        """Messages lost to a full buffer or an oversized text: counted, and logged."""

    def _connect(self) -> tuple[aioredis.Redis, AsyncScript]:
        client = self._given or redis_client(
            self._settings.redis_url, timeout=self._settings.enqueue_timeout
        )
        return client, client.register_script(ENQUEUE_LUA)

    def redis(self) -> aioredis.Redis:
        """The running loop's client (the turn path's registry reads share it)."""
        return self._client.get()[0]

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    async def enqueue(self, messages: Sequence[QueuedMessage]) -> bool:
        """Queue messages of one thread in order; True once Redis holds them (and all
        that was buffered before them). False: buffered for later, or dropped."""
        if not messages:
            return True
        thread = messages[0].thread_key
        if any(m.thread_key != thread for m in messages):
            raise ValueError("enqueue takes messages of one thread at a time")
        too_long = sum(len(m.content) > self._settings.max_queued_chars for m in messages)
        if too_long:
            self.dropped += len(messages)
            queue_failures.add(len(messages), {"outcome": "refused"})
            log.warning(
                "enqueue refused thread=%s oversized=%d max_chars=%d dropped_total=%d",
                thread,
                too_long,
                self._settings.max_queued_chars,
                self.dropped,
            )
            return False
        if self._buffer or self._breaker_open():
            self._hold(messages)  # behind what waits already, to keep each thread's order
            if await self.drain_buffer():
                return True
            self._write_directly()
            return False
        if await self.send(messages) is None:
            return True
        self._hold(messages)
        self._write_directly()
        return False

    def _write_directly(self) -> None:
        """While Redis is failing, hand what is buffered to the direct writer, in the
        background (the turn does not wait for the backend)."""
        if self.direct is None or not self._failures:
            return
        if self._direct_task is None or self._direct_task.done():
            self._direct_task = asyncio.get_running_loop().create_task(self._direct_drain())

    async def _direct_drain(self) -> None:
        assert self.direct is not None
        while self._failures:
            with self._lock:
                known = [m for m in self._buffer if self.direct.knows(m.thread_key)]
                if not known:
                    return
                thread = known[0].thread_key
                run = [m for m in self._buffer if m.thread_key == thread]
                self._buffer = deque(m for m in self._buffer if m.thread_key != thread)
            try:
                await self.direct.write(run)
            except Exception as exc:
                log.warning("direct write failed thread=%s error=%s", thread, type(exc).__name__)
                with self._lock:
                    self._buffer.extendleft(reversed(run))
                return

    async def drain_buffer(self) -> bool:
        """Send what the buffer holds, oldest first; True when it is empty."""
        while not self._breaker_open():
            with self._lock:
                if not self._buffer:
                    return True
                thread = self._buffer[0].thread_key
                run: list[QueuedMessage] = []
                while self._buffer and self._buffer[0].thread_key == thread and len(run) < 100:
                    run.append(self._buffer.popleft())
            if await self.send(run) is not None:
                with self._lock:
                    self._buffer.extendleft(reversed(run))
                return False
            log.info(
                "buffer drained thread=%s messages=%d left=%d", thread, len(run), self.buffered
            )
        return False

    async def send(self, messages: Sequence[QueuedMessage]) -> str | None:
        """One attempt, no buffering: None once queued, else why not (a full queue, or
        Redis unreachable). Messages of one thread, as for ``enqueue``."""
        thread = messages[0].thread_key
        _, script = self._client.get()
        s = self._settings
        try:
            async with asyncio.timeout(s.enqueue_timeout):
                result = await script(
                    keys=[
                        self._keys.pending(thread),
                        self._keys.thread(thread),
                        self._keys.ready,
                        self._keys.depth,
                        self._keys.epoch(messages[0].app, messages[0].user_id),
                        self._keys.user_threads(messages[0].app, messages[0].user_id),
                    ],
                    args=[
                        thread,
                        int(time.time() * 1000),
                        s.thread_queue_cap,
                        s.queue_cap,
                        *(m.encode() for m in messages),
                    ],
                )
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return UNREACHABLE
        self._failures = 0
        if result in REFUSED:
            log.warning(
                "enqueue backpressure thread=%s messages=%d reason=%s",
                thread,
                len(messages),
                REFUSED[result],
            )
            return REFUSED[result]
        return None

    def _hold(self, messages: Sequence[QueuedMessage]) -> None:
        queue_failures.add(len(messages), {"outcome": "buffered"})
        with self._lock:
            room = self._settings.buffer_size - len(self._buffer)
            self._buffer.extend(messages[: max(room, 0)])
            lost = len(messages) - max(room, 0)
        if lost > 0:
            self.dropped += lost
            queue_failures.add(lost, {"outcome": "dropped"})
            log.error("enqueue buffer full: dropped=%d dropped_total=%d", lost, self.dropped)

    def _failed(self, exc: BaseException) -> None:
        self._failures += 1
        log.warning(
            "enqueue failed error=%s failures=%d buffered=%d",
            type(exc).__name__,
            self._failures,
            self.buffered,
        )
        if self._failures >= self._settings.breaker_failures:
            self._open_until = time.monotonic() + self._settings.breaker_seconds

    def _breaker_open(self) -> bool:
        """Open: skip Redis entirely. After the window one call probes (half-open)."""
        return time.monotonic() < self._open_until

    async def aclose(self) -> None:
        held = self._client.pop_current()
        if held is not None and self._given is None:
            await held[0].aclose()
