"""``afterthought``: the command line. The only core module that may import both sides;
it does so lazily, per subcommand."""

from __future__ import annotations

import argparse
import logging
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def _worker(args: argparse.Namespace) -> int:
    from afterthought.settings import Settings
    from worker.settings import create_worker

    overrides = {"worker_concurrency": args.concurrency} if args.concurrency else {}
    worker = create_worker(Settings(**overrides), burst=args.burst)
    worker.run()
    return 0


def _dlq(args: argparse.Namespace) -> int:
    import asyncio
    import json
    from datetime import UTC, datetime

    import redis.asyncio as aioredis

    from afterthought.dead_letters import DeadLetters
    from afterthought.settings import Settings

    settings = Settings()

    async def run() -> int:
        client = aioredis.Redis.from_url(settings.redis_url)
        letters = DeadLetters(client, settings)
        try:
            if args.action == "list":
                rows = [
                    {
                        "index": i,
                        "at": datetime.fromtimestamp(d.at / 1000, UTC).isoformat(),
                        "thread": d.thread,
                        "reason": d.reason,
                        "attempts": d.attempts,
                        "bytes": len(d.item),
                    }
                    for i, d in await letters.listing(count=args.limit)
                ]
                if args.json:
                    print(json.dumps(rows))
                for row in [] if args.json else rows:
                    print(
                        "{index:>5}  {at}  thread={thread}  attempts={attempts}  "
                        "bytes={bytes}  {reason}".format(**row)
                    )
                return 0
            indexes = None if args.all else args.index
            if not args.all and not args.index:
                print("afterthought: name letters by index, or pass --all", file=sys.stderr)
                return 2
            if args.action == "replay":
                done = await letters.replay(indexes)
                print(f"replayed={done.replayed} malformed={done.malformed} refused={done.refused}")
                return 0 if not done.refused else 1
            if not args.yes:
                print("afterthought: purging deletes messages for good; add --yes", file=sys.stderr)
                return 2
            print(f"purged={await letters.purge(indexes)}")
            return 0
        finally:
            await client.aclose()

    return asyncio.run(run())


def _operate(args: argparse.Namespace) -> int:
    """prune and forget: both dry runs unless ``--yes``."""
    import asyncio
    import json
    from dataclasses import asdict

    import redis.asyncio as aioredis

    from afterthought.backend import open_backend
    from afterthought.identity import IdentityRegistry
    from afterthought.settings import Settings
    from worker.forget import Forgetter
    from worker.prune import Pruner

    settings = Settings()

    async def run() -> int:
        client = aioredis.Redis.from_url(settings.redis_url)
        backend = open_backend(settings)
        apply = bool(args.yes)
        try:
            if args.command == "prune":
                pruner = Pruner(settings, client, backend)
                if args.user:
                    user = await IdentityRegistry(client, settings).lookup_user(
                        app=args.app, user_id=args.user
                    )
                    if user is None:
                        print(f"afterthought: no such user in app {args.app!r}", file=sys.stderr)
                        return 1
                    report = await pruner.prune_user(
                        app=args.app, user_id=args.user, user=user, dry_run=not apply
                    )
                else:
                    report = await pruner.prune_all(dry_run=not apply)
                print(json.dumps(asdict(report)))
                return 0
            forgetter = Forgetter(settings, client, backend)
            if args.query:
                done = await forgetter.forget_matching(
                    app=args.app, user_id=args.user, query=args.query, confirm=apply
                )
            elif not apply:
                what = f"fact {args.fact}" if args.fact else "everything of this user"
                print(f"would forget {what}; add --yes to do it", file=sys.stderr)
                return 2
            elif args.fact:
                done = await forgetter.forget_fact(
                    app=args.app, user_id=args.user, fact_uuid=args.fact
                )
            else:
                done = await forgetter.forget_user(app=args.app, user_id=args.user)
            print(json.dumps(asdict(done)))
            return 0
        finally:
            await backend.aclose()
            await client.aclose()

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="afterthought",
        description="Long-term memory for ADK agents: run the worker that persists it.",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser(
        "worker", help="persist queued turns (settings from REDIS_URL, ZEP_API_KEY, ...)"
    )
    worker.add_argument("--burst", action="store_true", help="exit once the queue is empty")
    worker.add_argument("--concurrency", type=int, help="threads flushed at once per job")
    worker.set_defaults(run=_worker)

    dlq = commands.add_parser("dlq", help="list, replay or purge dead letters")
    dlq.add_argument("action", choices=["list", "replay", "purge"])
    dlq.add_argument("index", nargs="*", type=int, help="letters to replay or purge")
    dlq.add_argument("--all", action="store_true", help="every letter")
    dlq.add_argument("--limit", type=int, default=100, help="letters to list")
    dlq.add_argument("--json", action="store_true", help="list as JSON")
    dlq.add_argument("--yes", action="store_true", help="confirm a purge")
    dlq.set_defaults(run=_dlq)

    prune = commands.add_parser("prune", help="prune facts (a dry run unless --yes)")
    prune.add_argument("--app", default="", help="with --user: the ADK app name")
    prune.add_argument("--user", help="only this ADK user id (with --app)")
    prune.add_argument("--dry-run", action="store_true", help="report only (the default)")
    prune.add_argument("--yes", action="store_true", help="delete what the report lists")
    prune.set_defaults(run=_operate)

    forget = commands.add_parser(
        "forget", help="forget a user, one fact, or facts matching a query"
    )
    forget.add_argument("--app", required=True, help="the ADK app name")
    forget.add_argument("--user", required=True, help="the ADK user id")
    which = forget.add_mutually_exclusive_group()
    which.add_argument("--fact", help="one fact id (from search results)")
    which.add_argument("--query", help="facts holding every word (listed unless --yes)")
    forget.add_argument("--yes", action="store_true", help="really forget")
    forget.set_defaults(run=_operate)

    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT)
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    except (ValueError, RuntimeError) as exc:  # configuration problems, said plainly
        print(f"afterthought: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
