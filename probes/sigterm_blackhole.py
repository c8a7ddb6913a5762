"""Probe: SIGTERM to a one-turn agent while its user's enqueue is in flight against a Redis
that accepts TCP and never answers. enqueue_timeout 5 s, exit_flush_seconds 0.3 s.
Measures: seconds from SIGTERM to exit, exit status, and what the spool holds.
Usage: .venv/bin/python probes/sigterm_blackhole.py [runs] [delay_after_sending]"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def blackhole() -> tuple[int, list[socket.socket]]:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []

    def read(c: socket.socket) -> None:
        while True:  # read, never answer
            data = c.recv(65536)
            if not data:
                return
            GOT.append((time.monotonic(), data[:40]))

    def accept() -> None:
        while True:
            c, _ = srv.accept()
            held.append(c)
            threading.Thread(target=read, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv.getsockname()[1], held


GOT: list[tuple[float, bytes]] = []


def run(port: int, delay: float, text: str) -> tuple[float, int, str, list[str]]:
    spool = tempfile.mkdtemp(prefix="spool21c-")
    os.chmod(spool, 0o700)
    env = {
        **os.environ,
        "REDIS_URL": f"redis://127.0.0.1:{port}/0",
        "AFTERTHOUGHT_KEY_PREFIX": "b21c",
        "AFTERTHOUGHT_ENQUEUE_TIMEOUT": "5",
        "AFTERTHOUGHT_EXIT_FLUSH_SECONDS": "0.3",
        "AFTERTHOUGHT_SPOOL_PATH": spool,
        "AFTERTHOUGHT_BACKEND": os.environ.get("AFTERTHOUGHT_BACKEND", "local"),
    }
    p = subprocess.Popen(
        [sys.executable, os.environ.get("AGENT", "-m"), *([] if os.environ.get("AGENT") else ["tests.one_shot_agent"]), "u1", text],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    GOT.clear()
    while not GOT:  # the agent's first command reached the blackhole
        time.sleep(0.005)
        assert p.poll() is None
    time.sleep(delay)
    first = GOT[0][1]
    t0 = time.monotonic()
    p.send_signal(15)
    out, err = p.communicate(timeout=60)
    took = time.monotonic() - t0
    found = []
    for f in Path(spool).rglob("*"):
        if f.is_file():
            found += [ln for ln in f.read_text(errors="replace").splitlines() if text in ln]
    return took, p.returncode, f"first={first!r} " + err[-600:], found


if __name__ == "__main__":
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
    port, _ = blackhole()
    lost = 0
    for i in range(runs):
        took, rc, err, found = run(port, delay, f"hello blackhole {i}")
        print(f"run {i}: exit {rc} after {took:.2f}s spooled={len(found)} {err[:80]!r}")
        if not found:
            lost += 1
            print("  stderr tail:", err.replace("\n", " | ")[-400:])
    print(f"lost {lost} of {runs}")
