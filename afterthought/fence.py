"""A worker job's right to write on a user's behalf: the user's forget epoch as the job read
it, and the job's hold (the lease of the thread it sends, the mark of its synthesis run).

A forget raises the epoch before it waits for the holds to go (``worker.forget``), so a
write made while both still hold happens before the forget cleans up, and the clean-up
takes it. Each kind of write is checked so:

- a Redis write, inside the script that writes: the script begins with :data:`GUARD` and
  writes nothing unless the epoch and the hold are still the job's. A job whose hold
  expired while it was stopped (SIGSTOP, a long GC pause) writes nothing when it goes on,
  whether or not a forget came meanwhile.
- a backend write cannot be checked in the same step: the fence is read (:meth:`Fence.read`)
  just before it, and again just after it (``Forgetter.raced``). A forget that began in
  between and still waits for the job's hold deletes what the write stored. One that no
  longer waits (the hold expired while the job was stopped) may have finished before the
  write landed: the job has it done again (``Forgetter.reopen``). What is left: a job
  stopped between the first read and the write past its hold, the forget finishing
  meanwhile, and the job killed after its write landed and before the second read: then
  nothing knows of that write.

A forget of the user's person elsewhere — in another deployment that shares users on the
store, or in another app — raises no epoch here and waits for no hold of this job: its
time (``forget_marks.person_key``) is fenced too, as the job read it before the epoch. In
the flat layout the guard compares it in the same script; in a sharded one it lives in
another slot than the user's keys (a script never crosses slots), so it is read just
before the script (:meth:`Fence.write`): a forget that begins between the two is the one
window left there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

#: The first lines of a script that writes for a user: KEYS[1] the user's epoch, KEYS[2] the
#: job's hold, KEYS[3] the time of a forget of their person elsewhere; ARGV[1] the epoch
#: the job read, ARGV[2] its token, ARGV[3] that time as the job read it ('' for none), or
#: :data:`UNCHECKED` (then KEYS[3] is not read). Returns -1 (nothing written) unless all
#: still hold. A script's own keys and arguments begin at the 4th.
GUARD = """
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1])
    or redis.call('GET', KEYS[2]) ~= ARGV[2]
    or (ARGV[3] ~= '*' and (redis.call('GET', KEYS[3]) or '') ~= ARGV[3]) then
  return -1
end
"""
#: ARGV[3] of a guard that does not compare a person's forget time.
UNCHECKED = "*"
#: What a guarded script returns when it wrote nothing.
REFUSED = -1


@dataclass(frozen=True, slots=True)
class Fence:
    """The epoch a job read of one user and the hold it writes under; ``keys`` and
    ``args`` are a guarded script's first ones."""

    epoch_key: str
    hold_key: str
    epoch: int
    token: str
    person_key: str | None = None
    """Where a forget of the user's person elsewhere is timed (``forget_marks.person_key``);
    None when nothing else forgets them."""
    person_forgot: str = ""
    """Its value when the job read it, before the epoch ('' for none)."""
    in_script: bool = True
    """Whether ``person_key`` may join a script of the user's keys: the flat layout. In a
    sharded one it is in another slot (untagged)."""

    @property
    def keys(self) -> list[str]:
        checked = self.person_key if self.person_key is not None and self.in_script else None
        return [self.epoch_key, self.hold_key, checked or self.epoch_key]

    @property
    def args(self) -> list[str | int]:
        checked = self.person_key is not None and self.in_script
        return [self.epoch, self.token, self.person_forgot if checked else UNCHECKED]

    async def read(self, redis: aioredis.Redis) -> tuple[bool, bool]:
        """Read now: whether the user's forget (or their person's) began after the job read
        the epoch, and whether the job still holds its hold."""
        epoch, hold = await redis.mget(self.keys[:2])
        return int(epoch or 0) != self.epoch or await self.person_moved(redis), (
            hold == self.token.encode()
        )

    async def write(
        self, redis: aioredis.Redis, script: AsyncScript, keys: list[str], args: list[Any]
    ) -> bool:
        """Run a guarded script with its own ``keys`` and ``args``; whether it wrote."""
        if self.person_key is not None and not self.in_script and await self.person_moved(redis):
            return False
        return int(await script(keys=[*self.keys, *keys], args=[*self.args, *args])) != REFUSED

    async def person_moved(self, redis: aioredis.Redis) -> bool:
        """Whether a forget of the user's person elsewhere began since the job read it."""
        if self.person_key is None:
            return False
        return (await redis.get(self.person_key) or b"").decode() != self.person_forgot
