"""The spool: messages an agent process could not hand to Redis before it exited (or while
its buffer was full), kept in a local file until a process on this machine that reaches
Redis replays them (W7).

A spool is a private directory (0700) per deployment and Redis (``spool_path``):

- ``spool.log``: appended to, one record a line, ``LENGTH:CRC32:PAYLOAD``, the payload
  the queue's own JSON of a message (:meth:`QueuedMessage.encode`). Each append is
  fsynced before it counts. A torn line (a process killed mid-write, a full disk) fails
  its length or checksum: it is skipped and counted, and the next record is read on.
- ``claimed-*.log``: ``spool.log`` renamed by a replayer, so appends go on into a new
  file while it is replayed; ``.done`` beside it, the offset replayed so far (fsynced
  after every batch Redis took), so a replayer that dies is followed by one that goes
  on from there.
- ``append.lock`` (held while appending or renaming) and ``replay.lock`` (held for a
  whole replay): two replayers never run at once, so a thread's spooled messages reach
  Redis in the order they were said, and never twice from one file.

Replaying is the enqueue script itself, which skips keys its thread holds or lately held:
a message spooled while Redis may already have taken it (its reply lost) is marked
``unsure``, so the worker reconciles it against the backend even after the thread has
forgotten its key. Nothing here is pickled; nothing logged holds content."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from afterthought.connections import FAILURES
from afterthought.contract import QueuedMessage
from afterthought.queue import FORGOTTEN, ThreadQueue
from afterthought.settings import Settings

log = logging.getLogger("afterthought.spool")
T = TypeVar("T")

LIVE = "spool.log"
CLAIMED = "claimed-"
APPEND_LOCK = "append.lock"
REPLAY_LOCK = "replay.lock"
#: Messages of one thread a replay hands the enqueue script at once.
REPLAY_CHUNK = 100


@dataclass(frozen=True, slots=True)
class Appended:
    """What an append kept (durably) and what did not fit under ``spool_max_bytes``."""

    spooled: int
    full: int


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a replay handed to Redis (new there, or held already) and what it skipped as
    torn or damaged; ``busy``: another process was replaying, so this one did nothing."""

    replayed: int = 0
    damaged: int = 0
    forgotten: int = 0
    """Made before their user was forgotten: refused by the enqueue script, dropped."""
    busy: bool = False
    finished: bool = False
    """Every file there was when it looked last is replayed."""


def frame(message: QueuedMessage) -> bytes:
    payload = message.encode().encode()
    return b"%d:%08x:%s\n" % (len(payload), zlib.crc32(payload), payload)


def unframe(line: bytes) -> QueuedMessage | None:
    """The message of one line, or None when the line is torn or damaged."""
    if not line.endswith(b"\n"):
        return None
    size, _, rest = line[:-1].partition(b":")
    crc, _, payload = rest.partition(b":")
    if not size.isdigit() or int(size) != len(payload) or len(crc) != 8:
        return None
    try:
        if int(crc, 16) != zlib.crc32(payload):
            return None
        return QueuedMessage.model_validate_json(payload)
    except (ValueError, ValidationError):
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """An exclusive ``flock`` on ``path`` (per open file, so threads of one process
    exclude each other too); yields False when ``wait`` is off and another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


class Spool:
    """One deployment's spool on this machine. Its methods are blocking file I/O, but for
    :meth:`replay`, which does its file work on another thread."""

    def __init__(self, directory: Path, *, max_bytes: int, chunk: int = REPLAY_CHUNK) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.chunk = chunk

    @classmethod
    def of(cls, settings: Settings) -> Spool:
        # Never more of a thread at once than a cap admits, or it is refused for good.
        chunk = min(REPLAY_CHUNK, settings.thread_queue_cap, settings.queue_cap)
        return cls(settings.spool_path, max_bytes=settings.spool_max_bytes, chunk=chunk)

    def _ready(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory.chmod(0o700)  # mkdir's mode is cut by the umask, never widened

    def _claimed(self) -> list[Path]:
        """Claimed files, oldest first."""
        try:
            return sorted(self.directory.glob(f"{CLAIMED}*.log"))
        except OSError:
            return []

    def _files(self) -> list[Path]:
        """Every file holding records, oldest first."""
        return [*self._claimed(), self.directory / LIVE]

    def empty(self) -> bool:
        """Nothing to replay (a cheap look: no file, no claim); a spool that cannot be
        looked at holds nothing this process could replay."""
        try:
            return not (self.directory / LIVE).exists() and not self._claimed()
        except OSError:
            return True

    def size(self) -> int:
        """Bytes of records waiting to be replayed (replayed parts of a claim included)."""
        total = 0
        for path in self._files():
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def _lines(self) -> Iterator[bytes]:
        """The lines waiting to be replayed, oldest first."""
        for path in self._files():
            with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
                f.seek(_done(path))
                yield from f

    def waiting(self) -> int:
        """Records waiting to be replayed (counted in the files: for ``status``)."""
        return sum(1 for line in self._lines() if line.endswith(b"\n"))

    def messages(self) -> list[QueuedMessage]:
        """The messages waiting to be replayed, oldest first (to inspect it)."""
        return [m for m in map(unframe, self._lines()) if m is not None]

    def threads(self) -> set[str]:
        """The threads of the messages waiting (none, when the spool cannot be read: this
        process could not replay it either)."""
        try:
            return {m.thread_key for m in self.messages()}
        except OSError:
            return set()

    def append(self, messages: Sequence[QueuedMessage]) -> Appended:
        """Write messages at the end, in order, durably; those past ``max_bytes`` are not
        written (the caller counts them dropped)."""
        if not messages:
            return Appended(0, 0)
        self._ready()
        records = [frame(m) for m in messages]
        with _locked(self.directory / APPEND_LOCK):
            room = self.max_bytes - self.size()
            kept = 0
            while kept < len(records) and len(records[kept]) <= room:
                room -= len(records[kept])
                kept += 1
            if kept:
                self._write(b"".join(records[:kept]))
        return Appended(kept, len(records) - kept)

    def _write(self, data: bytes) -> None:
        path = self.directory / LIVE
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            if end and os.pread(fd, 1, end - 1) != b"\n":
                data = b"\n" + data  # a torn record stays a line of its own, not glued to this
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if not end:
            _fsync_dir(self.directory)  # the new file's name is durable too

    def _claim(self) -> Path | None:
        """The oldest claim left (by a replayer that died), else the live file renamed
        into a claim (appends go on into a new one), else None. Under the replay lock."""
        claimed = self._claimed()
        if claimed:
            return claimed[0]
        live = self.directory / LIVE
        with _locked(self.directory / APPEND_LOCK):
            if not live.exists():
                return None
            claim = self.directory / f"{CLAIMED}{time.time_ns():020d}-{os.getpid()}.log"
            os.rename(live, claim)
            _fsync_dir(self.directory)
        return claim

    async def replay(
        self, send: Callable[[list[QueuedMessage]], Awaitable[bool]], *, blocking: bool = False
    ) -> Replayed:
        """Send every spooled record, oldest first, in runs of one thread of at most
        ``chunk``: ``send`` returns True once Redis holds them (new, or there already),
        False to stop, keeping the rest for the next replay (it raises nothing: what is
        damaged is counted in the result). Returns at once when another process is replaying.
        ``blocking``: do the file work on the caller's thread (a loop of its own, which may
        replay at interpreter exit, when no new thread can be started), else on another."""

        async def run(work: Callable[..., T], *args: object) -> T:
            return work(*args) if blocking else await asyncio.to_thread(work, *args)

        if self.empty():
            return Replayed(finished=True)
        self._ready()
        replayed = damaged = 0
        with _locked(self.directory / REPLAY_LOCK, wait=False) as mine:
            if not mine:
                return Replayed(busy=True)
            while (claim := await run(self._claim)) is not None:
                batch: list[QueuedMessage] = []
                end_of_batch = 0
                for end, message in await run(_records, claim):
                    if message is None:
                        damaged += 1
                        if not batch:  # replayed up to here: not counted again
                            await run(_mark, claim, end)
                        continue
                    thread = message.thread_key
                    if batch and (thread != batch[0].thread_key or len(batch) >= self.chunk):
                        if not await send(batch):
                            return Replayed(replayed, damaged)
                        replayed += len(batch)
                        await run(_mark, claim, end_of_batch)
                        batch = []
                    batch.append(message)
                    end_of_batch = end
                if batch and not await send(batch):
                    return Replayed(replayed, damaged)
                replayed += len(batch)
                await run(_finish, claim)
        return Replayed(replayed, damaged, finished=True)


def _records(claim: Path) -> list[tuple[int, QueuedMessage | None]]:
    """Each record of a claim past what was replayed: where it ends, and its message (None:
    torn or damaged, logged with its length only)."""
    offset = _done(claim)
    records: list[tuple[int, QueuedMessage | None]] = []
    with claim.open("rb") as f:
        f.seek(offset)
        for line in f:
            offset += len(line)
            message = unframe(line)
            if message is None:
                log.error("spool record damaged, skipped bytes=%d", len(line))
            records.append((offset, message))
    return records


def _done_path(claim: Path) -> Path:
    return claim.with_suffix(".done")


def _done(claim: Path) -> int:
    """How far a claim was replayed (0: not at all, or the live file)."""
    try:
        text = _done_path(claim).read_text()
    except (FileNotFoundError, ValueError):
        return 0
    return int(text) if text.isdigit() else 0


def _mark(claim: Path, offset: int) -> None:
    """Record durably that a claim is replayed up to ``offset``."""
    temporary = claim.with_suffix(".done-new")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, str(offset).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, _done_path(claim))


def _finish(claim: Path) -> None:
    claim.unlink()
    _done_path(claim).unlink(missing_ok=True)
    _fsync_dir(claim.parent)


async def replay_into(spool: Spool, queue: ThreadQueue) -> Replayed:
    """Replay a spool through ``queue``'s enqueue script (a worker's, whose client has its
    own command timeouts); a failure of Redis stops it, to be tried again. A message made
    before its user's forget is refused by the script, dropped and counted."""
    forgotten = 0

    async def send(messages: list[QueuedMessage]) -> bool:
        nonlocal forgotten
        try:
            result = await queue.enqueue(messages, now_ms=int(time.time() * 1000))
        except FAILURES as exc:
            log.warning("spool replay stopped error=%s", type(exc).__name__)
            return False
        if result != FORGOTTEN:
            return result >= 0
        if len(messages) == 1:
            forgotten += 1
            log.info(
                "spool record dropped thread=%s: made before its user's forget",
                messages[0].thread_key,
            )
            return True
        # A run that spans the forget queued nothing: each alone, to find which go.
        for message in messages:
            if not await send([message]):
                return False
        return True

    return replace(await spool.replay(send), forgotten=forgotten)
