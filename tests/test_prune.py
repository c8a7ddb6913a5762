"""Pruning: the plan for each rule, and a dry run that changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import redis.asyncio as aioredis

from afterthought.backends import open_backend
from afterthought.facts import StoredFact
from afterthought.identity import IdentityRegistry
from afterthought.keys import Keys
from afterthought.settings import Settings
from afterthought.worker.prune import Pruner, plan
from tests.adk_support import APP
from tests.test_synthesis import _session

NOW = datetime(2026, 11, 29, tzinfo=UTC)


def _fact(uuid: str, predicate: str, value: str, *, days: float, **extra: object) -> StoredFact:
    values: dict[str, object] = {
        "uuid": uuid,
        "subject": "user",
        "predicate": predicate,
        "value": value,
        "kind": "preference",
        "importance": 0.5,
        "trust": "user",
        "valid_at": (NOW - timedelta(days=days)).isoformat(),
        "invalid_at": None,
        "source_keys": [uuid],
    }
    values.update(extra)
    return StoredFact(**values)  # type: ignore[arg-type]


def test_each_rule_prunes_what_it_should(local_settings: Settings) -> None:
    settings = Settings.model_validate(
        {**local_settings.model_dump(), "fact_ttl_days": {"ephemeral": 7}, "max_facts_per_user": 3}
    )
    facts = [
        _fact(
            "old-city",
            "lives_in",
            "Lisbon",
            days=90,
            invalid_at=(NOW - timedelta(days=60)).isoformat(),
        ),
        _fact(
            "new-old", "lives_in", "Oslo", days=5, invalid_at=(NOW - timedelta(days=1)).isoformat()
        ),
        _fact("mood", "feels", "tired", days=10, kind="ephemeral"),
        _fact("trivia", "likes", "trivia", days=400, importance=0.2),
        _fact("tea1", "likes", "the genmaicha", days=20),
        _fact("tea2", "likes", "Genmaicha!", days=2),
        _fact("a", "likes", "a", days=1, importance=0.9),
        _fact("b", "likes", "b", days=300, importance=0.1),
        _fact("c", "likes", "c", days=1, importance=0.8),
    ]
    reasons = dict(plan(facts, settings, NOW))
    assert reasons == {
        "old-city": "superseded",
        "mood": "ttl ephemeral",
        "trivia": "stale",
        "tea1": "near-duplicate",
        "b": "over the per-user cap",
    }  # "new-old" is superseded but within its grace period


async def test_a_dry_run_changes_nothing_and_a_real_run_deletes_and_audits(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    settings = Settings.model_validate({**local_settings.model_dump(), "superseded_grace_days": 0})
    await _session(settings, "I live in Lisbon.")
    await _session(settings, "I moved to Porto.")  # Lisbon superseded, past a grace of 0
    backend = open_backend(settings)
    user = await IdentityRegistry(redis, settings).lookup_user(app=APP, user_id="alice")
    assert user is not None
    before = await backend.list_facts(user=user)

    dry = await Pruner(settings, redis, backend).prune_all()
    assert dry.dry_run and [r for _, r in dry.pruned] == ["superseded"]
    assert await backend.list_facts(user=user) == before

    done = await Pruner(settings, redis, backend).prune_all(dry_run=False)
    assert done.pruned == dry.pruned
    assert [f.value for f in await backend.list_facts(user=user)] == ["Porto"]
    ops = [f[b"op"] for _, f in await redis.xrange(Keys(settings.key_prefix).audit)]
    assert ops.count(b"delete_fact") == 1
    await backend.aclose()
