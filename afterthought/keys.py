"""Every Redis key name, in one place. All carry the deployment prefix."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

#: Registry entries and pending lists are durable state; these are not and expire.
LOCK_TTL_MS = 10_000


def digest(*ids: str, size: int = 32) -> str:
    """A short stable hex id for a tuple of ids, over an unambiguous encoding (a JSON
    array, ASCII-escaped): no id can hold a separator that makes two tuples one, and an id
    that is not valid Unicode (a lone surrogate) still has exactly one digest."""
    return hashlib.sha256(json.dumps(ids, ensure_ascii=True).encode()).hexdigest()[:size]


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str

    # --- the write queue -------------------------------------------------------------
    def pending(self, thread_key: str) -> str:
        """LIST of queued message payloads of one thread, oldest first."""
        return f"{self.prefix}:pending:{thread_key}"

    def thread(self, thread_key: str) -> str:
        """HASH: ``seq`` (last assigned), ``persisted`` (high-water mark), identity fields."""
        return f"{self.prefix}:thread:{thread_key}"

    @property
    def ready(self) -> str:
        """ZSET thread_key -> ms when it may next be claimed (claiming pushes it a lease out)."""
        return f"{self.prefix}:ready"

    def seen(self, thread_key: str) -> str:
        """ZSET message key -> seq: the thread's latest keys, so a re-push adds nothing;
        bounded (``queue.SEEN_KEYS``) and expiring."""
        return f"{self.prefix}:seen:{thread_key}"

    @property
    def lost(self) -> str:
        """Counter of messages Redis lost (a sequence gap: evicted, or a failover without
        persistence); durable, so ``status`` keeps reporting it until reset."""
        return f"{self.prefix}:lost"

    def lease(self, thread_key: str) -> str:
        """STRING token of the worker that holds the thread; expires with the lease."""
        return f"{self.prefix}:lease:{thread_key}"

    @property
    def depth(self) -> str:
        """Counter of queued messages across all threads (the global cap reads it)."""
        return f"{self.prefix}:depth"

    @property
    def dead(self) -> str:
        """LIST of dead letters (a JSON header line, then the item), newest last."""
        return f"{self.prefix}:dead"

    # --- pacing: shared by every worker ----------------------------------------------
    @property
    def paused(self) -> str:
        """STRING (JSON reason) while consumption is paused (401/403); expires to re-probe."""
        return f"{self.prefix}:paused"

    @property
    def rate_limit(self) -> str:
        """STRING ms until which no worker calls the backend (after a 429); expires."""
        return f"{self.prefix}:ratelimit"

    @property
    def backend_ok(self) -> str:
        """STRING ms when a worker last stored a batch (marked at most once a second): a
        message failing while others succeed is poisoned, not caught in an outage."""
        return f"{self.prefix}:backend-ok"

    @property
    def dispatch(self) -> str:
        """STRING set while a flush job waits to start, so dispatchers don't pile them up."""
        return f"{self.prefix}:dispatch"

    # --- arq -------------------------------------------------------------------------
    @property
    def queue(self) -> str:
        """arq's queue ZSET name."""
        return f"{self.prefix}:arq:queue"

    def health(self, worker: str) -> str:
        """STRING arq's health line of one worker process; expires unless it is renewed."""
        return f"{self.prefix}:health:{worker}"

    @property
    def status(self) -> str:
        """STRING: the latest status snapshot (JSON), shared by every worker's gauges."""
        return f"{self.prefix}:status"

    def job_id(self, kind: str, suffix: str) -> str:
        """arq job id; arq stores it under ``arq:job:<id>``, so the prefix travels inside."""
        return f"{self.prefix}:{kind}:{suffix}"

    # --- identity registry -----------------------------------------------------------
    def user(self, app: str, user_id: str) -> str:
        """HASH ``user_uuid``, ``graph_uuid`` of an ADK (app, user)."""
        return f"{self.prefix}:id:user:{digest(app, user_id)}"

    def session(self, app: str, user_id: str, session_id: str) -> str:
        """STRING thread uuid of an ADK session (under its user, so forget finds it)."""
        return f"{self.prefix}:id:thread:{digest(app, user_id)}:{digest(app, user_id, session_id)}"

    # --- the context cache (R2) -------------------------------------------------------
    def context_user(self, app: str, user_id: str) -> str:
        """STRING ``version\\nwritten_ms\\nblock``: the user's block; expires."""
        return f"{self.prefix}:ctx:user:{digest(app, user_id)}"

    def context_thread(self, app: str, user_id: str, session_id: str) -> str:
        """STRING, same form: the block for one session's latest turns (overlay); expires."""
        return f"{self.prefix}:ctx:thread:{digest(app, user_id)}:{digest(app, user_id, session_id)}"

    def context_graph(self, graph_uuid: str) -> str:
        """SET of every cache entry built from one backend graph (a shared graph's blocks
        are cached under each reader), so a change to the graph reaches all of them."""
        return f"{self.prefix}:ctx:graph:{digest(graph_uuid)}"

    def context_index(self, app: str, user_id: str) -> str:
        """SET of the user's overlay keys, so invalidating a user needs no SCAN; expires
        with the newest of them."""
        return f"{self.prefix}:ctx:index:{digest(app, user_id)}"

    # --- out-of-band memory ---------------------------------------------------------------
    def synthesized(self, app: str, user_id: str) -> str:
        """STRING: the backend cursor up to which the user's messages were synthesized."""
        return f"{self.prefix}:synth:{digest(app, user_id)}"

    def synthesizing(self, app: str, user_id: str) -> str:
        """STRING token of the worker synthesizing the user's facts; expires unless renewed
        (a forget waits for it, so no synthesis writes after the forget cleaned up)."""
        return f"{self.prefix}:synthesizing:{digest(app, user_id)}"

    def epoch(self, app: str, user_id: str) -> str:
        """Counter bumped when a user is forgotten: older queued messages are dropped."""
        return f"{self.prefix}:epoch:{digest(app, user_id)}"

    def forgetting(self, app: str, user_id: str) -> str:
        """STRING set while the user is being forgotten, and for a short cool-down after:
        their new messages wait, and no cache entry is written or served meanwhile."""
        return f"{self.prefix}:forgetting:{digest(app, user_id)}"

    @property
    def forgets(self) -> str:
        """HASH user digest -> JSON (app, user id, since): forgets not yet confirmed done
        (the backend's deletion still pending); durable, so a worker resumes them."""
        return f"{self.prefix}:forgets"

    def user_threads(self, app: str, user_id: str) -> str:
        """SET of the user's thread keys (so forgetting a user finds its queues)."""
        return f"{self.prefix}:threads:{digest(app, user_id)}"

    def tombstones(self, app: str, user_id: str) -> str:
        """SET of forgotten fact signatures: synthesis never writes them again."""
        return f"{self.prefix}:tomb:{digest(app, user_id)}"

    @property
    def audit(self) -> str:
        """STREAM: the audit log (bounded by MAXLEN)."""
        return f"{self.prefix}:audit"

    @property
    def quarantine(self) -> str:
        """LIST (JSON) of facts validation refused, newest last; trimmed to a bound."""
        return f"{self.prefix}:quarantine"

    def backfill(self, source: str) -> str:
        """HASH of a backfill source's progress: sessions done, and where the next begins."""
        return f"{self.prefix}:backfill:{source}"

    @property
    def stores(self) -> str:
        """HASH local store id -> its path, announced by each worker at start (expiring):
        an agent whose store is not among them reads another file."""
        return f"{self.prefix}:stores"

    def lock(self, name: str) -> str:
        return f"{self.prefix}:lock:{name}"
