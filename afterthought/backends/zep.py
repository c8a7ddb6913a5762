"""The Zep v4 adapter, on the real ``zep_cloud.AsyncZep``.

The SDK's own retries are off (``max_retries=0``): the worker's policy governs, and the
turn path has a hard budget. Errors are classified into :class:`BackendError` without the
SDK's text, which can echo request bodies."""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import httpx
from zep_cloud import AddMessage, AsyncZep, EdgeInput, EdgeNodeRef
from zep_cloud.core.api_error import ApiError
from zep_cloud.core.parse_error import ParsingError
from zep_cloud.core.request_options import RequestOptions

from afterthought.backends.base import (
    MESSAGE_KEY_FIELD,
    BackendError,
    Capabilities,
    ErrorKind,
    HistoryMessage,
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

T = TypeVar("T")

#: Messages per page when reading a thread back.
PAGE_SIZE = 100

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


def _error_code(body: object) -> str | None:
    error = getattr(body, "error", None)
    if error is None and isinstance(body, dict):
        error = body.get("error")
    code = getattr(error, "code", None) if not isinstance(error, dict) else error.get("code")
    return code if isinstance(code, str) else None


def classify(exc: BaseException) -> BackendError | None:
    """Map an SDK or transport failure to a :class:`BackendError`; None if it is neither."""
    if isinstance(exc, ParsingError):
        return BackendError("invalid_response", status=exc.status_code)
    if isinstance(exc, ApiError):
        status = exc.status_code or 0
        kind = _KIND_BY_STATUS.get(status, "unavailable" if status >= 500 else "bad_request")
        code = _error_code(exc.body)
        if status == 400 and code and any(w in code for w in ("too_long", "too_large")):
            kind = "too_large"  # Zep answers some over-long content with 400
        try:
            retry_after = _retry_after(exc.headers)
        except (TypeError, ValueError):
            retry_after = None
        return BackendError(kind, status=status, code=code, retry_after=retry_after)
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return BackendError("timeout")
    if isinstance(exc, httpx.TransportError):
        return BackendError("unavailable")
    return None


def _hit(item: Any) -> SearchHit:
    """Edges read as their fact, episodes as their content, the rest as name: summary."""
    text = getattr(item, "fact", None) or getattr(item, "content", None)
    if not text:
        name, summary = getattr(item, "name", None), getattr(item, "summary", None)
        text = f"{name}: {summary}" if name and summary else (name or summary or "")
    when = getattr(item, "valid_at", None) or getattr(item, "created_at", None)
    return SearchHit(uuid=str(getattr(item, "uuid_", "") or ""), text=str(text), created_at=when)


class ZepBackend(MemoryBackend):
    name = "zep"
    capabilities = Capabilities(extracts_facts=True, ignores_roles=True, async_deletes=True)

    def __init__(self, settings: Settings) -> None:
        if settings.zep_api_key is None:
            raise ValueError("the Zep backend needs ZEP_API_KEY")
        self._settings = settings
        self._clients: PerLoop[tuple[AsyncZep, httpx.AsyncClient]] = PerLoop(self._connect)

    def _connect(self) -> tuple[AsyncZep, httpx.AsyncClient]:
        http = httpx.AsyncClient(timeout=self._settings.backend_timeout)
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
            created = False  # 409: it exists (perhaps created by our own lost reply)
            user = await self._call(
                lambda z: z.user.lookup(user_id=zep_user_id, request_options=self._options())
            )
        if not user.uuid_ or not user.graph_uuid:
            raise BackendError("invalid_response", code="user without uuid")
        return UserRef(user_uuid=user.uuid_, graph_uuid=user.graph_uuid), created

    async def create_thread(self, *, user: UserRef, idempotency_key: str) -> str:
        thread = await self._call(
            lambda z: z.thread.create(
                user_uuid=user.user_uuid,
                idempotency_key=idempotency_key,
                request_options=self._options(),
            )
        )
        if not thread.uuid_:
            raise BackendError("invalid_response", code="thread without uuid")
        return str(thread.uuid_)

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
        result = await self._call(
            lambda z: z.thread.add_messages(
                thread_uuid,
                messages=payload,
                idempotency_key=idempotency_key,
                request_options=self._options(timeout),
                **extra,
            )
        )
        return str(result.context or "").strip() if return_context else None

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
        try:
            async for m in pager:  # further pages are fetched as the loop goes
                found.append(
                    StoredMessage(
                        uuid=m.uuid_ or "",
                        role=str(m.role or ""),
                        content=m.content or "",
                        metadata=dict(m.metadata or {}),
                    )
                )
                if len(found) >= limit:
                    break
        except Exception as exc:
            error = classify(exc)
            if error is None:
                raise
            raise error from None
        return found

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
                idempotency_key=f"template:{name}",
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
        self, *, user: UserRef, text: str, key: str, trust: str, reference_time: str
    ) -> None:
        await self._call(
            lambda z: z.graph.episode.add(
                user.graph_uuid,
                data=text,
                type="text",
                source_description=f"afterthought {trust}",
                reference_time=reference_time,
                metadata={MESSAGE_KEY_FIELD: key, "trust": trust},
                idempotency_key=f"fact:{key}",
                request_options=self._options(),
            )
        )

    async def delete_user(self, *, user: UserRef) -> None:
        try:
            await self._call(
                lambda z: z.user.delete(user.user_uuid, request_options=self._options())
            )
        except BackendError as exc:
            if exc.kind != "not_found":
                raise

    async def delete_memory(self, *, user: UserRef, memory_uuid: str) -> None:
        try:
            await self._call(
                lambda z: z.graph.edge.delete(
                    user.graph_uuid, memory_uuid, request_options=self._options()
                )
            )
        except BackendError as exc:
            if exc.kind != "not_found":
                raise

    # --- our synthesis on Zep ("managed" mode) and pruning -------------------------------
    async def user_messages(
        self, *, user: UserRef, after: str | None, limit: int
    ) -> tuple[list[HistoryMessage], str | None]:
        """All the user's threads, oldest first. The cursor is how many messages of each
        thread were read before (a JSON map), so a run resumes where the last one ended."""
        seen: dict[str, int] = json.loads(after) if after else {}
        threads = await self._call(
            lambda z: z.thread.list(
                user_uuid=user.user_uuid, page_size=PAGE_SIZE, request_options=self._options()
            )
        )
        found: list[tuple[str, str, HistoryMessage]] = []
        async for thread in threads:
            uuid_ = str(thread.uuid_)
            pager = await self._call(
                lambda z, t=uuid_: z.thread.list_messages(  # type: ignore[misc]
                    t, page_size=PAGE_SIZE, order="asc", request_options=self._options()
                )
            )
            position = 0
            async for m in pager:
                position += 1
                if position <= seen.get(uuid_, 0):
                    continue
                key = str((m.metadata or {}).get(MESSAGE_KEY_FIELD) or m.uuid_)
                found.append(
                    (
                        str(m.created_at or ""),
                        uuid_,
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
        for _, uuid_, _message in taken:
            seen[uuid_] = seen.get(uuid_, 0) + 1
        return [message for _, _, message in taken], json.dumps(seen, sort_keys=True)

    async def list_facts(self, *, user: UserRef) -> list[StoredFact]:
        """Every edge of the user's graph: ours carry their fields in attributes; Zep's
        own read as user facts of unknown kind (pruning treats them alike)."""
        pager = await self._call(
            lambda z: z.graph.edge.list(
                user.graph_uuid, page_size=PAGE_SIZE, request_options=self._options()
            )
        )
        facts = []
        async for edge in pager:
            a = edge.attributes or {}
            facts.append(
                StoredFact(
                    uuid=str(edge.uuid_),
                    subject=str(a.get("subject") or "user"),
                    predicate=str(a.get("predicate") or (edge.name or "related_to").lower()),
                    value=str(a.get("value") or edge.fact or ""),
                    kind=str(a.get("kind") or "preference"),
                    importance=float(a.get("importance") or 0.5),
                    trust=str(a.get("trust") or "zep"),
                    valid_at=str(edge.valid_at or edge.created_at or ""),
                    invalid_at=edge.invalid_at,
                    source_keys=json.loads(a.get("source_keys") or "[]"),
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
        key = "facts:" + digest(
            *(f.signature for f in add), *(k for f in add for k in f.source_keys)
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

    async def aclose(self) -> None:
        held = self._clients.pop_current()
        if held is not None:
            await held[1].aclose()
