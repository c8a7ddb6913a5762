"""Memory backends: the port (``base``) and its adapters, Zep v4 (``zep``), the embedded
SQLite store (``local``) and PostgreSQL (``postgres``). Each adapter is imported only when
selected."""

from __future__ import annotations

from typing import TYPE_CHECKING

from afterthought.backends.base import MemoryBackend

if TYPE_CHECKING:
    from afterthought.settings import Settings


def open_backend(settings: Settings, *, upgrade: bool = False) -> MemoryBackend:
    """The backend the settings select (``Settings.resolved_backend``).
    ``upgrade``: bring an older local store to the current schema (workers and the CLI
    do; an agent's turn must not wait minutes for it, and reads nothing until it is done)."""
    if settings.resolved_backend == "zep":
        from afterthought.backends.zep import ZepBackend

        return ZepBackend(settings)
    if settings.resolved_backend == "postgres":
        from afterthought.backends.postgres import PostgresBackend

        assert settings.database_url is not None  # the settings refuse postgres without it
        return PostgresBackend(
            settings.database_url.get_secret_value(),
            schema=settings.database_schema,
            max_chars=settings.context_max_chars,
            upgrade=upgrade,
            embedding_model=settings.embedding_model,
        )
    from afterthought.backends.local import LocalBackend

    if settings.embedding_model is None:  # numpy and model2vec are imported only if used
        return LocalBackend(
            settings.local_db_path, max_chars=settings.context_max_chars, upgrade=upgrade
        )
    from afterthought.backends.embeddings import Model2VecEmbedder

    return LocalBackend(
        settings.local_db_path,
        Model2VecEmbedder(settings.embedding_model),
        max_chars=settings.context_max_chars,
        upgrade=upgrade,
    )
