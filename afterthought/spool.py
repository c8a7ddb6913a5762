"""The spool: messages an agent process could not hand to Redis before it exited (or while
its buffer was full), kept in a local file until a process on this machine that reaches
Redis replays them (W7).

A spool is a private directory (0700) per deployment and Redis (``spool_path``), this
user's own (one another user made is refused: it could hold their symlinks); its files
are never opened through a symlink:

- ``spool.log``: appended to, one record a line, ``LENGTH:CRC32:PAYLOAD``, the payload
  the queue's own JSON of a message (:meth:`QueuedMessage.encode`). Each append is
  fsynced before it counts; one the disk cuts short keeps its whole records, one whose
  fsync fails is cut off, so what is counted not written is never replayed. A torn line
  (a process killed mid-write) fails its length or checksum: it is skipped and counted,
  and the next record is read on.
- ``claimed-*.log``: ``spool.log`` renamed by a replayer, so appends go on into a new
  file while it is replayed; ``.done`` beside it, the offset replayed so far (fsynced
  after every batch Redis took), so a replayer that dies is followed by one that goes
  on from there, sending what it finds ``unsure`` (the one before may have sent it).
  ``claimed-*~N.log``: the records a replay held back (their thread's queue full),
  sorted right after the claim they came from.
- ``append.lock`` (held while appending or renaming; waited for a bounded time, as its
  holder may be stopped) and ``replay.lock`` (held for a whole replay): two replayers
  never run at once, so a thread's spooled messages reach Redis in the order they were
  said, and never twice from one file.

Replaying is the enqueue script itself, which skips keys its thread holds or lately held:
a message spooled while Redis may already have taken it (its reply lost) is marked
``unsure``, so the worker reconciles it against the backend even after the thread has
forgotten its key. Nothing here is pickled; nothing logged holds content."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import logging
import os
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, TypeVar

from pydantic import ValidationError

from afterthought.connections import FAILURES
from afterthought.contract import QueuedMessage
from afterthought.queue import FORGOTTEN, REFUSED, ThreadQueue
from afterthought.settings import Settings

log = logging.getLogger("afterthought.spool")
T = TypeVar("T")

LIVE = "spool.log"
CLAIMED = "claimed-"
#: Between a claim's name and its generation, in the claim of the records a replay held
#: back: sorts after the claim's own name, before any later claim's.
REST = "~"
APPEND_LOCK = "append.lock"
REPLAY_LOCK = "replay.lock"
#: Messages of one thread a replay hands the enqueue script at once.
REPLAY_CHUNK = 100
#: How long spool work off the turn path (a replay's claim, an append by default) waits
#: for the append lock, which a stopped process may hold for good.
LOCK_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Appended:
    """What an append kept (durably), what did not fit under ``spool_max_bytes``, and what
    could not be written (a full or failing disk, a spool directory refused, its lock held
    by another process past the deadline): ``failed``, with ``why`` the reason."""

    spooled: int
    full: int
    failed: int = 0
    why: str = ""


#: Why an append wrote nothing: the spool directory is not this user's own.
REFUSED_DIRECTORY = "spool directory refused"
#: Why an append wrote nothing: another process held the spool past the deadline.
LOCKED = "spool locked by another process"
#: Why an append wrote (some of) nothing: the file could not be written or synced.
UNWRITABLE = "spool not writable"


class Sent(enum.Enum):
    """What became of a run a replay handed to Redis."""

    QUEUED = "queued"
    """Redis holds it (new, or there already)."""
    HELD = "held"
    """Refused for now (its queue is full): the thread waits, the others go on."""
    FAILED = "failed"
    """Redis failing: the replay stops, the rest waits for the next."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a replay handed to Redis (new there, or held already) and what it skipped as
    torn or damaged; ``busy``: another process was replaying, so this one did nothing."""

    replayed: int = 0
    damaged: int = 0
    forgotten: int = 0
    """Made before their user was forgotten: refused by the enqueue script, dropped (not
    counted in ``replayed``)."""
    busy: bool = False
    finished: bool = False
    """Every file there was when it looked last is replayed."""


class SpoolRefused(OSError):
    """The spool directory is not this user's own: nothing is written or read there."""


class SpoolLocked(OSError):
    """Another process held the spool's append lock past the deadline (stopped, or stuck
    on a hung disk)."""


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


def _open(path: Path, flags: int, mode: int = 0o600) -> int:
    """Open a file of the spool, never through a symlink (one planted there would have a
    process of another user write where it points), nor into a child process."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def _read(path: Path) -> BinaryIO:
    return os.fdopen(_open(path, os.O_RDONLY), "rb")


#: Makes what was written to a file descriptor durable (``os.fsync``).
Fsync = Callable[[int], None]


def _fsync_dir(path: Path, fsync: Fsync) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fsync(fd)
    finally:
        os.close(fd)


#: How often a bounded wait for a lock looks again.
LOCK_POLL_SECONDS = 0.01


@contextlib.contextmanager
def _locked(path: Path, *, wait: float) -> Iterator[bool]:
    """An exclusive ``flock`` on ``path`` (per open file, so threads of one process
    exclude each other too), waiting at most ``wait`` seconds (0: one try); yields False
    when another holds it that long. Bounded: a holder may be stopped (SIGSTOP) for good."""
    fd = _open(path, os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(LOCK_POLL_SECONDS)
        yield True
    finally:
        os.close(fd)  # releases the lock


class Spool:
    """One deployment's spool on this machine. Its methods are blocking file I/O, but for
    :meth:`replay`, which does its file work on another thread."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        chunk: int = REPLAY_CHUNK,
        lock_seconds: float = LOCK_SECONDS,
        fsync: Fsync = os.fsync,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.chunk = chunk
        self.lock_seconds = lock_seconds
        """How long a replay waits for the append lock to claim the live file."""
        self.fsync = fsync
        """Every sync of the spool's files and directory: a test fails it here, and one
        that models no crash of the machine skips the disk's wait."""
        self._refusal_logged = False
        self._seen: dict[tuple[int, int], tuple[int, set[str], int]] = {}
        """What :meth:`threads` read of each file (by device and inode): how far, the
        threads found, and a checksum of its first record (an inode is reused)."""
        self._seen_lock = threading.Lock()

    @classmethod
    def of(cls, settings: Settings) -> Spool:
        # Never more of a thread at once than a cap admits, or it is refused for good: a
        # sharded queue's cap is each shard's share.
        chunk = min(REPLAY_CHUNK, settings.thread_queue_cap, settings.shard_queue_cap)
        return cls(settings.spool_path, max_bytes=settings.spool_max_bytes, chunk=chunk)

    def _ready(self) -> None:
        """The directory exists, this user's own and private; else :class:`SpoolRefused`
        (logged once): a directory another user made first (a shared volume, a path under
        /tmp) could hold their symlinks, and they could read what is spooled."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            owner = os.fstat(fd).st_uid
            if owner != os.geteuid():
                if not self._refusal_logged:
                    self._refusal_logged = True
                    log.error(
                        "spool directory refused: owned by uid %d, not this process's %d",
                        owner,
                        os.geteuid(),
                    )
                raise SpoolRefused(f"spool directory owned by uid {owner}")
            os.fchmod(fd, 0o700)  # mkdir's mode is cut by the umask, never widened
        finally:
            os.close(fd)

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

    def stamp(self) -> tuple[int, ...]:
        """What an append, a claim or a finished replay changes: the directory's and the
        live file's modification times and sizes (two stats, nothing read)."""
        found: list[int] = []
        for path in (self.directory, self.directory / LIVE):
            try:
                st = path.stat()
            except OSError:
                found.append(-1)
            else:
                found += (st.st_mtime_ns, st.st_size, st.st_ino)
        return tuple(found)

    def size(self) -> int:
        """Bytes of records waiting to be replayed (replayed parts of a claim included)."""
        total = 0
        for path in self._files():
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def _lines(self, files: Sequence[Path]) -> Iterator[bytes]:
        for path in files:
            with contextlib.suppress(FileNotFoundError), _read(path) as f:
                f.seek(_done(path))
                yield from f

    def waiting(self) -> int:
        """Records waiting to be replayed (counted in the files: for ``status``)."""
        return sum(1 for line in self._lines(self._files()) if line.endswith(b"\n"))

    def messages(self) -> list[QueuedMessage]:
        """The messages waiting to be replayed, oldest first (to inspect it)."""
        return [m for m in map(unframe, self._lines(self._files())) if m is not None]

    def threads(self) -> set[str]:
        """The threads of the messages in the files (none, when the spool cannot be read:
        this process could not replay it either), on the turn path at every change of
        :meth:`stamp`: each file (by inode: the live file renamed into a claim is the same)
        is read once, then only what was appended since, so a spool of 64 MiB costs a turn
        its new records, not a second of the agent's loop. Records a claim's replayer sent
        already count until the claim is gone (a thread taken for spooled goes on in the
        spool a while longer: its order holds). The live file is read before the claims
        are listed: a replayer renaming it meanwhile leaves its records in a claim listed
        after, and a claim gone by then is in Redis."""
        found: set[str] = set()
        seen: dict[tuple[int, int], tuple[int, set[str], int]] = {}
        with self._seen_lock:  # the agent's loops and its drain thread share the spool
            try:
                for path in [self.directory / LIVE, *self._claimed()]:
                    with contextlib.suppress(FileNotFoundError), _read(path) as f:
                        st = os.fstat(f.fileno())
                        head = zlib.crc32(f.readline())
                        offset, threads, was = self._seen.get(
                            (st.st_dev, st.st_ino), (0, set(), head)
                        )
                        # Another file under a freed inode (its first record differs), or
                        # one cut back since (an append whose sync failed): read it all.
                        if offset and (was != head or os.pread(f.fileno(), 1, offset - 1) != b"\n"):
                            offset, threads = 0, set()
                        f.seek(offset)
                        for line in f:
                            if not line.endswith(b"\n"):
                                break  # an append under way: read whole next time
                            offset += len(line)
                            if (message := unframe(line)) is not None:
                                threads.add(message.thread_key)
                        seen[st.st_dev, st.st_ino] = (offset, threads, head)
                        found |= threads
            except OSError:
                return set()
            self._seen = seen  # files gone are forgotten
        return found

    def append(self, messages: Sequence[QueuedMessage], *, wait: float = LOCK_SECONDS) -> Appended:
        """Write messages at the end, in order, durably; those past ``max_bytes`` are not
        written, nor any when another process holds the spool for ``wait`` seconds or the
        disk fails (the caller counts them dropped, with the reason). Raises nothing."""
        if not messages:
            return Appended(0, 0)
        records = [frame(m) for m in messages]
        try:
            self._ready()
            with _locked(self.directory / APPEND_LOCK, wait=wait) as mine:
                if not mine:
                    log.error("spool append gave up: another process holds %s", APPEND_LOCK)
                    return Appended(0, 0, len(records), LOCKED)
                room = self.max_bytes - self.size()
                fits = 0
                while fits < len(records) and len(records[fits]) <= room:
                    room -= len(records[fits])
                    fits += 1
                kept = self._write(records[:fits]) if fits else 0
        except SpoolRefused:
            return Appended(0, 0, len(records), REFUSED_DIRECTORY)
        except OSError as exc:
            log.error("spool write failed error=%s errno=%s", type(exc).__name__, exc.errno)
            return Appended(0, 0, len(records), UNWRITABLE)
        return Appended(kept, len(records) - fits, fits - kept, UNWRITABLE if fits > kept else "")

    def _write(self, records: Sequence[bytes]) -> int:
        """Append records durably; how many of them are in the file (the first ones).
        A write cut short (a full disk) keeps the whole records it wrote, its torn tail cut
        off; a failed fsync cuts off all it wrote. What cannot be cut off is counted kept:
        it may be replayed, so the thread must go on in the spool behind it."""
        path = self.directory / LIVE
        fd = _open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            # A torn record of a process killed as it wrote stays a line of its own.
            lead = b"\n" if end and os.pread(fd, 1, end - 1) != b"\n" else b""
            data = memoryview(lead + b"".join(records))
            written = 0
            try:
                while written < len(data):
                    written += os.write(fd, data[written:])
            except OSError as exc:
                log.error("spool write cut short errno=%s written=%d", exc.errno, written)
            kept, whole = 0, len(lead)
            while kept < len(records) and whole + len(records[kept]) <= written:
                whole += len(records[kept])
                kept += 1
            try:
                if written > whole or kept == 0:
                    os.ftruncate(fd, end + whole if kept else end)
                self.fsync(fd)
            except OSError as exc:
                log.error("spool fsync failed errno=%s", exc.errno)
                try:
                    os.ftruncate(fd, end)
                    self.fsync(fd)
                except OSError:
                    return kept
                return 0
        finally:
            os.close(fd)
        if not end:
            _fsync_dir(self.directory, self.fsync)  # the new file's name is durable too
        return kept

    def _claim(self, passed: set[Path]) -> Path | None:
        """The oldest claim left (by a replayer that died or stopped) not
        ``passed`` in this replay, else the live file renamed into a claim (appends go on
        into a new one), else None. Under the replay lock; :class:`SpoolLocked` when
        another process holds the append lock past ``lock_seconds``."""
        for claim in self._claimed():
            if claim not in passed:
                return claim
        live = self.directory / LIVE
        with _locked(self.directory / APPEND_LOCK, wait=self.lock_seconds) as mine:
            if not mine:
                raise SpoolLocked(f"another process holds {APPEND_LOCK}")
            if not live.exists():
                return None
            # Named after every claim left (held-back records), even when the clock was
            # stepped back since: claims replay in the order of their names.
            stamp = max([time.time_ns(), *(_stamp_of(c) + 1 for c in self._claimed())])
            claim = self.directory / f"{CLAIMED}{stamp:020d}-{os.getpid()}.log"
            os.rename(live, claim)
            _fsync_dir(self.directory, self.fsync)
        return claim

    async def replay(
        self, send: Callable[[list[QueuedMessage]], Awaitable[Sent]], *, blocking: bool = False
    ) -> Replayed:
        """Send every spooled record, oldest first, in runs of one thread of at most
        ``chunk`` (``send`` raises nothing: what is damaged is counted in the result). A
        run ``send`` finds refused (``HELD``) keeps its thread's later records back too,
        the other threads go on; they are written into a claim of their own, sorted where
        they were, for the next replay. ``FAILED`` stops, keeping the rest. Returns at once
        when another process is replaying. ``blocking``: do the file work on the caller's
        thread (a loop of its own, which may replay at interpreter exit, when no new thread
        can be started), else on another."""

        if self.empty():
            return Replayed(finished=True)
        await _io(blocking, self._ready)
        total = Replayed()
        held_back: set[str] = set()
        passed: set[Path] = set()
        with _locked(self.directory / REPLAY_LOCK, wait=0) as mine:
            if not mine:
                return Replayed(busy=True)
            while (claim := await _io(blocking, self._claim, passed)) is not None:
                passed.add(claim)
                done = await self._replay_claim(claim, send, held_back, passed, blocking)
                total = replace(
                    total,
                    replayed=total.replayed + done.replayed,
                    damaged=total.damaged + done.damaged,
                )
                if not done.finished:
                    return total
        return replace(total, finished=not held_back)

    async def _replay_claim(
        self,
        claim: Path,
        send: Callable[[list[QueuedMessage]], Awaitable[Sent]],
        held_back: set[str],
        passed: set[Path],
        blocking: bool,
    ) -> Replayed:
        """One claim's records past its offset; ``finished`` False when Redis failed.
        ``held_back``: threads refused in this replay (their later records wait too);
        ``passed``: claims this replay is done with (the held-back records' one too)."""
        replayed = damaged = 0
        unmarked = 0  # damaged records past the offset last marked: counted once passed
        kept: list[QueuedMessage] = []
        batch: list[QueuedMessage] = []
        batch_end = 0

        async def settle() -> bool:
            """Send the batch; False when Redis fails (the replay stops)."""
            nonlocal batch, replayed, damaged, unmarked
            outcome = await send(batch)
            if outcome is Sent.FAILED:
                return False
            if outcome is Sent.HELD:
                held_back.add(batch[0].thread_key)
                kept.extend(batch)
            else:
                replayed += len(batch)
                if not kept:
                    await _io(blocking, _mark, claim, batch_end, self.fsync)
                    damaged, unmarked = damaged + unmarked, 0
            batch = []
            return True

        for end, message in await _io(blocking, _records, claim):
            if message is not None:
                # Reconciled by the worker against the whole thread, however long ago: the
                # replayer before may have sent what it had not marked yet (its run stopped,
                # or it died), and a spool may wait for hours, during which the session can
                # be re-imported (its keys pushed out of the thread's ``seen`` memory).
                message = message.model_copy(update={"unsure": True})
            thread = None if message is None else message.thread_key
            boundary = batch and (thread != batch[0].thread_key or len(batch) >= self.chunk)
            if boundary and not await settle():
                return Replayed(replayed, damaged)
            if message is None:
                unmarked += 1
                if not batch and not kept:  # replayed up to here
                    await _io(blocking, _mark, claim, end, self.fsync)
                    damaged, unmarked = damaged + unmarked, 0
            elif message.thread_key in held_back:
                kept.append(message)  # behind its thread's refused run
            else:
                batch.append(message)
                batch_end = end
        if batch and not await settle():
            return Replayed(replayed, damaged)
        rest = await _io(blocking, _finish, claim, kept, self.fsync)
        if rest is not None:
            passed.add(rest)
        return Replayed(replayed, damaged + unmarked, finished=True)


async def _io(blocking: bool, work: Callable[..., T], *args: object) -> T:
    """File work of a replay: on the caller's thread when ``blocking``, else on another."""
    return work(*args) if blocking else await asyncio.to_thread(work, *args)


def _records(claim: Path) -> list[tuple[int, QueuedMessage | None]]:
    """Each record of a claim past what was replayed: where it ends, and its message (None:
    torn or damaged, logged with its length only)."""
    offset = _done(claim)
    records: list[tuple[int, QueuedMessage | None]] = []
    with _read(claim) as f:
        f.seek(offset)
        for line in f:
            offset += len(line)
            message = unframe(line)
            if message is None:
                log.error("spool record damaged, skipped bytes=%d", len(line))
            records.append((offset, message))
    return records


def _stamp_of(claim: Path) -> int:
    """The time a claim's name gives (0 for a name not made here)."""
    stamp = claim.name[len(CLAIMED) :].partition("-")[0]
    return int(stamp) if stamp.isdigit() else 0


def _done_path(claim: Path) -> Path:
    return claim.with_suffix(".done")


def _done(claim: Path) -> int:
    """How far a claim was replayed (0: not at all, or the live file)."""
    try:
        with _read(_done_path(claim)) as f:
            text = f.read()
    except FileNotFoundError:
        return 0
    return int(text) if text.isdigit() else 0


def _write_durably(path: Path, data: bytes, fsync: Fsync) -> None:
    """``path`` holds ``data`` (written beside it, synced, renamed over it)."""
    temporary = path.with_name(path.name + "-new")
    fd = _open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def _mark(claim: Path, offset: int, fsync: Fsync) -> None:
    """Record durably that a claim is replayed up to ``offset``."""
    _write_durably(_done_path(claim), str(offset).encode(), fsync)


def _finish(claim: Path, kept: Sequence[QueuedMessage], fsync: Fsync) -> Path | None:
    """A claim is replayed but for ``kept`` (held back): those go into a claim of their
    own (returned) sorted right after it, before any later file; then it is removed."""
    rest = None
    if kept:
        base, _, generation = claim.stem.partition(REST)
        rest = claim.with_name(f"{base}{REST}{int(generation or 0) + 1:06d}.log")
        _write_durably(rest, b"".join(map(frame, kept)), fsync)
        _fsync_dir(claim.parent, fsync)
    claim.unlink()
    _done_path(claim).unlink(missing_ok=True)
    _fsync_dir(claim.parent, fsync)
    return rest


async def replay_into(spool: Spool, queue: ThreadQueue) -> Replayed:
    """Replay a spool through ``queue``'s enqueue script (a worker's, whose client has its
    own command timeouts); a failure of Redis stops it, to be tried again, a thread whose
    queue is full waits while the others go on. A message made before its user's forget
    is refused by the script, dropped and counted (once its run is through)."""
    forgotten = 0

    async def attempt(messages: list[QueuedMessage]) -> tuple[Sent, int]:
        """What became of the run, and how many of it were dropped as forgotten."""
        try:
            result = await queue.enqueue(messages, now_ms=int(time.time() * 1000))
        except FAILURES as exc:
            log.warning("spool replay stopped error=%s", type(exc).__name__)
            return Sent.FAILED, 0
        if result in REFUSED:
            return Sent.HELD, 0
        if result != FORGOTTEN:
            return (Sent.QUEUED if result >= 0 else Sent.FAILED), 0
        if len(messages) == 1:
            log.info(
                "spool record dropped thread=%s: made before its user's forget",
                messages[0].thread_key,
            )
            return Sent.QUEUED, 1
        # A run that spans the forget queued nothing: each alone, to find which go.
        dropped = 0
        for message in messages:
            outcome, gone = await attempt([message])
            if outcome is not Sent.QUEUED:
                return outcome, 0  # sent again next time, counted then
            dropped += gone
        return Sent.QUEUED, dropped

    async def send(messages: list[QueuedMessage]) -> Sent:
        nonlocal forgotten
        outcome, gone = await attempt(messages)
        if outcome is Sent.QUEUED:
            forgotten += gone
        return outcome

    result = await spool.replay(send)
    return replace(result, replayed=result.replayed - forgotten, forgotten=forgotten)
