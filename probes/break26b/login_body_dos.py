"""An unauthenticated POST /login of N MiB (Content-Length, then chunked): the inspector's
peak RSS (VmHWM) before and after, and the answer. Args: PID [MIB]."""

import socket
import sys
import time
from pathlib import Path

pid, mib = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300


def hwm() -> str:
    return (
        next(
            x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM")
        )
        .split(":")[1]
        .strip()
    )


print("peak RSS before:", hwm())
for chunked in (False, True):
    s = socket.create_connection(("127.0.0.1", 8766))
    head = b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += b"Content-Type: application/x-www-form-urlencoded\r\n"
    head += (
        b"Transfer-Encoding: chunked\r\n\r\n"
        if chunked
        else b"Content-Length: %d\r\n\r\n" % (mib << 20)
    )
    s.sendall(head)
    chunk = b"a" * (1 << 20)
    t = time.time()
    try:
        for _ in range(mib):
            s.sendall((b"100000\r\n" + chunk + b"\r\n") if chunked else chunk)
        if chunked:
            s.sendall(b"0\r\n\r\n")
    except OSError as exc:
        print("server stopped reading:", type(exc).__name__)
    s.settimeout(10)
    try:
        print(
            "chunked" if chunked else "length ",
            "answer:",
            s.recv(100).split(b"\r\n")[0],
            f"{time.time() - t:.1f} s",
        )
    except OSError as exc:
        print("no answer:", type(exc).__name__)
    s.close()
print("peak RSS after:", hwm())
