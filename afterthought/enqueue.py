"""The write half of the turn path: one Lua script, one Redis round trip, never raises.

An enqueue whose reply does not come in time may have committed: the script skips the
keys a thread already holds, so sending a message again is always safe (W2). What could
not be queued at once waits in a bounded in-process buffer that a drain thread empties as
soon as Redis answers: in order within a thread, fair across threads (a full thread
never holds up another user), never waiting for another turn, and once more at exit (W7).
Every message handed to :meth:`Enqueuer.enqueue` is in Redis, in the buffer (``buffered``,
also a gauge), or counted in ``dropped``."""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis.sentinel import MasterNotFoundError

from afterthought.breaker import CircuitBreaker
from afterthought.connections import FAILURES, connect
from afterthought.contract import QueuedMessage
from afterthought.direct_write import DirectWriter
from afterthought.layout import LayoutMismatch, check_layout
from afterthought.loops import PerLoop
from afterthought.queue import FORGOTTEN, REFUSED, ThreadQueue
from afterthought.settings import Settings
from afterthought.telemetry import queue_failures, watch_buffer

log = logging.getLogger("afterthought.enqueue")

#: ``send`` could not tell whether Redis ran the script (a timeout, a dropped connection).
UNREACHABLE = "redis unreachable"
#: Redis answered with an error (out of memory, a read-only replica): nothing was queued.
REDIS_REFUSED = "redis refused"
#: No connection could be made: the script was never sent.
NOT_SENT = "redis not reached"
#: The deployment's queue is laid out otherwise (``redis_shards``): nothing is queued.
MISLAID = "layout mismatch"
#: Why messages still buffered when the process exits are dropped: the drain ran out of
#: time before Redis took them (Redis down, or answering too slowly).
EXIT_UNSENT = "exit before Redis took them"
#: Why a message made before its user was forgotten is dropped (the enqueue script refused it).
SAID_BEFORE_FORGET = "made before its user was forgotten"
#: Messages one drain round trip carries.
DRAIN_CHUNK = 100
#: The drain thread is off the turn path, so it can wait longer for a reply than a turn.
DRAIN_TIMEOUT_SECONDS = 2.0
#: A thread whose queue is full is retried after this long; the others go on meanwhile.
FULL_RETRY_SECONDS = 1.0
#: Backoff of the drain thread while Redis fails, from this long up to the next.
BACKOFF_START_SECONDS = 0.05
MAX_DRAIN_BACKOFF_SECONDS = 1.0
#: At close and at interpreter exit, how long the buffer may take to drain.
CLOSE_DRAIN_SECONDS = 5.0
#: An idle drain thread ends after this long (the next held message starts another).
IDLE_EXIT_SECONDS = 30.0


@dataclass(slots=True)
class _Held:
    message: QueuedMessage
    maybe_queued: bool = False
    """An attempt to queue it may have run: never written directly (the worker would send
    the queued copy too)."""
    maybe_stored: bool = False
    """A direct write of it may have landed: queued as ``unsure``, so the worker reconciles."""


def _may_have_run(exc: BaseException) -> bool:
    """Whether the script may have run although the call failed: only a failure to
    connect is certain not to have sent it (redis-py raises those from ``connect``)."""
    text = str(exc)
    refused = isinstance(exc.__context__, ConnectionRefusedError)
    no_master = isinstance(exc, MasterNotFoundError)  # no sentinel named one to send to
    return not (
        refused or no_master or " connecting to " in text or text.startswith("Timeout connecting")
    )


class Enqueuer:
    """Queues messages for the worker. Thread-safe; one per process is enough."""

    def __init__(
        self,
        settings: Settings,
        *,
        redis: aioredis.Redis | None = None,
        direct: DirectWriter | None = None,
    ) -> None:
        """``redis``: a client to use instead of one per event loop made from the settings
        (the drain thread always makes its own). ``direct``: writes buffered messages to the
        backend while Redis is down."""
        self._settings = settings
        self.direct = direct
        self._given = redis
        self._client: PerLoop[tuple[aioredis.Redis, ThreadQueue]] = PerLoop(self._connect)
        self._held: OrderedDict[str, deque[_Held]] = OrderedDict()
        self._count = 0
        self._lock = threading.Lock()
        self._emptied = threading.Condition(self._lock)
        self._retry_at: dict[str, float] = {}
        self.breaker = CircuitBreaker(
            failures=settings.breaker_failures, seconds=settings.breaker_seconds
        )
        self.dropped = 0
        """Messages lost to a full buffer, an oversized text, exit or a layout mismatch, and
        messages made before their user was forgotten (refused): counted, and logged."""
        self._layout_known = False
        """The deployment's layout was found to be this process's (checked once)."""
        self._mislaid = False
        """It was found to be another: every message is dropped (logged once)."""
        self._drainer = _Drainer(self)
        _ENQUEUERS.add(self)

    def _connect(self) -> tuple[aioredis.Redis, ThreadQueue]:
        client = self._given or connect(
            self._settings.redis_url, timeout=self._settings.enqueue_timeout
        )
        return client, ThreadQueue(client, self._settings)

    def redis(self) -> aioredis.Redis:
        """The running loop's client (the turn path's registry reads share it)."""
        return self._client.get()[0]

    @property
    def buffered(self) -> int:
        return self._count

    async def enqueue(self, messages: Sequence[QueuedMessage]) -> bool:
        """Queue messages of one thread in order; True once Redis holds them. False: they
        wait in the buffer (the drain thread sends them), or were dropped and counted."""
        if not messages:
            return True
        thread = messages[0].thread_key
        if any(m.thread_key != thread for m in messages):
            raise ValueError("enqueue takes messages of one thread at a time")
        too_long = sum(len(m.content) > self._settings.max_queued_chars for m in messages)
        if too_long:
            log.warning(
                "enqueue refused thread=%s oversized=%d max_chars=%d",
                thread,
                too_long,
                self._settings.max_queued_chars,
            )
            self._drop(len(messages), why="oversized")
            return False
        if self._mislaid:
            self._drop(len(messages), why=MISLAID, quiet=True)
            return False
        with self._lock:
            behind = thread in self._held  # the thread's earlier messages still wait
        if behind or not self.breaker.allow():
            self._hold(messages)
            return False
        try:
            why = await self.send(messages)
        except asyncio.CancelledError:  # the caller is cancelled: the script may have run
            self.hold(messages)
            raise
        if why is None:
            return True
        if why == MISLAID:
            self._drop(len(messages), why=MISLAID, quiet=True)
            return False
        self._hold(messages, maybe_queued=why == UNREACHABLE)
        return False

    async def send(self, messages: Sequence[QueuedMessage]) -> str | None:
        """One attempt on the running loop's client, no buffering: None once queued, else
        why not (a full queue, Redis refusing, or Redis unreachable: then it may have run)."""
        try:
            queue = self._client.get()[1]
        except Exception as exc:  # building a client must not fail the turn (nothing ran)
            self._failed(exc)
            return NOT_SENT
        return await self._send(queue, messages, self._settings.enqueue_timeout)

    async def _send(
        self, queue: ThreadQueue, messages: Sequence[QueuedMessage], timeout: float
    ) -> str | None:
        thread = messages[0].thread_key
        if not self._layout_known:
            try:
                async with asyncio.timeout(timeout):
                    await check_layout(queue.redis, self._settings)
            except LayoutMismatch as exc:
                self._mislay(exc)
                return MISLAID
            except Exception as exc:  # Redis failing, or its client: the message was not sent
                self._failed(exc)
                return NOT_SENT
            self._layout_known = True
        try:
            async with asyncio.timeout(timeout):
                result = await queue.enqueue(messages, now_ms=int(time.time() * 1000))
        except ResponseError as exc:  # Redis answered: the script did not run
            self._failed(exc)
            return REDIS_REFUSED
        except FAILURES as exc:  # a cluster's or a failing-over Sentinel's errors too
            self._failed(exc)
            return UNREACHABLE if _may_have_run(exc) else NOT_SENT
        except Exception as exc:
            # A client library's own failure (one was seen inside redis-py's cluster client
            # during a failover): the script may have run; the message is kept, never lost.
            log.error("enqueue failed unexpectedly error=%s", type(exc).__name__)
            self._failed(exc)
            return UNREACHABLE
        self.breaker.succeeded()
        if result == FORGOTTEN:
            return await self._forgotten(queue, messages, timeout)
        if result in REFUSED:
            log.warning(
                "enqueue backpressure thread=%s messages=%d reason=%s",
                thread,
                len(messages),
                REFUSED[result],
            )
            return REFUSED[result]
        return None

    async def _forgotten(
        self, queue: ThreadQueue, messages: Sequence[QueuedMessage], timeout: float
    ) -> str | None:
        """The script queued none of ``messages``: one was made before its user's forget.
        That one is dropped and counted; of several (a buffered run that spans a forget),
        each is sent alone to find which. Why one of them did not go, if one did not (a run
        retried after that counts its forgotten ones again: never fewer than were lost)."""
        if len(messages) == 1:
            self._drop(1, why=SAID_BEFORE_FORGET)
            return None
        for message in messages:
            why = await self._send(queue, [message], timeout)
            if why is not None:
                return why
        return None

    def _failed(self, exc: BaseException) -> None:
        self.breaker.failed()
        log.warning(
            "enqueue failed error=%s failures=%d buffered=%d",
            type(exc).__name__,
            self.breaker.failures,
            self.buffered,
        )

    def hold(self, messages: Sequence[QueuedMessage]) -> None:
        """Into the buffer at once, no attempt made here, as if one may have run (never
        written directly): for messages whose enqueue was cut short."""
        if messages:
            self._hold(messages, maybe_queued=True)

    def drop(self, count: int, *, why: str) -> None:
        """Count messages that could not even be made (an id that names no thread, an
        identity the application's resolver failed to give): lost, counted, logged."""
        self._drop(count, why=why)

    def _hold(self, messages: Sequence[QueuedMessage], *, maybe_queued: bool = False) -> None:
        """Into the buffer behind the thread's earlier messages; what does not fit is
        dropped and counted. Wakes the drain thread."""
        queue_failures.add(len(messages), {"outcome": "buffered"})
        thread = messages[0].thread_key
        with self._lock:
            room = max(0, self._settings.buffer_size - self._count)
            kept = [_Held(m, maybe_queued=maybe_queued) for m in messages[:room]]
            if kept:
                self._held.setdefault(thread, deque()).extend(kept)
                self._count += len(kept)
        if len(messages) > len(kept):
            self._drop(len(messages) - len(kept), why="buffer full")
        self._drainer.wake()

    def _drop(self, count: int, *, why: str, quiet: bool = False) -> None:
        """Count messages lost; ``quiet``: the cause was logged once already."""
        with self._lock:
            self.dropped += count
        queue_failures.add(count, {"outcome": "dropped", "reason": why})
        log.log(
            logging.DEBUG if quiet else logging.ERROR,
            "enqueue dropped=%d reason=%s dropped_total=%d",
            count,
            why,
            self.dropped,
        )

    def _mislay(self, exc: LayoutMismatch) -> None:
        """This process's layout is not the deployment's: said once, and from now on
        every message is dropped and counted, the buffered ones first."""
        with self._lock:
            if self._mislaid:
                return
            self._mislaid = True
            held, self._count = self._count, 0
            self._held.clear()
            self._retry_at.clear()
            self._emptied.notify_all()
        log.error("enqueue refused: %s", exc)
        if held:
            self._drop(held, why=MISLAID, quiet=True)

    # --- the drain thread's side ------------------------------------------------------------
    def _next_run(self, now: float) -> tuple[str, list[_Held]] | None:
        """The next thread in turn that is not waiting, with its oldest held messages.
        They stay held (later messages of the thread queue up behind them) until sent."""
        with self._lock:
            for thread in list(self._held):
                self._held.move_to_end(thread)  # round robin: every thread gets its turn
                if self._retry_at.get(thread, 0.0) <= now:
                    items = self._held[thread]
                    # Never more than a cap admits at once, or the thread is refused forever.
                    s = self._settings
                    size = min(DRAIN_CHUNK, s.thread_queue_cap, s.queue_cap, len(items))
                    return thread, [items[i] for i in range(size)]
        return None

    def _next_due(self, now: float) -> float:
        """Seconds until a held thread may be tried again (0: one may be tried now)."""
        with self._lock:
            waits = [max(0.0, self._retry_at.get(t, 0.0) - now) for t in self._held]
        return min(waits, default=0.0)

    def _release(self, thread: str, count: int) -> None:
        """The oldest ``count`` held messages of a thread are in Redis (or stored)."""
        with self._lock:
            items = self._held[thread]
            for _ in range(count):
                items.popleft()
            self._count -= count
            self._retry_at.pop(thread, None)
            if not items:
                del self._held[thread]
            if not self._count:
                self._emptied.notify_all()

    async def _drain(self, queue: ThreadQueue, *, until: float) -> None:
        """Send what the buffer holds until it is empty (or ``until``, monotonic)."""
        backoff = BACKOFF_START_SECONDS
        while self.buffered and time.monotonic() < until:
            wait = await self.drain_step(queue, backoff=backoff)
            backoff = min(backoff * 2, MAX_DRAIN_BACKOFF_SECONDS) if wait else BACKOFF_START_SECONDS
            if wait:
                await asyncio.sleep(min(wait, until - time.monotonic()))

    async def drain_step(self, queue: ThreadQueue, *, backoff: float) -> float:
        """One step of draining: the next thread's oldest held messages, sent once. Returns
        how long to wait before the next step (0: go on at once)."""
        now = time.monotonic()
        run = self._next_run(now)
        if run is None:
            return self._next_due(now)
        thread, held = run
        if not self.breaker.allow():
            written = await self._write_directly(thread, held)
            return 0.0 if written else self.breaker.retry_in() or backoff
        messages = [
            h.message.model_copy(update={"unsure": True}) if h.maybe_stored else h.message
            for h in held
        ]
        why = await self._send(queue, messages, DRAIN_TIMEOUT_SECONDS)
        if why == MISLAID:  # the buffer was dropped
            return 0.0
        if why is None:
            self._release(thread, len(held))
            log.info(
                "buffer drained thread=%s messages=%d left=%d", thread, len(held), self.buffered
            )
            return 0.0
        if why in REFUSED.values():  # this thread waits; the others go on
            with self._lock:
                self._retry_at[thread] = now + FULL_RETRY_SECONDS
            return 0.0
        for h in held:
            h.maybe_queued = h.maybe_queued or why == UNREACHABLE
        return backoff

    async def _write_directly(self, thread: str, held: list[_Held]) -> bool:
        """While Redis is failing, write a thread's held messages to the backend (opt-in),
        if none of them may already be queued. True when they were written."""
        if self.direct is None or not self.direct.knows(thread):
            return False
        certain = []
        for h in held:
            if h.maybe_queued:
                break
            certain.append(h)
        if not certain:
            return False
        try:
            await self.direct.write([h.message for h in certain])
        except Exception as exc:
            log.warning("direct write failed thread=%s error=%s", thread, type(exc).__name__)
            for h in certain:
                h.maybe_stored = True
            return False
        self._release(thread, len(certain))
        return True

    def wait_empty(self, timeout: float) -> bool:
        """Block until the buffer is empty or ``timeout`` passes; True when empty."""
        with self._lock:
            if not self._count:
                return True  # nothing to drain: no thread is started for it
        self._drainer.wake()
        with self._lock:
            return self._emptied.wait_for(lambda: not self._count, timeout)

    async def drain_buffer(self, timeout: float = CLOSE_DRAIN_SECONDS) -> bool:
        """Wait (off the loop) until the drain thread has emptied the buffer; True if so."""
        return await asyncio.to_thread(self.wait_empty, timeout)

    async def aclose(self) -> None:
        """Drain the buffer (bounded), then close this loop's connections."""
        if await self.drain_buffer():
            # The drain thread holds a loop and a connection until it idles out; an app
            # that opens and closes memories (a test suite, a batch job) must not pile
            # them up. What is still buffered keeps its thread, to drain or be counted.
            await asyncio.to_thread(self._drainer.stop)
        held = self._client.pop_current()
        if held is not None and self._given is None:
            await held[0].aclose()

    def _abandon(self) -> None:
        """At exit: what is still held now will never be sent; count it as dropped."""
        with self._lock:
            left, self._count = self._count, 0
            self._held.clear()
            self._emptied.notify_all()
        if left:
            self._drop(left, why=EXIT_UNSENT)


class _Drainer:
    """The thread that empties an :class:`Enqueuer`'s buffer, on a loop of its own: the
    agent's loops may be busy, blocked, or gone (``Runner.run`` closes its loop)."""

    def __init__(self, enqueuer: Enqueuer) -> None:
        self._enqueuer = weakref.ref(enqueuer)
        self._settings = enqueuer._settings
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closing_until: float | None = None
        self._start = threading.Lock()
        self._stopping = False

    def wake(self) -> None:
        with self._start:
            self._stopping = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._main, name="afterthought-drain", daemon=True
                )
                self._thread.start()
                _DRAINERS.add(self)
        self._wake.set()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        client = None
        try:
            client = connect(self._settings.redis_url, timeout=DRAIN_TIMEOUT_SECONDS)
            queue = ThreadQueue(client, self._settings)  # connects on first use, on this loop
            while True:
                if not self._wake.wait(IDLE_EXIT_SECONDS):
                    with self._start:  # wake() sees this thread gone, or it sees the event
                        if not self._wake.is_set():
                            self._thread = None
                            return
                self._wake.clear()
                with self._start:  # a wake() after stop() clears the flag: keep draining
                    if self._stopping:
                        self._thread = None
                        return
                enqueuer = self._enqueuer()
                if enqueuer is None:
                    return
                until = self._closing_until or float("inf")
                loop.run_until_complete(enqueuer._drain(queue, until=until))
                if self._closing_until is not None:
                    return
                del enqueuer
        except Exception as exc:  # never silent: the buffer would stop draining
            log.error("drain thread failed error=%s", type(exc).__name__)
        finally:
            if client is not None:
                loop.run_until_complete(client.aclose())
            loop.close()

    def stop(self) -> None:
        """End the thread now (its buffer is empty): its loop and connection are closed."""
        with self._start:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            self._stopping = True
        self._wake.set()
        thread.join(CLOSE_DRAIN_SECONDS)

    def close(self, until: float) -> None:
        """Drain until ``until`` (monotonic), then stop; what is left is counted dropped."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._closing_until = until
        self._wake.set()
        thread.join(max(0.0, until - time.monotonic()) + 1)
        enqueuer = self._enqueuer()
        if enqueuer is not None:
            enqueuer._abandon()


_ENQUEUERS: weakref.WeakSet[Enqueuer] = weakref.WeakSet()
_DRAINERS: weakref.WeakSet[_Drainer] = weakref.WeakSet()
watch_buffer(lambda: sum(e.buffered for e in list(_ENQUEUERS)))


@atexit.register
def _drain_at_exit() -> None:
    """Every buffer gets the same few seconds, together, to reach Redis."""
    until = time.monotonic() + CLOSE_DRAIN_SECONDS
    drainers = list(_DRAINERS)
    for drainer in drainers:
        drainer._closing_until = until
        drainer._wake.set()
    for drainer in drainers:
        drainer.close(until)
