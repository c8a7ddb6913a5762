"""The Sentinel and Cluster test topologies themselves, driven with plain redis-py: they
start healthy, fail over, and come back, as the tests of Sentinel and Cluster support
will rely on."""

from __future__ import annotations

import random
import socket
import tempfile
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from afterthought.testing.redis_server import listening
from afterthought.testing.topologies import ClusterSet, SentinelSet, have_redis_server

pytestmark = pytest.mark.skipif(
    not have_redis_server(), reason="needs redis-server and redis-cli on PATH"
)


def _cluster_client(c: ClusterSet, password: str | None = None) -> RedisCluster:
    # No CLIENT SETINFO per connection: keeps the nodes' command counts to the workload.
    return RedisCluster(
        host="127.0.0.1",
        port=c.nodes[0],
        password=password,
        decode_responses=True,
        lib_name=None,
        lib_version=None,
    )


def _write_replicated(client: RedisCluster, keys: dict[str, str]) -> None:
    for key, value in keys.items():
        client.set(key, value)
    # WAIT counts the replicas that have the connection's writes: one connection per node
    # here, as the client is used from one thread.
    for node in client.get_primaries():
        assert client.execute_command("WAIT", 1, 1000, target_nodes=node) == 1


def test_urls_name_three_addresses_and_the_password() -> None:
    s = SentinelSet(service="svc", password="p@ss")
    hosts = ",".join(f"127.0.0.1:{port}" for _, port in s.sentinels)
    assert s.url == f"redis+sentinel://:p%40ss@{hosts}/svc/0"
    assert SentinelSet().url.startswith("redis+sentinel://127.0.0.1:")
    assert SentinelSet().url.endswith("/afterthought/0")
    c = ClusterSet()
    assert c.url == "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in c.nodes[:3]) + "/0"
    assert ClusterSet(password="pw").url.startswith("redis+cluster://:pw@127.0.0.1:")


def test_sentinel_fails_over_to_the_replica_with_its_data() -> None:
    with SentinelSet() as s:
        sentinel = Sentinel(s.sentinels, socket_timeout=2)
        master = sentinel.master_for(s.service, socket_timeout=2)
        master.set("before", "kept")
        assert master.get("before") == b"kept"
        assert master.execute_command("WAIT", 1, 1000) == 1
        before = s.master_address()

        old = s.kill_master()
        assert old == before[1]
        after = s.wait_failover(old)
        assert after != before
        assert s.master_address() == after

        master = Sentinel(s.sentinels, socket_timeout=2).master_for(s.service, socket_timeout=2)
        assert master.get("before") == b"kept"
        master.set("after", "written")
        assert master.get("after") == b"written"

        s.restart(old)
        assert s.master_address() == after  # the old master came back as a replica
        assert master.execute_command("WAIT", 1, 1000) == 1
        replica = redis.Redis(host="127.0.0.1", port=old, decode_responses=True)
        assert replica.get("after") == "written"
        replica.close()


def test_sentinel_with_a_password() -> None:
    with SentinelSet(password="s3cret") as s:
        master = Sentinel(s.sentinels).master_for(s.service, password="s3cret")
        master.set("k", "v")
        assert master.get("k") == b"v"
        with pytest.raises(redis.AuthenticationError):
            Sentinel(s.sentinels).master_for(s.service).ping()


def test_cluster_keys_survive_a_manual_failover() -> None:
    with ClusterSet() as c:
        client = _cluster_client(c)
        keys = {f"key:{i}": str(i) for i in range(100)}
        for key, value in keys.items():
            client.set(key, value)
        assert len({client.keyslot(key) for key in keys}) == 100
        assert len({client.get_node_from_key(key).port for key in keys}) == 3
        assert [client.get(key) for key in keys] == list(keys.values())

        masters = c.masters()
        assert len(masters) == 3
        assert set(masters) | {c.replica_of(m) for m in masters} == set(c.nodes)
        old = masters[0]
        new = c.failover(old)
        assert new not in masters
        assert sorted([*masters[1:], new]) == c.masters()
        assert c.replica_of(new) == old
        assert [client.get(key) for key in keys] == list(keys.values())
        client.close()


def test_cluster_keys_survive_a_killed_master() -> None:
    with ClusterSet() as c:
        client = _cluster_client(c)
        keys = {f"key:{i}": str(i) for i in range(100)}
        _write_replicated(client, keys)

        old = c.masters()[0]
        heir = c.replica_of(old)
        c.kill_master(old)
        assert not listening("127.0.0.1", old)
        assert c.wait_promoted(old) == heir
        masters = c.masters()
        assert len(masters) == 3
        assert heir in masters
        assert old not in masters
        assert [client.get(key) for key in keys] == list(keys.values())

        c.restart(old)
        assert c.replica_of(heir) == old
        assert c.masters() == masters
        client.close()


def test_cluster_counts_commands_per_master() -> None:
    with ClusterSet() as c:
        client = _cluster_client(c)
        client.ping(target_nodes=RedisCluster.ALL_NODES)
        # Seeded: with 300 truly random keys a master's share would leave ±20 % of a
        # third about once in 25 runs.
        rng = random.Random(7)
        keys = [f"k{rng.getrandbits(64):x}" for _ in range(300)]
        c.reset_stats()
        for key in keys:
            client.set(key, "v")

        expected = dict.fromkeys(c.masters(), 0)
        for key in keys:
            expected[client.get_node_from_key(key).port] += 1
        assert {port: c.commandstats(port).get("set", 0) for port in expected} == expected
        executed = c.executed_by_master()
        assert executed == expected
        for calls in executed.values():
            assert abs(calls / 300 - 1 / 3) <= 0.2 / 3
        client.close()


def test_cluster_with_a_password() -> None:
    with ClusterSet(password="s3cret") as c:
        client = _cluster_client(c, password="s3cret")
        for i in range(30):
            client.set(f"k{i}", i)
        assert [client.get(f"k{i}") for i in range(30)] == [str(i) for i in range(30)]
        client.close()


def _children() -> set[int]:
    return {
        int(pid)
        for task in Path("/proc/self/task").iterdir()
        for pid in (task / "children").read_text().split()
    }


def test_a_failed_start_stops_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = _children()
    s = SentinelSet()
    (_, taken_port), *others = s.sentinels
    with socket.socket() as taken:
        # The data nodes start; the first sentinel cannot bind its port.
        taken.bind(("127.0.0.1", taken_port))
        taken.listen()
        with pytest.raises(RuntimeError, match=f"port {taken_port} exited"):
            s.start()
    assert _children() == before
    assert not any(listening(host, port) for host, port in others)
    assert list(tmp_path.iterdir()) == []
