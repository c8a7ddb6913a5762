"""The write half of the turn path: one Lua script, one Redis round trip, never raises.

An enqueue whose reply does not come in time may have committed: the script skips the
keys a thread already holds, so sending a message again is always safe (W2). What could
not be queued at once waits in a bounded in-process buffer that a drain thread empties as
soon as Redis answers: in order within a thread, fair across threads (a full thread
never holds up another user), never waiting for another turn, and once more at exit (W7).
What Redis has not taken when the process exits or is sent SIGTERM (after
``exit_flush_seconds``), or when the buffer is full, goes to the machine's spool
(:mod:`afterthought.spool`), which this process's drain thread replays once Redis
answers, as do the workers of this machine.
Every message handed to :meth:`Enqueuer.enqueue` is in Redis, in the buffer
(``buffered``, also a gauge), in the spool (``spooled``), or counted in ``dropped``."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import signal
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis.sentinel import MasterNotFoundError

from afterthought.breaker import CircuitBreaker
from afterthought.connections import FAILURES, connect
from afterthought.contract import QueuedMessage
from afterthought.direct_write import DirectWriter
from afterthought.layout import LayoutMismatch, check_layout
from afterthought.loops import PerLoop
from afterthought.queue import FORGOTTEN, REFUSED, HandedOut, ThreadQueue
from afterthought.settings import Settings
from afterthought.spool import Sent, Spool
from afterthought.telemetry import queue_failures, spool_events, watch_buffer
from afterthought.tracing import enqueue_span

log = logging.getLogger("afterthought.enqueue")

#: ``send`` could not tell whether Redis ran the script (a timeout, a dropped connection).
UNREACHABLE = "redis unreachable"
#: Redis answered with an error (out of memory, a read-only replica): nothing was queued.
REDIS_REFUSED = "redis refused"
#: No connection could be made: the script was never sent.
NOT_SENT = "redis not reached"
#: The deployment's queue is laid out otherwise (``redis_shards``): nothing is queued.
MISLAID = "layout mismatch"
#: Why a message made before its user was forgotten is dropped (the enqueue script refused it).
SAID_BEFORE_FORGET = "made before its user was forgotten"
#: Why messages meant for the spool were dropped: it holds ``spool_max_bytes`` already
#: (else the reason the spool gives: its file cannot be written, a full or failing disk, a
#: directory of someone else's, its lock held by a stopped process).
SPOOL_FULL = "spool full"
#: Why a spooled message was dropped on replay: its record is torn (a process killed as it
#: wrote it) or damaged.
SPOOL_DAMAGED = "spool record damaged"
#: Messages one drain round trip carries.
DRAIN_CHUNK = 100
#: Messages one enqueue round trip carries (a replayed session: a few, not one each).
ENQUEUE_CHUNK = 100
#: The drain thread is off the turn path, so it can wait longer for a reply than a turn.
DRAIN_TIMEOUT_SECONDS = 2.0
#: A thread whose queue is full is retried after this long; the others go on meanwhile.
FULL_RETRY_SECONDS = 1.0
#: Backoff of the drain thread while Redis fails, from this long up to the next.
BACKOFF_START_SECONDS = 0.05
MAX_DRAIN_BACKOFF_SECONDS = 1.0
#: How long closing waits for a drain thread whose buffer is empty to end.
STOP_SECONDS = 5.0
#: An idle drain thread ends after this long (the next held message starts another).
IDLE_EXIT_SECONDS = 30.0
#: The signals a process is stopped by: ``docker stop`` and Kubernetes (SIGTERM), Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: What a stop signal's flush may take past ``exit_flush_seconds`` to write the spool (its
#: fsync): then the signal goes on, whatever the flush is waiting for (a lock the
#: interrupted code holds, a disk that hangs).
STOP_WRITE_SECONDS = 1.0


@dataclass(slots=True)
class _Held:
    message: QueuedMessage
    maybe_queued: bool = False
    """An attempt to queue it may have run: never written directly (the worker would send
    the queued copy too)."""
    maybe_stored: bool = False
    """A direct write of it may have landed: queued as ``unsure``, so the worker reconciles."""
    sending: bool = False
    """The drain thread is sending it: spooled now, it may be queued as well."""

    def to_send(self) -> QueuedMessage:
        """The message as it is queued (or spooled): ``unsure`` when a copy may already
        be queued or stored, so the worker reconciles it even after the thread's queue
        has forgotten its key."""
        if self.maybe_stored or self.maybe_queued or self.sending:
            return self.message.model_copy(update={"unsure": True})
        return self.message


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
        self.handed_out = HandedOut.of(settings)
        """What Redis handed this process's enqueues, on every loop and the drain thread:
        a thread's counter found below it means Redis lost that thread's last messages."""
        self._client: PerLoop[tuple[aioredis.Redis, ThreadQueue]] = PerLoop(self._connect)
        self._held: OrderedDict[str, deque[_Held]] = OrderedDict()
        self._count = 0
        self._lock = threading.Lock()
        self._emptied = threading.Condition(self._lock)
        self._retry_at: dict[str, float] = {}
        self._in_flight: dict[int, Sequence[QueuedMessage]] = {}
        """Messages a turn's enqueue is sending now, by a token of the call: a stop signal
        spools them too (unsure), or a process ended during the call loses them."""
        self._tokens = itertools.count()
        self.breaker = CircuitBreaker(
            failures=settings.breaker_failures, seconds=settings.breaker_seconds
        )
        self.dropped = 0
        """Messages lost to an oversized text, a layout mismatch, a full spool or a damaged
        spool record, and messages made before their user was forgotten (refused): counted,
        and logged."""
        self.spool = Spool.of(settings)
        self.spooled = 0
        """Messages this process wrote to the spool."""
        self.replayed = 0
        """Messages this process replayed from the spool into Redis (any process's)."""
        self._spool_lock = threading.Lock()
        """Held to spool a thread's messages or to find the spool replayed (before
        ``_lock``, never inside it)."""
        self._spool_stamp = self.spool.stamp()
        """The spool as :meth:`_look_at_spool` last found it (before reading it)."""
        self._spooled: set[str] = self.spool.threads()
        """Threads with messages in the spool, this process's or (found as it began) an
        earlier process's, perhaps of a session this one goes on with: their next messages
        go to the spool too, behind them, until a replay finds the spool empty."""
        self._replay_due = True
        """The spool may hold messages: replayed once Redis answers (at the first contact,
        another process's of an earlier run)."""
        self._layout_known = False
        """The deployment's layout was found to be this process's (checked once)."""
        self._mislaid = False
        """It was found to be another: every message is dropped (logged once)."""
        self._drainer = _Drainer(self)
        _ENQUEUERS.add(self)
        if settings.spool_on_signals:
            _catch_stop_signals()

    def _connect(self) -> tuple[aioredis.Redis, ThreadQueue]:
        client = self._given or connect(
            self._settings.redis_url, timeout=self._settings.enqueue_timeout
        )
        return client, ThreadQueue(client, self._settings, handed_out=self.handed_out)

    def redis(self) -> aioredis.Redis:
        """The running loop's client (the turn path's registry reads share it)."""
        return self._client.get()[0]

    @property
    def buffered(self) -> int:
        return self._count

    def reserve(self, messages: Sequence[QueuedMessage]) -> int:
        """Messages handed over for an :meth:`enqueue` that has not begun (its task not yet
        run): a stop signal spools them meanwhile, as it spools those being sent. Pass the
        token to that ``enqueue`` (``reserved``), or to :meth:`hold` if it never runs."""
        token = next(self._tokens)
        with self._lock:
            self._in_flight[token] = list(messages)
        return token

    async def enqueue(
        self, messages: Sequence[QueuedMessage], *, reserved: int | None = None
    ) -> bool:
        """Queue messages of one thread in order (``ENQUEUE_CHUNK`` a round trip); True
        once Redis holds them. False: they wait in the buffer (the drain thread sends
        them), in the spool, or were dropped and counted. ``reserved``: the token
        :meth:`reserve` gave for them. Traced (``afterthought.tracing``): wherever they go
        from here, they carry the enqueue's context."""
        if not messages:
            if reserved is not None:
                self._landed(reserved)
            return True
        with enqueue_span(messages) as (span, traced):
            token = self.reserve([]) if reserved is None else reserved
            try:
                queued = await self._enqueue(list(traced), token)
            finally:
                self._landed(token)  # whatever became of them, none is in flight now
            span.set_attribute("afterthought.queued", queued)
            return queued

    async def _enqueue(self, messages: list[QueuedMessage], token: int) -> bool:
        """``token``: their entry among the messages in flight, which each chunk sent
        leaves; until then a stop signal spools what it holds (and once it has, they are
        the spool's: False)."""
        with self._lock:
            if token not in self._in_flight:
                return False  # a stop signal spooled them before this began
            self._in_flight[token] = messages
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
            if self._landed(token):
                self._drop(len(messages), why="oversized")
            return False
        if self._mislaid:
            if self._landed(token):
                self._drop(len(messages), why=MISLAID, quiet=True)
            return False
        self._look_at_spool()
        with self._lock:
            # The thread's earlier messages still wait, in the buffer or the spool.
            behind = thread in self._held or thread in self._spooled
        if behind or not self.breaker.allow():
            self._hold(messages, release=token)
            return False
        for start in range(0, len(messages), ENQUEUE_CHUNK):
            part, rest = messages[start : start + ENQUEUE_CHUNK], messages[start + ENQUEUE_CHUNK :]
            try:
                why = await self.send(part)
            except asyncio.CancelledError:  # the caller is cancelled: the script may have run
                self._hold(part, maybe_queued=True, rest=rest, release=token)
                raise
            if why is None:
                if self._replay_due:
                    self._drainer.wake()  # Redis answers: the drain thread replays the spool
                with self._lock:
                    if token not in self._in_flight:  # a stop signal spooled them meanwhile
                        return not rest
                    self._in_flight[token] = rest
                continue
            if why == MISLAID:
                if self._landed(token):
                    self._drop(len(part) + len(rest), why=MISLAID, quiet=True)
                return False
            self._hold(part, maybe_queued=why == UNREACHABLE, rest=rest, release=token)
            return False
        return True

    def _landed(self, token: int) -> bool:
        """The messages of ``token`` are in flight no more: False when a stop signal
        spooled them."""
        with self._lock:
            return self._in_flight.pop(token, None) is not None

    def _look_at_spool(self) -> None:
        """Another process of this machine (one that exited while Redis did not answer it)
        may have spooled a turn of a session this one goes on with: its threads join
        ``_spooled``, so their next messages queue behind the spooled ones. Two stats an
        enqueue; the spool is read only when they changed."""
        stamp = self.spool.stamp()
        if stamp == self._spool_stamp:
            return
        self._spool_stamp = stamp
        threads = self.spool.threads()
        if threads:
            with self._lock:
                self._spooled |= threads
            self._replay_due = True

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

    def hold(self, messages: Sequence[QueuedMessage], *, reserved: int | None = None) -> None:
        """Into the buffer at once, no attempt made here, as if one may have run (never
        written directly): for messages whose enqueue was cut short. ``reserved``: the
        token :meth:`reserve` gave for them (none are held if a stop signal spooled them)."""
        if messages:
            self._hold(messages, maybe_queued=True, release=reserved)
        elif reserved is not None:
            self._landed(reserved)

    def drop(self, count: int, *, why: str) -> None:
        """Count messages that could not even be made (an id that names no thread, an
        identity the application's resolver failed to give): lost, counted, logged."""
        self._drop(count, why=why)

    def _hold(
        self,
        messages: Sequence[QueuedMessage],
        *,
        maybe_queued: bool = False,
        rest: Sequence[QueuedMessage] = (),
        release: int | None = None,
    ) -> None:
        """Into the buffer behind the thread's earlier messages, and ``rest`` (no attempt
        made) behind them. When they do not fit, the thread's earlier messages are spooled,
        or a stop signal came, the thread goes on in the spool: its buffered messages
        first, so a replay keeps its order (a file write on the turn path, only while the
        buffer is full or the process stops). ``release``: their entry among the messages
        in flight, left in the same step (a stop signal's flush meets them in one place or
        the other, never neither); gone already, they were spooled, and nothing is held.
        Wakes the drain thread."""
        thread = messages[0].thread_key
        held = [_Held(m, maybe_queued=maybe_queued) for m in messages]
        held += [_Held(m) for m in rest]
        with self._spool_lock:
            with self._lock:
                if release is not None and self._in_flight.pop(release, None) is None:
                    return
                spooling = thread in self._spooled or _stopping.is_set()
                room = 0 if spooling else max(0, self._settings.buffer_size - self._count)
                if len(held) <= room:
                    self._held.setdefault(thread, deque()).extend(held)
                    self._count += len(held)
                    spill = []
                else:
                    spill = [*self._take(thread), *held]
            if spill:
                # On the turn path: a short try for the lock, never a long block.
                self._spool(spill, wait=self._settings.enqueue_timeout)
        if not spill:
            queue_failures.add(len(held), {"outcome": "buffered"})
        self._drainer.wake()

    def _take(self, thread: str) -> deque[_Held]:
        """A thread's held messages, out of the buffer (holding ``_lock``)."""
        items = self._held.pop(thread, deque())
        self._count -= len(items)
        self._retry_at.pop(thread, None)
        if not self._count:
            self._emptied.notify_all()
        return items

    def _spool(self, held: Sequence[_Held], *, wait: float) -> None:
        """Into the spool, durably (holding ``_spool_lock``), waiting at most ``wait``
        seconds for another process's append; what it cannot take is dropped and counted."""
        written = self.spool.append([h.to_send() for h in held], wait=wait)
        if written.spooled:
            with self._lock:
                self.spooled += written.spooled
                self._spooled.update(h.message.thread_key for h in held[: written.spooled])
            self._replay_due = True
            queue_failures.add(written.spooled, {"outcome": "spooled"})
            spool_events.add(written.spooled, {"event": "spooled"})
            log.warning("enqueue spooled=%d spooled_total=%d", written.spooled, self.spooled)
        if written.full:
            self._drop(written.full, why=SPOOL_FULL)
        if written.failed:
            self._drop(written.failed, why=written.why)

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
                    size = min(DRAIN_CHUNK, s.thread_queue_cap, s.shard_queue_cap, len(items))
                    return thread, [items[i] for i in range(size)]
        return None

    def _next_due(self, now: float) -> float:
        """Seconds until a held thread may be tried again (0: one may be tried now)."""
        with self._lock:
            waits = [max(0.0, self._retry_at.get(t, 0.0) - now) for t in self._held]
        return min(waits, default=0.0)

    def _release(self, thread: str, done: list[_Held]) -> None:
        """The oldest held messages of a thread, ``done``, are in Redis (or stored): out
        of the buffer, unless they were spooled meanwhile (the spool's copy is a no-op)."""
        with self._lock:
            items = self._held.get(thread)
            for h in done:
                if not items or items[0] is not h:
                    break
                items.popleft()
                self._count -= 1
            self._retry_at.pop(thread, None)
            if items is not None and not items:
                del self._held[thread]
            if not self._count:
                self._emptied.notify_all()

    async def _drain(
        self, queue: ThreadQueue, *, until: float, replay: bool, halt: threading.Event
    ) -> None:
        """Send what the buffer holds until it is empty (or ``until``, monotonic, or
        ``halt``), then, with ``replay``, what the spool holds (the two hold different
        threads). Its waits block: the drain thread's loop runs nothing else, and ``halt``
        ends them at once."""
        backoff = BACKOFF_START_SECONDS
        while time.monotonic() < until and not halt.is_set():
            if self.buffered:
                wait = await self.drain_step(queue, backoff=backoff)
            elif replay and self._replay_due:
                wait = await self.replay_step(queue, backoff=backoff)
            else:
                return
            backoff = min(backoff * 2, MAX_DRAIN_BACKOFF_SECONDS) if wait else BACKOFF_START_SECONDS
            if wait:
                halt.wait(max(0.0, min(wait, until - time.monotonic())))

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
        # Before ``sending`` is set: a message an earlier attempt may have queued is unsure
        # as it is in the spool, since Redis may have lost its key with the message.
        messages = [h.to_send() for h in held]
        for h in held:
            h.sending = True
        try:
            why = await self._send(queue, messages, DRAIN_TIMEOUT_SECONDS)
        finally:
            for h in held:
                h.sending = False
        if why == MISLAID:  # the buffer was dropped
            return 0.0
        if why is None:
            self._release(thread, held)
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
        self._release(thread, certain)
        return True

    async def replay_step(self, queue: ThreadQueue, *, backoff: float) -> float:
        """Replay the spool (every process's of this machine) through the enqueue script,
        once the buffer is empty: its messages are older than any held now. Returns how
        long to wait before the next step (0: go on at once)."""
        if not self.breaker.allow():
            return self.breaker.retry_in() or backoff

        async def send(messages: list[QueuedMessage]) -> Sent:
            why = await self._send(queue, messages, DRAIN_TIMEOUT_SECONDS)
            if why is None:
                return Sent.QUEUED
            return Sent.HELD if why in REFUSED.values() else Sent.FAILED

        try:
            result = await self.spool.replay(send, blocking=True)  # the drain thread's loop
        except OSError as exc:
            log.error("spool replay failed error=%s errno=%s", type(exc).__name__, exc.errno)
            return MAX_DRAIN_BACKOFF_SECONDS
        if result.replayed:
            with self._lock:
                self.replayed += result.replayed
            spool_events.add(result.replayed, {"event": "replayed"})
            log.info("spool replayed=%d", result.replayed)
        if result.damaged:
            self._drop(result.damaged, why=SPOOL_DAMAGED)
        if self._mislaid:
            # The spool is another layout's: left for its processes.
            self._replay_due = False
            return 0.0
        if result.busy:
            return FULL_RETRY_SECONDS  # another process replays: this one looks again later
        if not result.finished:
            return backoff
        with self._spool_lock:  # no message of this process is spooled meanwhile
            if self.spool.empty():
                self._spooled.clear()
                self._replay_due = False
        return 0.0

    def wait_empty(self, timeout: float) -> bool:
        """Block until the buffer is empty or ``timeout`` passes; True when empty."""
        with self._lock:
            if not self._count:
                return True  # nothing to drain: no thread is started for it
        self._drainer.wake()
        with self._lock:
            return self._emptied.wait_for(lambda: not self._count, timeout)

    async def drain_buffer(self, timeout: float | None = None) -> bool:
        """Wait (off the loop) until the drain thread has emptied the buffer, at most
        ``timeout`` (``exit_flush_seconds``); True if so."""
        if timeout is None:
            timeout = self._settings.exit_flush_seconds
        return await asyncio.to_thread(self.wait_empty, timeout)

    async def aclose(self) -> None:
        """Drain the buffer for up to ``exit_flush_seconds`` and spool what is left (within
        the same time, but for one try for the spool's lock), then close this loop's
        connections."""
        until = time.monotonic() + self._settings.exit_flush_seconds
        if not await self.drain_buffer():
            await asyncio.to_thread(self._spool_all, max(0.0, until - time.monotonic()))
        # The drain thread holds a loop and a connection until it idles out; an app that
        # opens and closes memories (a test suite, a batch job) must not pile them up.
        await asyncio.to_thread(self._drainer.stop)
        held = self._client.pop_current()
        if held is not None and self._given is None:
            await held[0].aclose()

    def _spool_all(self, wait: float, *, in_flight: bool = False) -> None:
        """What is still held now goes to the spool (at close and exit: the drain's time
        is up), each thread's messages in order; ``wait``: what is left of that time for
        another process's append (held by a stopped process, it is not waited out).
        ``in_flight`` (the process ends): the messages enqueues are sending now too, unsure,
        before what is held (a thread is held only behind its messages already in flight)."""
        with self._spool_lock:
            with self._lock:
                sending = list(self._in_flight.values()) if in_flight else []
                if in_flight:
                    self._in_flight.clear()
                held = [_Held(m, maybe_queued=True) for batch in sending for m in batch]
                held += [h for thread in list(self._held) for h in self._take(thread)]
            if held:
                self._spool(held, wait=wait)


class _Drainer:
    """The thread that empties an :class:`Enqueuer`'s buffer, on a loop of its own: the
    agent's loops may be busy, blocked, or gone (``Runner.run`` closes its loop)."""

    def __init__(self, enqueuer: Enqueuer) -> None:
        self._enqueuer = weakref.ref(enqueuer)
        self._settings = enqueuer._settings
        self._handed_out = enqueuer.handed_out
        self._wake = threading.Event()
        self._halt = threading.Event()
        """Set by :meth:`stop` (cleared by a wake after it): the drain ends its current
        step, waits no more, and the thread ends."""
        self._thread: threading.Thread | None = None
        self._closing_until: float | None = None
        self._start = threading.Lock()

    def wake(self) -> None:
        with self._start:
            self._halt.clear()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._main, name="afterthought-drain", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        client = None
        try:
            client = connect(self._settings.redis_url, timeout=DRAIN_TIMEOUT_SECONDS)
            queue = ThreadQueue(  # connects on first use, on this loop
                client, self._settings, handed_out=self._handed_out
            )
            while True:
                if not self._wake.wait(IDLE_EXIT_SECONDS):
                    with self._start:  # wake() sees this thread gone, or it sees the event
                        if not self._wake.is_set():
                            self._thread = None
                            return
                self._wake.clear()
                with self._start:  # a wake() after stop() clears the flag: keep draining
                    if self._halt.is_set():
                        self._thread = None
                        return
                enqueuer = self._enqueuer()
                if enqueuer is None:
                    return
                closing = self._closing_until
                until = float("inf") if closing is None else closing
                # A replay is done at the exit too (within its bound): an exit that came
                # before this thread began the replay it was woken for would leave it
                # undone, for a worker, though Redis answers.
                loop.run_until_complete(
                    enqueuer._drain(queue, until=until, replay=True, halt=self._halt)
                )
                if self._closing_until is not None:
                    return
                del enqueuer
        except Exception as exc:  # never silent: the buffer would stop draining
            log.error("drain thread failed error=%s", type(exc).__name__)
        finally:
            if client is not None:
                loop.run_until_complete(client.aclose())
            loop.close()

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def stop(self) -> None:
        """End the thread after its current step (its buffer is empty): its loop and
        connection are closed."""
        with self._start:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            self._halt.set()
        self._wake.set()
        thread.join(STOP_SECONDS)

    def close(self, until: float) -> None:
        """Drain until ``until`` (monotonic), then stop."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._closing_until = until
        self._wake.set()
        thread.join(max(0.0, until - time.monotonic()))


_ENQUEUERS: weakref.WeakSet[Enqueuer] = weakref.WeakSet()
watch_buffer(lambda: sum(e.buffered for e in list(_ENQUEUERS)))


@atexit.register
def _spool_held() -> None:
    """Every buffer gets its ``exit_flush_seconds``, together, to reach Redis (and a
    replay under way, to end); what is left then is spooled, whether or not its drain
    thread is still waiting on Redis (a copy it sends after all is one the replay skips).
    At exit and at a stop signal: the drain threads are done with (after a signal, what
    is held goes to the spool at once, for a worker or the next process to replay)."""
    start = time.monotonic()
    held = [
        e
        for e in list(_ENQUEUERS)
        if e.buffered or e._in_flight or (e._replay_due and e._drainer.alive)
    ]
    for enqueuer in held:
        enqueuer._drainer._closing_until = start + enqueuer._settings.exit_flush_seconds
        enqueuer._drainer._wake.set()
    for enqueuer in held:
        until = start + enqueuer._settings.exit_flush_seconds
        enqueuer._drainer.close(until)
        enqueuer._spool_all(max(0.0, until - time.monotonic()), in_flight=True)
        # Its time is up: a drain thread asleep on the breaker or a backoff ends now, or
        # the exit after a stop signal's flush would wait for it once more.
        enqueuer._drainer._halt.set()


_replaced: dict[int, Callable[[int, FrameType | None], Any] | int] = {}
"""The handler each stop signal had before this module's (it goes on to it)."""
_stopping = threading.Event()
"""A stop signal came: what is held from then on is spooled at once. A server's graceful
shutdown still serves turns, and it may end by the signal's default action (uvicorn puts
back the handler it found and raises the signal again), where no exit hook runs."""
_flush: tuple[threading.Thread, float] | None = None
"""A stop signal's flush under way: its thread, and when its time is up (monotonic).
Signal handlers run on the main thread only, a second one inside the first."""


def _catch_stop_signals() -> None:
    """Spool on SIGTERM, then pass it on to the handler it found (uvicorn's graceful
    shutdown, or the default action, raised again, so the process ends as the signal ends
    it: 143 to a shell). SIGINT only under its default action: Python's KeyboardInterrupt
    (asyncio's too) exits through the exit hook, and asyncio puts Python's handler back
    only over its own, so one wrapped would stay, stale, past its ``asyncio.run``.
    Python's handler, not a loop's: the buffer belongs to no loop (``Runner.run`` closes
    its own), and a loop's handler runs all the same (the loop learns of the signal from
    its wakeup fd, whatever Python handler is set). Once a process, from the main thread
    only (Python's rule); a signal ignored, or handled outside Python, is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        found = signal.getsignal(sig)
        if sig in _replaced or found is None or found == signal.SIG_IGN:
            continue
        if sig == signal.SIGINT and found != signal.SIG_DFL:
            continue
        _replaced[sig] = found
        signal.signal(sig, _on_stop_signal)


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    global _flush
    _stopping.set()
    if _flush is None:
        # A thread of its own, joined for a bounded time: this one may have been
        # interrupted holding a lock the flush takes.
        bound = max((e._settings.exit_flush_seconds for e in list(_ENQUEUERS)), default=0.0)
        thread = threading.Thread(target=_spool_held, name="afterthought-stop", daemon=True)
        _flush = (thread, time.monotonic() + bound + STOP_WRITE_SECONDS)
    thread, until = _flush
    # A second signal (a supervisor's retry, Ctrl-C twice) waits for the same flush, for
    # the time it has left: passed on at once, it ended the process before the spool was
    # written. It may come between the two lines of the first: then it starts the thread.
    with contextlib.suppress(RuntimeError):  # started already (by the other handler)
        thread.start()
    if thread.ident is not None:  # else no thread could be started: nothing to wait for
        thread.join(max(0.0, until - time.monotonic()))
    if not thread.is_alive():
        _flush = None  # a later signal flushes what was held since
    found = _replaced[signum]
    if callable(found):
        found(signum, frame)
    elif found == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
