"""Against real Zep Cloud: runs only with a real ZEP_API_KEY (and skips cleanly without)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable

import pytest
from zep_cloud.core.api_error import ApiError

from afterthought.backends.zep import ZepBackend
from afterthought.settings import Settings

LIVE_KEY = os.environ.get("ZEP_API_KEY")  # read at import: fixtures clear the environment

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not LIVE_KEY, reason="needs a real ZEP_API_KEY"),
]


async def test_provision_write_and_read_on_zep_cloud(
    make_settings: Callable[..., Settings],
) -> None:
    backend = ZepBackend(make_settings(backend="zep", zep_api_key=LIVE_KEY))
    user, _ = await backend.ensure_user(zep_user_id=f"afterthought-live-{uuid.uuid4().hex[:8]}")
    try:
        thread = await backend.create_thread(user=user, idempotency_key=uuid.uuid4().hex)
        context = await backend.get_context(user=user, query="hello", max_chars=500, timeout=10)
        assert isinstance(context, str)
        assert await backend.recent_messages(thread_uuid=thread, limit=5) == []
    finally:
        with contextlib.suppress(ApiError):  # cleanup; the assertions above decide
            await backend.zep.user.delete(user.user_uuid)
        await backend.aclose()
