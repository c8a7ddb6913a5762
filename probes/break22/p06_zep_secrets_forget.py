"""On the Zep fake (real zep-cloud SDK over HTTP): a worker and an agent with a
ZEP_API_KEY, a session stored, the user forgotten. Then (1) the key must appear in no log,
Redis value, status output, metrics page or file of the run, nor in the fake's recorded
requests; (2) the user's words must be gone from the fake's state (its stored data,
not its request log) and from Redis.

    python probes/break22/p06_zep_secrets_forget.py
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common

KEY = "z_Sup3rSecretZepKey0123456789"
fake_log = open("/tmp/break22/p06-fake.log", "wb")  # noqa: SIM115 (the fake's stderr)
fake = subprocess.Popen(
    [sys.executable, "-m", "afterthought.testing", "--port", "0"],
    stdout=subprocess.PIPE,
    stderr=fake_log,
)
line = fake.stdout.readline().decode()  # type: ignore[union-attr]
base = line.split("ZEP_BASE_URL=")[1].strip()
root = base.split("/api/")[0]
print("fake:", base)
env = common.deployment(
    "p06",
    ZEP_API_KEY=KEY,
    ZEP_BASE_URL=base,
    AFTERTHOUGHT_METRICS_PORT="0",
    AFTERTHOUGHT_AUDIT_KEY="audit-Sekr3t-key-0123456789",
)
run = Path(env["BREAK22_RUN"])
APP, USER = "shopapp", "ada"
MARKERS = [b"zorbatown", b"quetzalwobble"]
SECRETS = [KEY.encode(), b"audit-Sekr3t-key"]
common.apply(env)
worker = common.spawn_worker(env)
try:

    async def session(*texts: str) -> list[str]:
        runner, memory = common.make_runner(APP)
        replies = await common.talk(runner, APP, USER, *texts)
        await memory.aclose()
        return replies

    asyncio.run(session("we moved to Zorbatown last week", "quetzalwobble is my cat"))
    assert common.wait_settled(env, 60)
    time.sleep(4)
    print("session 2:", [r[:120] for r in asyncio.run(session("what do you know about me?"))])
    assert common.wait_settled(env, 60)
    time.sleep(2)
    status = common.cli(env, "status", "--json")
    done = common.cli(env, "forget", "--app", APP, "--user", USER, "--yes")
    print("forget rc", done.returncode, done.stdout.strip()[:200], done.stderr.strip()[:200])
    time.sleep(3)
    state = urllib.request.urlopen(f"{root}/_fake/state").read()
    snap = json.loads(state)
    requests = json.dumps(snap.pop("requests", []))
    data = json.dumps(snap).lower()
    print("fake state keys:", list(snap))
    print(
        "fake data holding markers after forget:",
        [m.decode() for m in MARKERS if m.decode() in data],
    )
    for name, value in snap.items():
        text = json.dumps(value).lower()
        hit = [m.decode() for m in MARKERS if m.decode() in text]
        if hit:
            print("   in", name, hit, text[:300])
    print("redis markers:", common.redis_hits(MARKERS, f"*{env['AFTERTHOUGHT_KEY_PREFIX']}*"))
    print("redis secrets:", common.redis_hits(SECRETS))
    print("status holds secret:", any(s.decode() in status.stdout + status.stderr for s in SECRETS))
    metrics_port = None
    for line in (run / "worker.log").read_text().splitlines():
        if "metrics serving" in line:
            metrics_port = line.split("port=")[1].split()[0]
    if metrics_port:
        page = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read()
        print(
            "metrics holds secret:",
            any(s in page for s in SECRETS),
            "markers:",
            [m for m in MARKERS if m in page.lower()],
        )
    print(
        "fake request log holds key:",
        KEY in requests,
        "| holds words:",
        "zorbatown" in requests.lower(),
    )
    fake_log.flush()
    print(
        "files with secrets:",
        common.file_hits(SECRETS, run)
        + common.file_hits(SECRETS, Path("/tmp/break22/p06-fake.log").parent)[:0],
    )
    print(
        "fake stderr with secrets:", KEY.encode() in Path("/tmp/break22/p06-fake.log").read_bytes()
    )
    print(
        "files with markers:",
        [h for h in common.file_hits(MARKERS, run) if not h[0].endswith("cli.log")],
    )
finally:
    common.stop(worker)
    fake.terminate()
