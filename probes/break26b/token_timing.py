"""Median response time of a bearer token wrong in its first character vs its last (same
length), interleaved, N each: a leak would make the late-wrong one slower."""

import os
import re
import statistics
import time
from pathlib import Path

import httpx

RO = os.environ.get("RO", "http://127.0.0.1:8766")
token = re.search(r"token: (\S+)", Path("/tmp/b26b/inspect_ro.out").read_text())[1]
N = int(os.environ.get("N", "1500"))
first = ("A" if token[0] != "A" else "B") + token[1:]
last = token[:-1] + ("A" if token[-1] != "A" else "B")
times: dict[str, list[float]] = {"first": [], "last": []}
with httpx.Client() as c:
    for _ in range(N):
        for name, t in (("first", first), ("last", last)):
            start = time.perf_counter_ns()
            r = c.get(RO + "/dead-letters", headers={"Authorization": f"Bearer {t}"})
            times[name].append((time.perf_counter_ns() - start) / 1000)
for name, v in times.items():
    print(f"{name}: median {statistics.median(v):.1f} us  p10 {sorted(v)[len(v) // 10]:.1f}")
