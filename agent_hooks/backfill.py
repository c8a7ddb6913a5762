"""Importing existing ADK sessions into the queue (``afterthought backfill``): from an ADK
``DatabaseSessionService`` or a JSONL export, one ``Session`` JSON per line.

Resumable: a session is marked done (with its ``last_update_time``) only once all of it
is queued, so an interrupted run starts again where it stopped and a session that grew
since is imported again. Never duplicating: its messages carry the callbacks' keys and
are replays, so the worker sends only what the backend lacks."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis
from google.adk.sessions import Session
from pydantic import ValidationError

from afterthought.agent_hooks.identity import IdentityResolver, ZepIdentity, replay_pins
from afterthought.agent_hooks.messages import messages_from_events
from afterthought.contract import QueuedMessage
from afterthought.enqueue import NOT_SENT, UNREACHABLE, Enqueuer
from afterthought.keys import Keys, digest
from afterthought.settings import Settings
from afterthought.validation import detect

log = logging.getLogger("afterthought.backfill")

#: Messages per enqueue round trip.
CHUNK = 100
#: Progress is kept this long after the last session was imported.
PROGRESS_TTL_SECONDS = 30 * 86400
#: While the queue is full, wait this long between tries (workers drain it meanwhile).
FULL_WAIT_SECONDS = 1.0
#: Tries of an unreachable Redis before the run stops (it resumes when run again).
UNREACHABLE_TRIES = 5


class BackfillError(RuntimeError):
    """The run stopped; what was marked done stays done."""


@dataclass
class Report:
    sessions: int = 0
    """Sessions queued by this run."""
    skipped: int = 0
    """Sessions an earlier run queued already (and unchanged since)."""
    messages: int = 0
    """Messages queued by this run."""
    malformed: list[int] = field(default_factory=list)
    """Line numbers of a JSONL export that are not an ADK session."""
    refused: list[str] = field(default_factory=list)
    """Ids of sessions with a message over ``max_queued_chars``: not queued, not marked
    done (raise the limit and run again)."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Messages that cannot be made, by reason (``invalid ids``: an id that is not valid
    Unicode; ``invalid time``: an event time that names no instant): left out, the rest
    of their sessions queued."""


@dataclass(frozen=True)
class Source:
    """Sessions to import, their count (for the progress bar), and a stable name."""

    name: str
    total: int
    sessions: Callable[[Report], AsyncIterator[Session]]


def jsonl_source(path: Path) -> Source:
    path = path.resolve()
    if not path.exists():
        raise BackfillError(f"no such file: {path}")
    if not path.is_file():
        raise BackfillError(f"not a regular file: {path}")
    with path.open("rb") as lines:
        total = sum(1 for line in lines if line.strip())

    async def sessions(report: Report) -> AsyncIterator[Session]:
        with path.open(encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    yield _session(line)
                except ValidationError:
                    # The line number only: the line itself is somebody's conversation.
                    report.malformed.append(number)
                    log.warning("backfill skipped line=%d reason=not an ADK session", number)

    return Source(name=f"jsonl:{path}", total=total, sessions=sessions)


def _session(line: str) -> Session:
    """A session of a JSONL line. Pydantic's JSON parser refuses a whole line for one
    lone surrogate escape (``"\\ud800"``: valid JSON, invalid Unicode, e.g. a client's
    invocation id); Python's keeps it, so the event that holds it is refused alone."""
    try:
        return Session.model_validate_json(line)
    except ValidationError as exc:
        if not any(e["type"] == "json_invalid" for e in exc.errors()):
            raise
        try:
            parsed = json.loads(line)
        except ValueError:
            raise exc from None
        return Session.model_validate(parsed)


async def database_source(url: str, *, app: str, user_id: str | None = None) -> Source:
    """Sessions of ``app`` (one user's, with ``user_id``) in an ADK session database."""
    try:
        from google.adk.sessions import DatabaseSessionService
    except ImportError as exc:
        raise BackfillError(
            "reading an ADK session database needs SQLAlchemy: pip install 'afterthought-adk[db]'"
        ) from exc
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    try:
        where = make_url(url)
    except (SQLAlchemyError, ValueError):
        raise BackfillError("--db-url is not a database URL") from None
    # SQLite would create a file that is not there (a typo) and find no session in it.
    file = where.database if where.get_backend_name() == "sqlite" else None
    if file not in (None, "", ":memory:") and not Path(str(file)).is_file():
        raise BackfillError(f"no such database file: {file}")
    try:
        service = DatabaseSessionService(db_url=url)
        listed = (await service.list_sessions(app_name=app, user_id=user_id)).sessions
    except SQLAlchemyError as exc:  # its text may quote the URL, with its password
        raise BackfillError(f"cannot read the session database ({type(exc).__name__})") from None

    async def sessions(report: Report) -> AsyncIterator[Session]:
        for stub in listed:
            full = await service.get_session(
                app_name=stub.app_name, user_id=stub.user_id, session_id=stub.id
            )
            if full is not None:  # deleted since it was listed
                yield full

    # The name leaves out the URL's credentials: it ends up in a Redis key's digest only,
    # but a password must not decide whether a run resumes.
    host = url.split("@")[-1]
    return Source(name=f"db:{host}:{app}:{user_id or ''}", total=len(listed), sessions=sessions)


class Backfill:
    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        source: Source,
        *,
        resolver: IdentityResolver | None = None,
    ) -> None:
        """``resolver``: the application's identity resolver (``resolve_identity`` of its
        ``TurnMemory``), asked for each invocation as its turns asked it, so the import is
        reconciled against the threads the turns went to (as the memory service's replay
        is); without it the session's state pins, as the turns had them without one."""
        self._resolver = resolver
        # A larger deadline than the turn path's: a backfill waits for Redis, not a user.
        self._settings = settings.model_copy(
            update={"enqueue_timeout": max(settings.enqueue_timeout, 5.0)}
        )
        self._redis = redis
        self._source = source
        self._progress = Keys.of(settings).backfill(digest(source.name))
        self._enqueuer = Enqueuer(self._settings, redis=redis)

    async def run(self, *, advance: Callable[[], None] = lambda: None) -> Report:
        """Queue every session not queued before; ``advance`` is called once a session."""
        report = Report()
        # User messages the validation refuses: queued all the same (history keeps what
        # was said), never a source of facts for our synthesis, which validates each
        # source; in ``zep`` memory mode Zep's own extractor reads them, so the operator
        # is told how many (in the log: the report's shape is a stable interface).
        flagged = 0
        async for session in self._source.sessions(report):
            field_name = digest(session.app_name, session.user_id, session.id)
            done = await self._redis.hget(self._progress, field_name)
            if done is not None and float(done) >= session.last_update_time:
                report.skipped += 1
            elif (queued := await self._queue(session, report)) is None:
                report.refused.append(session.id)
            else:
                report.messages += len(queued)
                flagged += sum(m.role == "user" and detect(m.content) is not None for m in queued)
                # Not a transaction (a cluster client refuses one): a stop between the two
                # leaves the progress without its expiry until the run, resumed, sets it.
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.hset(self._progress, field_name, repr(session.last_update_time))
                    pipe.expire(self._progress, PROGRESS_TTL_SECONDS)
                    await pipe.execute()
                report.sessions += 1
            advance()
        log.info(
            "backfill done sessions=%d skipped=%d messages=%d flagged=%d malformed=%d refused=%d"
            " dropped=%d",
            report.sessions,
            report.skipped,
            report.messages,
            flagged,
            len(report.malformed),
            len(report.refused),
            sum(report.dropped.values()),
        )
        return report

    async def _queue(self, session: Session, report: Report) -> list[QueuedMessage] | None:
        # Pinned as its turns were, by the resolver and the session's state (checked by the
        # worker as theirs were), so the replay is reconciled against the thread they went to.
        refused: Counter[str] = Counter()
        messages = messages_from_events(
            session.events,
            app=session.app_name,
            user_id=session.user_id,
            session_id=session.id,
            assistant_name=self._settings.assistant_name,
            identity=await replay_pins(
                session,
                explicit=ZepIdentity(),
                resolver=self._resolver,
                trust_state=self._settings.trust_state_identity,
            ),
            refused=refused,
        )
        if any(len(m.content) > self._settings.max_queued_chars for m in messages):
            log.warning("backfill refused session=%s reason=message too long", session.id)
            return None
        for reason, count in refused.items():
            # Ids and counts only: what was said stays out of the log.
            log.warning(
                "backfill left out messages=%d session=%s reason=%s", count, session.id, reason
            )
            report.dropped[reason] = report.dropped.get(reason, 0) + count
        for start in range(0, len(messages), CHUNK):
            await self._send(messages[start : start + CHUNK])
        return messages

    async def _send(self, chunk: list[QueuedMessage]) -> None:
        unreachable = 0
        while (why := await self._enqueuer.send(chunk)) is not None:
            if why in (UNREACHABLE, NOT_SENT):
                unreachable += 1
                if unreachable >= UNREACHABLE_TRIES:
                    raise ConnectionError("Redis is unreachable; run backfill again to resume")
            await asyncio.sleep(FULL_WAIT_SECONDS)  # backpressure: workers make room
