"""A throwaway PostgreSQL server of the caller's own, for benches that must stop or restart
the database (never a shared one): ``initdb`` into a temporary directory, served on a free
port of 127.0.0.1 and a unix socket in that directory, trust authentication, removed
afterwards. Found under ``/usr/lib/postgresql/<version>/bin`` or PATH; the server refuses
to run as root, so as root it runs as the ``postgres`` user."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from afterthought.testing.redis_server import free_port


def _binaries() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl) installed")
    return Path(initdb).parent


class PostgresServer:
    def __init__(self, *, fsync: bool = True) -> None:
        """``fsync``: off only where a crash of the machine may lose the database (a
        bench of the write path's logic, not of its durability)."""
        self._bin = _binaries()
        self.port = free_port()
        self._fsync = fsync
        self._dir = Path(tempfile.mkdtemp(prefix="afterthought-pg-"))
        self._data = self._dir / "data"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self._dir, "postgres")
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self._as, str(self._bin / "pg_ctl"), "-D", str(self._data), *args],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def start(self) -> PostgresServer:
        if not self._data.exists():
            initdb = [str(self._bin / "initdb"), "-D", str(self._data), "-A", "trust"]
            subprocess.run(
                [*self._as, *initdb, "-U", "postgres"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self._dir}"
        options += "" if self._fsync else " -c fsync=off"
        self._ctl("-l", str(self._dir / "log"), "-w", "-o", options, "start")
        return self

    def restart(self) -> None:
        """Stopped as a crash stops it (``immediate``: no checkpoint, every connection and
        open transaction cut), then started again: it recovers from its WAL."""
        self._ctl("-m", "immediate", "-w", "stop")
        self.start()
        self.restarts += 1

    def stop(self) -> None:
        if (self._data / "postmaster.pid").exists():
            self._ctl("-m", "fast", "-w", "stop")
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
