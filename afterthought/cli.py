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
