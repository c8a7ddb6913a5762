"""The Zep v4 adapter, on the real ``zep_cloud.AsyncZep``.

The SDK's own retries are off (``max_retries=0``): the worker's policy governs, and the
turn path has a hard budget. Errors are classified into :class:`BackendError` without the
SDK's text, which can echo request bodies."""

from __future__ import annotations

import asyncio
import email.utils
import functools
import importlib
import json
import logging
import re
import ssl
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import httpx
from typing_extensions import override
from zep_cloud import AddMessage, AsyncZep, EdgeInput, EdgeNodeRef, Message, Task
from zep_cloud.core.api_error import ApiError
from zep_cloud.core.pagination import AsyncPager
from zep_cloud.core.parse_error import ParsingError
from zep_cloud.core.request_options import RequestOptions

from afterthought.backends.base import (
    COPY_OF_FIELD,
    LAST_CHECK,
    MESSAGE_KEY_FIELD,
    SESSION_FIELD,
    BackendError,
    Capabilities,
    ErrorKind,
    HistoryMessage,
    LateCopy,
    MemoryBackend,
    OutgoingMessage,
    StoredMessage,
    UserRef,
)
from afterthought.facts import Fact, StoredFact
from afterthought.keys import digest
from afterthought.loops import PerLoop
from afterthought.search import SearchHit, SearchRequest
from afterthought.settings import Settings

log = logging.getLogger("afterthought.backend")

T = TypeVar("T")

#: Items per page asked for when reading lists back; the server may send fewer (it has a
#: maximum of its own), and the SDK's pager follows the cursor either way.
PAGE_SIZE = 50
#: Characters ``graph.episode.add`` takes (Zep docs "Chunking large documents").
EPISODE_LIMIT = 10_000
#: Longest wait between two polls of an asynchronous delete's task.
MAX_POLL_SECONDS = 1.0
#: What a refusal of over-long content says (its wording is not documented; its status
#: may be 400): a length, a limit, "too long/large", "exceeds".
_NAMES_LENGTH = re.compile(r"too[ _-]?(long|large)|exceed|length|characters|\blimit\b", re.I)
_ALREADY_EXISTS = re.compile(r"already[ _-]?exists?", re.I)

_KIND_BY_STATUS: dict[int, ErrorKind] = {
    400: "bad_request",
    401: "unauthorized",
    403: "unauthorized",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "too_large",
    422: "bad_request",
    425: "unavailable",
    429: "rate_limited",
}


def _retry_after(headers: dict[str, str] | None) -> float | None:
    value = next((v for k, v in (headers or {}).items() if k.lower() == "retry-after"), None)
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())


def _error_fields(body: object) -> tuple[str | None, str]:
    """The error's code, and its code and message together (read to classify it, never
    kept: a message may echo what was sent)."""
    error = getattr(body, "error", None)
    if error is None and isinstance(body, dict):
        error = body.get("error")
    if isinstance(error, dict):
        code, message = error.get("code"), error.get("message")
    else:
        code, message = getattr(error, "code", None), getattr(error, "message", None)
    if error is None and isinstance(body, str):
        message = body
    code = code if isinstance(code, str) else None
    return code, f"{code or ''} {message if isinstance(message, str) else ''}"


def classify(exc: BaseException) -> BackendError | None:
    """Map an SDK or transport failure to a :class:`BackendError`; None if it is neither."""
    if isinstance(exc, ParsingError):
        return BackendError("invalid_response", status=exc.status_code)
    if isinstance(exc, ApiError):
        status = exc.status_code or 0
        kind = _KIND_BY_STATUS.get(status, "unavailable" if status >= 500 else "bad_request")
        code, text = _error_fields(exc.body)
        if status == 400 and _ALREADY_EXISTS.search(text):
            kind, code = "conflict", "already_exists"  # Zep's answer to a duplicate user
        elif status == 400 and _NAMES_LENGTH.search(text):
            kind = "too_large"  # Zep answers over-long content with 400: re-split it
        try:
            retry_after = _retry_after(exc.headers)
        except (TypeError, ValueError):
            retry_after = None
        return BackendError(kind, status=status, code=code, retry_after=retry_after)
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return BackendError("timeout")
    if isinstance(exc, httpx.TransportError):
        return BackendError("unavailable", detail=_unreached(exc))
    return None


def _unreached(exc: httpx.TransportError) -> str | None:
    """The server a request could not reach, by host and port only (the URL's path holds
    user and thread ids; the key travels in a header and is never named)."""
    try:
        url = exc.request.url
    except RuntimeError:  # raised before a request was made
        return None
    port = f":{url.port}" if url.port else ""
    return f"cannot reach Zep at {url.host}{port} ({type(exc).__name__})"


async def _classified(pager: AsyncPager[T, Any]) -> AsyncIterator[T]:
    """The pager's items across its pages; a failure fetching a later page is classified
    like any other call's."""
    try:
        async for item in pager:
            yield item
    except Exception as exc:
        error = classify(exc)
        if error is None:
            raise
        raise error from None


async def _last_check(request: httpx.Request) -> None:
    """:data:`LAST_CHECK`, for a write: the latest point before the request is sent that
    httpx offers (its connection is taken, and the request written, after)."""
    check = LAST_CHECK.get()
    if check is not None and request.method != "GET":
        check()


def _stored(m: Message) -> StoredMessage:
    return StoredMessage(
        uuid=m.uuid_ or "",
        role=str(m.role or ""),
        content=m.content or "",
        metadata=dict(m.metadata or {}),
        processed=m.processed,
    )


def split_text(text: str, limit: int) -> list[str]:
    """Ordered parts of at most ``limit`` characters, joined back the original: cut after
    the last sentence end that leaves a part at least half full, else after the last
    space; a run of more than ``limit`` characters without one (no word is that long) is
    the only thing ever cut inside."""
    parts: list[str] = []
    rest = text
    while len(rest) > limit:
        head = rest[:limit]
        ends = [m.end() for m in re.finditer(r"[.!?][\"')\]]*\s", head)]
        spaces = [m.end() for m in re.finditer(r"\s", head)]
        if ends and ends[-1] >= limit // 2:
            cut = ends[-1]
        elif rest[limit].isspace():
            cut = limit
        else:
            cut = spaces[-1] if spaces else limit
        parts.append(rest[:cut])
        rest = rest[cut:]
    parts.append(rest)
    return parts


def _hit(item: Any) -> SearchHit:
    """Edges read as their fact, episodes as their content, the rest as name: summary."""
    text = getattr(item, "fact", None) or getattr(item, "content", None)
    if not text:
        name, summary = getattr(item, "name", None), getattr(item, "summary", None)
        text = f"{name}: {summary}" if name and summary else (name or summary or "")
    # An edge holds from its validity, an episode from when it was said (reference_time;
    # created_at is when Zep received it: an import's would date old turns today).
    when = (
        getattr(item, "valid_at", None)
        or getattr(item, "reference_time", None)
        or getattr(item, "created_at", None)
    )
    role = getattr(item, "role", None)
    score = getattr(item, "score", None)
    name = getattr(item, "name", None)  # an edge's is its relation ("LIVES_IN")
    return SearchHit(
        uuid=str(getattr(item, "uuid_", "") or ""),
        text=str(text),
        created_at=when,
        score=float(score) if isinstance(score, int | float) else None,
        extra={"predicate": name} if getattr(item, "fact", None) and name else {},
        said_by=str(role) if role else None,
    )


#: What the SDK and httpx import on first use (a sub-client and its types, the connection
#: pool and its async backend).
_LAZY_MODULES = (
    *(f"zep_cloud.{part}.client" for part in ("graph", "thread", "user", "task")),
    "zep_cloud.errors",
    "httpcore",
    "anyio._backends._asyncio",
)


@functools.cache
def _load_sdk() -> None:
    """Import now what the first call would: ~0.5 s that blocks the event loop, so the
    first turn's read budget could not cut it short and its read always timed out (an
    agent that lives for one turn never read its memory). An agent opens the backend as
    its callbacks are made."""
    for name in _LAZY_MODULES:
        importlib.import_module(name)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The CA bundle, read once per process: reading it costs ~50 ms of CPU, which every
    backend (an agent opens one per memory) and every loop's client paid. A context is
    safe to share between connections, loops and threads."""
    return httpx.create_ssl_context()


def scoped_key(key: str, target: str) -> str:
    """An idempotency key as sent to Zep: the caller's, and what it writes to (a thread, a
    graph). Zep may keep keys per project rather than per request path, and the callers'
    keys are made from ADK's ids and the words (``batching.Call``, ``contract``): another
    deployment's (or another backend user's) import of the same session, or the same fact,
    would be taken for a replay of the first and stored nowhere."""
    return f"{key}@{digest(target, size=16)}"


class ZepBackend(MemoryBackend):
    name = "zep"
    capabilities = Capabilities(
        extracts_facts=True,
        ignores_roles=True,
        async_deletes=True,
        ingests_async=True,
        replays_thread_creates=False,
    )

    def __init__(self, settings: Settings) -> None:
        if settings.zep_api_key is None:
            raise ValueError("the Zep backend needs ZEP_API_KEY")
        self._settings = settings
        _load_sdk()
        self._clients: PerLoop[tuple[AsyncZep, httpx.AsyncClient]] = PerLoop(self._connect)

    def _connect(self) -> tuple[AsyncZep, httpx.AsyncClient]:
        http = httpx.AsyncClient(
            timeout=self._settings.backend_timeout,
            verify=_tls_context(),
            event_hooks={"request": [_last_check]},
        )
        key = self._settings.zep_api_key
        assert key is not None
        client = AsyncZep(
            api_key=key.get_secret_value(),
            base_url=self._settings.zep_base_url,
            httpx_client=http,
            max_retries=0,
        )
        return client, http

    @property
    def zep(self) -> AsyncZep:
        """The running loop's SDK client, for operations the port does not cover."""
        return self._clients.get()[0]

    async def _call(self, op: Callable[[AsyncZep], Awaitable[T]]) -> T:
        try:
            return await op(self.zep)
        except Exception as exc:
            error = classify(exc)
            if error is None:
                raise
            raise error from None

    def _options(self, timeout: float | None = None) -> RequestOptions:
        """Our own retry policy governs (the SDK's is off); the turn path passes its budget."""
        return {"timeout": timeout or self._settings.backend_timeout, "max_retries": 0}

    async def ensure_user(
        self, *, zep_user_id: str, first_name: str | None = None, last_name: str | None = None
    ) -> tuple[UserRef, bool]:
        names: dict[str, Any] = {}
        if first_name:
            names["first_name"] = first_name
        if last_name:
            names["last_name"] = last_name
        created = True
        try:
            user = await self._call(
                lambda z: z.user.create(
                    user_id=zep_user_id, request_options=self._options(), **names
                )
            )
        except BackendError as exc:
            if exc.kind != "conflict":
                raise
            # 400 "already exists" (as Zep answers) or 409: it exists, perhaps created by
            # our own call whose reply was lost.
            created = False
            user = await self._call(
                lambda z: z.user.lookup(user_id=zep_user_id, request_options=self._options())
            )
        if not user.uuid_ or not user.graph_uuid:
            raise BackendError("invalid_response", code="user without uuid")
        return UserRef(user_uuid=user.uuid_, graph_uuid=user.graph_uuid), created

    async def find_user(self, *, zep_user_id: str) -> UserRef | None:
        try:
            user = await self._call(
                lambda z: z.user.lookup(user_id=zep_user_id, request_options=self._options())
            )
        except BackendError as exc:
            if exc.kind == "not_found":
                return None
            raise
        if not user.uuid_ or not user.graph_uuid:
            raise BackendError("invalid_response", code="user without uuid")
        return UserRef(user_uuid=user.uuid_, graph_uuid=user.graph_uuid)

    async def create_thread(self, *, user: UserRef, idempotency_key: str) -> str:
        """The key is scoped by the user here too: the same session of a user created
        again (forgotten, then back) never meets the old user's key, whose replay would
        name a deleted thread, or a conflict, depending on the server."""
        thread = await self._call(
            lambda z: z.thread.create(
                user_uuid=user.user_uuid,
                idempotency_key=f"{idempotency_key}:{user.user_uuid}",
                request_options=self._options(),
            )
        )
        if not thread.uuid_:
            raise BackendError("invalid_response", code="thread without uuid")
        return str(thread.uuid_)

    @override
    async def session_threads(self, *, user: UserRef) -> AsyncGenerator[tuple[str, str | None]]:
        """A page of the user's threads a call (the pager follows the cursor), then a call
        per thread for its first message."""
        threads = await self._call(
            lambda z: z.thread.list(
                user_uuid=user.user_uuid,
                page_size=PAGE_SIZE,
                order_by="created_at",
                order="desc",
                request_options=self._options(),
            )
        )
        async for thread in _classified(threads):
            if not thread.uuid_ or (thread.user_uuid and thread.user_uuid != user.user_uuid):
                continue  # a server that ignores the filter must not mix users
            first = await self._call(
                lambda z, t=str(thread.uuid_): z.thread.list_messages(  # type: ignore[misc]
                    t, page_size=1, order="asc", request_options=self._options()
                )
            )
            tag = next(iter(first.items or []), None)
            found = (tag.metadata or {}).get(SESSION_FIELD) if tag is not None else None
            yield str(thread.uuid_), found if isinstance(found, str) else None

    async def thread_owner(self, *, thread_uuid: str) -> str | None:
        try:
            thread = await self._call(
                lambda z: z.thread.get(thread_uuid, request_options=self._options())
            )
        except BackendError as exc:
            if exc.kind == "not_found":
                return None
            raise
        return str(thread.user_uuid) if thread.user_uuid else None

    async def add_messages(
        self,
        *,
        thread_uuid: str,
        messages: Sequence[OutgoingMessage],
        idempotency_key: str,
        ignore_roles: Sequence[str] = (),
        return_context: bool = False,
        timeout: float | None = None,
    ) -> str | None:
        payload = [
            AddMessage(
                content=m.content,
                reference_time=m.reference_time,
                metadata=dict(m.metadata),
                # Unset fields are left out of the JSON; None would be sent as null.
                **{k: v for k, v in (("role", m.role), ("name", m.name)) if v is not None},
            )
            for m in messages
        ]
        extra: dict[str, Any] = {"ignore_roles": list(ignore_roles)} if ignore_roles else {}
        if return_context:
            extra["return_context"] = True
        # The key covers the whole body, so that it is never reused with another one (a
        # conflict, or a replay of a reply that was not for it): the messages are in the
        # caller's key, the options here. Callers keep the body of a call the same at
        # every attempt (the worker asks ``return_context`` of every call alike,
        # ``batching.asks_context``), so every attempt carries the first one's key.
        options = digest(str(return_context), *sorted(ignore_roles), size=12)
        key = scoped_key(f"{idempotency_key}:{options}", thread_uuid)
        result = await self._call(
            lambda z: z.thread.add_messages(
                thread_uuid,
                messages=payload,
                idempotency_key=key,
                request_options=self._options(timeout),
                **extra,
            )
        )
        return str(result.context or "").strip() if return_context else None

    async def remove_copy(
        self, *, thread_uuid: str, copy: LateCopy, last_chance: bool
    ) -> str | None:
        """Zep v4 deletes no single message (only its thread or user) and updates only its
        metadata: the copy is marked (merged by Zep), and history read through this adapter
        skips it; the thread as Zep's own API lists it keeps it. What Zep's graph made of
        it is deleted (``graph.episode.delete``, which takes the edges only that episode
        supports), so the context block and search meet the words once. The thread's
        episodes that carry the copy's key (Zep keeps a message's metadata on its episode)
        and text are the first copy's and the late ones': the earliest made stays (any one
        of them says the same, at the same reference time). Zep makes a message's episode
        only once it has processed it: until then the copy is left for the next run (None),
        unless this is the last chance. Marked last, so a run cut short in between finds
        the copy again, with its episode gone."""
        if copy.processed is False and not last_chance:
            return None
        pager = await self._call(
            lambda z: z.thread.list_episodes(
                thread_uuid, page_size=PAGE_SIZE, request_options=self._options()
            )
        )
        made, keyed, alike = False, False, []
        async for episode in _classified(pager):
            key = (episode.metadata or {}).get(MESSAGE_KEY_FIELD)
            made, keyed = True, keyed or key is not None
            if key == copy.key and copy.content in (episode.content or ""):
                alike.append(episode)
        alike.sort(key=lambda e: str(e.created_at or ""))
        for episode in alike[1:]:
            graph_uuid = episode.graph_uuid or await self._graph_of(thread_uuid)
            await self._delete_episode(graph_uuid, str(episode.uuid_))
        await self._call(
            lambda z: z.thread.message.update(
                thread_uuid,
                copy.uuid,
                metadata={COPY_OF_FIELD: copy.kept},
                request_options=self._options(),
            )
        )
        # Episodes, none with a key: this Zep keeps no metadata on episodes, so the copy's
        # cannot be told from the first copy's; the graph may keep a second mention.
        return "marked_unmatched" if made and not keyed else "marked"

    async def _graph_of(self, thread_uuid: str) -> str:
        thread = await self._call(
            lambda z: z.thread.get(thread_uuid, request_options=self._options())
        )
        return str(thread.graph_uuid or "")

    async def recent_messages(
        self, *, thread_uuid: str, limit: int, timeout: float | None = None
    ) -> list[StoredMessage]:
        pager = await self._call(
            lambda z: z.thread.list_messages(
                thread_uuid,
                page_size=min(limit, PAGE_SIZE),
                order="desc",
                request_options=self._options(timeout),
            )
        )
        found: list[StoredMessage] = []
        async for m in _classified(pager):  # further pages are fetched as the loop goes
            found.append(_stored(m))
            if len(found) >= limit:
                break
        return found

    async def message_page(
        self, *, thread_uuid: str, cursor: str | None, timeout: float | None = None
    ) -> tuple[list[StoredMessage], str | None]:
        pager = await self._call(
            lambda z: z.thread.list_messages(
                thread_uuid,
                page_size=PAGE_SIZE,
                cursor=cursor,
                order="desc",
                request_options=self._options(timeout),
            )
        )
        following = pager.response.next_cursor if pager.has_next else None
        return [_stored(m) for m in pager.items or []], following or None

    async def get_context(
        self,
        *,
        user: UserRef,
        query: str,
        max_chars: int,
        timeout: float,
        template_uuid: str | None = None,
    ) -> str:
        template = {"template_uuid": template_uuid} if template_uuid else {}
        response = await self._call(
            lambda z: z.graph.get_context(
                user.graph_uuid,
                query=query or "the user",
                max_characters=max_chars,
                request_options=self._options(timeout),
                **template,
            )
        )
        return str(response.context or "").strip()

    async def create_template(self, *, name: str, template: str) -> str:
        created = await self._call(
            lambda z: z.context.create_template(
                name=name,
                template=template,
                # Templates are the project's: one name with another text is another one.
                idempotency_key=f"template:{digest(name, template)}",
                request_options=self._options(),
            )
        )
        return str(created.uuid_)

    async def get_template(self, template_uuid: str) -> tuple[str, str]:
        found = await self._call(
            lambda z: z.context.get_template(template_uuid, request_options=self._options())
        )
        return str(found.name or ""), str(found.template or "")

    async def update_template(self, template_uuid: str, *, name: str, template: str) -> None:
        await self._call(
            lambda z: z.context.update_template(
                template_uuid, name=name, template=template, request_options=self._options()
            )
        )

    async def delete_template(self, template_uuid: str) -> None:
        await self._call(
            lambda z: z.context.delete_template(template_uuid, request_options=self._options())
        )

    async def add_fact(
        self,
        *,
        user: UserRef,
        text: str,
        key: str,
        trust: str,
        reference_time: str,
        said_ms: int | None = None,
    ) -> None:
        """In ``zep`` mode an episode Zep extracts from; in ``managed`` mode, where only
        what we validated may reach the graph, edges carrying our provenance. Text longer
        than an episode takes goes in ordered parts, cut between sentences or words. The
        idempotency key names the add (``said_ms``): Zep keeps a key past a delete, so a
        fact added again after one would be taken for a replay of the first add."""
        pieces = split_text(text, EPISODE_LIMIT)
        add = key if said_ms is None else f"{key}@{said_ms}"
        for i, piece in enumerate(pieces):
            part_key = key if len(pieces) == 1 else f"{key}:{i}"
            idempotency = scoped_key(
                f"fact:{add}" if len(pieces) == 1 else f"fact:{add}:{i}", user.graph_uuid
            )
            metadata: dict[str, Any] = {MESSAGE_KEY_FIELD: part_key, "trust": trust}
            if len(pieces) > 1:
                metadata["afterthought_part"] = f"{i + 1}/{len(pieces)}"
            if self._settings.memory_mode == "managed":
                edge = EdgeInput(
                    fact=piece,
                    fact_name="NOTED",
                    source_node=EdgeNodeRef(name="user"),
                    target_node=EdgeNodeRef(name="note"),
                    valid_at=reference_time,
                    attributes={
                        "subject": "user",
                        "predicate": "noted",
                        "value": piece,
                        "kind": "note",
                        "importance": 0.5,
                        "trust": trust,
                        "source_keys": json.dumps([key]),
                    },
                    metadata=metadata,
                )
                await self._call(
                    lambda z, e=edge, k=idempotency: z.graph.edge.add(  # type: ignore[misc]
                        user.graph_uuid,
                        edges=[e],
                        idempotency_key=k,
                        request_options=self._options(),
                    )
                )
                continue
            await self._call(
                lambda z, p=piece, m=metadata, k=idempotency: z.graph.episode.add(  # type: ignore[misc]
                    user.graph_uuid,
                    data=p,
                    type="text",
                    source_description=f"afterthought {trust}",
                    reference_time=reference_time,
                    metadata=m,
                    idempotency_key=k,
                    request_options=self._options(),
                )
            )

    async def _done(self, task: Task | None) -> None:
        """Wait for an asynchronous delete (202 + task) to be done: poll the task, at most
        ``zep_delete_wait_seconds``. Still pending then: ``unavailable``/``delete_pending``
        (the caller retries; the data is still there meanwhile). Failed: ``delete_failed``."""
        deadline = time.monotonic() + self._settings.zep_delete_wait_seconds
        wait = 0.05
        while task is not None and task.status != "succeeded":
            if task.status in ("failed", "partial"):
                raise BackendError("unavailable", code="delete_failed")
            left = deadline - time.monotonic()
            if left <= 0 or not task.uuid_:
                raise BackendError("unavailable", code="delete_pending")
            await asyncio.sleep(min(wait, left))
            wait = min(wait * 2, MAX_POLL_SECONDS)
            task = await self._call(
                lambda z, t=task.uuid_: z.task.get(t, request_options=self._options())  # type: ignore[misc]
            )

    async def _delete(self, call: Callable[[AsyncZep], Awaitable[Any]]) -> bool:
        """One asynchronous delete: True once Zep has done it, False if there was nothing."""
        try:
            result = await self._call(call)
        except BackendError as exc:
            if exc.kind != "not_found":
                raise
            return False
        await self._done(result.task)
        return True

    async def delete_user(self, *, user: UserRef) -> None:
        """Returns once Zep has deleted the user, its threads and its graph."""
        await self._delete(lambda z: z.user.delete(user.user_uuid, request_options=self._options()))

    async def delete_memory(self, *, user: UserRef, memory_uuid: str) -> bool:
        """Delete an edge (a fact) and the episodes it was extracted from, or an episode
        (a search can return one); True once Zep has deleted it, False if there was none.

        What cannot be removed here: the thread message an episode was made of stays in
        its thread's history (only deleting the thread or the user removes it), and an
        episode's other facts go with it (Zep deletes the edges only it supported)."""
        graph = user.graph_uuid
        try:
            edge = await self._call(
                lambda z: z.graph.edge.get(graph, memory_uuid, request_options=self._options())
            )
        except BackendError as exc:
            if exc.kind != "not_found":
                raise
            return await self._delete_episode(graph, memory_uuid)
        deleted = await self._delete(
            lambda z: z.graph.edge.delete(graph, memory_uuid, request_options=self._options())
        )
        if deleted:
            for episode_uuid in edge.episode_uuids or []:
                await self._delete_episode(graph, episode_uuid)
        return deleted

    async def _delete_episode(self, graph_uuid: str, episode_uuid: str) -> bool:
        return await self._delete(
            lambda z: z.graph.episode.delete(
                graph_uuid, episode_uuid, request_options=self._options()
            )
        )

    # --- our synthesis on Zep ("managed" mode) and pruning -------------------------------
    async def user_messages(
        self, *, user: UserRef, after: str | None, limit: int
    ) -> tuple[list[HistoryMessage], str | None]:
        """All the user's threads, oldest first, late copies skipped (marked, or the same
        key and text again). The cursor is how many messages of each thread were read past
        (a JSON map), so a run resumes where the last one ended."""
        seen: dict[str, int] = json.loads(after) if after else {}
        threads = await self._call(
            lambda z: z.thread.list(
                user_uuid=user.user_uuid, page_size=PAGE_SIZE, request_options=self._options()
            )
        )
        found: list[tuple[str, str, int, HistoryMessage]] = []
        async for thread in _classified(threads):
            if thread.user_uuid and thread.user_uuid != user.user_uuid:
                continue  # a server that ignores the filter must not mix users
            uuid_ = str(thread.uuid_)
            pager = await self._call(
                lambda z, t=uuid_: z.thread.list_messages(  # type: ignore[misc]
                    t, page_size=PAGE_SIZE, order="asc", request_options=self._options()
                )
            )
            position = 0
            said: set[tuple[str, str]] = set()
            async for m in _classified(pager):
                position += 1
                metadata = m.metadata or {}
                key = str(metadata.get(MESSAGE_KEY_FIELD) or m.uuid_)
                # A late copy is skipped, marked or not yet (the same key and text again).
                copy = COPY_OF_FIELD in metadata or (key, m.content or "") in said
                said.add((key, m.content or ""))
                if position <= seen.get(uuid_, 0) or copy:
                    continue
                found.append(
                    (
                        str(m.created_at or ""),
                        uuid_,
                        position,
                        HistoryMessage(
                            key,
                            str(m.role or ""),
                            m.content or "",
                            str(m.reference_time or m.created_at or ""),
                        ),
                    )
                )
        found.sort(key=lambda item: item[0])
        taken = found[:limit]
        if not taken:
            return [], None
        for _, uuid_, position, _message in taken:  # copies before it are read past too
            seen[uuid_] = max(seen.get(uuid_, 0), position)
        return [message for _, _, _, message in taken], json.dumps(seen, sort_keys=True)

    async def list_facts(self, *, user: UserRef) -> list[StoredFact]:
        """Every edge of the user's graph: ours carry their fields and provenance in
        attributes; Zep's own have none of it and read as ``extracted`` user facts."""
        pager = await self._call(
            lambda z: z.graph.edge.list(
                user.graph_uuid, page_size=PAGE_SIZE, request_options=self._options()
            )
        )
        facts = []
        async for edge in _classified(pager):
            a = edge.attributes or {}
            importance = a.get("importance")
            facts.append(
                StoredFact(
                    uuid=str(edge.uuid_),
                    subject=str(a.get("subject") or "user"),
                    predicate=str(a.get("predicate") or (edge.name or "related_to").lower()),
                    value=str(a.get("value") or edge.fact or ""),
                    kind=str(a.get("kind") or "preference"),
                    importance=0.5 if importance is None else float(importance),
                    trust=str(a.get("trust") or "zep"),
                    valid_at=str(edge.valid_at or edge.created_at or ""),
                    invalid_at=edge.invalid_at,
                    source_keys=json.loads(a.get("source_keys") or "[]"),
                    extracted=not ("trust" in a and "source_keys" in a),
                )
            )
        return facts

    async def write_facts(
        self, *, user: UserRef, add: Sequence[Fact], invalidate: Sequence[str], at: str
    ) -> None:
        """v4 cannot set ``invalid_at`` on an existing edge: a superseded fact is deleted
        (the audit log keeps that it was). New facts carry their provenance."""
        for edge_uuid in invalidate:
            await self.delete_memory(user=user, memory_uuid=edge_uuid)
        if not add:
            return
        edges = [
            EdgeInput(
                fact=fact.statement(),
                fact_name=fact.predicate.upper(),
                source_node=EdgeNodeRef(name=fact.subject),
                target_node=EdgeNodeRef(name=fact.value),
                valid_at=fact.valid_at or at,
                attributes={
                    "subject": fact.subject,
                    "predicate": fact.predicate,
                    "value": fact.value,
                    "kind": fact.kind,
                    "importance": fact.importance,
                    "trust": fact.trust,
                    "source_keys": json.dumps(sorted(fact.source_keys)),
                },
                metadata={MESSAGE_KEY_FIELD: fact.signature, "trust": fact.trust},
            )
            for fact in add
        ]
        key = scoped_key(
            "facts:"
            + digest(*(f.signature for f in add), *(k for f in add for k in f.source_keys)),
            user.graph_uuid,
        )
        await self._call(
            lambda z: z.graph.edge.add(
                user.graph_uuid, edges=edges, idempotency_key=key, request_options=self._options()
            )
        )

    async def search(
        self, *, graph_uuid: str, request: SearchRequest, timeout: float
    ) -> list[SearchHit]:
        options = self._options(timeout)
        given: dict[str, Any] = {
            k: v
            for k, v in (
                ("filters", request.filters),
                ("reranker", request.reranker),
                ("mmr_lambda", request.mmr_lambda),
                ("center_node_uuid", request.center_node_uuid),
                ("bfs_origin_node_uuids", request.bfs_origin_node_uuids),
            )
            if v is not None  # None would be sent as JSON null
        }
        if request.scope == "context":
            filters = {"filters": given["filters"]} if "filters" in given else {}
            found = await self._call(
                lambda z: z.graph.get_context(
                    graph_uuid, query=request.query, request_options=options, **filters
                )
            )
            text = str(found.context or "").strip()
            return [SearchHit(uuid="context", text=text)] if text else []

        def method(z: AsyncZep) -> Any:
            graph = z.graph
            return {
                "edges": graph.search_edges,
                "nodes": graph.search_nodes,
                "episodes": graph.search_episodes,
                "observations": graph.search_observations,
                "thread_summaries": graph.search_thread_summaries,
            }[request.scope]

        pager = await self._call(
            lambda z: method(z)(
                graph_uuid,
                query=request.query,
                page_size=request.limit,
                request_options=options,
                **given,
            )
        )
        return [_hit(item) for item in (pager.items or [])[: request.limit]]

    @override
    async def prepare(self) -> None:
        """A worker's start: one call that says whether Zep answers and takes the key (the
        user asked for does not exist: "not found" is the answer wanted). Said, not
        raised: the worker goes on, and what it is sent waits in the queue until Zep
        answers (an outage at start is an outage like any other)."""
        try:
            nobody = f"afterthought-probe-{uuid.uuid4().hex}"
            await self._call(lambda z: z.user.get(nobody, request_options=self._options()))
        except BackendError as exc:
            if exc.kind != "not_found":
                log.warning(
                    "zep unusable at start error=%s status=%s%s; messages wait until it is",
                    exc.kind,
                    exc.status,
                    f" ({exc.detail})" if exc.detail else "",
                )

    async def aclose(self) -> None:
        held = self._clients.pop_current()
        if held is not None:
            await held[1].aclose()
