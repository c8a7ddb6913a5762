"""Memory backends: the port (``base``) and its adapters, Zep v4 (``zep``) and the embedded
SQLite store (``local``). Each adapter is imported only when selected."""

from __future__ import annotations

from typing import TYPE_CHECKING

from afterthought.backends.base import MemoryBackend

if TYPE_CHECKING:
    from afterthought.settings import Settings


def open_backend(settings: Settings) -> MemoryBackend:
    """The backend the settings select: Zep with a key, else the embedded local store."""
    if settings.resolved_backend == "zep":
        from afterthought.backends.zep import ZepBackend

        return ZepBackend(settings)
    from afterthought.backends.local import LocalBackend

    if settings.embedding_model is None:  # numpy and model2vec are imported only if used
        return LocalBackend(settings.local_db_path, max_chars=settings.context_max_chars)
    from afterthought.backends.embeddings import Model2VecEmbedder

    return LocalBackend(
        settings.local_db_path,
        Model2VecEmbedder(settings.embedding_model),
        max_chars=settings.context_max_chars,
    )
