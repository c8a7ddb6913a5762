"""How long a one-shot agent (one turn of a real ADK Runner, then exit) takes to exit with
Redis down, and whether its turn waits in the spool: the facts behind ``exit_flush_seconds``.

    python bench/exit_spool.py [--runs 5 --exit-flush 1.0]

Per outage, a private Redis stopped (connections refused) or SIGSTOPped (taken, never
answered): each run's seconds from the end of the turn to the process's exit, and the
messages it left in its spool. Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import uuid
from pathlib import Path

from afterthought.settings import Settings
from afterthought.spool import Spool
from afterthought.testing import RedisServer
from tests.one_shot_agent import one_shot


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--exit-flush", type=float, default=1.0)
    args = parser.parse_args()
    report: dict[str, object] = {"exit_flush_seconds": args.exit_flush}
    for outage in ("stopped", "paused"):
        exits, spooled = [], []
        for _ in range(args.runs):
            server = RedisServer()
            settings = Settings(
                redis_url=server.start(),
                key_prefix=f"bench{uuid.uuid4().hex[:8]}",
                local_db_path=Path(tempfile.mkdtemp()) / "memory.sqlite3",
                spool_path=Path(tempfile.mkdtemp()) / "spool",
                exit_flush_seconds=args.exit_flush,
            )
            pid = server._proc.pid if server._proc else 0
            if outage == "stopped":
                server.stop()
            else:
                os.kill(pid, signal.SIGSTOP)
            try:
                took, _ = one_shot(settings, "ada", "hello")
            finally:
                if outage == "paused":
                    os.kill(pid, signal.SIGCONT)
                server.close()
            exits.append(round(took, 2))
            spooled.append(Spool.of(settings).waiting())
        report[outage] = {
            "exit_after_turn_seconds": exits,
            "p50": statistics.median(exits),
            "max": max(exits),
            "spooled": spooled,
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
