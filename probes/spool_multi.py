# ruff: noqa
"""Two appender processes and replayer processes SIGKILLed at random, outcomes random
(QUEUED / HELD / FAILED): per thread, the first-queued order must be the said order, none
lost. Prints figures."""

import asyncio, os, random, signal, subprocess, sys, tempfile, time
from pathlib import Path
from afterthought.contract import QueuedMessage
from afterthought.spool import Sent, Spool

D = Path(sys.argv[2]) if len(sys.argv) > 2 else None


def msg(t, n):
    return QueuedMessage.build(
        app="a",
        user_id=f"u{t}",
        session_id="s",
        invocation_id=f"i{n:05d}",
        role="user",
        ordinal=0,
        content=f"{t}:{n}",
    )


def appender(t0, count):
    # Resumes after the last append it knows it made (a kill may leave one more spooled,
    # or torn): appended again, a copy the queue's keys skip.
    sp = Spool(D, max_bytes=1 << 30)
    progress = D.parent / f"progress-{t0}"
    start = int(progress.read_text() or 0) if progress.exists() else 0
    for n in range(start, count):
        r = sp.append([msg(t0, n), msg(t0 + 1, n)])
        assert r.spooled == 2, r
        progress.write_text(str(n + 1))


async def replayer(seed, final):
    rnd = random.Random(seed)
    sp = Spool(D, max_bytes=1 << 30, chunk=7)
    out = os.open(D.parent / "queued.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    async def send(batch):
        x = rnd.random()
        if not final and x < 0.2:
            return Sent.HELD
        if not final and x < 0.3:
            return Sent.FAILED
        os.write(out, "".join(m.content + "\n" for m in batch).encode())
        return Sent.QUEUED

    while True:
        r = await sp.replay(send)
        if final and r.finished and sp.empty():
            return
        await asyncio.sleep(0.001)


if sys.argv[1] == "append":
    appender(int(sys.argv[3]), int(sys.argv[4]))
elif sys.argv[1] == "replay":
    asyncio.run(replayer(int(sys.argv[3]), sys.argv[4] == "1"))
else:
    root = Path(tempfile.mkdtemp())
    d = root / "spool"
    N = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    env = dict(os.environ)
    py = sys.executable

    def start(t0):
        return subprocess.Popen([py, __file__, "append", str(d), str(t0), str(N)], env=env)

    apps = {t0: start(t0) for t0 in (0, 2)}
    rnd = random.Random(1)
    kills = akills = 0
    seed = 0
    while any(a.poll() is None for a in apps.values()):
        seed += 1
        for t0, a in apps.items():
            if a.poll() is None and rnd.random() < 0.3:
                time.sleep(rnd.uniform(0.0, 0.3))
                a.send_signal(signal.SIGKILL)
                a.wait()
                akills += 1
                apps[t0] = start(t0)
        rs = [
            subprocess.Popen([py, __file__, "replay", str(d), str(seed * 10 + i), "0"], env=env)
            for i in range(2)
        ]
        time.sleep(rnd.uniform(0.05, 0.6))
        for p in rs:
            p.send_signal(signal.SIGKILL)
            p.wait()
            kills += 1
    for a in apps.values():
        assert a.wait() == 0
    subprocess.run([py, __file__, "replay", str(d), "999", "1"], env=env, check=True)
    lines = (root / "queued.log").read_text().split()
    first = {}
    order = {}
    for l in lines:
        t, n = l.split(":")
        if l not in first:
            first[l] = 1
            order.setdefault(t, []).append(int(n))
    lost = sum(N - len(v) for v in order.values()) + (4 - len(order)) * N
    reord = sum(sum(1 for a, b in zip(v, v[1:]) if b < a) for v in order.values())
    print(
        f"records={4 * N} queued_lines={len(lines)} distinct={len(first)} lost={lost} reordered={reord} kills={kills} appender_kills={akills} leftover={sorted(p.name for p in d.iterdir())}"
    )
