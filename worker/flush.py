"""Drains ready threads: claim each under a lease, send its queued messages in order,
acknowledge by sequence number. The queue's scripts live in ``afterthought.queue``; what
to do after each kind of error, in ``worker.retry``.

Every timeout is an unknown outcome: a call that failed ambiguously may still be stored,
so the next attempt waits for the server to settle, reads back what landed, and sends what
is missing as the same calls under the same idempotency keys, never as calls cut anew
(W2). No backend call outlives the lease that covers it on this worker's clock (W3). A
call that commits later than that all the same (minutes late, on a server that ignores
keys; or sent by a worker paused past its lease) makes copies: each thread that may see
one is read back until it no longer can, and its copies are repaired
(:meth:`Flusher.repair_late`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import random
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import redis.asyncio as aioredis
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_random_exponential

from afterthought.audit import AuditLog, Entry
from afterthought.backends.base import (
    LAST_CHECK,
    BackendError,
    LateCopy,
    MemoryBackend,
    OutgoingMessage,
    StoredMessage,
    UserRef,
    ignored_roles,
)
from afterthought.batching import (
    NUMBERING_FIELD,
    Call,
    StoredIndex,
    asks_context,
    missing,
    pack,
    parts,
)
from afterthought.connections import FAILURES
from afterthought.context_cache import PENDING, ContextCache, now_version
from afterthought.contract import MalformedPayload, QueuedMessage, checksum, split_content
from afterthought.fence import Fence
from afterthought.forget_marks import person_key
from afterthought.identity import Identity, IdentityRegistry
from afterthought.keys import Keys, digest
from afterthought.quarantine import Entry as QuarantineEntry
from afterthought.quarantine import Quarantine
from afterthought.queue import CHANGED, SERVER_CHANGED, Head, ThreadQueue
from afterthought.settings import Settings
from afterthought.tracing import persist_span
from afterthought.validation import refusal
from afterthought.worker import metrics
from afterthought.worker.forget import Forgetter
from afterthought.worker.pacing import MAX_IN_JOB_WAIT, Pacing
from afterthought.worker.retry import NARROW_AFTER, decide

log = logging.getLogger("afterthought.worker")

T = TypeVar("T")

#: In-job attempts for a transient failure before the thread is deferred.
IN_JOB_ATTEMPTS = 3
#: Deferred retries back off up to this many seconds.
MAX_DEFER_SECONDS = 300.0
#: A too-large reply halves the parts down to this size before giving up.
MIN_PART_CHARS = 100
#: Messages read past the newest of the last read, when a replay's thread is read again
#: after an unknown outcome: as many as a batch's own read back looks at (its parts, and
#: this many more), so a late commit stored just below a message sent after it is seen.
RECENT_MARGIN = 30
#: Replayed threads' histories a worker keeps between leases hold at most this many
#: messages in all (8 bytes each); the least recently used go first, the one in use never.
MAX_KEPT_MESSAGES = 2_000_000
#: Threads read back for late copies per :meth:`Flusher.repair_late` run.
LATE_THREADS_PER_RUN = 500
#: A thread whose call may commit late is first read back for copies this long after: the
#: worker's own read-back covers the first seconds, and a copy found later is no worse.
LATE_FIRST_READ_MS = 30_000
#: A thread is read back for late copies this far past the first message that may have
#: one: messages stored before it (and a copy of theirs) are not read.
LATE_MARGIN = 100
#: How often a claiming worker asks whether Redis is still the server the queue's state was
#: written on (:meth:`Flusher._check_server`): one round trip, whatever the load.
SERVER_CHECK_SECONDS = 1.0
#: How often a job looks for more due threads while it has free slots.
CLAIM_INTERVAL = 0.05
#: In a sharded layout, a shard that had nothing due is polled again after this long, not
#: at every claim: at light load a claim would cost a command per shard (24 shards made a
#: chat message cost 18 client commands instead of 7). A message queued in such a shard
#: meanwhile waits at most this much longer.
IDLE_SHARD_SECONDS = 0.25
#: A failed heartbeat is retried after this long, until the lease runs out.
RENEW_RETRY_SECONDS = 0.25
#: How often a worker records that the backend took a write (see ``_backend_ok_since``).
OK_MARK_SECONDS = 1.0
#: How long a forgotten user's new messages wait before the next look.
HOLD_MS = 5000
#: How long a thread whose record or head changed under a read waits before it is read
#: again: in a handover, until the worker's connections reach the new master (the old
#: one keeps its clients until the sentinels demote it, about 10 s).
CHANGED_RETRY_MS = 250
#: (thread, user) pairs whose ownership this process has checked.
MAX_KNOWN_OWNERS = 10_000
#: Threads whose (app, user, session) this process remembers, so the read of a batch's
#: head takes the user's epoch and registry entries along.
MAX_KNOWN_THREADS = 10_000


def _now_ms() -> int:
    return int(time.time() * 1000)


def _seq_of(message: StoredMessage) -> int:
    """The queue's sequence number a stored message carries; -1 for one stored otherwise."""
    value = message.metadata.get("afterthought_seq")
    return value if isinstance(value, int) else -1


def _backoff(attempts: int) -> float:
    """How long a thread waits after its ``attempts``-th failed attempt (jittered)."""
    return min(MAX_DEFER_SECONDS, 2.0**attempts) * random.uniform(0.5, 1.0)


def _retry_in_job(exc: BaseException) -> bool:
    """Transient, and not asking to wait longer than a job should sleep: a long
    ``Retry-After`` defers the thread instead, freeing the slot."""
    return (
        isinstance(exc, BackendError)
        and decide(exc).action == "retry"
        and (exc.retry_after or 0.0) <= MAX_IN_JOB_WAIT
    )


def _covers(inflight: bytes, first: int, last: int) -> bool:
    """Whether the recorded in-flight batch (``first:last``) holds all of ``first..last``."""
    low, high = (int(x) for x in inflight.decode().split(":"))
    return low <= first and last <= high


class _Flow(Exception):
    """How a flush tells its caller what to do next, not a failure: the persist span it
    ends is not an error."""


class _LeaseLost(_Flow):
    """Another worker may hold the thread now; stop touching it."""


class _Forgotten(_Flow):
    """The batch's user was forgotten while it was on its way: send nothing more of it."""


class _Held(_Flow):
    """The user is being forgotten: what they said since waits until that is done."""


class _Changed(_Flow):
    """The thread's record or head is not what the batch was read as (a read of the old
    master in a handover): nothing of it is sent; the thread is read again soon."""


class _Provisioning(Exception):
    """The backend failed while the batch's user and thread were found or made (a map
    rebuilt from the backend reads every thread of the user): nothing of the batch was
    sent."""

    def __init__(self, error: BackendError) -> None:
        super().__init__(error.kind)
        self.error = error


class _ReadAgain(_Flow):
    """The batch's thread is registered, but not where its BEGIN ran when the head was
    read: nothing of it is sent; the head is read again (its registered thread checked by
    the next BEGIN)."""


class _Paused(Exception):
    """Consumption is paused (the backend refused our credentials): the thread is given
    back at once, due again when the pause ends."""


class _IdentityMismatch(Exception):
    """The thread pinned to the batch does not belong to the batch's user."""


class _Epoch:
    """The deletion epoch of a batch's user, as it was when the batch was read.

    A forget marks the user and raises their epoch in one step, then waits until no
    worker holds one of their threads (``worker.forget``): so a holder that checks the
    epoch right before each backend call writes nothing of a user once their forget has
    begun. :meth:`check` is that check. When a script that ran just before has already
    compared the epoch atomically (the batch's BEGIN, see :meth:`confirmed`), the next
    check is that comparison: nothing but this process's own work (no sleep, no other
    backend call) lies between it and the call, the same window a separate read leaves.
    So whatever calls the backend or waits before the first send calls :meth:`stale`: the
    read back of a batch to reconcile, a pinned thread's owner check, an in-job retry, a
    wait at the shared 429 gate."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        message: QueuedMessage,
        lease: _Lease,
        *,
        person: str | None = None,
    ) -> None:
        self._redis = redis
        self.app, self.user_id = message.app, message.user_id
        self.keys = (
            keys.epoch(message.app, message.user_id),
            keys.forgetting(message.app, message.user_id),
        )
        self._hold = (keys.lease(lease.tk), lease.token)
        self.seen = 0
        self._confirmed = False
        # A forget of the user's person in another app (``worker.forget.person_key``):
        # it raises no epoch here and waits for no lease of this app, so its time is read
        # on its own, and its change since is checked with the epoch's.
        self._person = person
        self.person_forgot: int | None = None
        self._flat = not keys.shards  # the person's time may join a script of the user's keys

    async def read_person(self) -> int | None:
        """When a forget of the user's person last began (None: none known)."""
        if self._person is None:
            return None
        raw = await self._redis.get(self._person)
        self.person_forgot = None if raw is None else int(raw)
        return self.person_forgot

    async def person_moved(self) -> bool:
        """Whether a forget of the user's person began since :meth:`read_person`."""
        before = self.person_forgot
        return await self.read_person() != before

    def fence(self) -> Fence:
        """The epoch read, the thread's lease and the person's forget time read before the
        batch: what the batch's writes are fenced by."""
        forgot = "" if self.person_forgot is None else str(self.person_forgot)
        return Fence(
            self.keys[0],
            self._hold[0],
            self.seen,
            self._hold[1],
            person_key=self._person,
            person_forgot=forgot,
            in_script=self._flat,
        )

    async def read(self) -> int:
        """The epoch now. Raises :class:`_Held` while the user is being forgotten."""
        epoch, forgetting = await self._redis.mget(self.keys)
        return self.found(int(epoch or 0), forgetting)

    def found(self, epoch: int, forgetting: bytes | None) -> int:
        """What a read of the two keys (here, or in a script of the batch) found."""
        self.seen, self._confirmed = epoch, False
        if forgetting == PENDING.encode():
            raise _Held
        return self.seen

    def confirmed(self) -> None:
        """A script just compared the epoch with :attr:`seen` and found the user neither
        forgotten since nor being forgotten: the next :meth:`check` is that one."""
        self._confirmed = True

    def stale(self) -> None:
        """Time passed (a wait): the next :meth:`check` reads again."""
        self._confirmed = False

    async def check(self) -> None:
        """Raise :class:`_Forgotten` if the user was forgotten since :meth:`read`."""
        if self._confirmed:
            self._confirmed = False  # good for one step only
            return
        before = self.seen
        try:
            now = await self.read()
        except _Held:
            raise _Forgotten from None  # a forget began: it bumped the epoch too
        if now != before or await self.person_moved():
            raise _Forgotten


class _Lease:
    """This worker's claim on one thread (``tk``: the thread's reference): its token, and
    until when it surely holds it.

    The deadline is counted from when each renewal was *sent*, so Redis' own expiry is
    never earlier. A failed renewal is retried; once the deadline passes, or Redis says
    another token holds the thread, the lease is lost and nothing more is sent."""

    def __init__(
        self,
        queue: ThreadQueue,
        tk: str,
        token: str,
        *,
        seconds: float,
        settle: float,
        clock: Callable[[], float],
        claimed_at: float,
    ) -> None:
        self.tk = tk
        self.token = token
        self._queue = queue
        self._seconds = seconds
        self._settle = settle
        self._clock = clock
        self._deadline = claimed_at + seconds
        self._lost = False
        self._ended = False
        self.batch: list[QueuedMessage] = []
        """The batch being sent: what a failure is about (never what was queued since)."""
        self.thread_uuid: str | None = None
        self.user: UserRef | None = None
        """The backend user the batch is sent for, once known."""

    def remaining(self) -> float:
        return 0.0 if self._lost else self._deadline - self._clock()

    def call_timeout(self, wanted: float) -> float:
        """The next backend call gets its full ``wanted`` time, and the server ``settle``
        more, before the lease can expire; with less left the lease is given up (raises).
        A call is never cut short: one that gave up early would be read back before the
        server could have finished it."""
        if self.remaining() - self._settle < wanted:
            raise _LeaseLost
        return wanted

    async def keep(self) -> None:
        """The heartbeat, until the lease is lost or :meth:`end` is called."""
        wait = self._seconds / 3
        while not (self._lost or self._ended):
            await asyncio.sleep(wait)
            wait = await self.renew()

    def end(self, heartbeat: asyncio.Task[None]) -> None:
        """Stop the heartbeat for good. Cancelling it alone is not enough: a cancellation
        that lands while Redis fails can leave the client as another error (raised in a
        ``finally`` as the connection is dropped), which a renewal takes for a failed one,
        and the heartbeat went on renewing a lease nobody used, until the job's timeout
        (seen after a Sentinel failover; the thread sat for a minute)."""
        self._ended = True
        heartbeat.cancel()

    async def renew(self) -> float:
        """One renewal; returns how long to wait before the next. A failed one is retried
        soon, until the deadline passes."""
        sent_at = self._clock()
        try:
            held = await self._queue.renew(self.tk, self.token, now_ms=_now_ms())
        except FAILURES as exc:
            log.warning("lease renewal failed thread=%s error=%s", self.tk, type(exc).__name__)
            self._lost = self.remaining() <= 0
            return min(RENEW_RETRY_SECONDS, self._seconds / 10)
        if held:
            self._deadline = sent_at + self._seconds
        else:
            self._lost = True
        return self._seconds / 3


@dataclass
class _History:
    """A replayed thread's stored messages, recognised by key however long the thread: read
    whole, page by page, newest first, then kept as 64-bit digests (``StoredIndex``: 8
    bytes a message) and brought up to date with each call that succeeds. The worker keeps
    it between leases (``Flusher._histories``), so a later lease — or a later attempt after
    an unknown outcome — reads only the newest pages again: a thread only grows at its end,
    so what others, or an earlier attempt's late commit, stored since lies above the newest
    message read before (``newest``), or among the ``RECENT_MARGIN`` below it. A read cut
    short (a job's timeout, a crash of the lease) goes on where it stopped (``older``), so
    a thread too long to read in one job is read in several.

    Why not less: the backend is the only record that is complete (messages stored turn by
    turn, by an earlier import, by another integration before afterthought, or late by a
    request that timed out); a ledger of keys in Redis would miss what was stored without
    it and die with Redis' data, and telling the importer which keys are stored needs this
    read anyway. Why not more: a batch costs one lookup a message, and a lease a read of the
    pages written since the last."""

    index: StoredIndex = field(default_factory=lambda: StoredIndex(replay=True))
    newest: str | None = None
    """The uuid of the newest message a read began with: it and every older message down
    to ``older`` are in ``index``."""
    older: str | None = None
    """The cursor of the older pages not read yet (None: none left)."""
    lease: str | None = None
    """The token of the lease that last brought it up to date."""
    tops: dict[int | None, int] = field(default_factory=dict)
    """The highest queue sequence number read back, by the numbering it belongs to (None:
    stored without one's name; see :meth:`Flusher._gap_stored`); not raised by this
    worker's own calls, so a batch's own messages never cover a gap in it."""

    def sent(self, messages: Iterable[OutgoingMessage]) -> None:
        """Record what a call that succeeded, or a read back, found stored."""
        self.index.add_sent(messages)

    def read(self, stored: Sequence[StoredMessage]) -> None:
        """Record a page read back."""
        self.index.add_stored(stored)
        for m in stored:
            named = m.metadata.get(NUMBERING_FIELD)
            numbering = named if isinstance(named, int) else None
            self.tops[numbering] = max(self.tops.get(numbering, 0), _seq_of(m))

    def top_seq(self, numbering: int | None) -> int:
        """The highest sequence number read back of that numbering; of any, for a numbering
        whose name is unknown (queued before numberings were named, or one that went on
        after its counter was lost)."""
        if numbering is None:
            return max(self.tops.values(), default=0)
        return self.tops.get(numbering, 0)


@dataclass(frozen=True, slots=True)
class _Cut:
    """How a batch is cut into calls (``calls``: messages per call, characters per part)
    and the recorded in-flight range it is recorded with; ``held``: the cut the thread's
    record holds (None: none, a record from before cuts were recorded)."""

    calls: tuple[int, int]
    record: tuple[int, int]
    held: tuple[int, int] | None


@dataclass
class _Sending:
    """One batch of messages on its way to one thread."""

    thread_uuid: str
    lease: _Lease
    stats: Counter[str]
    history: _History | None
    """The thread's history, if this worker keeps one (it read the thread for a replay)."""
    epoch: _Epoch
    reconcile: bool
    """Check the backend first: an earlier attempt may have stored part of it."""
    fresh: bool
    """Read the backend itself, not ``history``: a call may have landed unseen."""
    replay: bool
    """A replayed session: reconciled by key and by role and text."""
    whole: bool
    """Reconciled against the whole thread (:class:`_History`): a replay, or a batch with
    a message that may be stored anywhere in it (``unsure``: a spool or buffer resend, a
    dead letter, a message Redis gave back after going back in time), as the thread may
    have grown far past it since (a re-import, the queue behind it)."""
    cut: tuple[int, int]
    """Messages per call and characters per part, as recorded with the batch."""
    record: tuple[int, int]
    """The recorded in-flight range (``first``, ``last``): the cut is recorded with it."""
    held: tuple[int, int] | None
    """The cut the thread's record holds (``cut``, once recorded)."""
    context: str | None = None
    """The context block the last successful call brought back."""
    context_version: int = 0
    """Its version: when the call that brought it back went out (``now_version``)."""
    stored_calls: set[str] = field(default_factory=set)
    """Idempotency keys of this batch's calls known to be stored (their replies came)."""


class Flusher:
    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        backend: MemoryBackend,
        *,
        after_flush: Callable[[QueuedMessage], Awaitable[None]] | None = None,
        allow_oom: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``after_flush`` runs after each batch of messages reached the backend.
        ``allow_oom``: see :class:`~afterthought.queue.ThreadQueue`. ``clock`` (monotonic
        seconds) and ``sleep`` (in-job retry waits) let a simulation drive time."""
        self.after_flush = after_flush
        self.settings = settings
        self.redis = redis
        self.backend = backend
        self.keys = Keys.of(settings)
        self.queue = ThreadQueue(redis, settings, allow_oom=allow_oom)
        self.registry = IdentityRegistry(
            redis,
            settings,
            allow_oom=allow_oom,
            rebuilt=lambda truncated: metrics.THREAD_MAP_REBUILDS.labels(
                "truncated" if truncated else "whole"
            ).inc(),
            confirm=self.queue.confirmed,
        )
        self.pacing = Pacing(redis, self.keys, pause_seconds=settings.pause_seconds)
        self.ignore_roles = ignored_roles(settings, backend)
        self.cache = ContextCache(settings)
        self._owners: dict[tuple[str, str], bool] = {}
        self._foreign_pin_told = False
        self._whose: dict[str, tuple[str, str, str]] = {}
        """Thread reference -> (app, user id, session id), as its payloads said."""
        self.forgetter = Forgetter(settings, redis, backend)
        self.audit = AuditLog(redis, settings)
        self._clock = clock
        self._sleep = sleep
        self._token = secrets.token_hex(8)
        self._claims = 0
        self._idle_until: dict[int | None, float] = {}
        """Sharded: when each shard that had nothing due is polled again (flusher clock)."""
        self._active: set[str] = set()
        """Threads this process is flushing: it never claims one of them twice."""
        self._ok_marked = 0.0
        self._open = 0
        """Drains of this process that will claim more within ``CLAIM_INTERVAL``."""
        self._settling: dict[tuple[str, str], asyncio.Task[None]] = {}
        """Users whose block is cached again once the backend has taken their batches in."""
        self._settle_now = asyncio.Event()
        self._histories: dict[str, _History] = {}
        """Replayed threads' stored messages, by thread uuid (see :class:`_History`)."""
        self._served: dict[int | None, tuple[int, str] | None] = {}
        """Each shard's server as last checked (``ThreadQueue.served_by``; None: it does
        not say which it is; see :meth:`_given_back`)."""
        self._server_checked: dict[int | None, float] = {}
        self._unnamed_told = False

    @property
    def _default_cut(self) -> tuple[int, int]:
        return self.settings.batch_size, self.settings.max_message_chars

    def _may_recut(self, head: Head) -> bool:
        """Whether a batch that keeps failing may be cut into other calls: only once it has
        failed for longer than a call may commit late. Before, an attempt at its calls may
        still land, and a call cut otherwise carries another key: both would be stored."""
        since = head.failing_since_ms
        return since is None or _now_ms() - since >= self.settings.late_commit_seconds * 1000

    async def _recut(self, sending: _Sending, cut: tuple[int, int]) -> None:
        """Record a new cut of the in-flight batch (after a too-large refusal, a certain
        outcome): the next attempt, by any worker, sends these calls."""
        first, last = sending.record
        began = await self.queue.begin(
            sending.lease.tk,
            sending.lease.token,
            first=first,
            last=last,
            cut=cut,
            read=(f"{first}:{last}".encode(), sending.held),
            epoch=(*sending.epoch.keys, sending.epoch.seen),
            server=self._server_of(sending.lease.tk),
        )
        if not began:
            raise _LeaseLost
        if began in (CHANGED, SERVER_CHANGED):
            raise _Changed
        if began < 0:
            raise _Forgotten
        sending.cut = sending.held = cut

    async def _expect_late(self, thread_uuid: str, *, seq: int) -> None:
        """A call of the thread, from message ``seq`` on, may commit late: look for copies
        until ``late_commit_seconds`` have passed (:meth:`repair_late`)."""
        horizon_ms = int(self.settings.late_commit_seconds * 1000)
        if horizon_ms:
            await self.queue.expect_late(
                thread_uuid, seq=seq, now_ms=_now_ms(), horizon_ms=horizon_ms
            )

    @property
    def claiming(self) -> bool:
        """Whether a drain in this process has free slots and time left: it claims what
        falls due by itself, so no other job need be queued for it."""
        return self._open > 0

    async def drain(self, *, budget: float) -> Counter[str]:
        """Flush due threads, ``worker_concurrency`` at a time, claiming more as slots free
        up, until none is due or ``budget`` seconds have passed."""
        stats: Counter[str] = Counter()
        end = self._clock() + budget
        self._idle_until.clear()  # dispatched because something is due: every shard is read
        running: set[asyncio.Task[Counter[str]]] = set()
        is_open = False
        try:
            while True:
                free = self.settings.worker_concurrency - len(running)
                now_open = free > 0 and self._clock() < end
                self._open += int(now_open) - int(is_open)
                is_open = now_open
                if free > 0 and self._clock() < end and not await self.pacing.paused():
                    claimed = await self.claim(limit=free)
                    running |= {
                        asyncio.create_task(self.flush_thread(lease, until=end))
                        for lease in claimed
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
                    else:  # e.g. Redis failed at release: the lease expires, it recovers
                        stats["errors"] += 1
                        log.error("flush task failed error=%s", type(task.exception()).__name__)
        finally:
            self._open -= int(is_open)
            # Ended early (the job's timeout, Redis failing a claim, a stop): the threads'
            # tasks would outlive the job; each gives its lease back as it is cancelled.
            for task in running:
                task.cancel()
        return stats

    async def _check_server(self, shards: Iterable[int | None]) -> None:
        """Whether each shard's Redis is still the server its state was written on, at most
        once per ``SERVER_CHECK_SECONDS`` a shard (before a claim and before each batch is
        recorded, so a rollback during a lease is caught at its next batch; the record
        itself is refused on another server, see ``BEGIN_LUA``): a Redis restarted from a
        snapshot, or a replica promoted while it lagged, gives back messages whose
        acknowledgement it lost, though they are stored. On a Cluster each shard is checked
        on its own node."""
        due = [
            s
            for s in dict.fromkeys(shards)
            if self._clock() >= self._server_checked.get(s, -math.inf) + SERVER_CHECK_SECONDS
        ]
        if not due:
            return
        checked = self._clock()
        found = await asyncio.gather(*(self.queue.served_by(s) for s in due))
        for shard, served in zip(due, found, strict=True):
            self._served[shard] = served
            self._server_checked[shard] = checked
        unnamed = sum(served is None for served in self._served.values())
        metrics.REDIS_SERVER_UNNAMED.set(unnamed)
        if unnamed and not self._unnamed_told:
            self._unnamed_told = True
            log.warning(
                "redis does not name its server (INFO refused) shards=%d:"
                " every batch there is reconciled against its thread",
                unnamed,
            )

    def _server_of(self, tk: str) -> str:
        """The ``run_id`` the thread's shard was last checked on ('': none known)."""
        served = self._served.get(self.keys.shard_of_ref(tk))
        return served[1] if served else ""

    def _given_back(self, message: QueuedMessage, shard: int | None) -> bool:
        """Whether the message may be one its shard's server gave back, stored already,
        anywhere below the messages stored after it, so it is reconciled as ``unsure``:
        queued (``queued_ms``, Redis' clock) before the server was found to be another
        (``since``, Redis' clock, whichever worker found it; the margin covers two servers'
        clocks, a failover's), or on a server that does not say which it is (every one:
        nothing tells a rollback there)."""
        if shard not in self._served:
            return False
        served = self._served[shard]
        if served is None:
            return True
        since = served[0]
        if not since:
            return False
        margin = int(self.settings.forget_clock_margin_seconds * 1000)
        queued = message.queued_ms
        return queued is None or queued < since + margin

    async def claim(self, *, limit: int) -> list[_Lease]:
        """Take up to ``limit`` due threads, each under a token of its own: the longest
        due first, whatever their shards (every shard's due threads read in one batch)."""
        now, polled_at = _now_ms(), self._clock()
        shards = [s for s in self.keys.shard_ids if self._idle_until.get(s, 0.0) <= polled_at]
        if not shards:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.zrangebyscore(
                    self.keys.ready(shard),
                    "-inf",
                    now,
                    start=0,
                    num=limit + len(self._active),
                    withscores=True,
                )
            due: list[list[tuple[bytes, float]]] = await pipe.execute()
        if self.keys.shards > 1:  # one shard: its poll is the claim itself
            for shard, found in zip(shards, due, strict=True):
                if found:
                    self._idle_until.pop(shard, None)
                else:
                    self._idle_until[shard] = polled_at + IDLE_SHARD_SECONDS
        ranked = sorted((score, raw.decode()) for found in due for raw, score in found)
        tks = [ref for _, ref in ranked if ref not in self._active][:limit]
        if not tks:
            return []
        await self._check_server(self.keys.shard_of_ref(tk) for tk in tks)
        tokens = [f"{self._token}:{self._claims + i}" for i in range(len(tks))]
        self._claims += len(tks)
        claimed_at = self._clock()  # before the claim is sent: never later than Redis' expiry
        won = await self.queue.claim(tks, tokens, now_ms=now)
        leases = [
            _Lease(
                self.queue,
                tk,
                token,
                seconds=self.settings.lease_seconds,
                settle=self.settings.backend_settle_seconds,
                clock=self._clock,
                claimed_at=claimed_at,
            )
            for tk, token, ok in zip(tks, tokens, won, strict=True)
            if ok
        ]
        self._active.update(lease.tk for lease in leases)
        return leases

    async def flush_thread(self, lease: _Lease, *, until: float = float("inf")) -> Counter[str]:
        """Send what is queued on one claimed thread, batch after batch, until it is empty
        or the job's time is up (``until``, on the flusher's clock); always gives the
        lease back."""
        tk = lease.tk
        stats: Counter[str] = Counter()
        next_ms = _now_ms()
        heartbeat = asyncio.create_task(lease.keep())
        try:
            await self._batches(lease, stats, until)
        except _LeaseLost:
            stats["lease_lost"] += 1
            log.warning("lease lost thread=%s", tk)
        except _Held:
            stats["held"] += 1
            next_ms += HOLD_MS
        except _Changed:
            stats["changed"] += 1
            next_ms += CHANGED_RETRY_MS
        except _Paused:
            stats["paused"] += 1
        except _Provisioning as exc:
            next_ms = await self._provisioning_failed(lease, exc.error, stats)
        except BackendError as exc:
            next_ms = await self._failed(lease, exc, stats)
        except Exception as exc:  # never lose the lease to a bug: defer and say so
            stats["errors"] += 1
            next_ms += 5000
            # The type only: an exception's text may quote content. The trace is for DEBUG.
            log.error("flush failed thread=%s error=%s", tk, type(exc).__name__)
            log.debug("flush failure trace thread=%s", tk, exc_info=True)
        finally:
            lease.end(heartbeat)
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            try:
                await self.queue.release(tk, lease.token, next_ms=next_ms, user=self._whose.get(tk))
            finally:
                self._active.discard(tk)
        return stats

    async def _batches(self, lease: _Lease, stats: Counter[str], until: float) -> None:
        try:
            while await self._flush_batch(lease, stats) and self._clock() < until:
                pass
        except Exception as exc:
            # A stop cancels the job's task, and a client in the middle of a call may
            # answer that with an error of its own (redis-py's ConnectionError): that is
            # the stop, not a failed batch; no attempt is counted and no error logged.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from exc
            raise

    async def _provisioning_failed(
        self, lease: _Lease, exc: BackendError, stats: Counter[str]
    ) -> int:
        """A retryable failure while the batch's thread was found or made is not a failed
        attempt at the batch: not counted (its count backs the head off exponentially, up
        to ``MAX_DEFER_SECONDS``, and dead-letters it after ``retry_max_attempts``), so the
        thread is tried again after a first failure's delay. Provisioning takes many calls
        after Redis went back (the map's rebuild reads each of the user's threads), and so
        fails far more often than one call: counted, a session waited minutes after a
        handover, or went to the dead letters, its messages never sent. Anything else is
        decided as any failure (:meth:`_failed`)."""
        if decide(exc).action != "retry":
            return await self._failed(lease, exc, stats)
        delay = max(_backoff(1), exc.retry_after or 0.0)
        stats["deferred"] += 1
        metrics.RETRIES.labels("deferred").inc()
        log.warning("provisioning deferred thread=%s error=%s in=%.1fs", lease.tk, exc, delay)
        return _now_ms() + int(delay * 1000)

    async def _failed(self, lease: _Lease, exc: BackendError, stats: Counter[str]) -> int:
        """Decide what a failure the job could not absorb means (``worker.retry``);
        returns when to try the thread next."""
        tk, now = lease.tk, _now_ms()
        head = lease.batch[0] if lease.batch else None
        if exc.kind == "not_found" and head is not None and await self._user_gone(head, lease.user):
            # Not the batch's fault: its user was deleted elsewhere. Due again at once, to
            # be provisioned afresh (what they said before the forget is dropped then).
            stats["reprovisioned"] += 1
            return now
        decision = decide(exc)
        if decision.action == "pause":
            await self._quietly(self.pacing.pause(exc), "pause")
            stats["paused"] += 1
            return now + int(self.settings.pause_seconds * 1000)
        try:
            attempts, since = await self.queue.failed_attempt(tk, now_ms=now)
        except FAILURES:  # e.g. at maxmemory: retry later without counting
            attempts, since = 1, now
        if decision.action == "retry":
            age = (now - since) / 1000
            if head is not None and (
                age > self.settings.retry_max_age_seconds
                or (
                    attempts >= self.settings.retry_max_attempts
                    # A call of it may still commit: it would be stored and dead-lettered.
                    and (not decision.unknown_outcome or age >= self.settings.late_commit_seconds)
                    and await self._backend_ok_since(since)
                )
            ):
                if decision.unknown_outcome and await self._stored_after_all(lease, head):
                    await self._acknowledge(lease, head.seq or 0)
                    stats["messages"] += 1
                    return now
                reason = f"{exc} after {attempts} attempts"
                await self._dead_letter(lease, 1, reason=reason, attempts=attempts, last=head.seq)
                stats["dead"] += 1
                return now
            delay = max(_backoff(attempts), exc.retry_after or 0.0)
            if decision.unknown_outcome:
                delay = max(delay, self.settings.backend_settle_seconds)
            stats["deferred"] += 1
            metrics.RETRIES.labels("deferred").inc()
            log.warning(
                "flush deferred thread=%s error=%s attempts=%d in=%.1fs", tk, exc, attempts, delay
            )
            return now + int(delay * 1000)
        count = len(lease.batch)
        last = lease.batch[-1].seq if lease.batch else None
        await self._dead_letter(lease, count, reason=str(exc), attempts=attempts, last=last)
        stats["dead"] += count
        return now

    async def repair_late(self, *, now_ms: int | None = None) -> Counter[str]:
        """Read back each thread a call may still commit to late (:attr:`Keys.late`) and
        repair the copies found: the first copy of a message (by key and text) stays,
        every later one is taken out of what readers meet (``MemoryBackend.remove_copy``:
        deleted, or on Zep marked and its graph episode deleted). The first copies are in
        the order said: no message is sent before the ones before it are known stored. A
        thread is watched until its time is past and it was read back after that (a late
        commit has landed by then) with no copy left waiting for the backend; one that
        cannot be read now is read at the next run. Runs as a cron, about once a minute."""
        now_ms = _now_ms() if now_ms is None else now_ms
        noted_before = now_ms + int(self.settings.late_commit_seconds * 1000) - LATE_FIRST_READ_MS
        stats: Counter[str] = Counter()
        watched: dict[str, list[tuple[str, int, int]]] = {}
        for entry in await self.queue.expected_late(limit=LATE_THREADS_PER_RUN):
            if entry[2] <= noted_before:  # noted long enough ago
                watched.setdefault(entry[0], []).append(entry)
        horizon_ms = int(self.settings.late_commit_seconds * 1000)
        for thread_uuid, entries in watched.items():
            try:
                found, marked = await self._late_copies(thread_uuid, seq=min(e[1] for e in entries))
            except BackendError as exc:
                if exc.kind != "not_found":  # a thread deleted since has nothing to repair
                    stats["unread"] += 1
                    await self.queue.keep_late(horizon_ms=horizon_ms)
                    log.warning("late copies unread thread_uuid=%s error=%s", thread_uuid, exc)
                    continue
                found, marked = [], []
            stats["threads"] += 1
            # A copy found marked was repaired by a run whose last reply was lost, or by
            # another run: counted here unless that run counted it.
            for _ in range(await self.queue.count_repaired(marked, now_ms=now_ms)):
                metrics.LATE_COPIES.labels("marked").inc()
            # What the backend derives from a copy (Zep's graph) comes later than the copy:
            # a thread with a copy not yet repairable is watched on, for one more horizon.
            last_chance = now_ms >= max(e[2] for e in entries) + horizon_ms
            waiting, left = await self._repair_copies(
                thread_uuid, found, last_chance, stats, now_ms=now_ms
            )
            if waiting or left:  # watched on: read back again at the next run
                stats["copies_waiting"] += waiting
                stats["copies_left"] += left
                if left:  # however long the backend keeps failing, until it is repaired
                    await self.queue.keep_late(horizon_ms=horizon_ms)
                continue
            await self.queue.late_over([e for e in entries if e[2] <= now_ms], now_ms=now_ms)
        return stats

    async def _repair_copies(
        self,
        thread_uuid: str,
        found: list[LateCopy],
        last_chance: bool,
        stats: Counter[str],
        *,
        now_ms: int,
    ) -> tuple[int, int]:
        """Repair each copy found in a thread, one at a time (each is counted once it is
        repaired, by its uuid: once, whichever runs repair it), every call retried in the
        run; a copy whose repair still fails is left for the next run and the others are
        repaired all the same. How many copies wait for the backend to process them, and
        how many were left after failures."""
        repaired: list[str] = []
        waiting = left = 0
        for copy in found:
            try:
                action = await self._retried(
                    functools.partial(
                        self.backend.remove_copy,
                        thread_uuid=thread_uuid,
                        copy=copy,
                        last_chance=last_chance,
                    )
                )
            except BackendError as exc:
                if exc.kind != "not_found":  # gone since: nothing of it to repair
                    left += 1
                    log.warning(
                        "late copy left thread_uuid=%s uuid=%s error=%s",
                        thread_uuid,
                        copy.uuid,
                        exc,
                    )
                continue
            if action is None:
                waiting += 1
                continue
            if await self.queue.count_repaired([copy.uuid], now_ms=now_ms):
                metrics.LATE_COPIES.labels(action).inc()
            stats[f"copies_{action}"] += 1
            repaired.append(copy.uuid)
        if repaired:
            log.warning(
                "late copies repaired thread_uuid=%s copies=%d uuids=%s",
                thread_uuid,
                len(repaired),
                ",".join(repaired),
            )
        return waiting, left

    async def _late_copies(self, thread_uuid: str, *, seq: int) -> tuple[list[LateCopy], list[str]]:
        """The late copies in a thread not yet marked, and the uuids of those marked, among
        its messages from ``LATE_MARGIN`` before message ``seq`` on: what a late call can
        have copied was sent from ``seq`` on, and stored after it. Read page by page,
        newest first, as deep as that is (a long re-import's first call may be thousands
        of messages down), keeping only each message's key, checksum and uuid (and a
        copy's text)."""
        read: list[tuple[tuple[str, str] | None, StoredMessage, int]] = []  # newest first
        cursor: str | None = None
        while True:
            found, cursor = await self._retried(
                functools.partial(
                    self.backend.message_page,
                    thread_uuid=thread_uuid,
                    cursor=cursor,
                    timeout=self.settings.backend_timeout,
                )
            )
            for m in found:
                said = None if m.key is None or m.is_copy else (m.key, checksum(m.content))
                read.append((said, m, _seq_of(m)))
            older = read[-LATE_MARGIN:]
            if cursor is None or (
                len(older) == LATE_MARGIN and all(at < seq for _, _, at in older)
            ):
                break
        kept: dict[tuple[str, str], str] = {}
        copies: list[LateCopy] = []
        for said, m, _ in reversed(read):  # oldest first
            if said is None:
                continue
            first = kept.setdefault(said, m.uuid)
            if first != m.uuid:
                copies.append(LateCopy(m.uuid, first, said[0], m.content, m.processed))
        return copies, [m.uuid for _, m, _ in read if m.is_copy]

    async def _stored_after_all(self, lease: _Lease, head: QueuedMessage) -> bool:
        """Whether a message whose last attempt had an unknown outcome is stored: read
        back, once the server has settled, before it is given up on."""
        if lease.thread_uuid is None:
            return False
        await self._sleep(self.settings.backend_settle_seconds)
        wanted = parts([head], self.settings.max_message_chars, self.keys)
        stored = await self.backend.recent_messages(
            thread_uuid=lease.thread_uuid,
            limit=len(wanted) + 30,
            timeout=lease.call_timeout(self.settings.backend_timeout),
        )
        return not missing(wanted, stored, replay=head.replay)

    async def _flush_batch(self, lease: _Lease, stats: Counter[str], *, again: bool = True) -> bool:
        """One batch from the head of the thread; False when nothing is left. ``again``:
        whether a batch whose thread provisioning found registered is read again at once
        (:class:`_ReadAgain`; else it is given back)."""
        tk = lease.tk
        # One round trip: the head, and (for a thread this process has seen) its user's
        # epoch and registry entries, which the steps below would otherwise each read.
        whose = self._whose.get(tk)
        head = await self.queue.head(tk, count=self.settings.batch_size, user=whose)
        raw_items, inflight = head.items, head.inflight
        if not raw_items:
            return False
        try:
            batch = self._decode_head(tk, raw_items, inflight)
        except MalformedPayload as exc:
            await self._dead_letter(lease, 1, reason=f"malformed: {exc}", attempts=0)
            stats["dead"] += 1
            return True
        if head.attempts >= NARROW_AFTER and self._may_recut(head):  # find which message
            batch = batch[:1]
        lease.batch, lease.thread_uuid, lease.user = batch, None, None
        first, last = batch[0].seq or 0, batch[-1].seq or 0
        said = (batch[0].app, batch[0].user_id, batch[0].session_id)
        if whose is None:  # first seen here: read again with its user's entries (BEGIN
            self._whose[tk] = said  # checks the registered thread the read finds)
            self._forget_whose()
            return await self._flush_batch(lease, stats)
        if whose != said:  # read for another user (never, short of a digest collision)
            head = Head(
                items=raw_items,
                inflight=inflight,
                attempts=head.attempts,
                cut=head.cut,
                failing_since_ms=head.failing_since_ms,
                done=head.done,
            )
            self._whose[tk] = said
            self._forget_whose()
        person = person_key(self.settings, app=batch[0].app, user_id=batch[0].user_id)
        epoch = _Epoch(self.redis, self.keys, batch[0], lease, person=person)
        try:
            if head.epoch is not None:
                current = epoch.found(head.epoch, head.forgetting)
            else:
                current = await epoch.read()
        except _Held:
            current = epoch.seen
            if all(m.epoch >= current for m in batch):
                raise
        # Said before a forget of their person (in another app, perhaps before this app
        # had them registered): the forgotten person's, as the enqueue script has it.
        margin = int(self.settings.forget_clock_margin_seconds * 1000)
        person_forgot = await epoch.read_person()
        forgotten = [
            m
            for m in batch
            if m.epoch < current
            or (
                person_forgot is not None
                and m.said_ms is not None
                and m.said_ms - m.skew_ms < person_forgot + margin
            )
        ]
        if forgotten:  # queued before the user was forgotten: dropped, never sent
            return await self._drop_forgotten(lease, forgotten, stats)
        # Narrowed inside the recorded batch: the record stays whole (no BEGIN), so once this
        # part is acknowledged the rest, which an earlier attempt may have stored under
        # another idempotency key, is still reconciled before it is sent (W2).
        recorded = inflight is not None and _covers(inflight, first, last)
        # Checked for every batch, not only at the claim: a Redis gone back in time while
        # this worker holds the thread (the snapshot has its lease) gives back messages it
        # has stored since, and they must be sent as given back (``_given_back``). BEGIN
        # records only on the server checked: one restarted within the second is found.
        shard = self.keys.shard_of_ref(tk)
        await self._check_server((shard,))
        # BEGIN compares the epoch too (atomically with recording the batch): the check
        # before the first backend call, unless something that takes time comes between.
        checked = (*epoch.keys, epoch.seen)
        # A recorded batch is sent as it was cut, whatever the settings say now.
        cut = head.cut if recorded and head.cut else self._default_cut
        record = (first, last)
        if recorded:
            low, high = (int(x) for x in (inflight or b"").decode().split(":"))
            record = (low, high)
        # Recorded now; or, recorded already, written again, the same, and confirmed before
        # it is relied on: it may be one a master wrote and never replicated before it was
        # replaced (a failed attempt's), or the new master's workers would send the batch
        # again; and one a restored snapshot gave back must be found on the server checked.
        # Only where the record, cut and head are still those read: the read may have
        # reached another node (see ``BEGIN_LUA``).
        began = await self.queue.begin(
            tk,
            lease.token,
            first=record[0],
            last=record[1],
            cut=cut,
            read=(inflight, head.cut),
            head=raw_items[: len(batch)],
            epoch=checked,
            server=self._server_of(tk),
            registered=(said, head.thread_uuid) if whose == said else None,
        )
        if not began:
            raise _LeaseLost
        if began == SERVER_CHANGED:  # checked again before the head is read again
            self._server_checked.pop(shard, None)
            raise _Changed
        if began == CHANGED:
            raise _Changed
        if began < 0:  # forgotten since the head was read: nothing of it is sent
            return await self._drop_forgotten(lease, batch, stats)
        if began == 1:
            epoch.confirmed()
        registered = head.user_uuid and head.graph_uuid
        known = Identity(
            user=UserRef(head.user_uuid or "", head.graph_uuid or "") if registered else None,
            thread_uuid=head.thread_uuid,
        )
        try:
            with persist_span(
                batch,
                backend=self.backend.name,
                flow=_Flow,
                ignored=metrics.TRACE_CONTEXTS_IGNORED.inc,
            ):
                return await self._flush_checked(
                    lease,
                    batch,
                    stats,
                    epoch,
                    inflight,
                    known,
                    _Cut(cut, record, cut if began == 1 else head.cut),
                    after_gap=head.done is not None and first > head.done + 1,
                )
        except _Forgotten:  # the user was forgotten meanwhile: what is left goes
            return await self._drop_forgotten(lease, batch, stats)
        except _IdentityMismatch:
            await self._dead_letter(lease, len(batch), reason="identity_mismatch", attempts=0)
            stats["dead"] += len(batch)
            return True
        except _ReadAgain:
            if not again:
                raise _Changed from None
            return await self._flush_batch(lease, stats, again=False)

    def _forget_whose(self) -> None:
        while len(self._whose) > MAX_KNOWN_THREADS:
            self._whose.pop(next(iter(self._whose)))

    async def _drop_forgotten(
        self, lease: _Lease, forgotten: Sequence[QueuedMessage], stats: Counter[str]
    ) -> bool:
        left = await self._acknowledge(lease, forgotten[-1].seq or 0)
        stats["forgotten"] += len(forgotten)
        await self._audit(lease.tk, forgotten, op="add_message", outcome="forgotten")
        return bool(left)

    async def _flush_checked(
        self,
        lease: _Lease,
        batch: list[QueuedMessage],
        stats: Counter[str],
        epoch: _Epoch,
        inflight: bytes | None,
        known: Identity,
        cut: _Cut,
        *,
        after_gap: bool = False,
    ) -> bool:
        """The batch, its user not forgotten when it was read; every backend step below
        checks that again first (``_Epoch.check``), since a forget may start at any time.
        ``known``: what the registry held for the batch's session when its head was read.
        ``after_gap``: numbers before the batch are neither queued nor done (Redis lost
        them, with the messages or with only their acknowledgements): the batch is
        reconciled, and the gap counted lost only where the backend lacks it."""
        tk = lease.tk
        first, last = batch[0].seq or 0, batch[-1].seq or 0
        if batch[0].kind != "message":
            return await self._apply_memory_changes(lease, batch, stats, epoch, known)
        # Whose a 404 in provisioning is about (``_user_gone``): the user as the head found them.
        lease.user = known.user
        try:
            user, thread_uuid = await self._identity(batch[0], epoch, known)
        except BackendError as exc:
            raise _Provisioning(exc) from exc
        lease.thread_uuid, lease.user = thread_uuid, user
        if inflight is not None:
            # Whoever sent it before (this worker's last job, or one that lost the thread
            # and may be paused in the middle of a call) may still have it committed.
            await self._expect_late(thread_uuid, seq=cut.record[0])
        replay = any(m.replay for m in batch)
        unsure = after_gap or any(
            m.unsure or self._given_back(m, self.keys.shard_of_ref(tk)) for m in batch
        )
        sending = _Sending(
            thread_uuid=thread_uuid,
            lease=lease,
            stats=stats,
            history=self._kept(thread_uuid),
            epoch=epoch,
            # A recorded in-flight batch was being sent when its worker stopped: unknown.
            reconcile=inflight is not None or replay or unsure,
            fresh=inflight is not None,
            replay=replay,
            whole=replay or unsure,
            cut=cut.calls,
            record=cut.record,
            held=cut.held,
        )
        stored, refused = await self._deliver(sending, batch)
        if refused is not None:
            if stored:
                await self._acknowledge(lease, batch[stored - 1].seq or 0)
                await self._after_sent(tk, batch[:stored], sending, user)
            await self._dead_letter(lease, 1, reason=str(refused), attempts=0)
            stats["messages"] += stored
            stats["dead"] += 1
            return True
        left = await self._acknowledge(
            lease, last, stored=self._gap_stored(batch, sending, after_gap=after_gap)
        )
        stats["messages"] += len(batch)
        log.info("flushed thread=%s seq=%s..%s", tk, first, last)
        await self._after_sent(tk, batch, sending, user)
        return bool(left)

    async def _after_sent(
        self, tk: str, batch: Sequence[QueuedMessage], sending: _Sending, user: UserRef
    ) -> None:
        """What follows a stored batch; none of it may fail the batch (at ``maxmemory``
        these writes are refused, while draining must go on)."""
        await self._mark_backend_ok()
        await self._quietly(self._audit(tk, batch, op="add_message", outcome="sent"), "audit")
        if self.after_flush is not None:
            await self._quietly(self.after_flush(batch[0]), "schedule")
        context, version = sending.context, sending.context_version
        template = self.settings.context_template_uuid
        if template and user.graph_uuid:  # return_context knows no templates
            said = " ".join(m.content for m in batch if m.role == "user")
            version = now_version()
            try:
                context = await self.backend.get_context(
                    user=user,
                    query=said,
                    max_chars=self.settings.context_max_chars,
                    timeout=self.settings.backend_timeout,
                    template_uuid=template,
                )
            except BackendError as exc:  # the write is stored: a failed read never undoes it
                log.warning("context refresh failed thread=%s error=%s", tk, exc.kind)
        if context is None:
            return
        # R2: the next turn reads what the backend now knows. The block retrieved for the
        # batch serves its session; a new session starts from the user-level block.
        head = batch[0]
        lagging = self.backend.capabilities.ingests_async
        write = self.cache.write(
            self.redis,
            app=head.app,
            user_id=head.user_id,
            session_id=head.session_id,
            graph_uuid=user.graph_uuid,
            block=context,
            version=version,
            epoch=sending.epoch.seen,
            user_block="drop" if lagging else "keep",
        )
        await self._quietly(write, "cache write")
        if lagging:
            self._settle_later(head.app, head.user_id, user)
        else:
            block = self._user_block(
                app=head.app, user_id=head.user_id, user=user, epoch=sending.epoch.seen
            )
            await self._quietly(block, "cache write")

    async def _user_block(self, *, app: str, user_id: str, user: UserRef, epoch: int) -> None:
        try:
            await self.cache.refresh_user(
                self.redis, self.backend, app=app, user_id=user_id, user=user, epoch=epoch
            )
        except BackendError as exc:  # the write is stored: a failed read never undoes it
            log.warning("context refresh failed user=%s error=%s", user.user_uuid, exc.kind)

    def _settle_later(self, app: str, user_id: str, user: UserRef) -> None:
        """The user's block was dropped (the block read with the batch may lack it): cached
        again ``context_settle_seconds`` later, once the backend has taken the batch in, so
        new sessions read it with one MGET instead of each reading through to the backend.
        In this process, not as a job: a job would cost arq's commands for each user."""
        if (app, user_id) in self._settling:
            return  # one waits: it reads this batch too

        async def settled() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._settle_now.wait(), self.settings.context_settle_seconds
                )
            epoch = await self.cache.epoch(self.redis, app=app, user_id=user_id)
            await self._user_block(app=app, user_id=user_id, user=user, epoch=epoch)

        task = asyncio.get_running_loop().create_task(self._quietly(settled(), "cache write"))
        self._settling[app, user_id] = task
        task.add_done_callback(lambda _: self._settling.pop((app, user_id), None))

    async def settle(self, *, timeout: float) -> None:
        """Cache now, within ``timeout`` seconds, the blocks that wait for the backend (a
        stopping worker); what is left then is given up."""
        self._settle_now.set()
        waiting = list(self._settling.values())
        if waiting:
            _, left = await asyncio.wait(waiting, timeout=timeout)
            for task in left:
                task.cancel()

    async def _quietly(self, work: Awaitable[object], what: str) -> None:
        try:
            await work
        except FAILURES as exc:  # a cluster client's own errors too
            metrics.SIDE_EFFECT_FAILURES.labels(what).inc()
            log.warning("%s skipped error=%s", what, type(exc).__name__)

    async def _mark_backend_ok(self) -> None:
        """Note, at most once a second, that the backend took a write: a message failing
        while others succeed is poisoned, not caught in an outage."""
        now = self._clock()
        if now - self._ok_marked < OK_MARK_SECONDS:
            return
        self._ok_marked = now
        await self._quietly(
            self.redis.set(self.keys.backend_ok, _now_ms(), px=7 * 86400 * 1000), "ok mark"
        )

    async def _backend_ok_since(self, since_ms: int) -> bool:
        raw = await self.redis.get(self.keys.backend_ok)
        return raw is not None and int(raw) > since_ms

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

    def _gap_stored(
        self, batch: Sequence[QueuedMessage], sending: _Sending, *, after_gap: bool
    ) -> int:
        """Up to which seq a gap before the batch is stored, not lost: a Redis gone back in
        time, or restarted empty, lost the counter with the acknowledgements, so the
        agent's next message skips the numbers it was handed (in the numbering it was
        handed them in, ``HandedOut``), though the worker stored those messages (the
        history read for the reconciled batch holds them). 0 (every gap lost) for any
        other batch, and for a numbering without a name: after Redis lost all its data,
        numbers start again, and a stored one of another numbering says nothing."""
        shard = self.keys.shard_of_ref(sending.lease.tk)
        named_gap = after_gap and batch[0].numbering is not None
        if sending.history is None or not (
            named_gap or any(self._given_back(m, shard) for m in batch)
        ):
            return 0
        return sending.history.top_seq(batch[0].numbering)

    async def _acknowledge(self, lease: _Lease, last: int, *, stored: int = 0) -> int:
        """Pop what is done up to ``last``; the messages left. Raises if the lease is lost.
        ``stored``: see :meth:`_gap_stored`."""
        left = await self.queue.ack(
            lease.tk, lease.token, last=last, stored=stored, user=self._whose.get(lease.tk)
        )
        if left == -1:
            raise _LeaseLost
        return left

    def _decode_head(
        self, ref: str, raw_items: Sequence[bytes], inflight: bytes | None
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
        if any(self.queue.ref_of(m) != ref for m in messages):
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

    async def _deliver(
        self, sending: _Sending, batch: list[QueuedMessage]
    ) -> tuple[int, BackendError | None]:
        """Send the batch. When the backend refuses content, bisect down to the message it
        refuses: returns how many messages (a prefix of ``batch``) are stored, and the
        refusal of the one after them (None when all are stored)."""
        try:
            await self._send_resplitting(sending, batch)
            return len(batch), None
        except BackendError as exc:
            if decide(exc).action not in ("narrow", "resplit") or len(batch) == 1:
                if decide(exc).action in ("narrow", "resplit"):
                    return 0, exc
                raise
            sending.reconcile = True  # calls before the refused one may be stored
            sending.stats["narrowed"] += 1
            half = len(batch) // 2
            stored, refused = await self._deliver(sending, batch[:half])
            if refused is not None:
                return stored, refused
            stored, refused = await self._deliver(sending, batch[half:])
            return half + stored, refused

    async def _send_resplitting(self, sending: _Sending, batch: list[QueuedMessage]) -> None:
        """Send the batch; when the backend says too large, send fewer messages per call,
        then smaller parts, before giving up (413 / 400 too long)."""
        while True:
            per_call, part_chars = sending.cut
            calls = pack(parts(batch, part_chars, self.keys), per_call)
            try:
                await self._send_all(sending, calls)
                return
            except BackendError as exc:
                if decide(exc).action != "resplit":
                    raise
                if per_call > 1:
                    per_call = max(1, per_call // 2)
                elif part_chars // 2 >= MIN_PART_CHARS:
                    part_chars //= 2
                else:
                    raise
                await self._recut(sending, (per_call, part_chars))
                sending.reconcile = True  # the calls before the refused one were stored
                sending.stats["resplit"] += 1
                log.warning(
                    "too large: resending thread_uuid=%s per_call=%d part_chars=%d",
                    sending.thread_uuid,
                    per_call,
                    part_chars,
                )

    def _in_job_attempts(self) -> AsyncRetrying:
        """Up to ``IN_JOB_ATTEMPTS`` of a backend call that fails transiently, on the
        worker's sleep: full jitter, capped, never sooner than ``Retry-After``; after an
        unknown outcome, not before the server has settled (a late commit must land
        before we read)."""
        settle = self.settings.backend_settle_seconds

        def wait(state: RetryCallState) -> float:
            backoff = wait_random_exponential(multiplier=0.2, max=5)(state)
            exc = state.outcome.exception() if state.outcome else None
            if not isinstance(exc, BackendError):
                return backoff
            floor = settle if decide(exc).unknown_outcome else 0.0
            return max(backoff, exc.retry_after or 0.0, floor)

        return AsyncRetrying(
            retry=retry_if_exception(_retry_in_job),
            wait=wait,
            stop=stop_after_attempt(IN_JOB_ATTEMPTS),
            sleep=self._sleep,
            reraise=True,
        )

    async def _retried(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` (idempotent) with in-job attempts (:meth:`_in_job_attempts`)."""
        async for attempt in self._in_job_attempts():
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    metrics.RETRIES.labels("in_job").inc()
                return await call()
        raise AssertionError("the last attempt's error is raised")  # for the type checker

    async def _send_all(self, sending: _Sending, calls: list[Call]) -> None:
        """Send with in-job retries. Whenever an earlier attempt may have reached the
        backend unseen (a crash, a timeout, a lost reply) or the batch replays a session,
        read back first and send only the calls it lacks, each as it was (W2). After a
        certain failure (a 429) only the calls not yet acknowledged are sent again, without
        a read. Every call asks for the context block alike (unless a template renders
        it), so a call's body, and so its key, is the same at every attempt."""
        return_context = asks_context(self.settings)
        async for attempt in self._in_job_attempts():
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    metrics.RETRIES.labels("in_job").inc()
                    sending.epoch.stale()  # a failed call and a wait lie behind
                if sending.reconcile:
                    todo = await self._missing(sending, calls)
                else:
                    todo = [c for c in calls if c.idempotency_key not in sending.stored_calls]
                for call in todo:
                    if await self.pacing.paused():  # set by this worker: at once; others: 0.25 s
                        raise _Paused
                    if await self.pacing.wait():
                        sending.epoch.stale()
                    await sending.epoch.check()
                    timeout = sending.lease.call_timeout(self.settings.backend_timeout)
                    # Checked again as the request leaves: this process may stop between.
                    last = LAST_CHECK.set(functools.partial(sending.lease.call_timeout, timeout))
                    asked = now_version()
                    try:
                        context = await self.backend.add_messages(
                            thread_uuid=sending.thread_uuid,
                            messages=call.messages,
                            idempotency_key=call.idempotency_key,
                            ignore_roles=self.ignore_roles,
                            return_context=return_context,
                            timeout=timeout,
                        )
                    except BackendError as exc:
                        if exc.kind == "rate_limited":
                            await self._quietly(self.pacing.hold(exc.retry_after or 1.0), "hold")
                        if decide(exc).unknown_outcome:
                            sending.reconcile = sending.fresh = True
                            sending.stats["unknown_outcomes"] += 1
                            seq = int(call.messages[0].metadata.get("afterthought_seq") or 0)
                            await self._expect_late(sending.thread_uuid, seq=seq)
                        raise
                    finally:
                        LAST_CHECK.reset(last)
                    await self._raced(sending.epoch)
                    sending.stored_calls.add(call.idempotency_key)
                    sending.context, sending.context_version = context, asked
                    if sending.history is not None:
                        sending.history.sent(call.messages)
                    sending.stats["calls"] += 1
                    sending.stats["parts"] += len(call.messages)
                    metrics.BATCH_SIZE.observe(len(call.messages))
                sending.reconcile = False  # everything of ``calls`` is stored now
                sending.fresh = False

    async def _missing(self, sending: _Sending, calls: list[Call]) -> list[Call]:
        """The calls of ``calls`` the backend lacks. One it lacks wholly is sent again as it
        was: a late commit of an earlier attempt and the resend are then one request where
        keys are honoured. One it holds part of (a batch cut otherwise before, e.g.
        narrowed) is sent for the rest only. A replay or an unsure batch (``whole``) is
        checked against the whole thread (:class:`_History`), brought up to date once per
        lease and after an unknown outcome (``sending.fresh``: a call may have landed
        unseen)."""
        wanted = [m for c in calls for m in c.messages]
        if sending.whole:
            history = sending.history = sending.history or self._keep(sending.thread_uuid)
            if history.lease != sending.lease.token or sending.fresh or history.older:
                await self._read_history(sending, history, margin=len(wanted) + RECENT_MARGIN)
            lacking = history.index.lacking(wanted, by_text=sending.replay)
        else:
            stored = await self.backend.recent_messages(
                thread_uuid=sending.thread_uuid,
                limit=len(wanted) + 30,
                timeout=sending.lease.call_timeout(self.settings.backend_timeout),
            )
            sending.stats["reconciled"] += 1
            sending.epoch.stale()  # a backend call lies between BEGIN and the first send
            lacking = missing(wanted, stored, replay=False)
        unsent = {id(m) for m in lacking}
        if sending.history is not None:  # found stored: a replay of it later is too
            sending.history.sent(m for m in wanted if id(m) not in unsent)
        rests = [(c, [m for m in c.messages if id(m) in unsent]) for c in calls]
        return [c if rest == c.messages else Call(rest) for c, rest in rests if rest]

    def _kept(self, thread_uuid: str) -> _History | None:
        """The history this worker keeps of the thread, if any (now the most recently
        used)."""
        history = self._histories.pop(thread_uuid, None)
        if history is not None:
            self._histories[thread_uuid] = history
        return history

    def _keep(self, thread_uuid: str) -> _History:
        """A new history of the thread, kept (see :meth:`_forget_histories`)."""
        history = self._histories[thread_uuid] = _History()
        return history

    def _forget_histories(self) -> None:
        """The least recently used histories go while all hold more than
        ``MAX_KEPT_MESSAGES``; the most recent (the one just read) stays."""
        while len(self._histories) > 1 and (
            sum(len(h.index) for h in self._histories.values()) > MAX_KEPT_MESSAGES
        ):
            self._histories.pop(next(iter(self._histories)))

    async def _read_history(self, sending: _Sending, history: _History, *, margin: int) -> None:
        """Bring ``history`` up to date, newest page first: the pages above the newest
        message read before and ``margin`` messages below it (all of them if that message
        is gone; the first page only, if the thread was never read), then the older pages
        a read cut short did not reach. Each page is kept as it comes: an interrupted read
        loses nothing of what it read."""

        async def page(cursor: str | None) -> tuple[list[StoredMessage], str | None]:
            found, following = await self.backend.message_page(
                thread_uuid=sending.thread_uuid,
                cursor=cursor,
                timeout=sending.lease.call_timeout(self.settings.backend_timeout),
            )
            sending.stats["history_pages"] += 1
            sending.epoch.stale()  # a backend call lies between BEGIN and the first send
            history.read(found)
            return found, following

        kept = history.older
        if history.newest is None:  # never read (or empty): from the top
            found, history.older = await page(None)
            history.newest = found[0].uuid if found else None
        elif history.lease != sending.lease.token or sending.fresh:
            cursor, top, past = None, None, None  # past: messages read below ``newest``
            while True:
                found, cursor = await page(cursor)
                top = top or (found[0].uuid if found else None)
                for m in found:
                    if past is not None:
                        past += 1
                    elif m.uuid == history.newest:
                        past = 0
                if cursor is None or (past is not None and past >= margin):
                    break
            if cursor is None:  # read to the oldest: nothing older is left to read
                history.older = None
            history.newest = top
        while history.older is not None:
            cursor = history.older
            try:
                found, history.older = await page(cursor)
                stale = cursor == kept and not found
            except BackendError as exc:
                if exc.kind != "bad_request" or cursor != kept:
                    raise
                stale = True
            if stale:
                # A cursor kept from an earlier lease that the backend no longer takes (Zep
                # calls its cursors opaque): refused, or an empty page where older messages
                # were. Taken for the thread's end, it would hide them: read it all again.
                log.warning("history cursor stale thread_uuid=%s", sending.thread_uuid)
                history.newest = history.older = None
                await self._read_history(sending, history, margin=margin)
                return
        history.lease = sending.lease.token
        sending.stats["reconciled"] += 1
        self._forget_histories()

    async def _apply_memory_changes(
        self,
        lease: _Lease,
        batch: list[QueuedMessage],
        stats: Counter[str],
        epoch: _Epoch,
        known: Identity,
    ) -> bool:
        """Facts to store and memories to forget, in queue order, each acknowledged once
        done (a later failure never repeats it); one the backend refuses is dead-lettered
        alone. The user's cached block is dropped so the next turn rereads. True when more
        is queued."""
        head = batch[0]
        if head.zep_graph_uuid:
            user = UserRef(head.zep_user_uuid or "", head.zep_graph_uuid)
        elif known.user is not None:  # registered: nothing to provision
            user = known.user
        else:
            await epoch.check()
            user, _ = await self.registry.ensure_user(
                self.backend, app=head.app, user_id=head.user_id
            )
            await self._raced(epoch)
        left, applied = 0, []
        for item in batch:
            if await self.pacing.wait():
                epoch.stale()
            await epoch.check()
            try:
                if item.kind == "fact" and (reason := await self._refused(item, epoch)):
                    left = await self._acknowledge(lease, item.seq or 0)
                    stats["quarantined"] += 1
                    stats["messages"] += 1
                    await self._quietly(
                        self._audit(lease.tk, [item], op="quarantine", outcome=reason),
                        "audit",
                    )
                    continue
                if item.kind == "fact":
                    await self.backend.add_fact(
                        user=user,
                        text=item.content,
                        key=item.key,
                        trust=item.trust or "app",
                        reference_time=item.reference_time,
                        said_ms=item.said_ms,
                    )
                    await self._raced(epoch)
                else:
                    await self.forgetter.forget_fact(
                        app=item.app, user_id=item.user_id, fact_uuid=item.content
                    )
            except BackendError as exc:
                if decide(exc).action not in ("narrow", "resplit"):
                    raise
                left = await self._dead_letter(lease, 1, reason=str(exc), attempts=0)
                stats["dead"] += 1
                continue
            left = await self._acknowledge(lease, item.seq or 0)
            applied.append(item)
            stats[item.kind] += 1
            stats["messages"] += 1
        await self._quietly(
            self.cache.invalidate(
                self.redis, app=head.app, user_id=head.user_id, graph_uuid=user.graph_uuid
            ),
            "cache invalidate",
        )
        for kind, op, outcome in (
            ("fact", "write_fact", "written"),
            ("forget", "delete_fact", "deleted"),
        ):
            changes = [i for i in applied if i.kind == kind]
            await self._quietly(self._audit(lease.tk, changes, op=op, outcome=outcome), "audit")
        return bool(left)

    async def _refused(self, item: QueuedMessage, epoch: _Epoch) -> str | None:
        """The one validation of every write path, for a queued fact (``remember``: trust
        ``model``; ``add_memory``: ``app``; a quarantine release: ``operator``, which
        passes). A refused fact is recorded in the quarantine, never stored (and not
        recorded either once its user's forget began: raises ``_Forgotten``)."""
        # In a thread: judging a long text is CPU work that must not starve the lease.
        reason = await asyncio.to_thread(refusal, item.content, trust=item.trust or "app")
        if reason is not None:
            entry = QuarantineEntry(
                app=item.app,
                user_id=item.user_id,
                text=item.content,
                reason=reason,
                trust=item.trust or "app",
                key=item.key,
                zep_user_uuid=item.zep_user_uuid,
                zep_graph_uuid=item.zep_graph_uuid,
            )
            if not await Quarantine(self.redis, self.settings).add([entry], fence=epoch.fence()):
                raise _Forgotten  # or the lease is lost: the acknowledgement finds that
            log.warning(
                "fact quarantined key=%s chars=%d reason=%s", item.key, len(item.content), reason
            )
        return reason

    async def _raced(self, epoch: _Epoch) -> None:
        """After a backend write for the batch's user: if their forget began since the
        epoch was read, nothing more is sent (raises ``_Forgotten``); if this worker's
        lease had lapsed meanwhile too, the forget no longer waited for it and is done
        again (``Forgetter.raced``). The next check before a call reads again."""
        epoch.stale()
        if await self.forgetter.raced(epoch.fence(), app=epoch.app, user_id=epoch.user_id):
            raise _Forgotten
        if await epoch.person_moved():
            # Their person's forget (in another app) waited for no hold of this one: the
            # write may have landed after its deletion, so this user is forgotten again.
            await self.forgetter.reopen(app=epoch.app, user_id=epoch.user_id)
            raise _Forgotten

    async def _identity(
        self, message: QueuedMessage, epoch: _Epoch, known: Identity
    ) -> tuple[UserRef, str]:
        """The batch's user and thread: as the registry held them when the head was read
        (``known``), else provisioned if need be (each step after an epoch check, so a
        forgotten user is not created again), or pinned by the application, then used only
        if the thread is that user's. A thread pinned without its user (all that session
        state not trusted may pin) that is another's is not written: its messages go to
        the user's own thread, as if unpinned (counted, warned about once)."""
        if message.zep_thread_uuid:
            user = await self._pinned_user(message, epoch, known)
            owned = await self._owns(message, user)
            epoch.stale()  # it may have called the backend: the next check reads again
            if owned:
                return user, message.zep_thread_uuid
            if message.zep_user_uuid:
                log.error(
                    "identity mismatch thread=%s: the pinned thread is not the user's",
                    message.thread_key,
                )
                raise _IdentityMismatch
            self._foreign_thread_pin(message)
        if known.user is not None and known.thread_uuid is not None:
            return known.user, known.thread_uuid  # registered: nothing to provision
        # ``known`` is what BEGIN found registered on the master (``registered``). A thread
        # found now that it did not have is read on another node (an old master in a
        # handover, whose records a failover wipes: what is stored in it would be in no
        # thread the session's map names) or was registered since (a rebuilt map): the head
        # is read again.
        if self.settings.provision_on_worker:
            await epoch.check()
            user, _ = await self.registry.ensure_user(
                self.backend, app=message.app, user_id=message.user_id
            )
            await self._raced(epoch)
            if known.thread_uuid is not None:  # only the user was not in this app's entry
                return user, known.thread_uuid
            user, thread_uuid, created = await self.registry.ensure_thread(
                self.backend,
                app=message.app,
                user_id=message.user_id,
                session_id=message.session_id,
            )
            await self._raced(epoch)
            if not created:  # a record this call made is confirmed (``_record_threads``)
                raise _ReadAgain
            return user, thread_uuid
        found = await self.registry.lookup(
            app=message.app, user_id=message.user_id, session_id=message.session_id
        )
        if found.user is None or found.thread_uuid is None:
            raise BackendError("not_found", code="unprovisioned")
        if found.thread_uuid != known.thread_uuid:
            raise _ReadAgain
        return found.user, found.thread_uuid

    async def _user_gone(self, message: QueuedMessage, used: UserRef | None) -> bool:
        """After a 404: whether the backend user the batch was for (``used``, else the one
        the registry maps the message's user to) is gone — the backend names another one
        by their id, or none — and if so, what this deployment held of them dropped
        (``Forgetter.deleted_elsewhere``). A pinned thread or user is the application's:
        never taken for stale."""
        if message.zep_thread_uuid or message.zep_user_uuid:
            return False
        app, user_id = message.app, message.user_id
        used = used or await self.registry.lookup_user(app=app, user_id=user_id)
        if used is None:
            return False
        try:
            named = await self.registry.backend_user_id(app=app, user_id=user_id)
            found = await self.backend.find_user(zep_user_id=named)
        except BackendError:
            return False  # cannot tell: the 404 is handled as any other
        if found is not None and found.user_uuid == used.user_uuid:
            return False  # the user is there: a thread of theirs is gone
        await self.forgetter.deleted_elsewhere(app=app, user_id=user_id, stale=used)
        return True

    async def _pinned_user(
        self, message: QueuedMessage, epoch: _Epoch, registered: Identity
    ) -> UserRef:
        """Whose the pinned thread must be: the pinned user (the agent sends only pins its
        application set, or session state it is trusted with), else the ADK user's: the
        registry's, the only one a user pinned in untrusted state may name."""
        if message.zep_user_uuid:
            return UserRef(message.zep_user_uuid, message.zep_graph_uuid or "")
        if registered.user is not None:
            return registered.user
        if self.settings.provision_on_worker:
            await epoch.check()
            user, _ = await self.registry.ensure_user(
                self.backend, app=message.app, user_id=message.user_id
            )
            await self._raced(epoch)
            return user
        known = await self.registry.lookup_user(app=message.app, user_id=message.user_id)
        if known is None:
            raise BackendError("not_found", code="unprovisioned")
        return known

    async def _owns(self, message: QueuedMessage, user: UserRef) -> bool:
        """Whether the pinned thread is the user's, asked once per (thread, user) and
        process: session state is client-writable, so a pinned thread may be someone
        else's."""
        pair = (message.zep_thread_uuid or "", user.user_uuid)
        if pair not in self._owners:
            owner = await self.backend.thread_owner(thread_uuid=pair[0])
            self._owners[pair] = owner is not None and owner == user.user_uuid
            while len(self._owners) > MAX_KNOWN_OWNERS:
                self._owners.pop(next(iter(self._owners)))
        return self._owners[pair]

    def _foreign_thread_pin(self, message: QueuedMessage) -> None:
        """A thread pinned without its user that is not the user's: counted, and said
        once per process (ids only), naming what pins it safely."""
        metrics.THREAD_PINS_IGNORED.inc()
        if self._foreign_pin_told:
            return
        self._foreign_pin_told = True
        log.warning(
            "thread pin ignored thread=%s: the pinned thread is not the user's, its messages"
            " go to the user's own thread (pins from your code: trust_state_identity=true or"
            " resolve_identity; told once)",
            message.thread_key,
        )

    async def _dead_letter(
        self,
        lease: _Lease,
        count: int,
        *,
        reason: str,
        attempts: int,
        last: int | None = None,
    ) -> int:
        """Move the first ``count`` items (none past seq ``last``) to the dead letters; the
        messages left."""
        left = await self.queue.dead_letter(
            lease.tk,
            lease.token,
            user=self._whose.get(lease.tk),
            count=count,
            reason=reason,
            attempts=attempts,
            now_ms=_now_ms(),
            last=last,
        )
        if left == -1:
            raise _LeaseLost
        log.error("dead-lettered thread=%s messages=%d reason=%s", lease.tk, count, reason)
        await self._quietly(
            self.audit.record(
                [Entry(job="flush", op="dead_letter", user="", thread=lease.tk, outcome=reason)]
            ),
            "audit",
        )
        return left
