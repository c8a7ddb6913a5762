"""Zep v4 graph search: one request shape, and the rules for which combinations are valid
(reference: the v4 search matrix). ``context`` is v4's replacement for v3's scope "auto":
``graph.get_context``, which takes no reranker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Scope = Literal["edges", "nodes", "episodes", "observations", "thread_summaries", "context"]
Reranker = Literal["rrf", "mmr", "node_distance", "episode_mentions", "cross_encoder"]

SCOPES: tuple[Scope, ...] = (
    "edges",
    "nodes",
    "episodes",
    "observations",
    "thread_summaries",
    "context",
)
RERANKERS: tuple[Reranker, ...] = (
    "rrf",
    "mmr",
    "node_distance",
    "episode_mentions",
    "cross_encoder",
)
#: Documented for edges and nodes. For the other searches only the set every scope is
#: known to accept (Graphiti, which Zep builds on, allows just these for episodes).
_SAFE: tuple[Reranker, ...] = ("rrf", "cross_encoder")
VALID_RERANKERS: Mapping[Scope, tuple[Reranker, ...]] = {
    "edges": RERANKERS,
    "nodes": RERANKERS,
    "episodes": _SAFE,
    "observations": _SAFE,
    "thread_summaries": _SAFE,
    "context": (),
}
#: Filter keys each search accepts (others answer ``unsupported_filter``).
FILTER_KEYS: Mapping[Scope, frozenset[str]] = {
    "edges": frozenset(
        {
            "edge_types",
            "exclude_edge_types",
            "edge_uuids",
            "connected_node_uuids",
            "source_node_uuids",
            "target_node_uuids",
            "episode_uuids",
            "date_filters",
            "property_filters",
            "metadata_filters",
        }
    ),
    "nodes": frozenset(
        {
            "node_labels",
            "exclude_node_labels",
            "episode_uuids",
            "property_filters",
            "metadata_filters",
        }
    ),
    "episodes": frozenset({"metadata_filters", "content_policy_violated"}),
    "observations": frozenset(),
    "thread_summaries": frozenset({"metadata_filters"}),
    "context": frozenset(
        {
            "edge_types",
            "exclude_edge_types",
            "node_labels",
            "exclude_node_labels",
            "date_filters",
            "property_filters",
            "metadata_filters",
        }
    ),
}
MAX_LIMIT = 50
MAX_QUERY_CHARS = 400


@dataclass(frozen=True, slots=True)
class SearchRequest:
    query: str
    scope: Scope = "edges"
    reranker: Reranker | None = None
    limit: int = 10
    mmr_lambda: float | None = None
    center_node_uuid: str | None = None
    filters: Mapping[str, Any] | None = None
    bfs_origin_node_uuids: Sequence[str] | None = None


@dataclass(frozen=True, slots=True)
class SearchHit:
    uuid: str
    text: str
    """A fact as a statement ("lives in: Lisbon"), an episode's content, a node's summary."""
    created_at: str | None = None
    score: float | None = None
    """Relevance to the query, higher first, when the backend gives one."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    said_by: str | None = None
    """A statement's speaker's role (``user``, ``assistant``), when the backend keeps it."""


def problems(
    *,
    scope: object = "edges",
    reranker: object = None,
    limit: object = 10,
    mmr_lambda: object = None,
    center_node_uuid: object = None,
    filters: Mapping[str, Any] | None = None,
    bfs_origin_node_uuids: object = None,
) -> list[str]:
    """What is wrong with a combination, each naming the valid choices; empty if none."""
    found: list[str] = []
    if scope not in SCOPES:
        found.append(f"scope must be one of {', '.join(SCOPES)}")
        return found
    valid = VALID_RERANKERS[scope]
    if reranker is not None and reranker not in valid:
        choices = ", ".join(valid) if valid else "none (it ranks by itself)"
        found.append(f"reranker for {scope} must be one of: {choices}")
    if reranker == "mmr" and not isinstance(mmr_lambda, int | float):
        found.append("reranker mmr needs mmr_lambda, a number from 0 (diverse) to 1 (relevant)")
    if isinstance(mmr_lambda, int | float) and not 0 <= mmr_lambda <= 1:
        found.append("mmr_lambda must be from 0 to 1")
    if reranker == "node_distance" and not (isinstance(center_node_uuid, str) and center_node_uuid):
        found.append("reranker node_distance needs center_node_uuid")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        found.append(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    unknown = set(filters or {}) - FILTER_KEYS[scope]
    if unknown:
        allowed = ", ".join(sorted(FILTER_KEYS[scope])) or "none"
        found.append(
            f"{scope} search takes the filters: {allowed} (not {', '.join(sorted(unknown))})"
        )
    if scope == "context" and bfs_origin_node_uuids:
        found.append("context takes no bfs_origin_node_uuids")
    return found
