"""Provisioning for applications that create Zep users and threads up front (onboarding),
rather than letting the worker do it on the first message. Idempotent across processes:
a Redis lock per user, 409 -> lookup, a stable idempotency key per thread, and the result
recorded in the registry the turn path reads. Failures raise (provisioning fails loudly)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from afterthought.backends import open_backend
from afterthought.backends.base import MemoryBackend, UserRef
from afterthought.connections import connect
from afterthought.identity import IdentityRegistry
from afterthought.settings import Settings

OnCreated = Callable[[UserRef], Awaitable[None]]


async def ensure_user(
    *,
    app: str,
    user_id: str,
    first_name: str | None = None,
    last_name: str | None = None,
    on_created: OnCreated | None = None,
    settings: Settings | None = None,
    backend: MemoryBackend | None = None,
    **overrides: Any,
) -> tuple[UserRef, bool]:
    """The backend user of an ADK ``(app, user_id)``; True if this call created it.
    ``on_created`` runs once, only for a new user (set its ontology, instructions...)."""
    settings = settings or Settings(**overrides)
    async with _registry(settings) as registry:
        owned = backend or open_backend(settings)
        try:
            user, created = await registry.ensure_user(
                owned, app=app, user_id=user_id, first_name=first_name, last_name=last_name
            )
            if created and on_created is not None:
                await on_created(user)
            return user, created
        finally:
            if backend is None:
                await owned.aclose()


async def ensure_thread(
    *,
    app: str,
    user_id: str,
    session_id: str,
    settings: Settings | None = None,
    backend: MemoryBackend | None = None,
    **overrides: Any,
) -> tuple[str, bool]:
    """The backend thread of an ADK session (its user too); True if this call created it."""
    settings = settings or Settings(**overrides)
    async with _registry(settings) as registry:
        owned = backend or open_backend(settings)
        try:
            _, thread_uuid, created = await registry.ensure_thread(
                owned, app=app, user_id=user_id, session_id=session_id
            )
            return thread_uuid, created
        finally:
            if backend is None:
                await owned.aclose()


class _registry:
    """An identity registry on its own connection, closed afterwards."""

    def __init__(self, settings: Settings) -> None:
        self._client = connect(settings.redis_url)
        self._settings = settings

    async def __aenter__(self) -> IdentityRegistry:
        return IdentityRegistry(self._client, self._settings)

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()
