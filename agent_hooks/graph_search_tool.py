"""``ZepGraphSearchTool``: a model-callable search of the user's (or a shared) graph.

Each search option is pin-or-expose: leave it out and the model chooses it (with the
default shown); give a value and it is pinned and hidden from the model; give ``None``
and it is hidden and never sent. ``filters`` and ``bfs_origin_node_uuids`` are
constructor-only. Whose graph is never the model's choice (R4). An invalid pinned
combination fails at construction; an invalid one from the model costs no backend call
and comes back naming the valid choices. Backend errors never reach the model's text."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from typing_extensions import override

from afterthought.agent_hooks.turn_memory import TurnMemory, Who
from afterthought.search import RERANKERS, SCOPES, SearchRequest, problems

log = logging.getLogger("afterthought.hooks")


class _Exposed:
    def __repr__(self) -> str:
        return "EXPOSED"


#: The default of every option: the model may choose it.
EXPOSED: Any = _Exposed()

_DEFAULTS: dict[str, Any] = {
    "scope": "edges",
    "reranker": "rrf",
    "limit": 10,
    "mmr_lambda": None,
    "center_node_uuid": None,
}
_SCHEMA: dict[str, types.Schema] = {
    "scope": types.Schema(
        type=types.Type.STRING,
        enum=list(SCOPES),
        description="What to search: facts (edges), entities (nodes), raw episodes, "
        "observations, thread summaries, or an assembled context block (context).",
    ),
    "reranker": types.Schema(
        type=types.Type.STRING,
        enum=list(RERANKERS),
        description="How to rank results (not used with scope context).",
    ),
    "limit": types.Schema(type=types.Type.INTEGER, description="How many results, 1 to 50."),
    "mmr_lambda": types.Schema(
        type=types.Type.NUMBER,
        description="Only with reranker mmr: 0 favours diversity, 1 relevance.",
    ),
    "center_node_uuid": types.Schema(
        type=types.Type.STRING, description="Only with reranker node_distance: the node."
    ),
}
NO_RESULTS = "No results found."
UNAVAILABLE = "Memory search is unavailable right now."


class ZepGraphSearchTool(BaseTool):
    def __init__(
        self,
        *,
        name: str = "memory_search",
        description: str = "Search long-term memory about the user for facts and history.",
        memory: TurnMemory | None = None,
        graph_uuid: str | None = None,
        filters: Mapping[str, Any] | None = None,
        bfs_origin_node_uuids: Sequence[str] | None = None,
        scope: Any = EXPOSED,
        reranker: Any = EXPOSED,
        limit: Any = EXPOSED,
        mmr_lambda: Any = EXPOSED,
        center_node_uuid: Any = EXPOSED,
        **kwargs: Any,
    ) -> None:
        """``graph_uuid`` binds the tool to one graph (a shared knowledge base); without it,
        the graph of the turn's user. Other keyword arguments configure the memory."""
        super().__init__(name=name, description=description)
        self.memory = memory or TurnMemory.create(**kwargs)
        self.graph_uuid = graph_uuid
        self.filters = dict(filters) if filters else None
        self.bfs_origin_node_uuids = list(bfs_origin_node_uuids or []) or None
        self.options = {
            "scope": scope,
            "reranker": reranker,
            "limit": limit,
            "mmr_lambda": mmr_lambda,
            "center_node_uuid": center_node_uuid,
        }
        if scope is None:
            raise ValueError("scope cannot be hidden: pin it or expose it")
        self.exposed = [k for k, v in self.options.items() if v is EXPOSED]
        # What the model may still supply counts as supplied; the rest must be valid now.
        could = {"mmr_lambda": 0.5, "center_node_uuid": "supplied-by-the-model"}
        values = {
            k: could.get(k, _DEFAULTS[k]) if v is EXPOSED else v for k, v in self.options.items()
        }
        wrong = self._problems(self._unranked_context(values))
        if wrong:
            raise ValueError("invalid search options: " + "; ".join(wrong))

    def _unranked_context(self, values: dict[str, Any]) -> dict[str, Any]:
        """Context ranks by itself: drop a reranker that only came from the default or the
        model (a pinned one stays, and is reported)."""
        if values["scope"] == "context" and self.options["reranker"] is EXPOSED:
            return {**values, "reranker": None}
        return values

    def _problems(self, values: dict[str, Any]) -> list[str]:
        return problems(
            **values, filters=self.filters, bfs_origin_node_uuids=self.bfs_origin_node_uuids
        )

    @override
    def _get_declaration(self) -> types.FunctionDeclaration:
        properties = {
            "query": types.Schema(type=types.Type.STRING, description="What to look for.")
        }
        properties |= {k: _SCHEMA[k] for k in self.exposed}
        return types.FunctionDeclaration(
            name=self.name,
            description=self.description,
            parameters=types.Schema(
                type=types.Type.OBJECT, properties=properties, required=["query"]
            ),
        )

    @override
    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            return "Give a non-empty query."
        chosen = {k: args[k] for k in self.exposed if args.get(k) is not None}
        pinned = {k: v for k, v in self.options.items() if v is not EXPOSED}
        values = {**_DEFAULTS, **chosen, **pinned}  # pinned beats the model, the model defaults
        values = self._unranked_context(values)
        wrong = self._problems(values)
        if wrong:
            return "Not searched: " + "; ".join(wrong) + "."
        request = SearchRequest(
            query=query.strip()[:400],
            filters=self.filters,
            bfs_origin_node_uuids=self.bfs_origin_node_uuids,
            **{k: v for k, v in values.items() if v is not None},
        )
        try:
            graph = await self._graph(tool_context)
            if graph is None:
                return NO_RESULTS
            hits = await self.memory.backend.search(
                graph_uuid=graph, request=request, timeout=self.memory.settings.tool_timeout
            )
        except Exception as exc:  # never raise into the agent, never echo the backend
            log.warning("memory search failed error=%s", type(exc).__name__)
            return UNAVAILABLE
        if not hits:
            return NO_RESULTS
        return "\n".join(f"- {hit.text}" for hit in hits)

    async def _graph(self, ctx: ToolContext) -> str | None:
        """The bound graph, else the turn's (options, resolver, session state, registry)."""
        if self.graph_uuid:
            return self.graph_uuid
        memory = self.memory
        user = await memory.user_of(Who.of(ctx), await memory.reads(ctx))
        return user.graph_uuid if user else None
