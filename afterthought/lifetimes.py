"""Lifetimes for the keys a version from before them wrote without one (``afterthought
sweep``): a session's thread hash and registry entry, a user's registry entry and thread
set. Those are given ``idle_ttl_seconds`` on their next activity; an idle user's would
otherwise stay forever. A session's registry entry of before the user's map (``Keys.user``)
is moved into it while its user's entry is there, so it lives as long as the user. The
sweep gives each the lifetime the queue's scripts would (``queue.idle``: never while a
message of theirs waits). A user's durable keys of use only while something else of theirs
is left (their deletion epoch, their synthesis watermark) are removed once nothing is.
Nothing else is touched: other durable state, keys that expire already, other
deployments' keys (the scan matches the prefix).

Bounded and resumable: a run reads at most ``pages`` pages of the scan and answers where
the next one begins (a cursor to pass back), so a large keyspace is swept in steps; a key
swept twice is skipped (it has a lifetime, or is gone)."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from afterthought.keys import Keys
from afterthought.settings import Settings

#: KEYS a key of a session (its thread hash or registry entry) and the session's pending
#: list; ARGV idle_ms, '1' to apply. The lifetime ``queue.idle`` gives it once the queue
#: is empty: none while a message waits. 1 if the key had none (and now has it).
SESSION_LUA = """
if redis.call('PTTL', KEYS[1]) ~= -1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if ARGV[2] == '1' then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return 1
"""
#: KEYS the user's registry entry or thread set, and their thread set; ARGV idle_ms, '1' to
#: apply, the head of the shard's pending lists. The lifetime ``queue.idle`` gives the two
#: once none of the user's threads holds messages. 1 if the key had none.
USER_LUA = """
if redis.call('PTTL', KEYS[1]) ~= -1 then return 0 end
for _, ref in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('EXISTS', ARGV[3] .. string.match(ref, '([^/]*)$')) == 1 then return 0 end
end
if ARGV[2] == '1' then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return 1
"""
#: KEYS a session's registry entry of before the user's map, the user's entry; ARGV the
#: session's field of the map, '1' to apply. Moves the entry into the map (where it lives
#: as long as the user; ``queue.idle`` does the same at the session's next flush) while
#: the user's entry is there; 1 if it was (or would be) moved.
MOVE_LUA = """
local thread = redis.call('GET', KEYS[1])
if not thread or redis.call('HEXISTS', KEYS[2], 'user_uuid') == 0 then return 0 end
if ARGV[2] == '1' then
  redis.call('HSETNX', KEYS[2], ARGV[1], thread)
  redis.call('DEL', KEYS[1])
end
return 1
"""
#: KEYS a user's durable key (epoch, synthesis watermark), then what of the user would
#: still need it; ARGV '1' to apply. Removed once none of those is left: no registry entry
#: or thread set (both kept while a message of theirs waits, and for ``idle_ttl_seconds``
#: after), no forget or synthesis at work. 1 if it was (or would be) removed.
DURABLE_LUA = """
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
if ARGV[1] == '1' then redis.call('DEL', KEYS[1]) end
return 1
"""
#: Keys read per page of the scan.
PAGE = 1000
#: Pages one run reads at most by default (a million keys).
PAGES = 1000


@dataclass
class Swept:
    """What a run found without a lifetime (and, unless a dry run, gave one)."""

    dry_run: bool
    # Plain dicts, not Counters: ``dataclasses.asdict`` rebuilds a Counter from its items,
    # counting the (kind, n) pairs as keys, and the CLI prints ``asdict`` as JSON.
    given: dict[str, int] = field(default_factory=dict)
    """Keys by kind (``thread``, ``id:thread``, ``id:user``, ``threads``)."""
    removed: dict[str, int] = field(default_factory=dict)
    """Users' durable keys by kind (``epoch``, ``synth``) removed as nothing else of their
    user is left."""
    moved: int = 0
    """Session registry entries of before the user's map moved into it (their user's
    entry was there; the others are given a lifetime, ``given["id:thread"]``)."""
    scanned: int = 0
    cursor: str | None = None
    """Where the next run begins (``--cursor``); None: the scan is complete."""


async def sweep(
    redis: aioredis.Redis,
    settings: Settings,
    *,
    apply: bool,
    cursor: str | None = None,
    pages: int = PAGES,
    page: int = PAGE,
) -> Swept:
    """Give the deployment's keys that have none the lifetime the docs define (a dry run
    counts them) for at most ``pages`` pages of the scan from ``cursor``."""
    keys, done = Keys.of(settings), Swept(dry_run=not apply)
    scripts = (
        redis.register_script(SESSION_LUA),
        redis.register_script(USER_LUA),
        redis.register_script(MOVE_LUA),
        redis.register_script(DURABLE_LUA),
    )
    args = (int(settings.idle_ttl_seconds * 1000), "1" if apply else "0")
    # Both layouts' names: a deployment that resharded may keep flat entries of before.
    targets = [
        (pattern, node)
        for pattern in (f"{keys.prefix}:*", f"{{{keys.prefix}:*")
        for node in await _nodes(redis)
    ]
    at, position = _parse(cursor)
    for _ in range(pages):
        if at >= len(targets):
            return done
        pattern, node = targets[at]
        position, names = await _scan(redis, node, position, pattern, page)
        done.scanned += len(names)
        await _give(scripts, keys, [n.decode() for n in names], args, done)
        if position == 0:
            at += 1
    done.cursor = None if at >= len(targets) else f"{at}:{position}"
    return done


async def _give(
    scripts: tuple[AsyncScript, AsyncScript, AsyncScript, AsyncScript],
    keys: Keys,
    names: list[str],
    args: tuple[int, str],
    done: Swept,
) -> None:
    session, user, move, durable = scripts
    for name in names:
        found = keys.lifetime_of(name)
        if found is None:
            continue
        kind, guards = found
        if kind in ("epoch", "synth"):
            if await durable(keys=[name, *guards], args=[args[1]]):
                done.removed[kind] = done.removed.get(kind, 0) + 1
            continue
        if kind == "id:thread" and await move(keys=[name, guards[1]], args=[guards[2], args[1]]):
            done.moved += 1
            continue
        if kind in ("thread", "id:thread"):
            given = await session(keys=[name, guards[0]], args=args)
        else:
            given = await user(keys=[name, guards[0]], args=[*args, guards[1]])
        if given:
            done.given[kind] = done.given.get(kind, 0) + 1


async def _nodes(redis: aioredis.Redis) -> list[str | None]:
    """What a scan walks: the server, or each master of a cluster (by name, in order)."""
    if not isinstance(redis, RedisCluster):
        return [None]
    await redis.initialize()
    return sorted(node.name for node in redis.get_primaries())


async def _scan(
    redis: aioredis.Redis, node: str | None, position: int, pattern: str, page: int
) -> tuple[int, list[bytes]]:
    if node is None:
        found, names = await redis.scan(position, match=pattern, count=page)
        return int(found), list(names)
    assert isinstance(redis, RedisCluster)
    cursors, names = await redis.scan(
        position, match=pattern, count=page, target_nodes=redis.get_node(node_name=node)
    )
    return int(cursors[node]), list(names)


def _parse(cursor: str | None) -> tuple[int, int]:
    """A run's cursor: the target (pattern and node) and the scan's position in it."""
    if not cursor:
        return 0, 0
    at, _, position = cursor.partition(":")
    if not (at.isdigit() and position.isdigit()):
        raise ValueError("--cursor must be one a sweep printed (N:M)")
    return int(at), int(position)
