"""The thread queue: every Lua script that changes a thread's queue, and the payload header.

A thread's state lives in four keys (names in :mod:`afterthought.keys`):

- ``pending``: LIST of payloads, oldest first. Each is the message's JSON with a header the
  enqueue script writes in front: ``{"seq":N,"epoch":E,"queued_ms":T,...``.
- ``thread``: HASH. ``seq`` is the last sequence number handed out; ``done`` the highest
  one resolved (stored, dead-lettered or dropped as forgotten); ``persisted`` the highest
  stored; ``inflight`` (``first:last``) the batch a worker is sending and ``cut``
  (``per_call:part_chars``) how it is cut into calls, so every later attempt, by any
  worker, sends the same calls under the same keys; ``attempts`` and ``failing_since``
  (ms) the head's failed attempts; ``forget`` (``seq:said_ms``) the last forget queued in
  it (``ENQUEUE_LUA``).
- ``seen``: ZSET ``key:checksum`` -> seq of the thread's latest messages, bounded and
  expiring, so a re-push of a message whose enqueue reply was lost adds nothing (W2).
- ``lease``: STRING token of the worker holding the thread.

Invariant, kept by every script: ``pending`` holds exactly the sequence numbers
``done+1 .. seq``. Anything else means Redis lost data (eviction, a failover without
persistence): the difference is counted in the ``lost`` counter of the thread's shard (W9).
A Redis gone back in time (a replica that lagged promoted, an AOF cut short) lost ``seq``
with the messages: the process that was handed the lost numbers tells the enqueue script
at the thread's next message, which goes on past them and so leaves the gap.

Every script touches the keys of one shard only (its thread's keys and the shard's
``ready``, ``depth``, ``dead`` and ``lost``), so on a Redis Cluster each runs in one slot.

The worker's scripts carry ``allow-oom`` (Redis 7 script flags): at ``maxmemory`` under
``noeviction`` draining the queue is what frees memory, so it must not be refused. The
agent's enqueue does not: a full Redis pushes back on writers."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError, MovedError, NoScriptError, RedisError, ResponseError

from afterthought.connections import (
    FAILURES,
    SentinelView,
    is_cluster,
    lost_connection,
    sentinel_view,
)
from afterthought.contract import QueuedMessage
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.telemetry import clock_skewed, lost_messages

log = logging.getLogger("afterthought.queue")


class NotReplicated(RedisError):  # type: ignore[misc]
    """A write ran on the master, but fewer replicas than ``redis_wait_replicas`` hold it
    in time: a failover may drop it, so it must not count as done."""


#: The message keys each thread remembers for de-duplication. 128 keeps the ZSET in
#: Redis' compact encoding (about 5 KB a thread); a re-push comes within seconds of the
#: lost reply, while newer messages of the same session wait behind it.
SEEN_KEYS = 128
#: ... and for how long after the thread's last enqueue.
SEEN_TTL_MS = 24 * 3600 * 1000
#: Threads whose last handed-out sequence number a writer remembers (the most recently
#: written), to find a thread's counter gone back (:meth:`ThreadQueue.enqueue`).
HANDED_OUT_THREADS = 10_000

#: What the queue scripts are told of whose thread it is: app, user id, session id.
Whose = tuple[str, str, str]


class HandedOut:
    """The highest sequence number a writer was handed for each thread (by reference), and
    the name of the numbering it belongs to, to find a thread's counter gone back and to
    go on in that numbering (so a worker can tell which of the numbers skipped its backend
    holds). One writer's queues share one (an agent's loops and its drain thread write the
    same threads); thread-safe.

    A thread's counter also goes when the thread was idle for ``idle_ttl_seconds`` (its
    hash expired: no loss). Its hash only starts to expire once its queue is empty, after
    the enqueue that handed the number out, so a number handed out less than that long ago
    can only have gone with Redis' data; one older is forgotten (``trust_seconds``, half
    the idle lifetime, a margin for clocks) rather than taken for a loss."""

    def __init__(
        self, *, trust_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._last: OrderedDict[str, tuple[int, int | None, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._trust = trust_seconds
        self._clock = clock

    @classmethod
    def of(cls, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> HandedOut:
        return cls(trust_seconds=settings.idle_ttl_seconds / 2, clock=clock)

    def get(self, thread: str) -> tuple[int, int | None]:
        """The highest number handed out (0: none known) and its numbering's name."""
        with self._lock:
            return self._trusted(thread)

    def note(self, thread: str, seq: int, numbering: int | None = None) -> None:
        with self._lock:
            known = self._trusted(thread)
            last = (seq, numbering) if seq >= known[0] else known
            self._last[thread] = (*last, self._clock())
            self._last.move_to_end(thread)
            if len(self._last) > HANDED_OUT_THREADS:
                self._last.popitem(last=False)

    def _trusted(self, thread: str) -> tuple[int, int | None]:
        seq, numbering, at = self._last.get(thread, (0, None, 0.0))
        return (seq, numbering) if self._clock() - at <= self._trust else (0, None)


# The ``run_id`` of the server running the script (nil when ``INFO`` is refused): a restart
# changes it, and the script that records a batch compares it in the same step, so no
# check a second earlier leaves a window.
_SERVER = """
local function run_id()
  local ok, info = pcall(redis.call, 'INFO', 'server')
  return ok and string.match(info, 'run_id:(%x+)') or nil
end
"""

# Shared helpers. head_seq reads a payload's sequence number without decoding its JSON.
# take pops up to ``count`` items off the head whose seq is at most ``last`` (nil: any),
# handing each to ``keep`` (if given); a seq that skips past ``done`` + 1 means Redis lost
# the messages between: they are counted as lost and leave the depth counter too, but for
# those at or below ``stored`` (if given: the highest seq the worker found stored).
_COMMON = """
local function head_seq(item)
  return tonumber(string.match(item, '^{"seq":(%d+),'))
end
local function take(pending, thread, depth, lost, count, last, keep, stored)
  local done = tonumber(redis.call('HGET', thread, 'done') or '-1')
  local taken, missing = 0, 0
  while taken < count do
    local head = redis.call('LINDEX', pending, 0)
    if not head then break end
    local seq = head_seq(head)
    if seq and last and seq > last then break end
    redis.call('LPOP', pending)
    taken = taken + 1
    if keep then keep(head) end
    if seq then
      local known = math.max(done, stored or 0)
      if done >= 0 and seq > known + 1 then missing = missing + seq - known - 1 end
      if seq > done then done = seq end
    end
  end
  if done >= 0 then redis.call('HSET', thread, 'done', done) end
  if missing > 0 then redis.call('INCRBY', lost, missing) end
  if redis.call('DECRBY', depth, taken + missing) < 0 then redis.call('SET', depth, 0) end
  return taken, missing
end
-- After the head is done up to ``last``: its failure state goes; the part of a recorded
-- in-flight batch past ``last`` stays recorded, as an earlier attempt may have stored it
-- (a narrowed batch, a refused message in the middle), so its next attempt reads back.
local function finish(thread, last)
  local inflight = redis.call('HGET', thread, 'inflight')
  local upto = inflight and tonumber(string.match(inflight, ':(%d+)$'))
  redis.call('HDEL', thread, 'inflight', 'cut', 'attempts', 'failing_since')
  if upto and last and upto > last then
    redis.call('HSET', thread, 'inflight', (last + 1) .. ':' .. upto)
  end
end
-- Lifetimes (docs/DESIGN.md, "Key lifetimes"). ``keep`` (push): a thread with messages
-- queued keeps its hash, its registry entry, its user's entry and thread set, with no
-- expiry, so no message is ever lost to one. ``idle``, after a step that may have emptied
-- the queue: once it is empty the thread's hash and registry entry expire ``idle_ms`` on,
-- and the user's entry and thread set too once none of the user's threads holds
-- messages; members whose thread expired leave the set on the way (the set's sweep).
local function keep(held)
  for _, key in pairs(held) do redis.call('PERSIST', key) end
end
-- ``idle``'s arguments: the thread's hash, ARGV[a] (idle_ms, then the heads of the shard's
-- pending and thread key names, then the session's field of the user's map) and, when the
-- caller knows whose thread it is, KEYS[k] (the session's registry entry of before the
-- user's map, the user's entry, the user's thread set).
local function whose(thread, k, a)
  local t = {thread = thread, idle_ms = ARGV[a]}
  if KEYS[k] then
    t.session, t.user, t.threads = KEYS[k], KEYS[k + 1], KEYS[k + 2]
    t.pending_head, t.thread_head, t.field = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  end
  return t
end
local function idle(pending, t)
  if redis.call('EXISTS', pending) == 1 then return end
  redis.call('PEXPIRE', t.thread, t.idle_ms)
  if not t.threads then return end
  -- A session's entry of before the user's map moves into it, to live as long as the user.
  local entry = redis.call('GET', t.session)
  if entry and redis.call('HEXISTS', t.user, 'user_uuid') == 1 then
    redis.call('HSETNX', t.user, t.field, entry)
    redis.call('DEL', t.session)
  elseif entry then
    redis.call('PEXPIRE', t.session, t.idle_ms)
  end
  for _, ref in ipairs(redis.call('SMEMBERS', t.threads)) do
    local tk = string.match(ref, '([^/]*)$')
    if redis.call('EXISTS', t.pending_head .. tk) == 1 then return end
    if redis.call('EXISTS', t.thread_head .. tk) == 0 then redis.call('SREM', t.threads, ref) end
  end
  redis.call('PEXPIRE', t.threads, t.idle_ms)
  redis.call('PEXPIRE', t.user, t.idle_ms)
end
-- ``seen``'s scores are numbers of the thread's counter. A thread with neither a counter
-- nor a queue (its hash expired idle, being shorter-lived than ``seen``, or was evicted)
-- numbers from 1 again, so what ``seen`` kept is of another numbering and would be
-- compared with the new one (enqueue's "added again after a forget" rule): it goes.
local function renumbered(pending, thread, seen)
  if not redis.call('HGET', thread, 'seq') and redis.call('LLEN', pending) == 0 then
    redis.call('DEL', seen)
  end
end
local function room(pending, depth, n, thread_cap, global_cap)
  if redis.call('LLEN', pending) + n > thread_cap then return -1 end
  if tonumber(redis.call('GET', depth) or '0') + n > global_cap then return -2 end
  return 0
end
-- Redis' own clock (ms): what the queue compares with other servers' times (``since``, a
-- forget's), never a caller's.
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- ``known``: the highest number the caller was handed for this thread (0: none). A
-- counter below it went back with the messages after it (a failover to a replica that
-- lagged, a restart without the last writes): it goes on after ``known``, so the numbers
-- Redis lost are a gap, and none is handed out twice; the worker counts as lost those of
-- the gap its backend does not hold. ``known_numbering``: the name of ``known``'s
-- numbering ('' unknown), which a counter lost with its hash goes on in, so the worker
-- can tell the gap's numbers among those stored. ``stamp``:
-- the epoch to queue under (a replayed letter's own); nil: the user's current one.
-- ``skew``: how far the clock that stamped the messages' ``said_ms`` runs ahead of
-- Redis'. Returns the last number handed out and how many the counter skipped. ``held``:
-- what ``keep`` keeps while the messages wait. A numbering that starts at 1 is named
-- (``numbering``: Redis' clock then) and every payload carries the name, as the backend's
-- copy of it does: a thread idle long enough to lose its hash numbers from 1 again, and
-- the worker must not take its old numbers for the new ones (``Flusher._gap_stored``).
-- Returns the last number handed out, how many were skipped, and the numbering's name.
local function push(pending, thread, ready, depth, epoch_key, threads, seen, ref, keys, items,
    known, known_numbering, stamp, held, skew)
  local seq = tonumber(redis.call('HGET', thread, 'seq') or '0')
  local queued = clock_ms()
  if seq == 0 then
    -- A new thread, or one whose counter Redis lost (evicted) while messages wait: go on
    -- after the last of them, so acknowledgements by sequence number stay right.
    local tail = redis.call('LINDEX', pending, -1)
    seq = tail and head_seq(tail) or 0
    if seq == 0 then
      redis.call('HSETNX', thread, 'done', 0)
      if known == 0 then
        redis.call('HSET', thread, 'numbering', queued)
      elseif known_numbering ~= '' then
        redis.call('HSET', thread, 'numbering', known_numbering)
      end
    end
  end
  local skipped = math.max(0, known - seq)
  seq = seq + skipped
  local current = redis.call('GET', epoch_key) or '0'
  local epoch = stamp or current
  -- A replayed letter's epoch above the user's: the sweep removed theirs while nothing of
  -- theirs was queued. Raised back, so a later forget raises it past the letter's.
  if tonumber(epoch) > tonumber(current) then redis.call('SET', epoch_key, epoch) end
  local numbering = redis.call('HGET', thread, 'numbering')
  local named = numbering and (',"numbering":' .. numbering) or ''
  for i = 1, #items do
    seq = seq + 1
    redis.call('RPUSH', pending,
      '{"seq":' .. seq .. ',"epoch":' .. epoch .. ',"queued_ms":' .. queued .. ',"skew_ms":'
        .. skew .. named .. ',' .. string.sub(items[i], 2))
    redis.call('ZADD', seen, seq, keys[i])
  end
  local excess = redis.call('ZCARD', seen) - tonumber(ARGV[1])
  if excess > 0 then redis.call('ZREMRANGEBYRANK', seen, 0, excess - 1) end
  redis.call('PEXPIRE', seen, ARGV[2])
  redis.call('SADD', threads, ref)
  redis.call('HSET', thread, 'seq', seq)
  keep(held)
  redis.call('INCRBY', depth, #items)
  -- NX keeps the score of a claimed or deferred thread: its holder re-checks on release.
  redis.call('ZADD', ready, 'NX', queued, ref)
  return {seq, skipped, numbering or ''}
end
"""

# KEYS pending, thread, ready, depth, epoch, user threads, seen, forgot, the session's and
# the user's registry entries (kept while the messages wait: ``keep``), the shard's
# served-by (the first writer names the server: a snapshot with messages in it names the
# server they were queued on, see ``SERVED_BY_LUA``), and (optional) the user's person,
# whose idle lifetime each message appended renews (never made: a forgotten one stays gone)
# ARGV seen_keys, seen_ttl_ms, ref, now_ms, thread_cap, shard_cap, n, keys[n], payloads[n],
# margin_ms, keep_ms, known (push's), idle_ms, known_numbering (push's). A key ``seen``
# holds from before the thread's last queued forget (``forget``: its seq and said_ms) is
# appended again when the message was made after that forget: a fact deleted and then
# added again is a new change, a re-push of the add made before the delete is not.
# Returns {outcome, last number handed out (0: none), numbers skipped (push's), skew,
# the numbering's name (push's)}; the outcome is how many were appended (0: all were
# already there), -1 / -2 when a cap refuses, or -4 (nothing appended) when a new one was
# made before the user's latest forget began (plus the clock margin) or, live, longer ago
# than a forget is remembered: it is the forgotten user's, whether it comes from a buffer,
# a spool or a retry. A replay's ``said_ms`` is its event's time (months old, for an
# import of old sessions): it is held to a forget still remembered only; the time limit
# would refuse every import of old history. (``,"replay":true,`` is found in the JSON's
# structure only: inside a string every quote is escaped.) ``said_ms`` is the caller's
# clock and a forget's time Redis': they are compared on Redis' (``said - skew``, the
# caller's clock now against Redis' now, give or take the way here), so a caller's clock
# ahead of Redis' refuses what it must; the skew is returned too, and stamped into the
# payloads for the worker's own comparisons.
ENQUEUE_LUA = (
    _COMMON
    + _SERVER
    + """
renumbered(KEYS[1], KEYS[2], KEYS[7])
local n = tonumber(ARGV[7])
local forgot = tonumber(redis.call('GET', KEYS[8]) or '')
local now, margin, keep = tonumber(ARGV[4]), tonumber(ARGV[8 + 2 * n]), tonumber(ARGV[9 + 2 * n])
local skew = now - clock_ms()
local last = redis.call('HGET', KEYS[2], 'forget')
local forget_seq = last and tonumber(string.match(last, '^(%d+):'))
local forget_ms = last and tonumber(string.match(last, ':(%d+)$'))
local keys, items, taken, forgets = {}, {}, {}, {}
for i = 1, n do
  local key = ARGV[7 + i]
  local item = ARGV[7 + n + i]
  local made = tonumber(string.match(item, '^{"v":%d+,"said_ms":(%d+),'))
  local said = made and made - skew
  local at = tonumber(redis.call('ZSCORE', KEYS[7], key) or '')
  -- Seen before the thread's last forget, made after it: a new change, not a re-push.
  local again = at and forget_seq and said and at < forget_seq and said >= forget_ms
  if not taken[key] and (not at or again) then
    local live = not string.find(item, ',"replay":true,', 1, true)
    if said and ((forgot and said < forgot + margin) or (live and now - made > keep)) then
      return {-4, 0, 0, skew}
    end
    taken[key] = true
    keys[#keys + 1] = key
    items[#items + 1] = item
    -- Only a real field matches: a quote inside a JSON string is escaped.
    if string.find(item, ',"kind":"forget",', 1, true) then
      forgets[#items] = said or (now - skew)
    end
  end
end
if #items == 0 then return {0, 0, 0, skew} end
local full = room(KEYS[1], KEYS[4], #items, tonumber(ARGV[5]), tonumber(ARGV[6]))
if full < 0 then return {full, 0, 0, skew} end
local pushed = push(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[3],
  keys, items, tonumber(ARGV[10 + 2 * n]), ARGV[12 + 2 * n], nil,
  {KEYS[2], KEYS[6], KEYS[9], KEYS[10]}, skew)
if redis.call('EXISTS', KEYS[11]) == 0 then
  local live = run_id()
  if live then redis.call('HSET', KEYS[11], 'run', live) end
end
if KEYS[12] then redis.call('PEXPIRE', KEYS[12], ARGV[11 + 2 * n]) end
for i = #items, 1, -1 do
  if forgets[i] then
    redis.call('HSET', KEYS[2], 'forget', (pushed[1] - #items + i) .. ':' .. forgets[i])
    break
  end
end
return {#items, pushed[1], pushed[2], skew, pushed[3]}
"""
)

# A dead letter back into its thread's queue, at the end, in one step: it leaves the dead
# list only as it re-enters the queue. Its key is not checked against ``seen`` (it is
# there: it was queued once); the payload is marked ``unsure`` so the worker reconciles.
# The enqueue script's rule holds for it: one said before its user's latest forget (plus
# the margin) is the forgotten user's and goes (-4). Not its age: a letter stays in Redis,
# where every forget of its user purges it, so an old one is replayed. It keeps the epoch
# it was first queued under: a forget that raised the epoch since (and still waits to
# purge) drops it, as it drops every message queued before it, ``said_ms`` or not.
# KEYS as enqueue's first eight + dead, then the registry entries; ARGV seen_keys,
# seen_ttl_ms, ref, now_ms, thread_cap, shard_cap, letter, key, payload, margin_ms, epoch,
# the skew its ``said_ms`` was stamped with when it was first queued.
# Returns 1, -1 / -2 (caps), -3 (the letter is gone) or -4 (dropped as forgotten).
REPLAY_LUA = (
    _COMMON
    + """
local skew = tonumber(ARGV[12])
local said = tonumber(string.match(ARGV[9], '^{"v":%d+,"said_ms":(%d+),'))
said = said and said - skew
local forgot = tonumber(redis.call('GET', KEYS[8]) or '')
local person = tonumber(ARGV[13] or '')
if person and (not forgot or person > forgot) then forgot = person end
if said and forgot and said < forgot + tonumber(ARGV[10]) then
  if redis.call('LREM', KEYS[9], 1, ARGV[7]) == 0 then return -3 end
  return -4
end
local full = room(KEYS[1], KEYS[4], 1, tonumber(ARGV[5]), tonumber(ARGV[6]))
if full < 0 then return full end
if redis.call('LREM', KEYS[9], 1, ARGV[7]) == 0 then return -3 end
renumbered(KEYS[1], KEYS[2], KEYS[7])
push(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[3],
  {ARGV[8]}, {ARGV[9]}, 0, '', ARGV[11], {KEYS[2], KEYS[6], KEYS[10], KEYS[11]}, skew)
return 1
"""
)

_ALLOW_OOM = "#!lua flags=allow-oom\n"


# KEYS ready, then one lease per thread; ARGV lease_ms, until_ms, then token and ref per
# thread. Takes each thread nobody holds; its ready score moves a lease out, so if this
# worker dies the thread falls due again by itself (W4) without any recovery scan. One
# call per shard: the threads of one shard share its slot. Returns 1 or 0 per thread.
CLAIM_LUA = """
local won = {}
for i = 2, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[2 * i - 1], 'NX', 'PX', ARGV[1]) then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[2 * i])
    won[#won + 1] = 1
  else
    won[#won + 1] = 0
  end
end
return won
"""

# The holder's heartbeat: keep the lease and keep the thread from falling due.
RENEW_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[4])
return 1
"""

# KEYS pending, thread, then (when the worker knows whose thread it is) the user's epoch,
# forgetting mark, registry user and the session's entry of before the user's map, all in
# the user's slot; ARGV count, then the session's field of the user's map. Everything a
# worker reads before it sends a batch, in one round trip: the first ``count`` payloads,
# the in-flight record, its cut and the head's failed attempts and since when, then the
# user's deletion epoch and forgetting mark and the registry's user_uuid, graph_uuid and
# thread (the map's, else the old entry's; false when not asked: a reply has no holes),
# then the highest number done (a head past ``done + 1`` follows a gap).
HEAD_LUA = """
local out = {redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)}
local state = redis.call('HMGET', KEYS[2], 'inflight', 'attempts', 'cut', 'failing_since', 'done')
out[2], out[3], out[4], out[5] = state[1], state[2], state[3], state[4]
out[6], out[7], out[8], out[9], out[10] = false, false, false, false, false
out[11] = state[5]
if KEYS[3] then
  out[6], out[7] = redis.call('GET', KEYS[3]), redis.call('GET', KEYS[4])
  local user = redis.call('HMGET', KEYS[5], 'user_uuid', 'graph_uuid', ARGV[2])
  out[8], out[9], out[10] = user[1], user[2], user[3] or redis.call('GET', KEYS[6])
end
return out
"""

# KEYS lease, thread, pending, then optionally the user's epoch and forgetting mark, and
# then optionally the registry's user entry and the session's entry of before the user's
# map; ARGV token, ``first:last``, ``per_call:part_chars``, the record and cut the batch was
# decided on ('' for none), how many payloads it is at the head and their digest
# (``head_digest``; 0: not checked), the ``run_id`` of the server the worker last checked
# (``SERVED_BY_LUA``; '' for none), then the epoch the batch was read under, then the
# session's field of the user's map and the thread the head's read found registered ('' for
# none). Records the batch about to be sent and its cut into calls, so an attempt after a
# crash or by another worker sends exactly its calls again: 1, 0 if the lease is lost, -1
# if the user was forgotten since ``epoch`` was read or is being forgotten, -2 if this
# node's record, cut, head or registered thread is not the one the batch was decided on
# (a thread registered only on an old master is wiped with it: the batch would be stored
# where the session's map never points), -3 if this node is not the server the worker checked (a
# restart since, which may have given back what the batch holds: the worker checks again
# and reads the head again) (nothing recorded in any case). The -2 check is what
# makes a read on one node and a record on another safe: in a handover a worker's pooled
# connections still reach the old master for seconds while its new ones reach the new
# master, so its head may be read where an earlier attempt's record is missing, and written
# over where that record is.
BEGIN_LUA = (
    _SERVER
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[8] ~= '' and run_id() ~= ARGV[8] then return -3 end
if KEYS[4] and (tonumber(redis.call('GET', KEYS[4]) or '0') ~= tonumber(ARGV[9])
    or redis.call('GET', KEYS[5]) == 'pending') then
  return -1
end
if KEYS[6] and (redis.call('HGET', KEYS[6], ARGV[10]) or redis.call('GET', KEYS[7]) or '')
    ~= ARGV[11] then
  return -2
end
local state = redis.call('HMGET', KEYS[2], 'inflight', 'cut')
if (state[1] or '') ~= ARGV[4] or (state[2] or '') ~= ARGV[5] then return -2 end
local n = tonumber(ARGV[6])
if n > 0 then
  local items = redis.call('LRANGE', KEYS[3], 0, n - 1)
  local framed = {}
  for i = 1, #items do framed[i] = #items[i] .. ':' .. items[i] end
  if #items ~= n then return -2 end
  -- Redis has had sha1hex since 2.6; fakeredis' Lua (the unit tests' model) has none, and
  -- there the sequence numbers and the record alone are compared.
  if redis.sha1hex and redis.sha1hex(table.concat(framed)) ~= ARGV[7] then return -2 end
end
redis.call('HSET', KEYS[2], 'inflight', ARGV[2], 'cut', ARGV[3])
return 1
"""
)

# KEYS lease, pending, thread, depth, lost, [session, user, thread set]; ARGV token, last
# stored seq, the highest seq found stored in the thread (0: none looked for), idle_ms,
# pending head, thread head, the session's field (``whose``). Pops what is done up to
# ``last``; returns what is left (-1 if the lease is lost) and how many of a gap before
# them were counted lost.
ACK_LUA = (
    _COMMON
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1, 0} end
local last = tonumber(ARGV[2])
local _, missing = take(KEYS[2], KEYS[3], KEYS[4], KEYS[5], math.huge, last, nil,
  tonumber(ARGV[3]))
if last > tonumber(redis.call('HGET', KEYS[3], 'persisted') or '0') then
  redis.call('HSET', KEYS[3], 'persisted', last)
end
finish(KEYS[3], last)
idle(KEYS[2], whose(KEYS[3], 6, 4))
return {redis.call('LLEN', KEYS[2]), missing}
"""
)

# KEYS lease, pending, dead, thread, depth, lost, [session, user, thread set]; ARGV token,
# count, ref, reason, attempts, now_ms, last seq ('' for any), then ``whose``'s four.
# Moves the first ``count`` items, up to ``last``, to the dead letters: a JSON header
# line, then the item's bytes untouched (a malformed item may not even be UTF-8). Returns
# what is left.
DEAD_LUA = (
    _COMMON
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local header = cjson.encode({
  thread = ARGV[3], reason = ARGV[4], attempts = tonumber(ARGV[5]), at = tonumber(ARGV[6])
})
local top = nil
take(KEYS[2], KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[2]), tonumber(ARGV[7]), function(item)
  redis.call('RPUSH', KEYS[3], header .. '\\n' .. item)
  top = head_seq(item) or top
end)
finish(KEYS[4], top)
idle(KEYS[2], whose(KEYS[4], 7, 8))
return redis.call('LLEN', KEYS[2])
"""
)

# KEYS lease, pending, ready, thread, lost, depth, [session, user, thread set]; ARGV token,
# ref, next_ms, then ``whose``'s four.
# Gives the thread back: due again at next_ms if anything is still queued. An empty queue
# whose counter says more was queued lost those messages: counted, and the gap closed.
RELEASE_LUA = (
    _COMMON
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('LLEN', KEYS[2]) > 0 then
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
  return 1
end
redis.call('ZREM', KEYS[3], ARGV[2])
local seq = tonumber(redis.call('HGET', KEYS[4], 'seq') or '0')
local done = redis.call('HGET', KEYS[4], 'done')
if done and seq > tonumber(done) then
  local missing = seq - tonumber(done)
  redis.call('INCRBY', KEYS[5], missing)
  redis.call('HSET', KEYS[4], 'done', seq)
  if redis.call('DECRBY', KEYS[6], missing) < 0 then redis.call('SET', KEYS[6], 0) end
end
idle(KEYS[2], whose(KEYS[4], 7, 4))
return 1
"""
)

# KEYS pending, thread, ready, depth; ARGV ref, epoch, idle_ms. Drops the head messages queued
# before ``epoch`` (a forgotten user's; the user's newer ones come after them and stay).
# ``done`` moves past them, so an old holder's ack can never pop newer messages. The
# counter goes on. (A late re-push of a forgotten message is refused by the enqueue
# script for when it was made, so the forget may delete ``seen`` too.)
PURGE_LUA = (
    _COMMON
    + """
local n, last = 0, nil
while true do
  local head = redis.call('LINDEX', KEYS[1], 0)
  if not head then break end
  local seq, epoch = string.match(head, '^{"seq":(%d+),"epoch":(%d+),')
  if not seq or tonumber(epoch) >= tonumber(ARGV[2]) then break end
  redis.call('LPOP', KEYS[1])
  n, last = n + 1, seq
end
if last then redis.call('HSET', KEYS[2], 'done', last) end
if n > 0 then redis.call('HDEL', KEYS[2], 'inflight', 'attempts', 'failing_since') end
if redis.call('LLEN', KEYS[1]) == 0 then redis.call('ZREM', KEYS[3], ARGV[1]) end
if redis.call('DECRBY', KEYS[4], n) < 0 then redis.call('SET', KEYS[4], 0) end
idle(KEYS[1], {thread = KEYS[2], idle_ms = ARGV[3]})
return n
"""
)

# KEYS thread; ARGV now_ms. Counts a failed attempt at the head: (attempts, since ms).
FAILED_LUA = """
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSETNX', KEYS[1], 'failing_since', ARGV[1])
return {attempts, tonumber(redis.call('HGET', KEYS[1], 'failing_since'))}
"""

# KEYS marker, data-lost record; ARGV the marker this worker knows ('' for none yet), a new
# one, now_ms, record_ttl_ms. Keeps the shard's marker: {1 when this worker's marker is
# gone or replaced (Redis lost the shard's data; recorded once however many workers find
# it), else 0; the marker now}.
MARKER_LUA = """
local found = redis.call('GET', KEYS[1])
if found and found == ARGV[1] then return {0, found} end
if not found then
  found = ARGV[2]
  redis.call('SET', KEYS[1], found)
end
if ARGV[1] == '' then return {0, found} end
redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {1, found}
"""

# KEYS the shard's served-by, ready, depth. Records the server that runs it (its
# ``run_id``, read by the script itself: the node that holds the shard, on a Cluster too).
# Another one than recorded is a server that may have gone back in time; none recorded
# while the shard holds messages is one restored from a snapshot taken before any worker
# ran (an empty shard found first is a new one, or one emptied, which the markers report).
# Either way ``since`` is now by the server's clock (``TIME``), not the worker's, which
# may run behind and so hide messages queued just before the change. Returns {``since``
# (0: never changed), the run_id}, or {-1, ''} when the server will not say which it is
# (``INFO`` renamed away or refused, a proxy).
SERVED_BY_LUA = (
    _SERVER
    + """
local live = run_id()
if not live then return {-1, ''} end
local run = redis.call('HGET', KEYS[1], 'run')
if run ~= live then
  redis.call('HSET', KEYS[1], 'run', live)
  if run or redis.call('ZCARD', KEYS[2]) > 0 or tonumber(redis.call('GET', KEYS[3]) or '0') > 0 then
    local t = redis.call('TIME')
    redis.call('HSET', KEYS[1], 'since', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  end
end
return {tonumber(redis.call('HGET', KEYS[1], 'since') or '0'), live}
"""
)

# KEYS late; ARGV now_ms, members. Removes each member whose time is past.
LATE_OVER_LUA = """
for i = 2, #ARGV do
  local until_ms = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if until_ms and tonumber(until_ms) <= tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return 0
"""

# KEYS dead. Empties a shard's dead letters; how many there were.
DROP_DEAD_LUA = """
local n = redis.call('LLEN', KEYS[1])
redis.call('DEL', KEYS[1])
return n
"""

# Per thread (KEYS: lease, pending, thread, then the next thread's three): is it leased,
# when was its head queued (-1: nothing, or an item older than ``queued_ms``), and how many
# messages its counter says are missing. Read here, so payloads never cross the wire.
THREADS_LUA = """
local out = {}
for i = 1, #KEYS, 3 do
  out[#out + 1] = redis.call('EXISTS', KEYS[i])
  local head = redis.call('LINDEX', KEYS[i + 1], 0)
  local at = head and string.match(head, '^{"seq":%d+,"epoch":%d+,"queued_ms":(%d+),')
  out[#out + 1] = tonumber(at or '-1')
  local state = redis.call('HMGET', KEYS[i + 2], 'seq', 'done')
  local missing = 0
  if state[2] then
    missing = tonumber(state[1] or '0') - tonumber(state[2]) - redis.call('LLEN', KEYS[i + 1])
  end
  out[#out + 1] = missing
end
return out
"""

#: How long a worker waits for replicas to hold a batch's record before sending it.
BEGIN_WAIT_MS = 1000
#: How long ``status`` reports that Redis lost a shard's data.
DATA_LOST_REPORT_MS = 7 * 24 * 3600 * 1000
#: How often a process asks the sentinels again which replicas a write must reach.
SENTINEL_VIEW_SECONDS = 1.0

#: What :meth:`ThreadQueue.begin` returns when the thread is not as the batch was read.
CHANGED = -2
#: ... and when the node is not the server the worker last checked.
SERVER_CHANGED = -3
#: How often a process logs that its clock is off Redis' (``ThreadQueue._clock_told``).
SKEW_LOG_SECONDS = 60.0
#: What the enqueue and replay scripts return when a cap refuses the messages.
REFUSED = {-1: "thread queue full", -2: "queue full"}
GONE = -3
#: What the enqueue and replay scripts return when a message was made before its user was
#: forgotten (a replayed letter is dropped).
FORGOTTEN = -4
#: How long a forget's time is kept (``Keys.forgot``): a live message made longer ago than
#: this reaches Redis only to be refused, since a forget of its user may no longer be known.
FORGOT_KEEP_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class Head:
    """What :meth:`ThreadQueue.head` read of a thread: its head and, when asked for a
    user, that user's epoch, forgetting mark and registry entries (else all None)."""

    items: list[bytes]
    inflight: bytes | None
    attempts: int
    cut: tuple[int, int] | None = None
    """How the in-flight batch is cut into calls: messages per call, characters per part."""
    failing_since_ms: int | None = None
    epoch: int | None = None
    forgetting: bytes | None = None
    user_uuid: str | None = None
    graph_uuid: str | None = None
    thread_uuid: str | None = None
    done: int | None = None
    """The highest number done (None: not read)."""

    @property
    def read_user(self) -> bool:
        return self.epoch is not None


@dataclass(frozen=True, slots=True)
class ThreadState:
    """One thread as ``status`` sees it."""

    leased: bool
    head_queued_ms: int | None
    """When the oldest queued message was queued (None: nothing, or from before that
    field existed)."""
    missing: int
    """Messages the thread's counter says were queued but are neither queued nor done."""


class ThreadQueue:
    """The queue's scripts bound to one Redis client and one deployment. Threads are named
    by their references (:meth:`Keys.thread_ref`): each script runs on the keys of one
    shard (the thread's, or the one it is asked about).

    ``allow_oom``: mark the worker's scripts so Redis runs them at ``maxmemory`` (Redis 7
    script flags; off for servers that do not know them, e.g. fakeredis). ``handed_out``:
    the sequence numbers this writer's enqueues were handed (its own by default)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: Settings,
        *,
        allow_oom: bool = True,
        handed_out: HandedOut | None = None,
    ) -> None:
        self.redis = redis
        self.settings = settings
        self.handed_out = handed_out if handed_out is not None else HandedOut.of(settings)
        self.keys = Keys.of(settings)
        self.idle_ms = int(settings.idle_ttl_seconds * 1000)
        # Each shard's cap is checked inside its own slot: the deployment's share of it.
        self.shard_cap = math.ceil(settings.queue_cap / max(1, settings.redis_shards))
        flag = _ALLOW_OOM if allow_oom else ""
        self._enqueue = redis.register_script(ENQUEUE_LUA)
        self._replay = redis.register_script(REPLAY_LUA)
        self._claim = redis.register_script(flag + CLAIM_LUA)
        self._renew = redis.register_script(flag + RENEW_LUA)
        self._head = redis.register_script(flag + HEAD_LUA)
        self._begin = redis.register_script(flag + BEGIN_LUA)
        self._ack = redis.register_script(flag + ACK_LUA)
        self._dead = redis.register_script(flag + DEAD_LUA)
        self._release = redis.register_script(flag + RELEASE_LUA)
        self._purge = redis.register_script(flag + PURGE_LUA)
        self._failed = redis.register_script(flag + FAILED_LUA)
        self._drop_dead = redis.register_script(DROP_DEAD_LUA)
        self._marker = redis.register_script(flag + MARKER_LUA)
        self._served_by = redis.register_script(flag + SERVED_BY_LUA)

        self._late_over = redis.register_script(flag + LATE_OVER_LUA)
        self._threads: AsyncScript = redis.register_script(THREADS_LUA)
        self._view: SentinelView | None = None
        self._view_at = -math.inf
        self._replica_counts: dict[str, int] = {}
        """How many replicas each Cluster master's last ``ROLE`` listed, by node name."""
        self._skew_told = -math.inf

    async def _replicated(
        self, script: AsyncScript, *, keys: list[str], args: list[Any], wait_ms: int
    ) -> Any:
        """Run a script that writes what a failover must not lose; with
        ``redis_wait_replicas``, return once the write is on the node that is master after
        any handover, else raise :class:`NotReplicated` (after ``wait_ms`` at most): the
        write ran, but on a master that a failover may drop, so it counts as an outcome
        unknown — sent again, and never relied on — not as done.

        ``WAIT`` alone does not say so: it counts the replicas holding the write on the
        node that took it, and in a ``SENTINEL FAILOVER`` the old master goes on taking
        writes for a second after one replica was promoted, while the others, not yet
        re-pointed, acknowledge them — and lose them as they resync from the new master.
        A write counts only when every replica the master had as it ran (but one every
        sentinel has down: none can promote it) and every replica the sentinels could
        promote hold it (``ROLE`` before and after ``WAIT``): the
        promoted one has left the old master, so nothing the old master takes after the
        promotion counts; and the sentinels promote the replica that is furthest along,
        which holds whatever any other replica held. And none while a sentinel that
        answered names another node the master: once the ones that answer have switched
        to the promoted replica, they list only its followers, so with one of them silent
        (the view unsettled) the old master's lagging follower would be all that must
        hold the write. See docs/DESIGN.md."""
        wanted = self.settings.redis_wait_replicas
        if not wanted:
            return await script(keys=keys, args=args)
        if is_cluster(self.redis):
            result, before, waited, after = await _on_master_of(
                cast(RedisCluster, self.redis),
                script,
                keys=keys,
                args=args,
                wanted=wanted,
                wait_ms=wait_ms,
                replica_counts=self._replica_counts,
            )
            problem = _unconfirmed(before, waited, after, must=_attached(before), wanted=wanted)
            if problem is not None:
                raise _not_replicated(problem)
            return result
        client = self.redis.client()
        try:
            await client.initialize()
            connection = cast(aioredis.Connection, client.connection)

            async def write() -> tuple[Any, Any]:
                command = ("EVALSHA", script.sha, len(keys), *keys, *args)
                result, before = await _pipelined(connection, command, ("ROLE",))
                if isinstance(result, NoScriptError):  # it did not run: load it there, once
                    await client.script_load(script.script)
                    result, before = await _pipelined(connection, command, ("ROLE",))
                return result, before

            # The sentinels are asked (once a second) while the write is on its way.
            view, written = await asyncio.gather(
                self._sentinel_view(), write(), return_exceptions=True
            )
            if isinstance(written, BaseException):  # the write's own failure first
                raise written
            if isinstance(view, BaseException):
                raise view
            result, before = written
            if isinstance(result, Exception):
                raise result
            # A sentinel that names another node the master (by the address the
            # connection was made to) is past a promotion: that node lacks this write,
            # however many replicas still following this one hold it. No WAIT for it.
            if view is not None and view.masters - {(str(connection.host), int(connection.port))}:
                raise _not_replicated("the sentinels name another master")
            # Every replica the master has, but one no failover could promote (the
            # sentinels have it down), and every replica the sentinels could promote.
            must = (_attached(before) - view.down) | view.replicas if view else _attached(before)
            waited, after = await _pipelined(
                connection, ("WAIT", max(wanted, len(must)), wait_ms), ("ROLE",)
            )
        finally:
            await client.aclose()
        problem = _unconfirmed(before, waited, after, must=must, wanted=wanted)
        if problem is not None:
            raise _not_replicated(problem)
        return result

    async def _sentinel_view(self) -> SentinelView | None:
        """The sentinels' view of the set (None off Sentinel), read again once it is
        :data:`SENTINEL_VIEW_SECONDS` old. Its age does not weaken the check: a replica
        about to be promoted has long been one the sentinels list, and one they list as
        the master is only relied on while they agree on it."""
        now = time.monotonic()
        if self._view is not None and now - self._view_at < SENTINEL_VIEW_SECONDS:
            return self._view
        self._view_at = now  # the writers meanwhile use the last view
        try:
            self._view = await sentinel_view(self.redis)
        except FAILURES as exc:
            if self._view is None:
                raise _not_replicated(f"no sentinel answers ({type(exc).__name__})") from exc
        return self._view

    def _seen_args(self) -> list[int]:
        return [SEEN_KEYS, SEEN_TTL_MS]

    def _append_keys(self, ref: str, head: QueuedMessage) -> list[str]:
        k = self.keys
        shard = k.shard_of_ref(ref)
        return [
            k.pending(ref),
            k.thread(ref),
            k.ready(shard),
            k.depth(shard),
            k.epoch(head.app, head.user_id),
            k.user_threads(head.app, head.user_id),
            k.seen(ref),
            k.forgot(head.app, head.user_id),
        ]

    def _registry_keys(self, message: QueuedMessage) -> list[str]:
        """The registry entries of the message's session and user (kept while it waits)."""
        app, user_id = message.app, message.user_id
        return [self.keys.session(app, user_id, message.session_id), self.keys.user(app, user_id)]

    def ref_of(self, message: QueuedMessage) -> str:
        """The reference of the message's thread."""
        return self.keys.thread_ref(message.app, message.user_id, message.session_id)

    # --- the agent's side -------------------------------------------------------------------
    async def enqueue(self, messages: Sequence[QueuedMessage], *, now_ms: int) -> int:
        """Append messages of one thread; returns how many were new (keys the thread holds
        or recently held are skipped), a negative :data:`REFUSED` code, or
        :data:`FORGOTTEN` (nothing appended) when one was made before its user's forget.
        ``now_ms``: the caller's clock, the one the messages' ``said_ms`` were made by."""
        head = messages[0]
        ref = self.ref_of(head)
        known, known_numbering = self.handed_out.get(ref)
        person = [] if self.settings.apps_apart else [self.keys.person(head.user_id)]
        # Sharded, the person's key is in another slot than the thread's (their apps are
        # in different shards): renewed by a command of its own, sent alongside.
        in_script, alongside = ([], person) if self.keys.shards else (person, [])
        call = self._replicated(
            self._enqueue,
            # Half the budget: a replica that lags must not turn every turn's write
            # into a timeout (the message is queued; it is the copy that is late).
            wait_ms=max(1, int(self.settings.enqueue_timeout * 500)),
            keys=[
                *self._append_keys(ref, head),
                *self._registry_keys(head),
                self.keys.served_by(self.keys.shard_of_ref(ref)),
                *in_script,
            ],
            args=[
                *self._seen_args(),
                ref,
                now_ms,
                self.settings.thread_queue_cap,
                self.shard_cap,
                len(messages),
                *(_seen_member(m) for m in messages),
                *(m.encode() for m in messages),
                int(self.settings.forget_clock_margin_seconds * 1000),
                FORGOT_KEEP_MS,
                known,
                self.idle_ms,
                "" if known_numbering is None else known_numbering,
            ],
        )
        if alongside:
            # A renewal lost (its node down) only costs a lookup in another app that falls
            # back to the backend: the write's own outcome is the call's.
            written: Any
            written, _ = await asyncio.gather(
                call, self.redis.pexpire(alongside[0], self.idle_ms), return_exceptions=True
            )
            if isinstance(written, BaseException):
                raise written
        else:
            written = await call
        outcome, last, skipped, skew, *named = written
        if skipped:
            # Numbers this process was handed that Redis no longer holds: lost from the
            # queue, or stored and acknowledged before Redis lost the acknowledgement with
            # them. The worker that takes the gap tells which from what the backend holds
            # and counts the lost ones (``ack``).
            upto = int(last) - int(outcome)
            log.warning(
                "redis counter went back thread=%s skipped=%d seqs=%d..%d",
                ref,
                skipped,
                upto - int(skipped) + 1,
                upto,
            )
        if last:
            name = named[0] if named and named[0] else None
            self.handed_out.note(ref, int(last), None if name is None else int(name))
        self._clock_told(int(skew))
        return int(outcome)

    def _clock_told(self, skew_ms: int) -> None:
        """Report a caller's clock off Redis' by more than ``forget_clock_margin_seconds``
        (once a minute: a log line; every enqueue: the counter). The queue's decisions do
        not depend on it (the scripts compare on Redis' clock); the turns' reference times,
        and what an exit spool holds, do."""
        if abs(skew_ms) <= self.settings.forget_clock_margin_seconds * 1000:
            return
        clock_skewed.add(1)
        now = time.monotonic()
        if now - self._skew_told >= SKEW_LOG_SECONDS:
            self._skew_told = now
            log.warning("clock off redis skew_ms=%d (this process minus redis)", skew_ms)

    async def replay(
        self, letter: bytes, message: QueuedMessage, *, now_ms: int, person_forgot: int | None
    ) -> int:
        """Re-queue one dead letter (of the dead letters of its thread's shard) at its
        thread's end, under the epoch it was queued under: 1, a :data:`REFUSED` code,
        :data:`GONE` when another process took it first, or :data:`FORGOTTEN` (the letter
        is dropped) when it was made before its user's forget, or before ``person_forgot``
        (ms, Redis' clock: the forget of their person, read by the caller from a key of
        another slot, ``forget_marks.person_key``). With ``redis_wait_replicas``,
        :class:`NotReplicated` when only a master a failover may drop holds the replay (the
        letter would be back among the dead)."""
        again = message.model_copy(update={"unsure": True})
        ref = self.ref_of(message)
        return int(
            await self._replicated(
                self._replay,
                wait_ms=BEGIN_WAIT_MS,
                keys=[
                    *self._append_keys(ref, message),
                    self.keys.dead(self.keys.shard_of_ref(ref)),
                    *self._registry_keys(message),
                ],
                args=[
                    *self._seen_args(),
                    ref,
                    now_ms,
                    self.settings.thread_queue_cap,
                    self.shard_cap,
                    letter,
                    _seen_member(message),
                    again.encode(),
                    int(self.settings.forget_clock_margin_seconds * 1000),
                    message.epoch,
                    message.skew_ms,
                    "" if person_forgot is None else person_forgot,
                ],
            )
        )

    # --- the worker's side ------------------------------------------------------------------
    async def claim(self, refs: Sequence[str], tokens: Sequence[str], *, now_ms: int) -> list[bool]:
        """Try to take each thread under its own token; which were won. One script call
        per shard, all shards at once."""
        lease_ms = int(self.settings.lease_seconds * 1000)
        by_shard: dict[int | None, list[int]] = {}
        for i, ref in enumerate(refs):
            by_shard.setdefault(self.keys.shard_of_ref(ref), []).append(i)
        calls = [
            self._claim(
                keys=[self.keys.ready(shard), *(self.keys.lease(refs[i]) for i in members)],
                args=[
                    lease_ms,
                    now_ms + lease_ms,
                    *(x for i in members for x in (tokens[i], refs[i])),
                ],
            )
            for shard, members in by_shard.items()
        ]
        won = [False] * len(refs)
        for members, replies in zip(by_shard.values(), await asyncio.gather(*calls), strict=True):
            for i, reply in zip(members, replies, strict=True):
                won[i] = bool(reply)
        return won

    async def renew(self, ref: str, token: str, *, now_ms: int) -> bool:
        """Extend the lease. With ``redis_wait_replicas`` a renewal counts only once a
        replica holds it: one that only a cut-off master took would let this worker go on
        sending after the promoted replica's copy of its lease expired and another worker
        took the thread there (both would send the same batch)."""
        lease_ms = int(self.settings.lease_seconds * 1000)
        return bool(
            await self._replicated(
                self._renew,
                wait_ms=max(1, min(BEGIN_WAIT_MS, lease_ms // 6)),
                keys=[self.keys.lease(ref), self._ready(ref)],
                args=[token, lease_ms, now_ms + lease_ms, ref],
            )
        )

    async def head(self, ref: str, *, count: int, user: Whose | None = None) -> Head:
        """The first ``count`` payloads of the thread and its in-flight state; with
        ``user`` (the thread's app, user id and session id), that user's deletion epoch,
        forgetting mark and registry entries too, in the same round trip (the thread's
        and its user's keys share a slot)."""
        k = self.keys
        keys, args = [k.pending(ref), k.thread(ref)], [str(count)]
        if user is not None:
            app, user_id, session_id = user
            keys += [
                k.epoch(app, user_id),
                k.forgetting(app, user_id),
                k.user(app, user_id),
                k.session(app, user_id, session_id),
            ]
            args.append(k.thread_field(app, user_id, session_id))
        reply = await self._head(keys=keys, args=args)
        reply += [None] * (11 - len(reply))
        (
            items,
            inflight,
            attempts,
            cut,
            since,
            epoch,
            forgetting,
            user_uuid,
            graph_uuid,
            thread,
            done,
        ) = reply
        text = [None if v is None else v.decode() for v in (user_uuid, graph_uuid, thread)]
        per_call, _, part_chars = (cut or b"").decode().partition(":")
        return Head(
            items=list(items),
            inflight=inflight,
            attempts=int(attempts or 0),
            cut=(int(per_call), int(part_chars)) if part_chars else None,
            failing_since_ms=int(since) if since else None,
            epoch=None if user is None else int(epoch or 0),
            forgetting=forgetting,
            user_uuid=text[0],
            graph_uuid=text[1],
            thread_uuid=text[2],
            done=int(done) if done else None,
        )

    async def begin(
        self,
        ref: str,
        token: str,
        *,
        first: int,
        last: int,
        cut: tuple[int, int],
        read: tuple[bytes | None, tuple[int, int] | None],
        head: Sequence[bytes] = (),
        epoch: tuple[str, str, int] | None = None,
        server: str = "",
        registered: tuple[Whose, str | None] | None = None,
    ) -> int:
        """Record the batch about to be sent and its ``cut`` (messages per call,
        characters per part): after a failover, a crash or a lost lease, a next attempt
        reads back what it may have stored and resends the same calls under the same keys
        instead of sending it twice. Only if the thread's record and cut are still ``read``
        (the ones the batch was decided on) and ``head`` (the batch's payloads, as read)
        is still the head of its queue: a read of another node, or of this one before it
        changed, would write over the record of calls already sent cut otherwise. With
        ``epoch`` (the user's epoch key, forgetting key, and the epoch the batch was read
        under), only if the user was not forgotten since and is not being forgotten. With
        ``registered`` (the batch's app, user id and session id, and the thread the head's
        read found registered for the session, None for none; with ``epoch`` only), only if
        the registry here says so too. With
        ``server`` (the ``run_id`` :meth:`served_by` last found), only on that server. 1 when
        recorded, 0 when the lease is lost, -1 when the user was (being) forgotten,
        :data:`CHANGED` when the thread is not as read, :data:`SERVER_CHANGED` when the
        server is another."""
        record, was = read
        keys = [self.keys.lease(ref), self.keys.thread(ref), self.keys.pending(ref)]
        args: list[Any] = [
            token,
            f"{first}:{last}",
            f"{cut[0]}:{cut[1]}",
            (record or b"").decode(),
            f"{was[0]}:{was[1]}" if was else "",
            len(head),
            head_digest(head),
            server,
        ]
        if epoch is not None:
            keys += [epoch[0], epoch[1]]
            args.append(epoch[2])
            if registered is not None:
                (app, user_id, session_id), thread_uuid = registered
                keys += [self.keys.user(app, user_id), self.keys.session(app, user_id, session_id)]
                args += [self.keys.thread_field(app, user_id, session_id), thread_uuid or ""]
        return int(await self._replicated(self._begin, wait_ms=BEGIN_WAIT_MS, keys=keys, args=args))

    async def confirmed(self, script: AsyncScript, *, keys: list[str], args: list[Any]) -> Any:
        """Run a script whose write the worker relies on once it returns (the registry's
        record of a session's new thread): with ``redis_wait_replicas``, only once it is on
        the node that is master after any handover, else :class:`NotReplicated` (see
        :meth:`_replicated`)."""
        return await self._replicated(script, keys=keys, args=args, wait_ms=BEGIN_WAIT_MS)

    def _lifetime(self, ref: str, user: Whose | None) -> tuple[list[str], list[Any]]:
        """The keys and arguments of the scripts' ``idle``: the registry entries and thread
        set of the thread's user when the caller knows them (``user``: app, user id, session
        id) and the session's field of the user's map, and the lifetime with the shard's
        key heads."""
        k, shard = self.keys, self.keys.shard_of_ref(ref)
        args = [self.idle_ms, k.thread_head("pending", shard), k.thread_head("thread", shard)]
        if user is None:
            return [], args
        app, user_id, session_id = user
        keys = [k.session(app, user_id, session_id), k.user(app, user_id)]
        args.append(k.thread_field(app, user_id, session_id))
        return [*keys, k.user_threads(app, user_id)], args

    async def ack(
        self, ref: str, token: str, *, last: int, stored: int = 0, user: Whose | None = None
    ) -> int:
        """Pop what is done up to ``last``; the messages left, or -1 if the lease is lost.
        ``stored``: the highest seq of the head's numbering the worker found stored in the
        thread: a gap below it is not counted lost (the rest of it is: counted, logged
        with ids only). ``user``: whose thread it is, so the lifetimes of their keys start
        once it is empty."""
        k, shard = self.keys, self.keys.shard_of_ref(ref)
        keys, args = self._lifetime(ref, user)
        left, missing = await self._ack(
            keys=[
                *(k.lease(ref), k.pending(ref), k.thread(ref), k.depth(shard), k.lost(shard)),
                *keys,
            ],
            args=[token, last, stored, *args],
        )
        if missing:
            lost_messages.add(int(missing))
            log.error("redis lost queued messages thread=%s lost=%d", ref, missing)
        return int(left)

    async def dead_letter(
        self,
        ref: str,
        token: str,
        *,
        count: int,
        reason: str,
        attempts: int,
        now_ms: int,
        last: int | None = None,
        user: Whose | None = None,
    ) -> int:
        """Move the first ``count`` items (none past seq ``last``) to the dead letters of
        the thread's shard; what is left, or -1. ``user`` as :meth:`ack`'s."""
        k, shard = self.keys, self.keys.shard_of_ref(ref)
        lifetime_keys, lifetime_args = self._lifetime(ref, user)
        return int(
            await self._dead(
                keys=[
                    k.lease(ref),
                    k.pending(ref),
                    k.dead(shard),
                    k.thread(ref),
                    k.depth(shard),
                    k.lost(shard),
                    *lifetime_keys,
                ],
                args=[
                    *(token, count, ref, reason, attempts, now_ms),
                    "" if last is None else last,
                    *lifetime_args,
                ],
            )
        )

    async def release(
        self, ref: str, token: str, *, next_ms: int, user: Whose | None = None
    ) -> bool:
        """Give the thread back (``user`` as :meth:`ack`'s)."""
        k, shard = self.keys, self.keys.shard_of_ref(ref)
        lifetime_keys, lifetime_args = self._lifetime(ref, user)
        return bool(
            await self._release(
                keys=[
                    k.lease(ref),
                    k.pending(ref),
                    k.ready(shard),
                    k.thread(ref),
                    k.lost(shard),
                    k.depth(shard),
                    *lifetime_keys,
                ],
                args=[token, ref, next_ms, *lifetime_args],
            )
        )

    async def purge(self, ref: str, *, before_epoch: int) -> int:
        """Drop what was queued on a thread before the user's deletion epoch
        ``before_epoch``; how many messages went."""
        k, shard = self.keys, self.keys.shard_of_ref(ref)
        return int(
            await self._purge(
                keys=[k.pending(ref), k.thread(ref), k.ready(shard), k.depth(shard)],
                args=[ref, before_epoch, self.idle_ms],
            )
        )

    async def expect_late(
        self, thread_uuid: str, *, seq: int, now_ms: int, horizon_ms: int
    ) -> None:
        """Note that calls of a backend thread, from message ``seq`` on, may commit until
        ``horizon_ms`` from ``now_ms``: its copies are looked for until then
        (:attr:`Keys.late`)."""
        key = self.keys.late
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {f"{thread_uuid}:{seq}": now_ms + horizon_ms}, gt=True)
            pipe.pexpire(key, 2 * horizon_ms)  # outlives every entry it holds
            await pipe.execute()

    async def expected_late(self, *, limit: int) -> list[tuple[str, int, int]]:
        """Up to ``limit`` threads that may see late commits, those whose time ends first
        first: ``(thread_uuid, seq, until_ms)``."""
        found = await self.redis.zrange(self.keys.late, 0, limit - 1, withscores=True)
        out = []
        for member, until in found:
            thread_uuid, _, seq = member.decode().rpartition(":")
            out.append((thread_uuid, int(seq), int(until)))
        return out

    async def late_over(self, entries: Sequence[tuple[str, int, int]], *, now_ms: int) -> None:
        """Drop entries whose time is past ``now_ms``: one noted again since with a later
        time stays (the score is compared in the same step as the removal)."""
        if entries:
            members = [f"{thread_uuid}:{seq}" for thread_uuid, seq, _ in entries]
            await self._late_over(keys=[self.keys.late], args=[now_ms, *members])

    async def keep_late(self, *, horizon_ms: int) -> None:
        """Keep the watched threads (:attr:`Keys.late`) as long as a new note would: a
        thread whose copies could not all be repaired yet is read back until they are.
        (With no horizon left to keep, a zero would delete them.)"""
        if horizon_ms > 0:
            await self.redis.pexpire(self.keys.late, 2 * horizon_ms)

    async def count_repaired(self, uuids: list[str], *, now_ms: int) -> int:
        """Record late copies known repaired (:attr:`Keys.late_repaired`); how many of
        them were not recorded before."""
        if not uuids:
            return 0
        added = await self.redis.zadd(
            self.keys.late_repaired, dict.fromkeys(uuids, now_ms), nx=True
        )
        return int(added)

    async def failed_attempt(self, ref: str, *, now_ms: int) -> tuple[int, int]:
        """Count a failed attempt at the head; ``(attempts, failing_since_ms)``."""
        attempts, since = await self._failed(keys=[self.keys.thread(ref)], args=[now_ms])
        return int(attempts), int(since)

    def _ready(self, ref: str) -> str:
        return self.keys.ready(self.keys.shard_of_ref(ref))

    async def keep_marker(self, shard: int | None, known: str, *, now_ms: int) -> tuple[bool, str]:
        """Check the shard's marker against the one this worker knows (``''``: none yet;
        one is written when the shard has none): whether Redis lost the shard's data since
        (recorded for ``status``), and the marker to know from now on."""
        k = self.keys
        lost, marker = await self._marker(
            keys=[k.marker(shard), k.data_lost(shard)],
            args=[known, uuid.uuid4().hex, now_ms, DATA_LOST_REPORT_MS],
        )
        return bool(lost), marker.decode() if isinstance(marker, bytes) else str(marker)

    async def served_by(self, shard: int | None) -> tuple[int, str] | None:
        """The server holding the shard, as ``(since, run_id)``: ``since`` is when the
        workers first found it to be another server than the one that held the shard before
        (a restart, which may have gone back to a snapshot, or a failover to a replica that
        may lag), or found it without a record while the shard held messages; 0 if never.
        None when the server will not say which it is (``INFO`` refused or renamed, a proxy,
        fakeredis). One round trip, on the node of the shard."""
        k = self.keys
        since, run = await self._served_by(
            keys=[k.served_by(shard), k.ready(shard), k.depth(shard)]
        )
        if int(since) < 0:
            return None
        return int(since), _text(run)

    # --- operations -------------------------------------------------------------------------
    async def drop_dead(self, *, shard: int | None) -> int:
        """Delete every dead letter of a shard; how many there were."""
        return int(await self._drop_dead(keys=[self.keys.dead(shard)]))

    async def thread_states(self, refs: Sequence[str]) -> list[ThreadState]:
        """The state of threads of one shard (one script call reads them all)."""
        k = self.keys
        replies = await self._threads(
            keys=[key for ref in refs for key in (k.lease(ref), k.pending(ref), k.thread(ref))]
        )
        return [
            ThreadState(
                leased=bool(replies[i]),
                head_queued_ms=None if replies[i + 1] < 0 else int(replies[i + 1]),
                missing=max(0, int(replies[i + 2])),
            )
            for i in range(0, len(replies), 3)
        ]


async def _on_master_of(
    cluster: RedisCluster,
    script: AsyncScript,
    *,
    keys: list[str],
    args: list[Any],
    wanted: int,
    wait_ms: int,
    replica_counts: dict[str, int],
) -> tuple[Any, Any, Any, Any]:
    """A script, ``ROLE``, ``WAIT`` and ``ROLE`` again, sent together on one connection to
    the master of the keys' slot: a cluster client has no connection to lend
    (``client()``), and WAIT counts the replicas holding the writes of the connection it
    runs on. The check that follows needs every replica the master's ``ROLE`` lists, so
    ``WAIT`` asks for as many as that master's last ``ROLE`` listed (``replica_counts``,
    by node; the client's slot cache the first time: it may be a layout learned during an
    outage), at least ``wanted``; when the ``ROLE`` of this round trip lists more, one
    more ``WAIT`` and ``ROLE`` follow on the same connection. Returns the script's result
    and the other three replies (an error as its exception); the script is loaded on that
    master when it does not know it yet."""
    await cluster.initialize()  # a no-op once the slots are known
    master = cluster.get_node_from_key(keys[0])
    cached = len(cluster.nodes_manager.slots_cache.get(cluster.keyslot(keys[0]), [])[1:])
    count = max(wanted, replica_counts.get(master.name, cached))
    connection = master.acquire_connection()
    try:
        for _ in range(2):
            command = ("EVALSHA", script.sha, len(keys), *keys, *args)
            ran, before, waited, after = await _pipelined(
                connection, command, ("ROLE",), ("WAIT", count, wait_ms), ("ROLE",)
            )
            if not isinstance(ran, NoScriptError):
                break
            await _pipelined(connection, ("SCRIPT", "LOAD", script.script))
        else:
            raise NoScriptError("the script could not be loaded")
        if not isinstance(ran, Exception) and not isinstance(before, Exception):
            attached = len(_attached(before))
            replica_counts[master.name] = attached
            if attached > count and not isinstance(waited, Exception) and int(waited) < attached:
                # WAIT was sized short and returned at the first acknowledgements.
                waited, after = await _pipelined(connection, ("WAIT", attached, wait_ms), ("ROLE",))
    except AttributeError as exc:  # redis-py, on a connection another command dropped
        raise lost_connection(exc) from exc
    finally:
        master._free.append(connection)
    if isinstance(ran, MovedError | ConnectionError):
        # The slot has another master now (a failover, a reshard): the client learns
        # the new layout before its next command, as it does after its own MOVED.
        await cluster.aclose()
    if isinstance(ran, Exception):
        raise ran
    return ran, before, waited, after


async def _pipelined(connection: aioredis.Connection, *commands: tuple[Any, ...]) -> list[Any]:
    """Commands sent together on one connection, their replies in order (an error reply
    as its exception): nothing of another client runs between them, and ``WAIT`` counts
    the replicas holding this connection's writes. A connection whose replies were not all
    read (a timeout, a cancellation) is dropped, never reused out of step."""
    try:
        await connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as error:
                replies.append(error)
        return replies
    except BaseException:
        await connection.disconnect(nowait=True)
        raise


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _attached(role: Any) -> frozenset[tuple[str, int]]:
    """The replicas a master's ``ROLE`` reply lists (none when it is not a master's)."""
    if isinstance(role, Exception) or _text(role[0]) != "master":
        return frozenset()
    return frozenset((_text(ip), int(port)) for ip, port, _ in role[2])


def _unconfirmed(
    before: Any, waited: Any, after: Any, *, must: frozenset[tuple[str, int]], wanted: int
) -> str | None:
    """Why a write is not known to be held where it must be (None: it is): ``before`` and
    ``after`` are the node's ``ROLE`` replies right after the write and after ``WAIT``
    (``waited``); any of them an error (an ACL without ``ROLE``, say) leaves it unknown."""
    for reply in (before, waited, after):
        if isinstance(reply, Exception):
            return f"{type(reply).__name__}: {reply}"
    if _text(before[0]) != "master" or _text(after[0]) != "master":
        return "the node is no longer a master"
    offset = int(before[1])
    held = {(_text(ip), int(port)) for ip, port, acked in after[2] if int(acked) >= offset}
    missing = sorted(must - held)
    if missing:
        return f"replicas {', '.join(f'{ip}:{port}' for ip, port in missing)} do not hold it"
    if len(held) < wanted:
        return f"{len(held)} of {wanted} replicas hold the write"
    return None


def _not_replicated(problem: str) -> NotReplicated:
    log.warning("write not replicated problem=%s", problem)
    return NotReplicated(problem)


def head_digest(items: Sequence[bytes]) -> str:
    """The digest ``BEGIN_LUA`` compares a queue's head with: SHA-1 of each payload framed
    by its length (so no two lists of payloads share one)."""
    return hashlib.sha1(b"".join(b"%d:%s" % (len(item), item) for item in items)).hexdigest()


def _seen_member(message: QueuedMessage) -> str:
    """What ``seen`` remembers of a message: its key *and* its checksum, so only a true
    re-push is skipped; two different texts under one key (a reused invocation id) are
    both queued."""
    return f"{message.key}:{message.checksum}"
