"""Redis Cluster: the queue on a real cluster the suite starts (three masters, a replica
each, on free ports), with arq's jobs on the shared standalone Redis under the test's own
prefix — the write path through a real worker process, dead letters and their replay,
status per shard, ``WAIT`` on the master that took the write, the processes a
deployment must refuse (one configured with another number of shards, one that
addresses a cluster node as a standalone Redis), and a master failing over in the middle
of traffic."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import redis
from redis.asyncio.cluster import RedisCluster

from afterthought.connections import FAILURES, connect
from afterthought.contract import QueuedMessage
from afterthought.enqueue import Enqueuer
from afterthought.keys import Keys
from afterthought.queue import NotReplicated, ThreadQueue
from afterthought.settings import Settings
from afterthought.testing import Fault, ZepFake
from afterthought.testing.processes import spawn_worker, wait_settled
from afterthought.testing.topologies import ClusterSet, have_redis_server
from tests.conftest import REDIS_URL, drain, failover_in_traffic, run_cli

pytestmark = pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed")

APP = "clustered"
SHARDS = 8
ADDS = "POST /threads/.*/messages"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterSet]:
    with ClusterSet() as topology:
        yield topology


@pytest.fixture
def settings(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, cluster: ClusterSet
) -> Settings:
    return make_settings(
        redis_url=cluster.url,
        redis_shards=SHARDS,
        arq_redis_url=REDIS_URL,  # arq cannot use a cluster: its jobs go to the shared Redis
        backend="zep",
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
    )


def said(user: str, n: int, *, session: str = "s1") -> QueuedMessage:
    return QueuedMessage.build(
        app=APP,
        user_id=user,
        session_id=session,
        invocation_id=f"inv-{n}",
        role="user",
        ordinal=0,
        content=f"{user} in {session} says {n}",
    )


def _status(settings: Settings) -> dict[str, object]:
    done = run_cli(settings, "status", "--json")
    assert "Traceback" not in done.stderr
    found: dict[str, object] = json.loads(done.stdout)
    return found


def _prefixed_keys_by_master(cluster: ClusterSet, prefix: str) -> dict[int, int]:
    """How many of the deployment's sharded keys each master holds."""
    found = {}
    for port in cluster.masters():
        with redis.Redis(port=port) as node:
            found[port] = sum(1 for _ in node.scan_iter(match=f"{{{prefix}:*", count=1000))
    return found


async def test_the_write_path_drains_through_a_worker_process_on_the_cluster(
    settings: Settings, zep_fake: ZepFake, cluster: ClusterSet
) -> None:
    users = [f"user{u}" for u in range(24)]
    enqueuer = Enqueuer(settings)
    for n in range(4):
        for user in users:
            for session in ("s1", "s2"):
                assert await enqueuer.enqueue([said(user, n, session=session)])
    await enqueuer.aclose()
    assert enqueuer.dropped == 0
    keys = Keys.of(settings)
    assert len({keys.shard_of(APP, user) for user in users}) == SHARDS

    worker = spawn_worker(settings)
    try:
        assert await wait_settled(settings, timeout=60)
    finally:
        worker.terminate()
        assert worker.wait(30) == 0

    stored = [m["content"] for m in zep_fake.messages()]
    for user in users:  # each thread in the order said, each message once
        for session in ("s1", "s2"):
            theirs = [text for text in stored if text.startswith(f"{user} in {session} ")]
            assert theirs == [f"{user} in {session} says {n}" for n in range(4)]
    found = _status(settings)
    queue = cast(dict[str, int], found["queue"])
    assert (queue["messages"], queue["threads"], found["lost_messages"]) == (0, 0, 0)
    assert found["dead_letters"] == 0 and found["redis_shards"] == SHARDS
    shards = cast(list[dict[str, int]], found["shards"])
    assert [s["shard"] for s in shards] == list(range(SHARDS))
    assert all(s["messages"] == 0 for s in shards)
    spread = _prefixed_keys_by_master(cluster, settings.key_prefix)
    assert len(spread) == 3 and all(spread.values()), spread  # capacity: every master holds some


async def test_dead_letters_are_listed_per_shard_and_replayed(
    settings: Settings, zep_fake: ZepFake
) -> None:
    keys = Keys.of(settings)
    users = ["ana", "bo", "cy", "di"]
    assert len({keys.shard_of(APP, user) for user in users}) > 1
    zep_fake.inject(Fault(match=ADDS, status=400, times=100))  # refused: dead letters
    await _enqueue(settings, *(said(user, 1) for user in users))
    await drain(settings)

    done = run_cli(settings, "dlq", "list", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert sorted(row["thread"] for row in rows) == sorted(
        keys.thread_ref(APP, user, "s1") for user in users
    )
    found = _status(settings)
    assert found["dead_letters"] == len(users)
    by_shard = {s["shard"]: s["dead_letters"] for s in cast(list[dict[str, int]], found["shards"])}
    for shard in range(SHARDS):
        expected = sum(keys.shard_of(APP, user) == shard for user in users)
        assert by_shard[shard] == expected

    holding = sum(1 for n in by_shard.values() if n)
    assert (
        f"shards        {SHARDS}, {holding} holding anything" in run_cli(settings, "status").stdout
    )

    zep_fake.faults.clear()
    # Each replay confirmed on the replica of the master that took it.
    waiting = settings.model_copy(update={"redis_wait_replicas": 1})
    done = run_cli(waiting, "dlq", "replay", "--all")
    assert (done.returncode, done.stdout.strip()) == (
        0,
        "replayed=4 malformed=0 refused=0 forgotten=0 unconfirmed=0",
    )
    await drain(settings)
    stored = [m["content"] for m in zep_fake.messages()]
    assert sorted(stored) == sorted(f"{user} in s1 says 1" for user in users)  # once each
    assert _status(settings)["dead_letters"] == 0


async def test_a_write_waits_for_the_replica_of_the_master_that_took_it(
    settings: Settings, cluster: ClusterSet
) -> None:
    """``WAIT`` must run on the connection that wrote, on the key's master: elsewhere it
    would count replicas holding nothing of this write, and return at once."""
    waiting = settings.model_copy(update={"redis_wait_replicas": 1, "enqueue_timeout": 0.4})
    client = connect(waiting.redis_url)
    queue = ThreadQueue(client, waiting)
    first = said("wren", 1)
    assert await queue.enqueue([first], now_ms=_now_ms()) == 1  # the replica holds it
    pending = queue.keys.pending(queue.ref_of(first))
    master = cast(RedisCluster, client).get_node_from_key(pending).port
    replica = cluster.replica_of(int(master))
    cluster.freeze(replica)
    try:
        with pytest.raises(NotReplicated):
            await queue.enqueue([said("wren", 2)], now_ms=_now_ms())
    finally:
        cluster.thaw(replica)
    assert await client.llen(pending) == 2  # written on the master all the same
    await client.aclose()


async def test_a_process_with_another_number_of_shards_is_refused(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    assert run_cli(settings, "status").returncode in (0, 1)  # records the layout: 8
    other = settings.model_copy(update={"redis_shards": 4})
    for command in (("status",), ("dlq", "list"), ("worker", "--burst")):
        done = run_cli(other, *command)
        assert done.returncode == 2, command
        (line,) = done.stderr.strip().splitlines()
        assert "laid out in 8 shards, this process in 4" in line

    enqueuer = Enqueuer(other)
    with caplog.at_level(logging.ERROR, logger="afterthought.enqueue"):
        assert not await enqueuer.enqueue([said("eve", 1)])
        assert not await enqueuer.enqueue([said("eve", 2)])
    assert (enqueuer.dropped, enqueuer.buffered) == (2, 0)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "laid out in 8 shards" in errors[0]
    await enqueuer.aclose()


async def test_a_flat_process_pointed_at_a_cluster_node_is_refused(
    make_settings: Callable[..., Settings], cluster: ClusterSet
) -> None:
    flat = make_settings(redis_url=f"redis://127.0.0.1:{cluster.masters()[0]}/0")
    for command in (("status",), ("worker", "--burst")):
        done = run_cli(flat, *command)
        assert done.returncode == 2, command
        (line,) = done.stderr.strip().splitlines()
        assert "redis+cluster://" in line and "AFTERTHOUGHT_REDIS_SHARDS" in line
        assert "unreachable" not in line and "cannot reach" not in line
    enqueuer = Enqueuer(flat)
    assert not await enqueuer.enqueue([said("flo", 1)])
    assert (enqueuer.dropped, enqueuer.buffered) == (1, 0)
    await enqueuer.aclose()


async def _enqueue(settings: Settings, *messages: QueuedMessage) -> None:
    client = connect(settings.redis_url)
    try:
        queue = ThreadQueue(client, settings)
        for message in messages:
            assert await queue.enqueue([message], now_ms=_now_ms()) == 1
    finally:
        await client.aclose()


def _now_ms() -> int:
    return int(time.time() * 1000)


async def test_the_read_path_and_forget_run_on_the_cluster(
    settings: Settings, zep_fake: ZepFake
) -> None:
    """A real ADK Runner on the cluster: what the user said is recalled in a new session
    (the cached block, written by the worker in the user's shard), and after a forget
    nothing is; several users, so several shards and masters, and only one forgotten."""
    from afterthought.agent_hooks import create_callbacks
    from afterthought.testing.stand_in_model import memory_lines
    from tests.adk_support import APP as RUNNER_APP
    from tests.adk_support import make_runner, new_session, say

    on_cluster = settings.model_copy(update={"redis_wait_replicas": 1})
    runner, model = make_runner(create_callbacks(settings=on_cluster))
    people = {f"person-{n}": f"I live in city number {n}." for n in range(6)}
    for user, line in people.items():
        await say(runner, user, await new_session(runner, user), line)
    await drain(on_cluster)
    for user, line in people.items():
        await say(runner, user, await new_session(runner, user), "Where do I live?")
        assert any(line.rstrip(".") in seen for seen in memory_lines(model.requests[-1])), user

    done = run_cli(on_cluster, "forget", "--app", RUNNER_APP, "--user", "person-0", "--yes")
    assert done.returncode == 0, done.stderr
    await say(runner, "person-0", await new_session(runner, "person-0"), "Where do I live?")
    assert memory_lines(model.requests[-1]) == []
    await say(runner, "person-1", await new_session(runner, "person-1"), "Where do I live?")
    assert any("city number 1" in seen for seen in memory_lines(model.requests[-1]))
    await runner.close()


def _busiest_master(topology: ClusterSet) -> int:
    """The master that has run the most commands of the traffic so far."""
    done = topology.executed_by_master()
    return max(done, key=lambda port: done[port])


def _handed_over(topology: ClusterSet) -> None:
    """``CLUSTER FAILOVER``: the busiest master's replica takes its slots, coordinated (the
    master's clients are paused until the replica has caught up)."""
    topology.failover(_busiest_master(topology))


def _killed(topology: ClusterSet) -> None:
    """SIGKILL of the busiest master: its replica is elected once the others see it gone
    (what the master took last and had not replicated is lost), then it is started again
    and comes back as the new master's replica."""
    port = _busiest_master(topology)
    topology.kill_master(port)
    topology.wait_promoted(port)
    topology.restart(port)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("failover", "seed"),
    [(_handed_over, 11), (_handed_over, 37), (_killed, 5), (_killed, 36)],
    ids=["failed-over", "failed-over-2", "killed", "killed-2"],
)
def test_a_failover_in_the_middle_of_traffic_loses_and_doubles_nothing(
    failover: Callable[[ClusterSet], None], seed: int
) -> None:
    """The chaos run (ADK sessions in a stalling loop, two worker processes, ambiguous
    backend faults) with its data on the cluster and arq's jobs on a standalone Redis, and
    a master failed over a third of the way in; every client finds the new master."""
    with ClusterSet() as topology:
        failover_in_traffic(
            topology.url,
            lambda: failover(topology),
            seed,
            arq_redis_url=REDIS_URL,
            redis_shards=SHARDS,
        )


async def test_redis_pys_failure_on_a_dropped_connection_is_a_lost_connection(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's cluster client can fail inside itself on a connection another command
    dropped (an AttributeError, seen while a master failed over): the enqueue takes it for
    the lost connection it is and keeps the message to send again, never losing it."""
    from redis.asyncio.cluster import ClusterNode

    real = ClusterNode.execute_command
    cuts = [1]

    async def dropped(self: ClusterNode, *args: object, **kwargs: object) -> object:
        if cuts and args and args[0] == "EVALSHA":
            cuts.pop()
            raise AttributeError("'NoneType' object has no attribute 'writelines'")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(ClusterNode, "execute_command", dropped)
    enqueuer = Enqueuer(settings)
    try:
        assert not await enqueuer.enqueue([said("dora", 1)])
        assert (enqueuer.buffered, enqueuer.dropped) == (1, 0)
    finally:
        await enqueuer.aclose()


async def test_a_client_left_with_no_node_to_start_from_finds_the_cluster_again(
    cluster: ClusterSet,
) -> None:
    """redis-py drops a node from the nodes it starts from each time a command to it fails
    with a lost connection, and refills them only once it has found the cluster again:
    commands failing together while a master fails over left none, and every worker
    failed every command from then on ("at least one reachable node: None", in CI). That
    state, set up directly: the client starts from its configured nodes again."""
    client = cast(RedisCluster, connect(cluster.url))
    try:
        await client.set("{lost-seeds}:k", "v")
        client.nodes_manager.startup_nodes.clear()
        await client.aclose()  # what redis-py does after each lost connection
        assert await client.get("{lost-seeds}:k") == b"v"
    finally:
        await client.delete("{lost-seeds}:k")
        await client.aclose()


async def test_a_script_a_new_master_lacks_runs_there_once(
    cluster: ClusterSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica promoted in a failover lacks its master's scripts, and redis-py loads a
    missing script only on the masters it knows of, which need not be the key's new one:
    every call failed with "no such script" (in CI: 140 messages stuck). Here no master
    has it and redis-py's loading reaches none: the call still runs, once."""
    client = cast(RedisCluster, connect(cluster.url))
    counted = client.register_script("return redis.call('INCR', KEYS[1])")
    key = "{lost-script}:n"
    try:
        for port in cluster.masters():
            redis.Redis(port=port).script_flush()

        async def loaded_elsewhere(*scripts: object) -> str:
            return counted.sha

        monkeypatch.setattr(client, "script_load", loaded_elsewhere)
        assert await counted(keys=[key]) == 1
        assert await client.get(key) == b"1"
        assert await counted(keys=[key]) == 2  # cached where it ran
    finally:
        await client.delete(key)
        await client.aclose()


@pytest.mark.timeout(240)
async def test_a_client_that_learned_the_slots_in_an_outage_has_writes_confirmed_by_two_replicas(
    make_settings: Callable[..., Settings],
) -> None:
    """The README's Cluster: two replicas per master, writes confirmed by one. A master
    is killed, one of its replicas promoted, and a client learns the layout then (a
    process started in the outage, any client after a MOVED): the slot has one replica.
    Then the old master is back as the second replica, in sync. The confirmation needs
    every replica the master's ``ROLE`` lists, so ``WAIT`` must wait for both, not for as
    many as the client's stale slot cache lists (it would return at the first)."""
    with ClusterSet(replicas=2) as cluster:
        settings = make_settings(redis_url=cluster.url, redis_shards=SHARDS, redis_wait_replicas=1)
        probe = said("wren", 0)
        first = connect(settings.redis_url)
        try:
            await first.initialize()
            owner = (
                cast(RedisCluster, first)
                .get_node_from_key(
                    Keys.of(settings).pending(ThreadQueue(first, settings).ref_of(probe))
                )
                .port
            )
        finally:
            await first.aclose()
        cluster.kill_master(int(owner))
        cluster.wait_promoted(int(owner))
        client = connect(settings.redis_url)
        queue = ThreadQueue(client, settings)
        try:
            for n in range(50):  # once the client found the promoted replica
                try:
                    await queue.enqueue([said("wren", 1000 + n)], now_ms=_now_ms())
                    break
                except FAILURES:
                    await asyncio.sleep(0.2)
            cluster.restart(int(owner))  # back as the new master's second replica
            for n in range(50):
                assert await queue.enqueue([said("wren", 2000 + n)], now_ms=_now_ms()) == 1
        finally:
            await client.aclose()
