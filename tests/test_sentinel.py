"""Sentinel: the product on a real Sentinel set the suite starts (a master with a password,
a replica, three sentinels on free ports) — the write and read paths, the CLI, dead
letters and forget — and a master SIGKILLed in the middle of an agent's traffic, with
nothing lost, doubled or reordered."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from afterthought import connections
from afterthought.agent_hooks import create_callbacks
from afterthought.connections import FAILURES, connect, sentinel_view
from afterthought.contract import QueuedMessage
from afterthought.keys import Keys
from afterthought.queue import NotReplicated, ThreadQueue
from afterthought.settings import Settings
from afterthought.testing import Fault, ZepFake
from afterthought.testing.stand_in_model import memory_lines
from afterthought.testing.topologies import HOST, SentinelSet, have_redis_server
from tests.adk_support import APP, make_runner, new_session, say
from tests.conftest import drain, failover_in_traffic, queued, run_cli
from tests.redelivery_support import flusher

pytestmark = pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed")

ADDS = "POST /threads/.*/messages"


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelSet]:
    with SentinelSet(password="data-nodes-secret") as topology:
        yield topology


@pytest.fixture
def settings(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, sentinel: SentinelSet
) -> Settings:
    return make_settings(
        redis_url=sentinel.url,
        backend="zep",
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
        redis_wait_replicas=1,
    )


def _cli(settings: Settings, *args: str) -> tuple[int, str]:
    done = run_cli(settings, *args)
    assert "Traceback" not in done.stderr and "data-nodes-secret" not in done.stderr
    return done.returncode, done.stdout


async def test_the_write_and_read_paths_dead_letters_and_forget_run_on_sentinel(
    settings: Settings, zep_fake: ZepFake
) -> None:
    runner, model = make_runner(create_callbacks(settings=settings))
    first = await new_session(runner, "alice")
    for line in ("I live in Lisbon.", "I like green tea.", "I work at Acme."):
        await say(runner, "alice", first, line)
    await drain(settings)
    said = [m["content"] for m in zep_fake.messages() if m["role"] == "user"]
    assert said == ["I live in Lisbon.", "I like green tea.", "I work at Acme."]  # in order
    code, out = _cli(settings, "status", "--json")
    found = json.loads(out)
    assert (found["queue"]["messages"], found["dead_letters"]) == (0, 0)

    await say(runner, "alice", await new_session(runner, "alice"), "Where do I live?")
    assert any("Lisbon" in line for line in memory_lines(model.requests[-1]))  # read path
    await drain(settings)

    zep_fake.inject(Fault(match=ADDS, status=400, times=100))  # refused: dead letters
    await say(runner, "alice", first, "Refused for now.")
    await drain(settings)
    code, out = _cli(settings, "dlq", "list", "--json")
    assert code == 0 and len(json.loads(out)) == 2  # the line and its reply
    zep_fake.faults.clear()
    assert _cli(settings, "dlq", "replay", "--all")[0] == 0
    await drain(settings)
    said = [m["content"] for m in zep_fake.messages() if m["role"] == "user"]
    assert said.count("Refused for now.") == 1  # replayed, once

    assert _cli(settings, "forget", "--app", APP, "--user", "alice", "--yes")[0] == 0
    await say(runner, "alice", await new_session(runner, "alice"), "Where do I live?")
    assert memory_lines(model.requests[-1]) == []
    await runner.close()


async def test_the_sentinels_view_names_the_master_and_every_replica_to_wait_for(
    sentinel: SentinelSet, redis: aioredis.Redis
) -> None:
    """What a write with ``redis_wait_replicas`` must reach, as the sentinels say: their
    master (agreed, no failover under way) and each replica they see up; nothing for a
    client that is not a Sentinel one."""
    client = connect(sentinel.url)
    try:
        view = await sentinel_view(client)
    finally:
        await client.aclose()
    assert view is not None and view.master == sentinel.master_address()
    host, port = view.master
    replicas = {(host, p) for p in sentinel.data_ports if p != port}
    assert view.replicas == replicas and view.masters == {view.master} and not view.down
    assert await sentinel_view(redis) is None


@pytest.mark.timeout(120)
async def test_a_write_the_old_master_takes_after_a_promotion_does_not_count(
    make_settings: Callable[..., Settings],
) -> None:
    """The handover's window, step by step: a replica is promoted (``REPLICAOF NO ONE``)
    while the other still follows the old master, which takes a write and has it
    acknowledged by that other replica — ``WAIT 1`` says 1. Then the other replica and
    the old master follow the new master, and the write is gone: it must not have counted.
    The sentinels are paused so that nothing moves but the steps (their view from before
    the promotion is all a client has)."""
    with SentinelSet(replicas=2) as topology:
        settings = make_settings(redis_url=topology.url, redis_wait_replicas=1, enqueue_timeout=1.0)
        client = connect(settings.redis_url, timeout=1.0)
        queue = ThreadQueue(client, settings)
        first, second = queued("before", 1), queued("in the window", 2)
        try:
            assert await queue.enqueue([first], now_ms=1) == 1  # both replicas hold it
            host, old = topology.master_address()
            promoted, other = (p for p in topology.data_ports if p != old)
            topology.pause_sentinels()
            nodes = {p: redis.Redis(host=host, port=p) for p in topology.data_ports}
            nodes[promoted].replicaof("NO", "ONE")
            await _refused_then_wiped(queue, second, nodes, old=old, promoted=promoted, other=other)
        finally:
            topology.resume_sentinels()
            await client.aclose()


@pytest.mark.timeout(120)
async def test_a_write_the_old_master_takes_while_a_sentinel_is_silent_does_not_count(
    make_settings: Callable[..., Settings],
) -> None:
    """The window once the sentinels that answer have switched to the promoted replica,
    while one is silent (slow, cut off) and the other replica still follows the old master
    (its re-pointing not done: the leader's link to it was down, say, and the failover
    ended at its timeout). Not every sentinel answered, so the view is not settled and
    names no master; the ones that answered list only the promoted replica's followers:
    none. The old master still has the other replica acknowledge a write — and the write
    is gone once everyone follows the promoted replica: it must not count."""
    with SentinelSet(replicas=2) as topology:
        settings = make_settings(redis_url=topology.url, redis_wait_replicas=1, enqueue_timeout=1.0)
        client = connect(settings.redis_url, timeout=1.0)
        first, second = queued("before", 1), queued("in the window", 2)
        try:
            # Both replicas hold it, and the client's pool keeps its connection to the master.
            assert await ThreadQueue(client, settings).enqueue([first], now_ms=1) == 1
            host, old = topology.master_address()
            promoted, other = (p for p in topology.data_ports if p != old)
            *answering, silent = topology.sentinels
            topology.pause_sentinels([silent])
            for sentinel in answering:  # as after the leader's switch, seen by these two
                with redis.Redis(*sentinel) as s:
                    s.execute_command("SENTINEL", "REMOVE", topology.service)
                    s.execute_command("SENTINEL", "MONITOR", topology.service, host, promoted, 2)
            nodes = {p: redis.Redis(host=host, port=p) for p in topology.data_ports}
            nodes[promoted].replicaof("NO", "ONE")
            queue = ThreadQueue(client, settings)  # no view yet: it asks the sentinels now
            await _refused_then_wiped(queue, second, nodes, old=old, promoted=promoted, other=other)
        finally:
            topology.resume_sentinels([silent])
            await client.aclose()


#: How the sentinels list the replica being promoted in the window, as Redis 7.0 answers
#: (leader's flags, the others'): promoting it, the leader kills its clients, every
#: sentinel's link to it among them, so each lists it disconnected until it reconnects;
#: cut off longer, they have it down, and only the leader's mark says it is promoted.
IN_THE_WINDOW = {
    "reconnecting": (("disconnected", "promoted"), ("disconnected",)),
    "cut off": (("s_down", "disconnected", "promoted"), ("s_down", "disconnected")),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("window", list(IN_THE_WINDOW))
async def test_a_write_the_old_master_takes_while_the_sentinels_lost_the_promoted_one_is_refused(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch, window: str
) -> None:
    """The window as the sentinels answer in it (``IN_THE_WINDOW``): the leader failing
    the master over, the promoted replica disconnected (or down) at every sentinel, the
    other replica still following the old master and acknowledging what it takes. Were
    a replica that no sentinel is connected to left out as one no failover can promote,
    that other replica would be all that must hold the write — gone as it resyncs from
    the promoted one (how the handover run lost 15 of 400, as far as its logs tell)."""
    with SentinelSet(replicas=2) as topology:
        settings = make_settings(redis_url=topology.url, redis_wait_replicas=1, enqueue_timeout=1.0)
        client = connect(settings.redis_url, timeout=1.0)
        first, second = queued("before", 1), queued("in the window", 2)
        try:
            assert await ThreadQueue(client, settings).enqueue([first], now_ms=1) == 1
            host, old = topology.master_address()
            promoted, other = (p for p in topology.data_ports if p != old)
            leader_flags, other_flags = IN_THE_WINDOW[window]
            answers = {}
            for i, (sentinel_host, port) in enumerate(topology.sentinels):
                with redis.Redis(sentinel_host, port) as sentinel:
                    master = sentinel.sentinel_master(topology.service)
                    entries = sentinel.sentinel_slaves(topology.service)
                if i == 0:
                    master = _flagged(master, "failover_in_progress", "force_failover")
                flags = leader_flags if i == 0 else other_flags
                answers[port] = (
                    master,
                    [_flagged(e, *flags) if e["port"] == promoted else e for e in entries],
                )

            async def in_the_window(
                sentinel: aioredis.Redis, service: str
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
                return answers[sentinel.connection_pool.connection_kwargs["port"]]

            topology.pause_sentinels()  # nothing moves but the steps
            monkeypatch.setattr(connections, "_sentinel_answer", in_the_window)
            nodes = {p: redis.Redis(host=host, port=p) for p in topology.data_ports}
            nodes[promoted].replicaof("NO", "ONE")
            queue = ThreadQueue(client, settings)  # no view yet: it reads the window's
            await _refused_then_wiped(queue, second, nodes, old=old, promoted=promoted, other=other)
        finally:
            topology.resume_sentinels()
            await client.aclose()


def _flagged(entry: dict[str, Any], *flags: str) -> dict[str, Any]:
    """A sentinel's entry for an instance with ``flags`` added, as redis-py parses it."""
    names = [*entry["flags"].split(","), *flags]
    marks = {"is_sdown": "s_down", "is_odown": "o_down", "is_disconnected": "disconnected"}
    return {**entry, "flags": ",".join(names), **{k: v in names for k, v in marks.items()}}


@pytest.mark.timeout(120)
async def test_a_thread_the_old_master_registers_after_a_promotion_does_not_count(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    """The window again, for the worker's record of a session's new thread: a worker whose
    connection still reaches the old master provisions a session there, and the record is
    wiped as the old master follows the new one. Had it counted, the batch would have been
    stored in a thread the session's map never names (the handover run lost a session so)."""
    with SentinelSet(replicas=2) as topology:
        settings = make_settings(
            redis_url=topology.url,
            redis_wait_replicas=1,
            backend="zep",
            zep_api_key="test-key",
            zep_base_url=zep_fake.base_url,
        )
        worker = flusher(settings)
        registry = worker.registry
        try:
            _, before, _ = await registry.ensure_thread(  # every replica holds it
                worker.backend, app=APP, user_id="alice", session_id="before"
            )
            host, old = topology.master_address()
            promoted, other = (p for p in topology.data_ports if p != old)
            topology.pause_sentinels()
            nodes = {p: redis.Redis(host=host, port=p) for p in topology.data_ports}
            nodes[promoted].replicaof("NO", "ONE")
            with pytest.raises(NotReplicated):
                await registry.ensure_thread(
                    worker.backend, app=APP, user_id="alice", session_id="in the window"
                )
            await _follow(nodes, promoted, (other, old))  # as the sentinels would
            keys = Keys.of(settings)
            entry = nodes[promoted].hmget(
                keys.user(APP, "alice"),
                [keys.thread_field(APP, "alice", s) for s in ("before", "in the window")],
            )
            assert entry == [before.encode(), None]  # wiped: it must not have counted
        finally:
            topology.resume_sentinels()
            await worker.backend.aclose()
            await worker.redis.aclose()


async def _refused_then_wiped(
    queue: ThreadQueue,
    message: QueuedMessage,
    nodes: dict[int, redis.Redis],
    *,
    old: int,
    promoted: int,
    other: int,
) -> None:
    """A write the old master takes in the window is refused although the other replica
    acknowledged it, and is gone once every node follows the promoted one."""
    with pytest.raises(NotReplicated):
        await queue.enqueue([message], now_ms=2)
    pending = queue.keys.pending(queue.ref_of(message))
    assert nodes[old].llen(pending) == 2  # the old master took it, and the other
    assert _held_by(nodes[old], other) > 0  # replica acknowledged it

    await _follow(nodes, promoted, (other, old))  # as the sentinels would
    assert [nodes[p].llen(pending) for p in (promoted, other, old)] == [1, 1, 1]


async def _follow(nodes: dict[int, redis.Redis], master: int, ports: tuple[int, ...]) -> None:
    """The nodes on ``ports`` follow the one on ``master``, once each is in sync with it."""
    for port in ports:
        nodes[port].replicaof(HOST, master)
    for port in ports:
        while nodes[port].info("replication")["master_link_status"] != "up":
            await asyncio.sleep(0.02)


def _held_by(master: redis.Redis, replica_port: int) -> int:
    """The offset ``replica_port`` acknowledged to ``master`` (0: not attached)."""
    _, _, replicas = master.execute_command("ROLE")
    return max((int(off) for _, port, off in replicas if int(port) == replica_port), default=0)


def _killed(topology: SentinelSet) -> tuple[str, int]:
    """Killed, and restarted by its supervisor: it comes back as the new master's replica
    (until then, with ``redis_wait_replicas``, writes wait: none is confirmed)."""
    killed = topology.kill_master()
    promoted = topology.wait_failover(killed)
    topology.restart(killed)
    return promoted


def _partitioned(topology: SentinelSet) -> tuple[str, int]:
    """Cut off for longer than the sentinels wait: they promote the replica; the old
    master, thawed, still takes writes from the connections it had until it is demoted."""
    frozen = topology.freeze_master()
    try:
        return topology.wait_failover(frozen)
    finally:
        topology.thaw(frozen)


def _handed_over(topology: SentinelSet) -> tuple[str, int]:
    """``SENTINEL FAILOVER``, nothing killed: the old master takes writes until it is told
    to follow the new one, and a failed attempt's unreplicated record is among them."""
    return topology.wait_failover(topology.hand_over())


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("failover", "seed"),
    [(_killed, 11), (_partitioned, 5), (_partitioned, 11), (_handed_over, 36), (_handed_over, 37)],
    ids=["killed", "partitioned", "partitioned-2", "handed-over", "handed-over-2"],
)
def test_a_failover_in_the_middle_of_traffic_loses_and_doubles_nothing(
    failover: Callable[[SentinelSet], tuple[str, int]], seed: int
) -> None:
    """The chaos run (ADK sessions in a stalling loop, workers in their own processes,
    ambiguous backend faults), with the master killed, cut off or handed over a third of
    the way in; every client finds the promoted replica."""
    with SentinelSet() as topology:
        failover_in_traffic(topology.url, lambda: failover(topology), seed)


HANDOVERS = 3


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [37])
def test_repeated_handovers_with_two_replicas_lose_and_double_nothing(seed: int) -> None:
    """The README's Sentinel set (a master, two replicas, three sentinels, writes confirmed
    by one replica) handed over by ``SENTINEL FAILOVER`` again and again in the middle of
    the agent's and the workers' traffic. In the second or so between the promotion of
    one replica and the sentinels' re-pointing of the other, the old master still takes
    writes and the other replica still acknowledges them: a ``WAIT 1`` there confirms a
    write the new master never had, wiped as that replica resyncs from it."""

    with SentinelSet(replicas=2) as topology:

        def hand_over() -> tuple[str, int]:
            promoted = topology.wait_failover(topology.hand_over())
            topology.wait_settled()  # the old master demoted: the next handover is taken
            return promoted

        # Turns paced so that every handover falls in the middle of the agent's traffic.
        failover_in_traffic(
            topology.url, hand_over, seed, failovers=HANDOVERS, messages=400, think=1.5
        )


def _in_sync(master: redis.Redis, replica_port: int) -> None:
    """Until the replica on ``replica_port`` acknowledged all the master holds."""
    for _ in range(500):
        if _held_by(master, replica_port) >= int(master.info("replication")["master_repl_offset"]):
            return
        time.sleep(0.02)
    raise AssertionError("the replica did not catch up")


@pytest.mark.timeout(150)
async def test_messages_a_failover_to_a_lagging_replica_lost_are_counted_at_the_next_enqueue(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    """Without ``redis_wait_replicas`` a failover may lose what the master accepted last.
    A thread holds a message its one replica holds; the replica stalls (SIGSTOP: a pause,
    a slow disk) while the master takes a burst of other data, two more messages of the
    thread and one of a new thread; the master is SIGKILLed, the replica resumes and is
    promoted without them. The promoted replica's counters went back with the messages:
    the process that saw them accepted finds that at each thread's next enqueue, which
    gets a number past them, and the gap is counted (``lost_messages``)."""
    with SentinelSet(replicas=1) as topology:
        settings = make_settings(redis_url=topology.url, redis_wait_replicas=0)
        client = connect(settings.redis_url, timeout=5.0)
        queue = ThreadQueue(client, settings)
        refs = queue.ref_of(queued("x", 0)), queue.ref_of(queued("x", 0, session="s2"))
        try:
            assert await queue.enqueue([queued("kept", 1)], now_ms=1) == 1
            _, old = topology.master_address()
            (replica,) = (p for p in topology.data_ports if p != old)
            master = redis.Redis(port=old)
            _in_sync(master, replica)
            topology.freeze(replica)
            for i in range(40):  # more than the loopback socket buffers hold
                master.set(f"{settings.key_prefix}:filler:{i}", b"x" * (1 << 20), ex=600)
            for n in (2, 3):
                assert await queue.enqueue([queued(f"gone {n}", n)], now_ms=n) == 1
            assert await queue.enqueue([queued("gone 4", 4, session="s2")], now_ms=4) == 1
            assert topology.kill_master() == old
            topology.thaw(replica)
            topology.wait_failover(old, timeout=60)

            promoted = redis.Redis(port=replica)
            held = [promoted.llen(queue.keys.pending(ref)) for ref in refs]
            if held == [3, 1]:
                pytest.skip("the replica got everything before the kill: nothing was lost")
            lost = (3 - held[0]) + (1 - held[1])
            for session, n in (("s1", 5), ("s2", 6)):  # each thread's next message
                for _ in range(50):  # once the client found the promoted replica
                    try:
                        await queue.enqueue([queued("next", n, session=session)], now_ms=10)
                        break
                    except FAILURES:
                        await asyncio.sleep(0.2)
            states = await queue.thread_states(list(refs))
            assert sum(state.missing for state in states) == lost
            assert caplog.text.count("redis counter went back") == (held[0] < 3) + (held[1] < 1)
        finally:
            await client.aclose()


def _sees_down(sentinel: tuple[str, int], service: str, port: int) -> bool:
    with redis.Redis(*sentinel) as client:
        entries = client.sentinel_slaves(service)
    return any(int(e["port"]) == port and e["is_sdown"] for e in entries)


@pytest.mark.timeout(120)
async def test_a_frozen_replica_holds_writes_up_only_until_the_sentinels_mark_it_down(
    make_settings: Callable[..., Settings],
) -> None:
    """The README's set (a master, two replicas, three sentinels, ``redis_wait_replicas``
    1). One replica stops answering without closing its connection (a frozen process, a
    host cut off): its master lists it until ``repl-timeout`` (60 s), but once every
    sentinel has it down no failover can promote it, so writes need not wait for it."""
    with SentinelSet(replicas=2) as topology:
        # A budget a loaded machine cannot miss: WAIT for the replica left gets half.
        settings = make_settings(redis_url=topology.url, redis_wait_replicas=1)
        client = connect(settings.redis_url, timeout=5.0)
        queue = ThreadQueue(client, settings)
        try:
            assert await queue.enqueue([queued("before", 1)], now_ms=1) == 1
            _, master = topology.master_address()
            frozen = next(p for p in topology.data_ports if p != master)
            topology.freeze(frozen)
            try:
                for _ in range(600):  # the sentinels take down-after-milliseconds (1 s)
                    if all(
                        _sees_down(sentinel, topology.service, frozen)
                        for sentinel in topology.sentinels
                    ):
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("the sentinels did not mark the frozen replica down")
                # The queue's view is older than the freeze: it asks again, and is told.
                for n in range(5):
                    assert await queue.enqueue([queued(f"w{n}", 10 + n)], now_ms=10) == 1
            finally:
                topology.thaw(frozen)
        finally:
            await client.aclose()
