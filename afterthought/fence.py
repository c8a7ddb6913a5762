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
  nothing knows of that write."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

#: The first lines of a script that writes for a user: KEYS[1] the user's epoch, KEYS[2] the
#: job's hold; ARGV[1] the epoch the job read, ARGV[2] its token. Returns -1 (nothing
#: written) unless both still hold.
GUARD = """
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1])
    or redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return -1
end
"""
#: What a guarded script returns when it wrote nothing.
REFUSED = -1


@dataclass(frozen=True, slots=True)
class Fence:
    """The epoch a job read of one user and the hold it writes under; ``keys`` and
    ``args`` are a guarded script's first ones (both keys are in the user's slot)."""

    epoch_key: str
    hold_key: str
    epoch: int
    token: str

    @property
    def keys(self) -> list[str]:
        return [self.epoch_key, self.hold_key]

    @property
    def args(self) -> list[str | int]:
        return [self.epoch, self.token]

    async def read(self, redis: aioredis.Redis) -> tuple[bool, bool]:
        """Read now: whether the user's forget began after the job read the epoch, and
        whether the job still holds its hold."""
        epoch, hold = await redis.mget(self.keys)
        return int(epoch or 0) != self.epoch, hold == self.token.encode()
