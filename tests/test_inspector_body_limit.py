"""The inspector's login takes posts from anyone, another site's page too (a cross-site
form or a no-cors fetch to 127.0.0.1): it must refuse a body past its form limit without
reading, let alone holding, the rest of it."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import pytest

pytest.importorskip("starlette")

from afterthought.inspector.app import MAX_FORM_BYTES, create_app
from afterthought.settings import Settings

CHUNK = b"a" * 65_536
CHUNKS = 1_000  # 64 MiB, were it all read


async def _post_login(headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """POSTs an endless-looking form to /login: the status, and the chunks the app read."""
    app, _ = create_app(Settings(key_prefix="body-limit"), token="t" * 32)
    read = 0
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return {"type": "http.request", "body": CHUNK, "more_body": read < CHUNKS}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/login",
        "raw_path": b"/login",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8765"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8765),
    }
    await app(scope, receive, send)
    return status, read


async def test_a_chunked_body_past_the_limit_is_not_read_on() -> None:
    status, read = await _post_login([(b"content-type", b"application/x-www-form-urlencoded")])
    assert status == 401
    assert read * len(CHUNK) <= MAX_FORM_BYTES + len(CHUNK)


async def test_a_declared_length_past_the_limit_is_refused_unread() -> None:
    length = str(CHUNKS * len(CHUNK)).encode()
    status, read = await _post_login([(b"content-length", length)])
    assert status == 401
    assert read == 0
