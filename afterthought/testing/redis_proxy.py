"""A TCP proxy in front of Redis that misbehaves on demand, for tests of unknown outcomes:
replies that come late or are held until the test lets them go (the command ran, the
client gave up), connections refused (the command never ran), connections cut. It runs
on a thread of its own, so a test that blocks its event loop does not block the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlparse


class RedisProxy:
    """``url`` points at the proxy; the settings below take effect at once."""

    def __init__(self, upstream_url: str) -> None:
        parsed = urlparse(upstream_url)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 6379)
        self._db = parsed.path or "/0"
        self.reply_delay = 0.0
        """Seconds each reply is held back (the command has run at Redis meanwhile)."""
        self.held_replies = 0
        """Replies held back now by :meth:`hold_replies`: each one's command ran at Redis."""
        self._replies_open: asyncio.Event | None = None
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self._port}{self._db}"

    def start(self) -> RedisProxy:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self._port = started.result(timeout=10)
        return self

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self._port)
        return int(self._server.sockets[0].getsockname()[1])

    def hold_replies(self) -> None:
        """Hold every reply back until :meth:`release_replies` (the commands still reach
        Redis and run): a client's deadline passes whatever the machine's speed."""

        async def close() -> None:
            self._open_replies().clear()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)

    def release_replies(self) -> None:
        """Let the held replies, and the next ones, through."""

        async def open_() -> None:
            self._open_replies().set()

        asyncio.run_coroutine_threadsafe(open_(), self._loop).result(timeout=10)

    def _open_replies(self) -> asyncio.Event:
        """Set while replies pass (made on the proxy's loop, at first use)."""
        if self._replies_open is None:
            self._replies_open = asyncio.Event()
            self._replies_open.set()
        return self._replies_open

    def refuse(self) -> None:
        """Stop listening and cut every connection: clients are refused (nothing reaches
        Redis) until :meth:`resume`."""

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                self._server = None
            await self._cut()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)

    def resume(self) -> None:
        """Listen again, on the same port."""
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    def cut(self) -> None:
        """Close every open connection now."""
        asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(timeout=10)

    async def _cut(self) -> None:
        for writer in list(self._writers):
            writer.close()

    def close(self) -> None:
        self.refuse()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> RedisProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, delay=False),
                self._pump(up_reader, writer, delay=True),
            )
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, delay: bool
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                if delay and self.reply_delay:
                    await asyncio.sleep(self.reply_delay)
                if delay and not self._open_replies().is_set():
                    self.held_replies += 1
                    try:
                        await self._open_replies().wait()
                    finally:
                        self.held_replies -= 1
                sink.write(data)
                await sink.drain()
        sink.close()
