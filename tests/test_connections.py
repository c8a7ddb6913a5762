"""One client factory: what each URL names, errors that never quote credentials, and a
turn that a client which cannot be built (or a cluster's error) never breaks."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    MovedError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)

from afterthought.agent_hooks import create_callbacks
from afterthought.connections import FAILURES, connect, describe, parse
from afterthought.enqueue import Enqueuer
from afterthought.settings import Settings, SettingsError
from tests.conftest import queued

SENTINEL_URLS = [
    (
        "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster/2",
        [("10.0.0.1", 26379), ("10.0.0.2", 26380)],
        "mymaster",
        2,
        False,
    ),
    ("redis+sentinel://s1/m", [("s1", 26379)], "m", 0, False),
    (
        "rediss+sentinel://:pw@[::1]:5000,[fe80::1]/svc",
        [("::1", 5000), ("fe80::1", 26379)],
        "svc",
        0,
        True,
    ),
]


@pytest.mark.parametrize(("url", "nodes", "service", "db", "tls"), SENTINEL_URLS)
def test_a_sentinel_url_names_its_sentinels_and_service(
    url: str, nodes: list[tuple[str, int]], service: str, db: int, tls: bool
) -> None:
    target = parse(url)
    assert target.topology == "sentinel"
    assert (list(target.nodes), target.service, target.db, target.tls) == (nodes, service, db, tls)


def test_credentials_go_where_they_belong_and_never_into_a_repr_or_message() -> None:
    target = parse("redis+sentinel://app:s3cret@h:1/svc?sentinel_password=s3ntinel")
    assert (target.username, target.password) == ("app", "s3cret")
    assert target.sentinel_auth == {"password": "s3ntinel"}
    assert "s3cret" not in repr(target) and "s3ntinel" not in repr(target)
    assert "s3cret" not in describe("redis://u:s3cret@h:7000/0")
    assert describe("redis+sentinel://u:s3cret@h:1,g:2/svc") == (
        "Redis (Sentinel service 'svc' via h:1,g:2)"
    )


def test_a_cluster_url_names_its_startup_nodes_and_options() -> None:
    target = parse("rediss+cluster://app:s3cret@h:7000,[::1]:7001,g/0?ssl_cert_reqs=none")
    assert target.topology == "cluster" and target.tls
    assert list(target.nodes) == [("h", 7000), ("::1", 7001), ("g", 6379)]
    assert (target.username, target.password) == ("app", "s3cret")
    assert target.options == {"ssl_cert_reqs": "none"}
    assert "s3cret" not in repr(target)
    assert describe("redis+cluster://:s3cret@h:1,g:2") == "Redis Cluster (via h:1,g:2)"
    assert parse("redis+cluster://h:1").password is None


CLUSTER = "redis+cluster://10.0.0.1:7000,10.0.0.2:7000"


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"redis_url": CLUSTER}, "needs redis_shards >= 1"),
        (
            {"redis_url": CLUSTER, "redis_shards": 8, "arq_redis_url": CLUSTER},
            "arq_redis_url must not be a Redis Cluster",
        ),
        ({"arq_redis_url": CLUSTER}, "arq_redis_url must not be a Redis Cluster"),
    ],
)
def test_a_cluster_needs_shards_and_a_redis_of_arqs_own(
    settings: dict[str, Any], says: str
) -> None:
    with pytest.raises(SettingsError, match=says):
        Settings(**settings)
    assert Settings(redis_url=CLUSTER, redis_shards=8, arq_redis_url="redis://a:1").redis_shards


def test_an_agent_on_a_cluster_needs_no_redis_for_arq_and_a_worker_is_told_it_does() -> None:
    agent = Settings(redis_url=CLUSTER, redis_shards=8)  # agents queue; they run no arq jobs
    create_callbacks(settings=agent)
    with pytest.raises(ValueError, match=r"needs arq_redis_url .* in every worker and CLI"):
        print(agent.jobs_redis_url)


BAD_URLS = [
    ("redis+cluster://h:7000/1", "a Redis Cluster has only database 0"),
    ("redis+cluster://h:7000,h:port", "a Cluster URL lists its nodes as host:port"),
    ("rediss+cluster://h:7000?ssl_ca_path=/x", "the Cluster URL takes only the options ssl_"),
    ("http://h:6379", "must start with redis://"),
    ("redis://h:6379/zero", "database (its path) must be a number"),
    ("redis://h:99999/0", "port must be a number"),
    ("redis+sentinel://h:1", "names the service"),
    ("redis+sentinel://h:1//0", "names the service"),
    ("redis+sentinel://h:1/svc/x", "database (after the service)"),
    ("redis+sentinel://h:port/svc", "host:port,host:port"),
    ("redis+sentinel://h:1,/svc", "host:port,host:port"),
    ("redis+sentinel://h:1/svc?ssl_certfile=/x", "takes only the options sentinel_password"),
    # Options redis-py refuses only when it connects: every turn would fail.
    ("rediss://h:6379/0?ssl_cert_reqs=bogus", "options (after ?) must be ones redis-py takes"),
    ("redis://h:6379/0?ssl_cert_reqs=none", "ssl_ options only in rediss://"),
    ("redis://h:6379/0?socket_timeout=soon", "options (after ?) must be ones redis-py takes"),
    ("unix:///run/redis.sock?no_such_option=1", "options (after ?) must be ones redis-py"),
    ("rediss+cluster://h:7000?ssl_cert_reqs=bogus", "ssl_cert_reqs must be none, optional"),
]


def test_a_url_with_options_redis_py_takes_is_accepted() -> None:
    for url in (
        "rediss://h:6379/0?ssl_cert_reqs=none&ssl_ca_certs=/etc/ca.pem",
        "redis://h:6379/0?socket_timeout=2&client_name=agent",
        "unix:///run/redis.sock?db=2",
        "rediss+cluster://h:7000?ssl_cert_reqs=optional",
    ):
        assert Settings(redis_url=url, redis_shards=8).redis_url == url


@pytest.mark.parametrize(("url", "says"), BAD_URLS)
def test_a_url_that_names_no_redis_is_refused_in_words_without_the_url(url: str, says: str) -> None:
    secret = url.replace("//", "//user:pa55word@", 1)
    with pytest.raises(SettingsError) as refused:
        Settings(redis_url=secret)
    assert says in str(refused.value) and "pa55word" not in str(refused.value)
    with pytest.raises(SettingsError, match="arq_redis_url"):
        Settings(arq_redis_url=url)


async def test_building_a_client_connects_nothing() -> None:
    """Building is what a turn does first: it must not reach the network (or fail)."""
    for url in (
        "redis://203.0.113.1:6379/0",
        "redis+sentinel://203.0.113.1:1,203.0.113.2:2/m",
        "redis+cluster://203.0.113.1:1,203.0.113.2:2",
    ):
        client = connect(url, timeout=0.05)
        await client.aclose()


async def test_a_client_that_cannot_be_built_never_reaches_the_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counted as a failed send; the message waits in the buffer."""
    import afterthought.enqueue as enqueue_module

    def unbuildable(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no client")

    monkeypatch.setattr(enqueue_module, "connect", unbuildable)
    enqueuer = Enqueuer(Settings(key_prefix="unit-build", breaker_failures=100))
    assert not await enqueuer.enqueue([queued("first", 1)])
    assert enqueuer.buffered == 1 and enqueuer.breaker.failures == 1
    enqueuer._drainer.stop()


CLUSTER_ERRORS = [
    RedisClusterException("EVALSHA - all keys must map to the same key slot"),
    ClusterError("TTL exhausted."),  # a storm of MOVED / ASK redirections
    ClusterDownError("CLUSTERDOWN The cluster is down"),
    TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
    MovedError("3999 127.0.0.1:6381"),
    SlotNotCoveredError("slot 3999 is not covered"),
    # redis-py's cluster client on a connection another command dropped (a failover)
    AttributeError("'NoneType' object has no attribute 'writelines'"),
]


@pytest.mark.parametrize("error", CLUSTER_ERRORS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("where", ["layout", "script"])
async def test_a_cluster_error_never_reaches_the_turn(error: Exception, where: str) -> None:
    """Whether it strikes the layout check or the enqueue script: a failed send, counted,
    and the message waits in the buffer."""

    class Cluster:
        """A cluster client whose layout check or script fails as ``error``."""

        async def info(self, section: str) -> dict[str, Any]:
            return {}

        async def get(self, key: str) -> bytes:
            if where == "layout":
                raise error
            return b"8"

        async def pexpire(self, key: str, ms: int) -> bool:
            return True  # sharded: the person's key is renewed beside the script

        def register_script(self, script: str) -> Any:
            async def run(**kwargs: Any) -> Any:
                if where == "script":
                    raise error
                return 1

            return run

    settings = Settings(key_prefix="unit-cluster", redis_shards=8)
    clustered = Enqueuer(settings, redis=Cluster())  # type: ignore[arg-type]
    assert not await clustered.enqueue([queued("second", 2)])
    assert clustered.buffered == 1 and clustered.breaker.failures == 1
    assert clustered.dropped == 0
    clustered._drainer.stop()


CANARY = "hunter2canary"
#: A URL urllib cannot split, with the canary as its password, for every URL setting and
#: topology: its own error would quote the host part, password and all.
UNSPLITTABLE = [
    ("REDIS_URL", f"redis://:{CANARY}\uff03@127.0.0.1:6379/0"),
    ("REDIS_URL", f"redis://{CANARY}\uff20:pw@127.0.0.1:6379/0"),
    ("REDIS_URL", f"redis://:{CANARY}@[::1/0"),
    ("AFTERTHOUGHT_REDIS_URL", f"rediss://u:{CANARY}\uff1a@h:6379/0"),
    ("REDIS_URL", f"redis+sentinel://:{CANARY}\uff0f@h:26379/svc"),
    ("REDIS_URL", f"redis+cluster://:{CANARY}\uff1f@h:7000"),
    ("ARQ_REDIS_URL", f"redis://:{CANARY}\uff03@h:6379/0"),
    ("ARQ_REDIS_URL", f"redis+sentinel://:{CANARY}\uff03@h:26379/svc"),
    ("ZEP_BASE_URL", f"https://u:{CANARY}\uff03@api.example.com/api/v4"),
    ("ZEP_BASE_URL", f"https://u:{CANARY}@api.example.com:{CANARY}/api/v4"),
]


@pytest.mark.parametrize(("variable", "url"), UNSPLITTABLE)
def test_a_url_that_cannot_be_split_is_one_line_naming_the_setting_never_the_value(
    variable: str, url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from afterthought import cli

    monkeypatch.setenv(variable, url)
    with pytest.raises(SettingsError) as refused:  # the agent's entry
        create_callbacks()
    said = str(refused.value)
    assert CANARY not in said and "\n" not in said
    assert variable.removeprefix("AFTERTHOUGHT_") in said.upper()
    assert cli.main(["status"]) == cli.USAGE
    out = capsys.readouterr()
    assert CANARY not in out.out + out.err
    assert out.err.count("\n") == 1 and "bad setting" in out.err


SILENT_NAME = "redis.example.internal"
#: One URL of each kind whose connections look a host name up.
NAMED_URLS = [
    f"redis://{SILENT_NAME}:6379/0",
    f"rediss://{SILENT_NAME}:6379/0",
    f"redis+sentinel://{SILENT_NAME}:26379/mymaster",
    f"rediss+sentinel://{SILENT_NAME}:26379/mymaster",
    f"redis+cluster://{SILENT_NAME}:7000",
    f"rediss+cluster://{SILENT_NAME}:7000",
]


@pytest.fixture
def name_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """``SILENT_NAME`` looked up: unanswered until the test ends (a silent name server),
    or, once ``answer`` is set, 127.0.0.1. ``threads`` records who looked it up."""
    real = socket.getaddrinfo
    released = threading.Event()
    seen: dict[str, Any] = {"threads": [], "answer": False}

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != SILENT_NAME:
            return real(host, port, *args, **kwargs)
        seen["threads"].append(threading.current_thread())
        if seen["answer"]:
            return real("127.0.0.1", port, *args, **kwargs)
        released.wait()
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield seen
    released.set()


@pytest.mark.parametrize("url", NAMED_URLS, ids=lambda url: url.partition(":")[0])
def test_a_name_server_that_does_not_answer_holds_no_client_past_its_connect_timeout(
    url: str, name_server: dict[str, Any]
) -> None:
    """The command fails within its connect timeout, and the event loop it ran on (as
    ``asyncio.run``, the agent's) ends while the lookup is still unanswered: asyncio's own
    lookup ran in the loop's default executor, which ``asyncio.run`` waits for at exit."""
    failed: list[BaseException] = []

    async def command() -> None:
        client = connect(url, timeout=0.1)
        try:
            await client.ping()
        except FAILURES as exc:
            failed.append(exc)
        finally:
            await client.aclose()

    loop_thread = threading.Thread(target=asyncio.run, args=(command(),), daemon=True)
    loop_thread.start()
    loop_thread.join(timeout=5)  # only ever reached when the lookup holds the loop
    assert not loop_thread.is_alive() and failed
    assert name_server["threads"] and all(thread.daemon for thread in name_server["threads"])


async def test_a_tls_connection_to_a_name_looked_up_by_us_still_names_the_host(
    name_server: dict[str, Any], tmp_path: Path
) -> None:
    """The connection goes to the address found, and its TLS handshake says the name
    (SNI; a certificate is checked against it), not the address."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subject = ["-subj", f"/CN={SILENT_NAME}", "-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *subject],
        check=True,
        capture_output=True,
    )
    said: list[str | None] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda _socket, name, _context: said.append(name)

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    name_server["answer"] = True
    client = connect(f"rediss://{SILENT_NAME}:{port}/0?ssl_cert_reqs=none", timeout=5)
    with pytest.raises(FAILURES):  # the server hangs up: it speaks no Redis
        await client.ping()
    await client.aclose()
    server.close()
    assert said == [SILENT_NAME]
    assert name_server["threads"] and all(thread.daemon for thread in name_server["threads"])
