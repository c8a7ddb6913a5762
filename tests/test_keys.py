"""The key layout: flat names unchanged, and with virtual shards every key a multi-key
script touches for one user in that user's shard's slot, shards spread evenly over slots."""

from __future__ import annotations

from collections import Counter

import pytest
from redis.crc import key_slot

from afterthought.contract import thread_key
from afterthought.keys import Keys, shard_tags

USERS = [("app", f"user-{i}") for i in range(10_000)]


def _slot(key: str) -> int:
    return key_slot(key.encode())


def test_the_flat_layout_keeps_every_name_it_always_had() -> None:
    keys = Keys("afterthought")
    tk = thread_key(app="a", user_id="u", session_id="s")
    assert keys.thread_ref("a", "u", "s") == tk
    assert keys.pending(tk) == f"afterthought:pending:{tk}"
    assert keys.lease(tk) == f"afterthought:lease:{tk}"
    assert keys.ready() == "afterthought:ready"
    assert keys.depth() == "afterthought:depth"
    assert keys.dead() == "afterthought:dead"
    assert keys.epoch("a", "u").startswith("afterthought:epoch:")
    assert keys.shard_ids == (None,)


@pytest.mark.parametrize("shards", [1, 3, 16, 48])
def test_a_users_keys_share_its_shards_slot(shards: int) -> None:
    keys = Keys("afterthought", shards)
    for app, user in USERS[:300]:
        ref = keys.thread_ref(app, user, "session")
        shard = keys.shard_of(app, user)
        assert keys.shard_of_ref(ref) == shard
        together = [
            keys.pending(ref),
            keys.thread(ref),
            keys.seen(ref),
            keys.lease(ref),
            keys.ready(shard),
            keys.depth(shard),
            keys.dead(shard),
            keys.lost(shard),
            keys.epoch(app, user),
            keys.forgetting(app, user),
            keys.user_threads(app, user),
            keys.user(app, user),
            keys.session(app, user, "session"),
            keys.context_user(app, user),
            keys.context_thread(app, user, "session"),
            keys.context_index(app, user),
            keys.tombstones(app, user),
            keys.synthesized(app, user),
            keys.synthesizing(app, user),
        ]
        assert len({_slot(k) for k in together}) == 1, together


@pytest.mark.parametrize("shards", [3, 12, 48])
def test_shards_fall_evenly_on_three_masters(shards: int) -> None:
    """Slots split in three equal ranges, as ``redis-cli --cluster create`` does: each
    master owns a third of the shards, and of 10,000 users within 20 % of a third."""
    keys = Keys("deploy-x", shards)
    third = 16384 / 3
    masters = Counter(int(_slot(tag) // third) for tag in shard_tags("deploy-x", shards))
    assert sorted(masters.values()) == [shards // 3] * 3
    users = Counter(int(_slot(keys.epoch(a, u)) // third) for a, u in USERS)
    assert all(abs(n - len(USERS) / 3) <= 0.2 * len(USERS) / 3 for n in users.values()), users


def test_a_reference_from_another_layout_is_refused() -> None:
    flat, sharded = Keys("p"), Keys("p", 8)
    with pytest.raises(ValueError, match="flat layout"):
        flat.pending(sharded.thread_ref("a", "u", "s"))
    with pytest.raises(ValueError, match="8 shards"):
        sharded.pending(flat.thread_ref("a", "u", "s"))
    with pytest.raises(ValueError, match="8 shards"):
        sharded.pending("9/" + flat.thread_ref("a", "u", "s"))
