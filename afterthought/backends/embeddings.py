"""Dense embeddings for the embedded store (the ``embeddings`` extra): the :class:`Embedder`
port, a model2vec implementation, and :class:`DenseIndex`, the per-user in-memory matrix the
local backend searches. Imported only when an embedder is configured, so the store works
without numpy."""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from model2vec import StaticModel


class Embedder(Protocol):
    """Turns texts into vectors. ``name`` identifies the vector space: vectors are stored
    with it, and only vectors of the configured space are searched."""

    @property
    def name(self) -> str: ...

    def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """One float32 row per text, in order."""
        ...


class Model2VecEmbedder:
    """A model2vec static model (token vectors averaged: numpy only, about a millisecond per
    batch), from a local directory or a model name on the Hugging Face hub. Loaded on first
    use, so opening a backend never pays for (or downloads) a model it does not use."""

    def __init__(self, source: str | Path, *, name: str | None = None) -> None:
        self._source = source
        self._name = name or str(source)
        self._model: StaticModel | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_model(cls, model: StaticModel, *, name: str) -> Model2VecEmbedder:
        """An already loaded model (tests build one in memory)."""
        embedder = cls(name, name=name)
        embedder._model = model
        return embedder

    @property
    def name(self) -> str:
        return self._name

    def _loaded(self) -> StaticModel:
        with self._lock:
            if self._model is None:
                from model2vec import StaticModel

                self._model = StaticModel.from_pretrained(self._source)
            return self._model

    def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        vectors = self._loaded().encode(list(texts), use_multiprocessing=False)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)


def unit_rows(vectors: NDArray[np.float32]) -> NDArray[np.float32]:
    """Rows scaled to length 1, so a dot product is the cosine; a zero row (a text with no
    known token) stays zero and so matches nothing."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms == 0, 1, norms)).astype(np.float32)


def to_blob(vector: NDArray[np.float32]) -> bytes:
    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


@dataclass
class _UserMatrix:
    ids: NDArray[np.int64]
    rows: NDArray[np.float32]
    count: int
    max_id: int

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.rows.nbytes)


class DenseIndex:
    """Per user, the statement vectors in memory, read from the file once and then
    incrementally (rows above the highest id seen), so a query is one matrix-vector product.
    Deletions anywhere (counted in ``retrieval_epoch`` by a trigger, also in other
    processes) drop every cached matrix: forgotten vectors never linger in memory. Least
    recently used users are evicted beyond ``max_bytes``. Not thread-safe: the backend calls
    it under its connection lock."""

    def __init__(self, model: str, *, max_bytes: int = 256 * 2**20) -> None:
        self._model = model
        self._max_bytes = max_bytes
        self._users: OrderedDict[str, _UserMatrix] = OrderedDict()
        self._epoch: int | None = None

    def clear(self) -> None:
        self._users.clear()

    def search(
        self, db: sqlite3.Connection, user_uuid: str, query: NDArray[np.float32], limit: int
    ) -> list[int]:
        """Message ids of the user's statements nearest the (unit) query vector, best
        first; only those with a positive cosine."""
        matrix = self._refreshed(db, user_uuid)
        if matrix is None or matrix.count == 0:
            return []
        scores = matrix.rows[: matrix.count] @ query
        take = min(limit, matrix.count)
        best = np.argpartition(-scores, take - 1)[:take]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [int(matrix.ids[i]) for i in best if scores[i] > 0]

    def _refreshed(self, db: sqlite3.Connection, user_uuid: str) -> _UserMatrix | None:
        (epoch,) = db.execute("SELECT deletions FROM retrieval_epoch").fetchone()
        if epoch != self._epoch:
            self._users.clear()
            self._epoch = epoch
        matrix = self._users.pop(user_uuid, None)
        found = db.execute(
            "SELECT message_id, vector FROM vectors WHERE user_uuid = ? AND model = ?"
            " AND message_id > ? ORDER BY message_id",
            (user_uuid, self._model, matrix.max_id if matrix else 0),
        ).fetchall()
        if found:
            ids = np.fromiter((r[0] for r in found), dtype=np.int64, count=len(found))
            rows = np.frombuffer(b"".join(r[1] for r in found), dtype=np.float32)
            rows = rows.reshape(len(found), -1)
            matrix = _append(matrix, ids, rows)
        if matrix is None:
            return None
        self._users[user_uuid] = matrix
        self._evict()
        return matrix

    def _evict(self) -> None:
        total = sum(m.nbytes for m in self._users.values())
        while total > self._max_bytes and len(self._users) > 1:
            _, dropped = self._users.popitem(last=False)
            total -= dropped.nbytes


def _append(
    matrix: _UserMatrix | None, ids: NDArray[np.int64], rows: NDArray[np.float32]
) -> _UserMatrix:
    """Rows appended into spare capacity (doubled when full), so a refresh copies only the
    new rows, not the whole matrix."""
    count = matrix.count if matrix else 0
    needed = count + len(ids)
    if matrix is None or needed > len(matrix.ids):
        capacity = max(needed, 2 * count, 64)
        grown = _UserMatrix(
            np.empty(capacity, dtype=np.int64),
            np.empty((capacity, rows.shape[1]), dtype=np.float32),
            count,
            matrix.max_id if matrix else 0,
        )
        if matrix is not None:
            grown.ids[:count] = matrix.ids[:count]
            grown.rows[:count] = matrix.rows[:count]
        matrix = grown
    matrix.ids[count:needed] = ids
    matrix.rows[count:needed] = rows
    matrix.count = needed
    matrix.max_id = int(ids[-1])
    return matrix
