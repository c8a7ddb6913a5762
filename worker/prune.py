"""Pruning: what memory should no longer hold. Facts past their kind's time to live,
stale unimportant ones, superseded ones past a grace period, near-duplicates, and the
least important x least recent above a per-user cap. A dry run reports and changes
nothing; every deletion is audited."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis.asyncio as aioredis

from afterthought.audit import AuditLog, Entry
from afterthought.backends.base import MemoryBackend, UserRef
from afterthought.context_cache import ContextCache
from afterthought.facts import StoredFact
from afterthought.identity import IdentityRegistry
from afterthought.keys import digest
from afterthought.settings import Settings

_ARTICLE = re.compile(r"\b(?:a|an|the|my)\b|[^\w\s]")
#: Recency half-life, in days, of the per-user cap's score.
RECENCY_DAYS = 180.0


@dataclass
class PruneReport:
    dry_run: bool
    pruned: list[tuple[str, str]] = field(default_factory=list)
    """(fact id, reason) deleted — or, in a dry run, that would be."""
    kept: int = 0


def _age_days(when: str | None, now: datetime) -> float:
    if not when:
        return 0.0
    try:
        then = datetime.fromisoformat(when)
    except ValueError:
        return 0.0
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return max(0.0, (now - then).total_seconds() / 86400)


def _normal(value: str) -> str:
    return " ".join(_ARTICLE.sub(" ", value.lower()).split())


def plan(facts: list[StoredFact], settings: Settings, now: datetime) -> list[tuple[str, str]]:
    """What to prune and why (pure: the tests and the dry run read it as is)."""
    doomed: dict[str, str] = {}
    live = []
    for fact in facts:
        age = _age_days(fact.valid_at, now)
        ttl = settings.fact_ttl_days.get(fact.kind)
        if fact.invalid_at is not None:
            if _age_days(fact.invalid_at, now) > settings.superseded_grace_days:
                doomed[fact.uuid] = "superseded"
        elif ttl is not None and age > ttl:
            doomed[fact.uuid] = f"ttl {fact.kind}"
        elif age > settings.stale_days and fact.importance < 0.5:
            doomed[fact.uuid] = "stale"
        else:
            live.append(fact)
    seen: dict[tuple[str, str, str], StoredFact] = {}
    for fact in sorted(live, key=lambda f: f.valid_at, reverse=True):  # newest kept
        same = (fact.subject, fact.predicate, _normal(fact.value))
        if same in seen:
            doomed[fact.uuid] = "near-duplicate"
        else:
            seen[same] = fact
    survivors = list(seen.values())
    if len(survivors) > settings.max_facts_per_user:

        def score(f: StoredFact) -> float:
            return f.importance * math.exp(-_age_days(f.valid_at, now) / RECENCY_DAYS)

        ranked = sorted(survivors, key=score, reverse=True)
        for fact in ranked[settings.max_facts_per_user :]:
            doomed[fact.uuid] = "over the per-user cap"
    return list(doomed.items())


class Pruner:
    def __init__(self, settings: Settings, redis: aioredis.Redis, backend: MemoryBackend) -> None:
        self.settings = settings
        self.redis = redis
        self.backend = backend
        self.audit = AuditLog(redis, settings)
        self.cache = ContextCache(settings)
        self.registry = IdentityRegistry(redis, settings)

    async def prune_user(
        self, *, app: str, user_id: str, user: UserRef, dry_run: bool = True
    ) -> PruneReport:
        facts = await self.backend.list_facts(user=user)
        if not self.settings.prune_zep_edges:  # only what we wrote, unless opted in
            facts = [f for f in facts if not f.extracted]
        doomed = plan(facts, self.settings, datetime.now(UTC))
        report = PruneReport(dry_run=dry_run, pruned=doomed, kept=len(facts) - len(doomed))
        if dry_run or not doomed:
            return report
        for fact_uuid, _ in doomed:
            await self.backend.delete_memory(user=user, memory_uuid=fact_uuid)
        await self.cache.invalidate(
            self.redis, app=app, user_id=user_id, graph_uuid=user.graph_uuid
        )
        who = digest(app, user_id)
        await self.audit.record(
            [Entry("prune", "delete_fact", who, reason, key=uuid) for uuid, reason in doomed]
        )
        return report

    async def prune_all(self, *, dry_run: bool = True) -> PruneReport:
        """Every user the registry knows."""
        total = PruneReport(dry_run=dry_run)
        async for known in self.registry.users():
            report = await self.prune_user(
                app=known.app, user_id=known.user_id, user=known.user, dry_run=dry_run
            )
            total.pruned += report.pruned
            total.kept += report.kept
        return total
