"""Every Redis key name, in one place. All carry the deployment prefix but one family
(``forgot_shared``, ``tombstones_shared``: what deployments that share users share is named
by their store).

Two layouts. With ``redis_shards = 0`` (the default, one Redis or a Sentinel set) names
are ``prefix:kind:id``, as they always were. With ``redis_shards = N`` (required on Redis
Cluster) each user belongs to one of N virtual shards, and every key a multi-key script
touches carries its shard's hash tag, so a script never crosses slots:

- per thread (``pending``, ``thread``, ``seen``, ``lease``) and per user (``epoch``,
  ``forgetting``, the context entries, ...): the user's shard's tag;
- per shard (``ready``, ``depth``, ``dead``, ``lost``): that shard's tag;
- deployment-wide (``paused``, ``forgets``, ``ctx:graph:*``, ...): untagged, so only ever
  used one key per command.

A thread is named by a *reference*: its key alone (``tk``) in the flat layout, ``s/tk``
when sharded, so everything that passes references around (the ready set, a user's
thread set, dead-letter headers) knows the shard without recomputing it."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Protocol

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

#: A lock's lifetime. (Every key's lifetime: docs/DESIGN.md, "Key lifetimes".)
LOCK_TTL_MS = 10_000
#: The field of a user's registry entry (``Keys.user``) that says since when (ms, Redis'
#: clock) its map of sessions to threads is whole: the user was new, or the map was
#: rebuilt from the backend. Missing, or older than ``served-by``'s ``since`` (Redis went
#: back to a snapshot, which may lack threads made after it): rebuilt on the next miss.
MAPPED_FIELD = "mapped"


@functools.lru_cache(maxsize=4096)
def digest(*ids: str, size: int = 32) -> str:
    """A short stable hex id for a tuple of ids, over an unambiguous encoding (a JSON
    array, ASCII-escaped): no id can hold a separator that makes two tuples one, and an id
    that is not valid Unicode (a lone surrogate) still has exactly one digest. Remembered:
    one turn names its user's and thread's keys some fifty times (ids only, never
    content, are digested)."""
    return hashlib.sha256(json.dumps(ids, ensure_ascii=True).encode()).hexdigest()[:size]


#: Per-user keys a reshard carries to the new layout: what keeps a forget final (``tomb``,
#: ``epoch``, ``forgot``) and synthesis' place in the user's history (``synth``). The rest
#: is the empty queue's, expires, or is rebuilt on demand (registry entries, caches).
RESHARDED = ("synth", "epoch", "forgot", "tomb")
#: The last part of a per-user key's name: the digest of (app, user id).
_USER = re.compile(r"[0-9a-f]{32}")
#: The per-user marks of a forget or a synthesis at work (``forgetting``, ``synthesizing``).
_MARKS = ("forgetting", "synthesizing")
#: The most virtual shards a deployment may have (each is polled by every dispatcher).
MAX_SHARDS = 1024


@functools.cache
def shard_tags(prefix: str, shards: int) -> tuple[str, ...]:
    """Each shard's hash tag, ``{prefix:s:x}``, where ``x`` is the first number that puts
    shard ``s`` in the ``s``-th of N equal ranges of hash slots: tags spread by CRC16 alone
    would give one master of three twice another's share at N = 16; spread evenly, any
    even division of the slots among masters gives each its share of shards."""
    tags: list[str] = []
    for s in range(shards):
        low = s * REDIS_CLUSTER_HASH_SLOTS // shards
        high = (s + 1) * REDIS_CLUSTER_HASH_SLOTS // shards
        x = 0
        while not low <= key_slot(f"{prefix}:{s}:{x}".encode()) < high:
            x += 1
        tags.append(f"{{{prefix}:{s}:{x}}}")
    return tuple(tags)


class _HasLayout(Protocol):
    # Read-only: ``Settings`` is frozen.
    @property
    def key_prefix(self) -> str: ...
    @property
    def redis_shards(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str
    shards: int = 0
    """Virtual shards (``redis_shards``); 0 is the flat layout."""

    @classmethod
    def of(cls, settings: _HasLayout) -> Keys:
        return cls(settings.key_prefix, settings.redis_shards)

    # --- shards and thread references ------------------------------------------------
    @property
    def shard_ids(self) -> tuple[int | None, ...]:
        """Every shard, for what loops over them (claim, dispatch, status): ``(None,)`` in
        the flat layout."""
        return (None,) if not self.shards else tuple(range(self.shards))

    def shard_of(self, app: str, user_id: str) -> int | None:
        """The user's shard (None in the flat layout)."""
        return self._shard_of_user(digest(app, user_id))

    def _shard_of_user(self, user: str) -> int | None:
        """The shard of the user of digest ``user`` (its first 8 digits decide)."""
        return int(user[:8], 16) % self.shards if self.shards else None

    def thread_ref(self, app: str, user_id: str, session_id: str) -> str:
        """How every key, set and message names the session's thread."""
        from afterthought.contract import thread_key  # contract imports keys

        tk = thread_key(app=app, user_id=user_id, session_id=session_id)
        shard = self.shard_of(app, user_id)
        return tk if shard is None else f"{shard}/{tk}"

    def shard_of_ref(self, ref: str) -> int | None:
        """The shard a thread reference names; a flat reference in a sharded layout (or
        the reverse) is a mix-up of deployments, refused rather than misrouted."""
        shard, sep, _ = ref.rpartition("/")
        if not self.shards:
            if sep:
                raise ValueError(f"sharded thread reference in a flat layout: {ref!r}")
            return None
        if not shard.isdigit() or int(shard) >= self.shards:
            raise ValueError(f"not a thread reference of {self.shards} shards: {ref!r}")
        return int(shard)

    def _in(self, shard: int | None) -> str:
        """The name's head: the prefix, or the shard's hash tag."""
        return self.prefix if shard is None else shard_tags(self.prefix, self.shards)[shard]

    def _of_thread(self, kind: str, ref: str) -> str:
        return self.thread_head(kind, self.shard_of_ref(ref)) + ref.rpartition("/")[2]

    def thread_head(self, kind: str, shard: int | None) -> str:
        """What the names of a shard's per-thread keys of one kind begin with: a script
        that walks a user's thread set appends each member's part after ``/``."""
        return f"{self._in(shard)}:{kind}:"

    def _user_base(self, app: str, user_id: str) -> str:
        return self._in(self.shard_of(app, user_id))

    # --- the write queue -------------------------------------------------------------
    def pending(self, ref: str) -> str:
        """LIST of queued message payloads of one thread, oldest first."""
        return self._of_thread("pending", ref)

    def thread(self, ref: str) -> str:
        """HASH: ``seq`` (last assigned), ``persisted`` (high-water mark), identity fields."""
        return self._of_thread("thread", ref)

    def ready(self, shard: int | None = None) -> str:
        """ZSET thread ref -> ms when it may next be claimed (claiming pushes it a lease out)."""
        return f"{self._in(shard)}:ready"

    def seen(self, ref: str) -> str:
        """ZSET message key -> seq: the thread's latest keys, so a re-push adds nothing;
        bounded (``queue.SEEN_KEYS``) and expiring."""
        return self._of_thread("seen", ref)

    def lost(self, shard: int | None = None) -> str:
        """Counter of messages Redis lost (a sequence gap: evicted, or a failover without
        persistence); durable, so ``status`` keeps reporting it until reset."""
        return f"{self._in(shard)}:lost"

    def marker(self, shard: int | None = None) -> str:
        """STRING: a random id the first worker writes into the shard, durable state kept
        for good: gone (or another) while a worker runs, Redis lost the shard's data (a
        restart without persistence, a flush, a failover to an empty replica)."""
        return f"{self._in(shard)}:marker"

    def served_by(self, shard: int | None = None) -> str:
        """HASH, durable state kept for good, one a shard (in its slot: on a Cluster each
        shard is served by its own node): ``run``, the ``run_id`` of the Redis server the
        workers last found holding the shard, and ``since`` (ms, Redis' clock), when they
        first found another one there (a restart from a snapshot or a cut-short AOF, a
        failover), or found none while the shard held messages (a snapshot from before
        any worker ran): that server may have given back messages whose acknowledgement
        it lost."""
        return f"{self._in(shard)}:served-by"

    def data_lost(self, shard: int | None = None) -> str:
        """HASH: a marker found gone -> when (ms), for ``status``; expires a week after the
        last one."""
        return f"{self._in(shard)}:data-lost"

    def lease(self, ref: str) -> str:
        """STRING token of the worker that holds the thread; expires with the lease."""
        return self._of_thread("lease", ref)

    def depth(self, shard: int | None = None) -> str:
        """Counter of queued messages across the shard's threads (its cap reads it)."""
        return f"{self._in(shard)}:depth"

    def dead(self, shard: int | None = None) -> str:
        """LIST of dead letters (a JSON header line, then the item), newest last."""
        return f"{self._in(shard)}:dead"

    @property
    def late(self) -> str:
        """ZSET ``thread_uuid:seq`` -> ms until which a call of that thread, from message
        ``seq`` on, may still commit late (its outcome was unknown, or a worker that lost
        the thread may still send it); read back for copies until then. Entries go once
        their time is past; the key expires a horizon after its last entry was added."""
        return f"{self.prefix}:late"

    @property
    def late_repaired(self) -> str:
        """ZSET uuid of a late copy -> ms it was first known repaired: ``status`` counts its
        members, so a copy two runs repair at once, or one found repaired after its repair's
        reply was lost, counts once. Durable (a member per copy ever repaired), so
        ``status`` keeps reporting them until reset."""
        return f"{self.prefix}:late_repaired"

    @property
    def layout(self) -> str:
        """STRING: the number of shards the deployment's keys are laid out in (durable):
        a process configured with another number refuses to start."""
        return f"{self.prefix}:layout"

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
        """HASH of an ADK (app, user): ``user_uuid``, ``graph_uuid``, the ADK ids, and the
        user's sessions, ``thread:<tag>`` -> thread uuid (:meth:`thread_field`), with
        :data:`MAPPED_FIELD`. The sessions live as long as their user: an active user's
        old sessions keep their thread whatever the backend replays."""
        return f"{self._user_base(app, user_id)}:id:user:{digest(app, user_id)}"

    def session_tag(self, app: str, user_id: str, session_id: str) -> str:
        """What the backend knows a session by (``SESSION_FIELD`` in its messages'
        metadata): the deployment over the session's digest, no raw id. Of the session's
        digest, so the name of a registry entry of before (:meth:`session`) gives it too."""
        return self.tag_of(digest(app, user_id, session_id))

    def tag_of(self, session_digest: str) -> str:
        """The session tag of a session's digest (``digest(app, user_id, session_id)``)."""
        return digest(self.prefix, session_digest)

    def thread_field(self, app: str, user_id: str, session_id: str) -> str:
        """The field of the user's entry that holds the session's thread uuid."""
        return self.tag_field(self.session_tag(app, user_id, session_id))

    @staticmethod
    def tag_field(tag: str) -> str:
        """The field of a user's entry that holds the thread of the session tagged ``tag``."""
        return f"thread:{tag}"

    def session(self, app: str, user_id: str, session_id: str) -> str:
        """STRING thread uuid of an ADK session, as versions before the user's map
        (:meth:`user`) wrote it: read while it lives (its idle lifetime), never written."""
        return (
            f"{self._user_base(app, user_id)}:id:thread:"
            f"{digest(app, user_id)}:{digest(app, user_id, session_id)}"
        )

    def person(self, user_id: str) -> str:
        """HASH ``user_uuid``, ``graph_uuid`` of the person a user id names in every app (a
        ``zep_user_id_template`` without ``{app}``), so an app the registry has not mapped
        them in yet reads their memory from the first turn. Lives ``idle_ttl_seconds`` from
        their last message or new thread (a miss falls back to the backend, which names them
        the same); a forget removes it. Untagged (their apps are in different shards)."""
        return f"{self.prefix}:id:person:{digest(user_id)}"

    @property
    def people(self) -> str:
        """The SCAN pattern of every person's entry (:meth:`person`)."""
        return f"{self.prefix}:id:person:*"

    @property
    def user_ids(self) -> str:
        """STRING: the ``zep_user_id_template`` of the deployment's default, recorded the
        first time it is needed (durable): ``{deployment}:{user_id}``, or ``{user_id}`` for
        a deployment that had users before it was recorded."""
        return f"{self.prefix}:user-ids"

    @property
    def user_ids_settled(self) -> str:
        """STRING (durable): the ``zep_user_id_template`` in effect when a worker last went
        over the registry for it (``afterthought.identity.settle_template``): another one in
        effect at a worker's start makes it go over the registry again."""
        return f"{self.prefix}:user-ids:settled"

    @property
    def user_ids_history(self) -> str:
        """ZSET (durable, bounded: ``identity.MAX_TEMPLATES``): every
        ``zep_user_id_template`` that named the deployment's backend users, by when it was
        last in effect (ms). A forget renders each: the backend users of a template changed
        since stay there, and what tied a user to them in the registry expires."""
        return f"{self.prefix}:user-ids:history"

    # --- the context cache (R2) -------------------------------------------------------
    def context_user(self, app: str, user_id: str) -> str:
        """STRING ``version\\nwritten_ms\\nblock``: the user's block; expires."""
        return f"{self._user_base(app, user_id)}:ctx:user:{digest(app, user_id)}"

    def context_thread(self, app: str, user_id: str, session_id: str) -> str:
        """STRING, same form: the block for one session's latest turns (overlay); expires."""
        return (
            f"{self._user_base(app, user_id)}:ctx:thread:"
            f"{digest(app, user_id)}:{digest(app, user_id, session_id)}"
        )

    def context_graph(self, graph_uuid: str) -> str:
        """SET of every cache entry built from one backend graph (a shared graph's blocks
        are cached under each reader), so a change to the graph reaches all of them."""
        return f"{self.prefix}:ctx:graph:{digest(graph_uuid)}"

    def context_index(self, app: str, user_id: str) -> str:
        """SET of the user's overlay keys, so invalidating a user needs no SCAN; expires
        with the newest of them."""
        return f"{self._user_base(app, user_id)}:ctx:index:{digest(app, user_id)}"

    # --- out-of-band memory ---------------------------------------------------------------
    def synthesized(self, app: str, user_id: str) -> str:
        """STRING: the backend cursor up to which the user's messages were synthesized."""
        return f"{self._user_base(app, user_id)}:synth:{digest(app, user_id)}"

    def synthesizing(self, app: str, user_id: str) -> str:
        """STRING token of the worker synthesizing the user's facts; expires unless renewed
        (a forget waits for it, so no synthesis writes after the forget cleaned up)."""
        return f"{self._user_base(app, user_id)}:synthesizing:{digest(app, user_id)}"

    def epoch(self, app: str, user_id: str) -> str:
        """Counter bumped when a user is forgotten: older queued messages are dropped."""
        return f"{self._user_base(app, user_id)}:epoch:{digest(app, user_id)}"

    def forgot(self, app: str, user_id: str) -> str:
        """STRING ms (Redis' clock) when the user's latest forget began: a message the agent
        made before it is refused when it reaches Redis. Expires (``queue.FORGOT_KEEP_MS``);
        a message older than that is refused anyway."""
        return f"{self._user_base(app, user_id)}:forgot:{digest(app, user_id)}"

    def forgot_cache(self, app: str, user_id: str) -> str:
        """STRING ms (Redis' clock) when the user's latest forget (of a fact, or of them)
        ended: a block whose read began before it is never cached (it may hold what was
        forgotten). Lives ``context_ttl_seconds``, as long as a block it refuses would."""
        return f"{self._user_base(app, user_id)}:forgot:ctx:{digest(app, user_id)}"

    def forgot_person(self, user_id: str) -> str:
        """STRING ms (Redis' clock) when a forget of the person a user id names in every app
        (a ``zep_user_id_template`` without ``{app}``) last began: the worker drops what
        they said before it in any app, registered there or not. Untagged (a person's apps
        are in different shards), so only read on its own; expires as ``forgot`` does. (By
        the user id: with the template ``{user_id}`` the backend user id, as it was named.)"""
        return f"{self.prefix}:forgot:person:{digest(user_id)}"

    @staticmethod
    def forgot_shared(store: str, backend_user_id: str) -> str:
        """STRING ms (Redis' clock) when a forget of a backend user that deployments share
        (a ``zep_user_id_template`` without ``{deployment}``) last began, in any of them:
        each drops what the person said before it, and takes a registry entry of theirs
        that names the deleted user for stale. Named by the store and the backend user id,
        not by a deployment (as ``tombstones_shared``: what is shared is the store's);
        untagged, read on its own; expires as ``forgot`` does."""
        return f"afterthought:shared:forgot:{digest(store, backend_user_id)}"

    @staticmethod
    def sharing(store: str) -> str:
        """ZSET key prefix -> ms of its workers' last heartbeat: the deployments that share
        users on ``store`` (a ``zep_user_id_template`` without ``{deployment}``), so a
        forget in one sweeps what the others hold of the person in Redis. Named by the
        store as ``forgot_shared`` is; expires ``SHARING_SECONDS`` after the last beat of
        any of them (a member older than that counts for nothing)."""
        return f"afterthought:shared:prefixes:{digest(store)}"

    @staticmethod
    def user_id_sharers(store: str) -> str:
        """HASH key prefix -> JSON (``said``: its own ``zep_user_id_template``, not its
        default; ``at``): the deployments whose backend user ids name no deployment on
        ``store``, so a deployment whose default names them so is refused beside another
        (they would share users without saying so). Named by the store as ``sharing`` is;
        renewed by every worker's heartbeat, expiring ``SHARING_SECONDS`` after the last."""
        return f"afterthought:shared:user-ids:{digest(store)}"

    @staticmethod
    def sharing_names(where: str) -> str:
        """HASH key prefix -> JSON (the store name it shares users under, when): the
        deployments that share users on one store as its workers see it (a local store's
        id, a Zep address), so a worker tells when two of them name it differently (then a
        forget in one misses the other). Expires as ``stores`` does."""
        return f"afterthought:shared:names:{digest(where)}"

    def forgetting(self, app: str, user_id: str) -> str:
        """STRING set while the user is being forgotten, and for a short cool-down after:
        their new messages wait, and no cache entry is written or served meanwhile."""
        return f"{self._user_base(app, user_id)}:forgetting:{digest(app, user_id)}"

    @property
    def forgets(self) -> str:
        """HASH user digest -> JSON (app, user id, since): forgets not yet confirmed done
        (the backend's deletion still pending); durable, so a worker resumes them."""
        return f"{self.prefix}:forgets"

    def user_threads(self, app: str, user_id: str) -> str:
        """SET of the user's thread keys (so forgetting a user finds its queues)."""
        return f"{self._user_base(app, user_id)}:threads:{digest(app, user_id)}"

    def tombstones(self, app: str, user_id: str) -> str:
        """SET of forgotten fact signatures: synthesis never writes them again."""
        return f"{self._user_base(app, user_id)}:tomb:{digest(app, user_id)}"

    def tombstones_person(self, user_id: str) -> str:
        """SET of forgotten facts' marks of the person a user id names in every app (a
        ``zep_user_id_template`` without ``{app}``): synthesis in none of their apps writes
        them again. Untagged (a person's apps are in different shards), so only read on its
        own; durable as ``tombstones``, removed by the person's forget."""
        return f"{self.prefix}:tomb:person:{digest(user_id)}"

    @staticmethod
    def tombstones_shared(store: str, backend_user_id: str) -> str:
        """``tombstones_person`` of a backend user that deployments share (a
        ``zep_user_id_template`` without ``{deployment}``), named as ``forgot_shared``."""
        return f"afterthought:shared:tomb:{digest(store, backend_user_id)}"

    @property
    def tombstone_keys(self) -> str:
        """HASH fingerprint of a tombstone key (an HMAC of a fixed label under it, never the
        key) -> JSON ``{"used": ms, "covers": [fingerprints]}``: every key a worker used,
        when one last started with it, and the earlier keys it still checks
        (``tombstone_previous_keys``). Durable: a field for each key ever used."""
        return f"{self.prefix}:tombstone_keys"

    @property
    def audit(self) -> str:
        """STREAM: the audit log (bounded by MAXLEN)."""
        return f"{self.prefix}:audit"

    def quarantine(self, shard: int | None = None) -> str:
        """LIST (JSON) of facts validation refused of the shard's users, newest last;
        trimmed to a bound. In the user's slot, so a write checks their epoch in the same
        script. (A sharded deployment's entries of before were in the flat name,
        ``quarantine(None)``: still read and dropped.)"""
        return f"{self._in(shard)}:quarantine"

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

    # --- a reshard (``afterthought.layout.carry``) ---------------------------------------
    def resharded(self) -> list[str]:
        """Match patterns of the per-user keys a reshard carries to the new layout
        (:data:`RESHARDED`), each shard's."""
        return [f"{self._in(s)}:{kind}:*" for s in self.shard_ids for kind in RESHARDED]

    def in_layout(self, name: str, other: Keys) -> str | None:
        """The name in ``other``'s layout of this layout's per-user key ``name`` of a kind
        in :data:`RESHARDED`; None for any other key (``forgot:ctx:…``, ``tomb:person:…``)."""
        for shard in self.shard_ids:
            for kind in RESHARDED:
                user = name.removeprefix(f"{self._in(shard)}:{kind}:")
                if _USER.fullmatch(user) and self._shard_of_user(user) == shard:
                    return f"{other._in(other._shard_of_user(user))}:{kind}:{user}"
        return None

    # --- lifetimes of keys written before them (``afterthought.lifetimes``) ----------------
    def lifetime_of(self, name: str) -> tuple[str, tuple[str, ...]] | None:
        """For one of the deployment's keys whose lifetime waits on a queue (docs/DESIGN.md,
        "Key lifetimes"), its kind and what guards it, from its name alone: a thread hash
        or a session's registry entry, the session's pending list (and for the entry, its
        user's entry and the field of their map it moves to); a user's registry entry or
        thread set, their thread set and the head of their shard's pending lists; a user's
        epoch or synthesis watermark (durable, removed once none is left), their registry
        entry, thread set and the marks of a forget or synthesis of theirs. None for any
        other key. A session entry's last part is the digest of the session's ids, of
        which its thread key is the first 24 characters (``contract.thread_key``: the
        same digest, shorter)."""
        if name.startswith("{"):
            head = name[: name.find("}") + 1]
            if not head.startswith(f"{{{self.prefix}:"):
                return None
        elif name.startswith(f"{self.prefix}:"):
            head = self.prefix
        else:
            return None
        kind, _, rest = name[len(head) + 1 :].rpartition(":")
        pending = f"{head}:pending:"
        if kind == "thread":
            return kind, (pending + rest,)
        if kind.startswith("id:thread:"):
            user = f"{head}:id:user:{kind.removeprefix('id:thread:')}"
            return "id:thread", (pending + rest[:24], user, self.tag_field(self.tag_of(rest)))
        if kind in ("id:user", "threads"):
            return kind, (f"{head}:threads:{rest}", pending)
        if kind in ("epoch", "synth"):
            # Durable per user, of use only while something of the user is left.
            return kind, tuple(f"{head}:{k}:{rest}" for k in ("id:user", "threads", *_MARKS))
        return None
