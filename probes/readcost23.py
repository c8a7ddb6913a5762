"""Throwaway: CPU time of the local block build (``LocalBackend._context``) for every
tune question on the stored split (probes/diag23.py store tune), with whichever
afterthought PYTHONPATH names: p50 / p90 / p99 ms, all questions and those asking about
before a change.

    PYTHONPATH=<tree> python probes/readcost23.py
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from afterthought.backends.base import UserRef  # noqa: E402
from afterthought.backends.local import LocalBackend  # noqa: E402
from afterthought.backends.retrieval import asks_before  # noqa: E402
from bench import memory_quality as mq  # noqa: E402

WORK = Path("/tmp/hop23d")


def main() -> None:
    users = mq.load("tune", "memory3", WORK / "fixture")
    path = WORK / "tune.sqlite3"
    raw = sqlite3.connect(path)
    refs = {
        uid: UserRef(u, g)
        for u, uid, g in raw.execute("SELECT uuid, user_id, graph_uuid FROM users")
    }
    backend = LocalBackend(path, max_chars=4000)
    db = backend._connect()
    times: list[float] = []
    before: list[float] = []
    for rep in range(2):
        for user in users:
            ref = next(r for k, r in refs.items() if k.endswith(user["user"]))
            for q in user["questions"]:
                start = time.process_time()
                backend._context(db, ref, q["text"], 4000)
                spent = (time.process_time() - start) * 1000
                if rep:  # the first pass warms SQLite's cache and the stem caches
                    times.append(spent)
                    if asks_before(q["text"]):
                        before.append(spent)
    for name, xs in (("all", times), ("asks_before", before)):
        q = statistics.quantiles(xs, n=100)
        print(f"{name}: n={len(xs)} p50={q[49]:.2f} p90={q[89]:.2f} p99={q[98]:.2f} ms")


if __name__ == "__main__":
    main()
