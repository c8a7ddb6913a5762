"""Running it: every CLI subcommand as a subprocess against real Redis and the Zep fake,
the status JSON's shape, the metrics endpoint, backfill."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace as types_ns
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from arq import func
from google.adk.events import Event
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService, Session
from google.genai import types
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from afterthought import shared_store
from afterthought.agent_hooks import TurnMemory, create_callbacks
from afterthought.agent_hooks.backfill import Backfill, jsonl_source
from afterthought.backends.base import BackendError
from afterthought.keys import Keys, digest
from afterthought.settings import Settings
from afterthought.testing import ZepFake
from afterthought.testing.cli import run_cli_here
from afterthought.testing.processes import spawn_worker, wait_settled
from afterthought.testing.redis_server import free_port
from afterthought.testing.zep_fake import Fault
from afterthought.worker.pacing import Pacing
from tests.adk_support import APP, make_runner, new_session, say
from tests.conftest import drain, enqueue, queued, run_cli, run_worker_once

ROOT = Path(__file__).resolve().parents[1]

ADDS = "POST /threads/.*/messages"

#: The documented shape of ``status --json`` (README, "Status"): fields may be added to
#: it, never renamed or removed; this test is the contract.
STATUS_SHAPE = {
    "version": int,
    "prefix": str,
    "at": float,
    "queue": {
        "messages": int,
        "threads": int,
        "due": int,
        "leased": int,
        "deferred": int,
        "stranded": int,
        "oldest_age_seconds": (float, type(None)),
        "jobs_waiting": int,
    },
    "dead_letters": int,
    "lost_messages": int,
    "lost_unverified": int,
    "redis_lost_data_at": (float, type(None)),
    "late_copies": int,
    "late_watched": int,
    "pause": {
        "paused": bool,
        "reason": (str, type(None)),
        "resumes_in_seconds": (float, type(None)),
        "rate_limited_for_seconds": (float, type(None)),
    },
    "workers": list,
    "synthesis": {"pending_users": int, "lag_seconds": (float, type(None))},
    "redis": {
        "maxmemory_policy": (str, type(None)),
        "persistence": (str, type(None)),
        "used_memory": (int, type(None)),
        "maxmemory": (int, type(None)),
    },
    "forgets": {"pending": int, "oldest_age_seconds": (float, type(None))},
    "local_stores": int,
    "redis_shards": int,
    "spooled": int,
    "tombstone_keys_unchecked": int,
    "shards": list,
    "problems": list,
}
WORKER_SHAPE = {"id", "last_seen_seconds", "jobs_complete", "jobs_failed", "jobs_retried"}


def assert_shape(value: object, shape: object) -> None:
    if isinstance(shape, dict):
        assert isinstance(value, dict) and set(value) == set(shape), value
        for name, inner in shape.items():
            assert_shape(value[name], inner)
    else:
        assert isinstance(value, shape), (value, shape)  # type: ignore[arg-type]


def status(settings: Settings) -> tuple[int, dict]:  # type: ignore[type-arg]
    done = run_cli_here(settings, "status", "--json")
    assert done.returncode in (0, 1), done.stderr
    found = json.loads(done.stdout)
    assert_shape(found, STATUS_SHAPE)
    return done.returncode, found


async def test_status_reports_queue_dead_letters_pause_and_stranded_threads(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis
) -> None:
    code, empty = status(zep_settings)
    assert code == 1 and empty["problems"] == ["no_workers"]
    assert empty["queue"]["messages"] == 0 and empty["queue"]["oldest_age_seconds"] is None

    await enqueue(zep_settings, queued("secret one", 1), queued("secret two", 2))
    await enqueue(zep_settings, queued("secret three", 3, session="s2"))
    _, found = status(zep_settings)
    queue = found["queue"]
    assert (queue["messages"], queue["threads"], queue["due"]) == (3, 2, 2)
    assert 0 <= queue["oldest_age_seconds"] < 60 and queue["stranded"] == 0

    keys = Keys(zep_settings.key_prefix)
    long_ago = int((time.time() - 3600) * 1000)
    thread = (await redis.zrange(keys.ready(), 0, 0))[0]
    await redis.zadd(keys.ready(), {thread: long_ago})  # due an hour ago, nobody took it
    _, found = status(zep_settings)
    assert found["queue"]["stranded"] == 1 and "stranded_threads" in found["problems"]

    zep_fake.inject(Fault(match=ADDS, status=400, times=10))
    await drain(zep_settings)
    await Pacing(redis, keys, pause_seconds=30).pause(BackendError("unauthorized", code="401"))
    code, found = status(zep_settings)
    assert code == 1 and found["dead_letters"] == 3 and found["queue"]["messages"] == 0
    assert found["pause"]["paused"] and 0 < found["pause"]["resumes_in_seconds"] <= 30
    assert {"dead_letters", "paused"} <= set(found["problems"])

    text = run_cli_here(zep_settings, "status")
    assert text.returncode == 1 and "dead letters  3" in text.stdout
    assert "secret" not in text.stdout  # ids and counts, never content


async def test_a_worker_serves_metrics_and_health_and_shows_in_status(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    port = free_port()
    settings = make_settings(
        backend="zep",
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
        metrics_port=port,
    )
    zep_fake.inject(Fault(match=ADDS, status=503, times=1))
    for n in range(40):
        await enqueue(settings, queued(f"secret message {n}", n, session=f"s{n % 4}"))
    worker = spawn_worker(settings)
    try:
        assert await wait_settled(settings, timeout=60)
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + 30
            while True:  # the queue gauges follow within a refresh
                body = (await http.get(f"{url}/metrics")).text
                samples = {
                    (s.name, tuple(sorted(s.labels.items()))): s.value
                    for family in text_string_to_metric_families(body)
                    for s in family.samples
                }
                settled = samples.get(("afterthought_queue_messages", ())) == 0
                if (settled and samples.get(("afterthought_workers", ())) == 1) or (
                    time.monotonic() > deadline
                ):
                    break
                await asyncio.sleep(0.5)
            health = await http.get(f"{url}/healthz")
        assert health.status_code == 200 and health.json()["ok"] is True

        def value(name: str, **labels: str) -> float:
            return samples.get((name, tuple(sorted(labels.items()))), 0.0)

        assert value("afterthought_job_events_total", function="flush", event="messages") == 40
        assert value("afterthought_jobs_total", function="flush", outcome="ok") >= 1
        assert value("afterthought_retries_total", kind="in_job") >= 1
        assert value("afterthought_batch_size_count") >= 4
        assert value("afterthought_batch_size_sum") >= 40  # the retried call counts again
        ok_adds = value(
            "afterthought_backend_seconds_count", operation="add_messages", outcome="ok"
        )
        failed = value(
            "afterthought_backend_seconds_count", operation="add_messages", outcome="unavailable"
        )
        assert ok_adds >= 4 and failed == 1
        assert value("afterthought_queue_messages") == 0 and value("afterthought_paused") == 0
        assert value("afterthought_workers") == 1
        assert "secret" not in body

        code, found = status(settings)
        assert code == 0 and found["problems"] == []
        (alive,) = found["workers"]
        assert set(alive) >= WORKER_SHAPE and str(worker.pid) in alive["id"]
        assert alive["last_seen_seconds"] <= 11
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def _session(n: int, *, turns: int = 3, at: float = 1_700_000_000.0) -> Session:
    events = []
    for t in range(turns):
        invocation = f"inv-{n}-{t}"
        events.append(
            Event(
                author="user",
                invocation_id=invocation,
                content=types.UserContent(f"session {n} turn {t}"),
                timestamp=at + t,
            )
        )
        events.append(
            Event(
                author="assistant",
                invocation_id=invocation,
                content=types.ModelContent(f"reply {n}.{t}"),
                timestamp=at + t + 0.5,
            )
        )
    return Session(
        id=f"old-{n}", app_name=APP, user_id="alice", events=events, last_update_time=at + turns
    )


class Interrupted(Exception):
    pass


async def test_backfill_resumes_after_interruption_without_duplicating(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis, tmp_path: Path
) -> None:
    export = tmp_path / "sessions.jsonl"
    lines = [_session(n).model_dump_json() for n in range(6)]
    lines.insert(3, '{"not": "a session"}')
    export.write_text("\n".join(lines) + "\n")

    done = 0

    def advance() -> None:  # the operator's Ctrl-C after the third session
        nonlocal done
        done += 1
        if done == 3:
            raise Interrupted

    with pytest.raises(Interrupted):
        await Backfill(zep_settings, redis, jsonl_source(export)).run(advance=advance)
    await drain(zep_settings)  # a worker persisted the first part meanwhile

    resumed = run_cli_here(zep_settings, "backfill", "--jsonl", str(export))
    report = json.loads(resumed.stdout)
    assert resumed.returncode == 1  # done, but one line was skipped: attention
    assert report == {
        "sessions": 3,
        "skipped": 3,
        "messages": 18,
        "malformed": [4],
        "refused": [],
        "dropped": {},
    }
    assert "not" not in resumed.stderr  # the bad line is named by number, not quoted
    again = json.loads(run_cli_here(zep_settings, "backfill", "--jsonl", str(export)).stdout)
    assert (again["sessions"], again["skipped"]) == (0, 6)
    await drain(zep_settings)

    stored = zep_fake.messages()
    assert len(stored) == 36 and len({m["content"] for m in stored}) == 36
    first = [m["content"] for m in stored if m["content"].startswith(("session 0", "reply 0."))]
    assert first == [t for n in range(3) for t in (f"session 0 turn {n}", f"reply 0.{n}")]


async def test_backfill_killed_midway_resumes_without_duplicating(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis, tmp_path: Path
) -> None:
    export = tmp_path / "big.jsonl"
    sessions = 600
    export.write_text(
        "".join(_session(n, turns=2).model_dump_json() + "\n" for n in range(sessions))
    )
    progress = Keys(zep_settings.key_prefix).backfill(digest(f"jsonl:{export.resolve()}"))
    command = [sys.executable, "-m", "afterthought.cli", "backfill", "--jsonl", str(export)]
    running = subprocess.Popen(
        command, env={**os.environ, **zep_settings.as_env()}, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while await redis.hlen(progress) < 100 and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    running.kill()  # SIGKILL: no clean-up, perhaps between queueing a session and marking it
    assert running.wait(timeout=10) == -signal.SIGKILL
    marked = await redis.hlen(progress)
    assert 100 <= marked < sessions

    resumed = run_cli(zep_settings, "backfill", "--jsonl", str(export))
    report = json.loads(resumed.stdout)
    assert report["skipped"] == marked and report["sessions"] == sessions - marked
    await drain(zep_settings, timeout=120)
    stored = [m["content"] for m in zep_fake.messages()]
    assert len(stored) == sessions * 4 and len(set(stored)) == sessions * 4


async def test_backfill_from_an_adk_session_database(
    zep_settings: Settings, zep_fake: ZepFake, tmp_path: Path
) -> None:
    from google.adk.sessions import DatabaseSessionService

    url = f"sqlite+aiosqlite:///{tmp_path / 'sessions.db'}"
    service = DatabaseSessionService(db_url=url)
    for n in range(2):
        session = await service.create_session(app_name=APP, user_id="bob", session_id=f"db-{n}")
        for event in _session(n, turns=2).events:
            await service.append_event(session, event)
    await service.close()

    done = run_cli_here(zep_settings, "backfill", "--db-url", url, "--app", APP, "--no-progress")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["messages"] == 8
    await drain(zep_settings)
    assert len(zep_fake.messages()) == 8
    assert run_cli_here(zep_settings, "backfill", "--db-url", url).returncode == 2  # needs --app


def test_worker_burst_drains_and_logs_json_without_content(local_settings: Settings) -> None:
    asyncio.run(enqueue(local_settings, queued("private words", 1), queued("more", 2)))
    elsewhere = local_settings.model_copy(update={"key_prefix": "not-this-one"})
    done = run_cli(  # --prefix picks the deployment whatever the environment says
        elsewhere,
        *("--log-level", "INFO", "--log-format", "json", "--prefix", local_settings.key_prefix),
        *("worker", "--burst", "--concurrency", "2", "--max-jobs", "3"),
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    flushed = [line for line in lines if line["msg"].startswith("flushed ")]
    assert flushed and flushed[0]["thread"] and flushed[0]["level"] == "info"
    assert "private" not in done.stderr
    assert "alice" not in done.stderr  # arq's job lines hold no user id either
    _, found = status(local_settings)
    assert found["queue"]["messages"] == 0


def test_a_worker_that_cannot_start_says_why_before_it_takes_work(
    local_settings: Settings, tmp_path: Path
) -> None:
    """A metrics port in use, or an embedding model that cannot be loaded: one line and
    the documented code, and the queued message is left for a worker that can run."""
    asyncio.run(enqueue(local_settings, queued("words", 1)))
    with socket.socket() as taken:
        taken.bind((local_settings.metrics_host, 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy = run_cli(local_settings, "worker", "--burst", "--metrics-port", port)
    no_model = local_settings.model_copy(update={"embedding_model": str(tmp_path / "no-model")})
    unloadable = run_cli(no_model, "worker", "--burst")
    for done, code, says in (
        (busy, 2, f"cannot serve metrics on {local_settings.metrics_host}:{port}"),
        (unloadable, 3, "code=embedding_model:"),
    ):
        assert done.returncode == code, done.stderr
        assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert status(local_settings)[1]["queue"]["messages"] == 1


#: Every documented error case of the CLI: (arguments, settings variant, exit code, what
#: stderr says). ``{missing}`` is a file that does not exist. Variants: ``ok`` the test's
#: deployment, ``down`` a Redis nobody listens on (with a password in its URL), ``db99``
#: a database index Redis refuses, ``badprefix`` an invalid setting.
CLI_ERRORS = [
    (("--bogus",), "ok", 2, "unrecognized arguments: --bogus"),
    (("status", "--bogus"), "ok", 2, "unrecognized arguments: --bogus"),
    ((), "ok", 2, "name a COMMAND"),
    (("worker", "--concurrency", "0"), "ok", 2, "--concurrency: must be a whole number"),
    (("worker", "--concurrency", "-3"), "ok", 2, "--concurrency: must be a whole number"),
    (("worker", "--metrics-port", "70000"), "ok", 2, "--metrics-port: must be a port"),
    (("dlq", "list", "--limit", "0"), "ok", 2, "--limit: must be a whole number"),
    (("prune", "--user", "bob"), "ok", 2, "--app and --user go together"),
    (("backfill",), "ok", 2, "one of the arguments --jsonl --db-url is required"),
    (("backfill", "--jsonl", "{missing}"), "ok", 2, "no such file"),
    (("forget", "--app", APP), "ok", 2, "the following arguments are required: --user"),
    (
        ("forget", "--app", APP, "--user", "nobody"),
        "ok",
        1,
        "no user 'nobody' of app 'memtest' in the backend",
    ),
    (("dlq", "purge", "--all"), "ok", 2, "add --yes"),
    # Every dry run of a destructive command exits 2: nothing was changed.
    (("reshard", "--to", "4"), "ok", 2, "would lay the queue out in 4 shards (from 0)"),
    (("prune",), "ok", 2, "a dry run: add --yes to prune"),
    (("prune", "--dry-run", "--yes"), "ok", 2, "a dry run, as --dry-run asks: nothing was"),
    # The index is optional: only the action is missing.
    (("dlq",), "ok", 2, "the following arguments are required: action\n"),
    (("dlq", "replay", "7"), "ok", 1, "no dead letter at index 7 (there are 0"),
    (("dlq", "list", "5"), "ok", 2, "list takes no index"),
    (("dlq", "replay"), "ok", 2, "replay: name letters by index"),
    (("quarantine", "release"), "ok", 2, "release: name the entry"),
    (("dlq", "replay", "1", "--all"), "ok", 2, "name letters or pass --all, not both"),
    (("dlq", "purge", "--id", "5f0c2e91", "--yes"), "ok", 1, "no dead letter with id 5f0c2e91"),
    (("quarantine", "list", "--user", "bob"), "ok", 2, "--user takes APP/USER"),
    (("backfill", "--jsonl", "/dev/null"), "ok", 2, "not a regular file"),
    (("forget", "--app", APP, "--user", "nobody", "--yes"), "ok", 1, "nothing of user"),
    (
        ("forget", "--app", APP, "--user", "nobody", "--fact", "f-1", "--yes"),
        "ok",
        1,
        "no fact f-1 of user 'nobody'",
    ),
    (("forget", "--app", APP, "--user", "nobody", "--query", "tea"), "ok", 1, "no current fact"),
    (("quarantine", "drop", "q-1"), "ok", 1, "no quarantined entry q-1"),
    (("status",), "down", 3, "cannot reach Redis at 127.0.0.1:{port}"),
    (("dlq", "list"), "down", 3, "cannot reach Redis at 127.0.0.1:{port}"),
    (("worker", "--burst"), "down", 3, "cannot reach Redis at 127.0.0.1:{port}"),
    (("demo",), "down", 3, "cannot reach Redis at 127.0.0.1:{port}"),
    (("status",), "db99", 3, "answered with an error"),
    (("status",), "badprefix", 2, "key_prefix"),
    (
        ("status",),
        "badbudget",
        2,
        "retrieval_budget (AFTERTHOUGHT_RETRIEVAL_BUDGET): Input should be a valid number",
    ),
    (("status",), "baddb", 2, "REDIS_URL: the Redis URL's database (its path)"),
    # A check across settings names what to set, never echoing the URLs it read.
    (("status",), "noshards", 2, "bad setting: a Redis Cluster needs redis_shards >= 1"),
    (("--prefix", "shop", "status"), "noshards", 2, "a Redis Cluster needs redis_shards"),
    # An empty id or query never widens a forget to the whole user.
    (("forget", "--app", APP, "--user", "alice", "--query", "", "--yes"), "ok", 2, "--query: must"),
    (("forget", "--app", APP, "--user", "alice", "--fact", " ", "--yes"), "ok", 2, "--fact: must"),
    (
        ("forget", "--app", APP, "--user", "alice", "--query", " ,. ", "--yes"),
        "ok",
        2,
        "--query: must hold a word",
    ),
    (("dlq", "replay", "-1"), "ok", 2, "argument index: must be an index 0 or more"),
    (("forget", "--app", "", "--user", "alice", "--yes"), "ok", 2, "--app: must not be empty"),
    (("prune", "--app", APP, "--user", ""), "ok", 2, "--user: must not be empty"),
    (("dlq", "list", "--limit", "9" * 23), "ok", 2, "--limit: must be a whole number 1-"),
    (("prune", "--app", APP), "ok", 2, "--app and --user go together"),
    (("--prefix", "", "status"), "ok", 2, "--prefix: must be letters"),
    (("status", "--prefix", "a b"), "ok", 2, "--prefix: must be letters"),
    (("forget", "--app", APP, "--user", "\udcff\udcfe"), "ok", 2, "--user: must be valid UTF-8"),
    (("quarantine", "list", "q-1"), "ok", 2, "list takes no id"),
    (("backfill", "--jsonl", "{missing}", "--user", "u"), "ok", 2, "filter a --db-url source"),
    (
        ("backfill", "--db-url", "sqlite+aiosqlite:///{missing}", "--app", APP),
        "ok",
        2,
        "no such database file",
    ),
    # A backend that cannot answer is not a user or fact that names nothing; what failed
    # is named: the store's file and why, the host Zep was not found at (never its key).
    (
        ("forget", "--app", APP, "--user", "alice", "--query", "tea"),
        "nostore",
        3,
        "a-file/memory.sqlite3: cannot create",
    ),
    (("forget", "--app", APP, "--user", "alice"), "nostore", 3, "(a file is in the way)"),
    (("forget", "--app", APP, "--user", "alice"), "notdb", 3, "a-file: file is not a database"),
    # A backend that cannot work is the worker's only line, before arq's or Redis's.
    (("worker", "--burst", "--log-level", "INFO"), "notdb", 3, "cannot open the local store"),
    (("worker", "--burst", "--log-level", "INFO"), "nokey", 2, "backend zep needs ZEP_API_KEY"),
    (
        ("forget", "--app", APP, "--user", "alice"),
        "nozep",
        3,
        "cannot reach Zep at 127.0.0.1:{port}",
    ),
    (
        ("status",),
        "badttl",
        2,
        "bad setting: fact_ttl_days (AFTERTHOUGHT_FACT_TTL_DAYS): must be a JSON object",
    ),
    (("worker", "--burst"), "badzepurl", 2, "ZEP_BASE_URL: must be an http://"),
    # The demo makes its own deployment and deletes its keys after: never another's.
    (("demo", "--prefix", "X"), "ok", 2, "--prefix: the demo makes and removes a deployment"),
    (("worker", "--burst"), "badttl", 2, "must be a JSON object of days by kind"),
    (
        ("status",),
        "negttl",
        2,
        "fact_ttl_days (AFTERTHOUGHT_FACT_TTL_DAYS): each kind's days",
    ),
    # A key no HTTP header can carry is refused before it is sent: named, never quoted.
    (
        ("forget", "--app", APP, "--user", "u"),
        "badkey",
        2,
        "bad setting: ZEP_API_KEY: must be printable ASCII",
    ),
    (("forget", "--app", APP, "--user", "u"), "nlkey", 2, "ZEP_API_KEY: must be printable"),
    # Only spaces is not "unset" (that would quietly pick the local backend).
    (("status",), "blankkey", 2, "bad setting: ZEP_API_KEY: is blank"),
    (("status",), "blankaudit", 2, "audit_key (AFTERTHOUGHT_AUDIT_KEY): is blank"),
    (("status",), "nohost", 2, "bad setting: REDIS_URL: the Redis URL names no host"),
]


@pytest.mark.parametrize(("args", "variant", "code", "says"), CLI_ERRORS)
def test_every_documented_error_is_one_clear_line(
    local_settings: Settings,
    tmp_path: Path,
    args: tuple[str, ...],
    variant: str,
    code: int,
    says: str,
) -> None:
    port = free_port()
    settings = {
        "ok": local_settings,
        "down": local_settings.model_copy(
            update={"redis_url": f"redis://user:sekret@127.0.0.1:{port}/0"}
        ),
        "db99": local_settings.model_copy(
            update={"redis_url": local_settings.redis_url.rsplit("/", 1)[0] + "/99"}
        ),
        "badprefix": local_settings.model_copy(update={"key_prefix": "has space"}),
        "badbudget": local_settings.model_copy(update={"retrieval_budget": "abc"}),
        "baddb": local_settings.model_copy(
            update={"redis_url": f"redis://user:sekret@127.0.0.1:{port}/abc"}
        ),
        "noshards": local_settings.model_copy(
            update={"redis_url": f"redis+cluster://:sekret@127.0.0.1:{port}"}
        ),
        # A store path under a regular file: it can never be opened.
        "nostore": local_settings.model_copy(
            update={"local_db_path": tmp_path / "a-file" / "memory.sqlite3"}
        ),
        "notdb": local_settings.model_copy(update={"local_db_path": tmp_path / "a-file"}),
        "nozep": local_settings.model_copy(
            update={
                "backend": "zep",
                "zep_api_key": SecretStr("sekret"),
                "zep_base_url": f"http://127.0.0.1:{port}/api/v4",
            }
        ),
        "badttl": local_settings.model_copy(update={"fact_ttl_days": "{bad"}),
        "negttl": local_settings.model_copy(update={"fact_ttl_days": {"ephemeral": -7}}),
        "badkey": local_settings.model_copy(update={"zep_api_key": SecretStr("sekret\u00c9")}),
        "nlkey": local_settings.model_copy(update={"zep_api_key": SecretStr("sekret\nsekret")}),
        "blankkey": local_settings.model_copy(update={"zep_api_key": SecretStr("  ")}),
        "blankaudit": local_settings.model_copy(update={"audit_key": SecretStr(" ")}),
        "nohost": local_settings.model_copy(update={"redis_url": "redis://:sekret@/0"}),
        "nokey": local_settings.model_copy(update={"backend": "zep"}),
        "badzepurl": local_settings.model_copy(update={"zep_base_url": "not-a-url"}),
    }[variant]
    (tmp_path / "a-file").write_text("not a directory")
    argv = [a.format(missing=tmp_path / "none.jsonl") for a in args]
    done = run_cli_here(settings, *argv)
    assert done.returncode == code, done.stderr
    assert says.format(port=port) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "sekret" not in done.stderr
    if "usage:" not in done.stderr:  # argparse's errors come with the usage; the rest: one line
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    elif argv and not argv[0].startswith("-"):  # the usage of the command that was misused
        assert done.stderr.startswith(f"usage: afterthought {argv[0]} "), done.stderr


@pytest.mark.parametrize("args", [("dlq", "list", "5"), ("dlq", "list"), ("dlq",)])
def test_the_cli_run_here_says_what_its_process_says(
    local_settings: Settings, args: tuple[str, ...]
) -> None:
    """The error-line tests run the CLI in this process: it must answer as a process does."""
    here, there = run_cli_here(local_settings, *args), run_cli(local_settings, *args)
    assert (here.returncode, here.stderr) == (there.returncode, there.stderr)
    assert here.stdout == there.stdout


@pytest.mark.parametrize("unbuffered", ["1", ""])
@pytest.mark.parametrize("args", [("status",), ("status", "--json"), ("dlq", "list"), ("--help",)])
def test_a_reader_that_goes_away_ends_the_command_quietly(
    local_settings: Settings, args: tuple[str, ...], unbuffered: str
) -> None:
    """``afterthought status | head``: stdout's pipe is closed before the command writes.
    Written at once (unbuffered) or at exit, that is no Redis failure and no traceback:
    the conventional 141, nothing on stderr."""
    command = subprocess.Popen(
        [sys.executable, "-m", "afterthought.cli", *args],
        env={**os.environ, **local_settings.as_env(), "PYTHONUNBUFFERED": unbuffered},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert command.stdout is not None and command.stderr is not None
    command.stdout.close()  # the reader is gone before the command has written a line
    said = command.stderr.read()
    assert command.wait(timeout=60) == 141, said
    assert said == ""


def test_unknown_variables_and_a_relative_store_are_warned_about_once(
    local_settings: Settings, tmp_path: Path
) -> None:
    """A misspelt variable would be ignored without a word, a relative store path names
    another file in a process started elsewhere: one warning each, never the value (nor
    the variable's name or the path: the user's text, which may be a key pasted there)."""
    env = {
        **os.environ,
        **local_settings.as_env(),
        "AFTERTHOUGHT_PREFIX": "value-never-shown",
        "AFTERTHOUGHT_LOCAL_DB_PATH": "relative.sqlite3",
    }
    done = subprocess.run(
        [sys.executable, "-m", "afterthought.cli", "status"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr
    warnings = [line for line in done.stderr.splitlines() if " WARNING " in line]
    unknown = [line for line in warnings if "name no setting" in line or "names no" in line]
    assert len(unknown) == 1 and "did you mean AFTERTHOUGHT_KEY_PREFIX?" in unknown[0]
    assert "AFTERTHOUGHT_PREFIX" not in unknown[0]
    relative = [line for line in warnings if "relative" in line]
    assert len(relative) == 1 and "relative.sqlite3" not in relative[0]
    assert "value-never-shown" not in done.stderr + done.stdout


def test_settings_refused_are_said_in_one_line_without_a_warning_before(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A relative store path is warned about once the settings are valid, not before the
    error of settings that are not (the refusal is one line); once valid it is said."""
    from afterthought.settings import SettingsError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AFTERTHOUGHT_LOCAL_DB_PATH", f"relative-{tmp_path.name}.sqlite3")
    monkeypatch.setenv("REDIS_URL", "notaurl")
    with caplog.at_level("WARNING"), pytest.raises(SettingsError, match="REDIS_URL"):
        Settings()
    assert [r.getMessage() for r in caplog.records] == []
    monkeypatch.delenv("REDIS_URL")
    with caplog.at_level("WARNING"):
        Settings()
    assert ["relative" in r.getMessage() for r in caplog.records] == [True]


def test_global_options_go_before_or_after_the_command(local_settings: Settings) -> None:
    elsewhere = local_settings.model_copy(update={"key_prefix": "not-this-one"})
    for argv in (
        ("--prefix", local_settings.key_prefix, "status", "--json"),
        ("status", "--json", "--prefix", local_settings.key_prefix, "--log-format", "json"),
    ):
        done = run_cli_here(elsewhere, *argv)
        assert json.loads(done.stdout)["prefix"] == local_settings.key_prefix, done.stderr
    empty = run_cli_here(local_settings, "dlq", "list")
    assert empty.returncode == 0 and empty.stdout.strip() == "no dead letters"


async def test_workers_share_one_snapshot_per_period(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    from afterthought.worker.metrics import shared_snapshot

    first = await shared_snapshot(redis, local_settings, "host:1")
    await enqueue(local_settings, queued("new", 1))
    second = await shared_snapshot(redis, local_settings, "host:2")
    assert second == first  # read, not recomputed, within the period
    keys = Keys(local_settings.key_prefix)
    await redis.delete(keys.lock("status"))  # the period is over
    third = await shared_snapshot(redis, local_settings, "host:2")
    assert third.queue.messages == 1
    assert 0 < await redis.pttl(keys.status) <= 15_000


def test_backfill_refuses_oversized_sessions_and_takes_empty_or_binary_input(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings(max_queued_chars=1000)
    huge = _session(1, turns=1)
    huge.events[0].content = types.UserContent("x" * 1001)
    export = tmp_path / "mixed.jsonl"
    export.write_bytes(
        (_session(0).model_dump_json() + "\n" + huge.model_dump_json() + "\n").encode()
        + b"\xff\xfe not json \x00\n\n"
    )
    done = run_cli_here(settings, "backfill", "--jsonl", str(export))
    assert done.returncode == 1
    assert json.loads(done.stdout) == {
        "sessions": 1,
        "skipped": 0,
        "messages": 6,
        "malformed": [3],
        "refused": ["old-1"],
        "dropped": {},
    }
    again = json.loads(run_cli_here(settings, "backfill", "--jsonl", str(export)).stdout)
    assert (again["skipped"], again["refused"]) == (1, ["old-1"])  # not marked done

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    nothing = run_cli_here(settings, "backfill", "--jsonl", str(empty))
    assert nothing.returncode == 0 and json.loads(nothing.stdout)["sessions"] == 0


def test_healthz_fails_once_the_refresh_stops_reaching_redis() -> None:
    from afterthought.worker.metrics import REFRESH_SECONDS, Health, serve

    health = Health("host:1")
    server = serve("127.0.0.1", 0, health)
    url = f"http://127.0.0.1:{server.server_port}/healthz"
    try:
        assert httpx.get(url).status_code == 503  # no refresh yet
        health.last_ok = time.monotonic()
        reply = httpx.get(url)
        assert reply.status_code == 200 and reply.json()["worker"] == "host:1"
        health.last_ok = time.monotonic() - 3 * REFRESH_SECONDS  # Redis gone for a while
        assert httpx.get(url).status_code == 503
        assert (
            "afterthought_jobs" in httpx.get(f"http://127.0.0.1:{server.server_port}/metrics").text
        )
    finally:
        server.shutdown()


async def test_a_session_that_grew_is_backfilled_again(
    zep_settings: Settings, zep_fake: ZepFake, redis: aioredis.Redis, tmp_path: Path
) -> None:
    export = tmp_path / "sessions.jsonl"
    export.write_text(_session(0, turns=1).model_dump_json() + "\n")
    first = await Backfill(zep_settings, redis, jsonl_source(export)).run()
    grown = _session(0, turns=2)
    grown.last_update_time += 60
    export.write_text(grown.model_dump_json() + "\n")
    second = await Backfill(zep_settings, redis, jsonl_source(export)).run()
    assert (first.sessions, second.sessions, second.skipped) == (1, 1, 0)
    await drain(zep_settings)
    assert len(zep_fake.messages()) == 4  # the first turn once, the new one added


async def _worker_running_on(settings: Settings) -> None:
    """The announcement a running worker makes of its store (a stopped one withdraws it)."""
    from afterthought.backends.local import LocalBackend
    from afterthought.connections import connect
    from afterthought.shared_store import announce

    client, store = connect(settings.redis_url), LocalBackend(settings.local_db_path)
    await announce(client, settings, store, worker="elsewhere:1")
    await store.aclose()
    await client.aclose()


async def test_an_agent_reading_another_store_than_its_worker_is_warned(
    make_settings: Callable[..., Settings], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The trap of two processes started in different directories: the agent would read
    an empty store of its own. The worker announces its store; the agent compares."""
    worker_settings = make_settings(local_db_path=tmp_path / "worker" / "memory.sqlite3")
    await _worker_running_on(worker_settings)
    (tmp_path / "link").symlink_to(tmp_path / "worker")
    cases = {
        tmp_path / "agent" / "memory.sqlite3": True,
        worker_settings.local_db_path: False,
        tmp_path / "link" / "memory.sqlite3": False,  # another path to the same file
    }
    for path, warned in cases.items():
        caplog.clear()
        memory = TurnMemory(worker_settings.model_copy(update={"local_db_path": path}))
        runner, _ = make_runner(create_callbacks(memory))
        await say(runner, "alice", await new_session(runner, "alice"), "hello there")
        assert memory._store_check is not None
        await memory._store_check  # awaited: no timing involved
        assert ("different stores" in caplog.text) is warned, path
        if warned:
            assert str(path) in caplog.text and str(worker_settings.local_db_path) in caplog.text
        await memory.aclose()


@pytest.mark.parametrize(
    ("agent", "worker", "warned"),
    [
        ("local", "zep", True),
        ("zep", "local", True),
        ("zep", "zep-other-key", True),
        ("zep", "zep", False),
    ],
)
async def test_an_agent_and_workers_on_different_backends_are_warned(
    make_settings: Callable[..., Settings],
    zep_fake: ZepFake,
    caplog: pytest.LogCaptureFixture,
    agent: str,
    worker: str,
    warned: bool,
) -> None:
    """An agent without the workers' ZEP_API_KEY reads a local store they never write (a
    reviewer's agent remembered nothing, and nothing said why); one with another key reads
    another Zep project."""
    from afterthought.backends import open_backend
    from afterthought.connections import connect
    from afterthought.shared_store import announce

    def configured(backend: str) -> Settings:
        if backend == "local":
            return make_settings()
        key = "other-key" if backend == "zep-other-key" else "test-key"
        return make_settings(backend="zep", zep_api_key=key, zep_base_url=zep_fake.base_url)

    worker_settings = configured(worker)
    client, store = connect(worker_settings.redis_url), open_backend(worker_settings)
    await store.prepare()
    await announce(client, worker_settings, store, worker="elsewhere:1")
    await store.aclose()
    await client.aclose()
    memory = TurnMemory(configured(agent))
    runner, _ = make_runner(create_callbacks(memory))
    await say(runner, "alice", await new_session(runner, "alice"), "hello there")
    assert memory._store_check is not None
    await memory._store_check  # awaited: no timing involved
    assert ("different stores" in caplog.text) is warned, caplog.text
    assert "other-key" not in caplog.text and "test-key" not in caplog.text
    await memory.aclose()


async def test_a_forget_in_another_store_than_the_workers_is_refused(
    make_settings: Callable[..., Settings], zep_fake: ZepFake
) -> None:
    """A forget run without the workers' ZEP_API_KEY would delete from a local file they
    never wrote, and report it done."""
    from afterthought.backends.zep import ZepBackend
    from afterthought.connections import connect
    from afterthought.shared_store import announce

    workers = make_settings(backend="zep", zep_api_key="test-key", zep_base_url=zep_fake.base_url)
    client, store = connect(workers.redis_url), ZepBackend(workers)
    await announce(client, workers, store, worker="elsewhere:1")
    await store.aclose()
    await client.aclose()
    done = run_cli_here(make_settings(), "forget", "--app", "a", "--user", "u", "--yes")
    assert done.returncode == 2, done.stderr
    assert "is not the workers' (Zep at 127.0.0.1)" in done.stderr
    assert "test-key" not in done.stderr + done.stdout


async def test_a_forget_with_no_worker_to_compare_stores_with_says_it_cannot_tell(
    local_settings: Settings,
) -> None:
    await enqueue(local_settings, queued("I live in Lisbon.", 1))  # what it forgets
    done = run_cli_here(local_settings, "forget", "--app", "memtest", "--user", "alice", "--yes")
    assert done.returncode == 0 and '"queued": 1' in done.stdout, done.stderr
    assert "no worker announced its store" in done.stderr, done.stderr
    assert f"({local_settings.local_db_path}) is the one they write cannot be told" in done.stderr


async def test_an_agent_up_before_its_worker_is_warned_once_the_worker_announces(
    make_settings: Callable[..., Settings],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long-lived agent whose first turn came before any worker started: nothing to
    compare with then, so it compares again later (here at once) until a worker has said
    which store it writes."""
    from afterthought.agent_hooks import turn_memory

    monkeypatch.setattr(turn_memory, "STORE_RECHECK_SECONDS", 0.0)
    worker_settings = make_settings(local_db_path=tmp_path / "worker" / "memory.sqlite3")
    memory = TurnMemory(
        worker_settings.model_copy(update={"local_db_path": tmp_path / "agent.sqlite3"})
    )
    runner, _ = make_runner(create_callbacks(memory))

    async def turn() -> None:
        await say(runner, "alice", await new_session(runner, "alice"), "hello there")
        assert memory._store_check is not None
        await memory._store_check  # awaited: no timing involved

    await turn()
    assert "different stores" not in caplog.text
    await _worker_running_on(worker_settings)
    await turn()
    assert "different stores" in caplog.text
    caplog.clear()
    await turn()  # compared once: not warned at every turn
    assert "different stores" not in caplog.text
    await memory.aclose()


@pytest.mark.parametrize(
    "surface", ["after_model_callback", "add_session_to_memory", "add_memory", "remember"]
)
async def test_an_agent_that_only_records_is_told_no_worker_runs(
    surface: str, make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    """The check also runs from every surface that queues: a process that only records
    (the after-model callback alone, ADK's memory service, the remember tool) is the one
    whose messages pile up when no worker runs."""
    from google.adk.agents import LlmAgent
    from google.adk.memory.memory_entry import MemoryEntry

    from afterthought.agent_hooks import ZepMemoryService
    from afterthought.agent_hooks.memory_tools import create_memory_tools
    from afterthought.testing import StandInLlm
    from tests.adk_support import said_session

    memory = TurnMemory(make_settings())
    memory._store_watch = _watch_of_an_agent_running_for_a_while()
    service = ZepMemoryService(memory=memory)
    if surface == "after_model_callback":
        agent = LlmAgent(
            name="helper",
            model=StandInLlm(),
            after_model_callback=create_callbacks(memory).after_model_callback,
        )
        runner = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())
        await say(runner, "alice", await new_session(runner, "alice"), "hello there")
    elif surface == "add_session_to_memory":
        await service.add_session_to_memory(said_session("s1", ["hello there", "hi"]))
    elif surface == "add_memory":
        entry = MemoryEntry(content=types.UserContent("alice likes tea"))
        await service.add_memory(app_name=APP, user_id="alice", memories=[entry])
    else:
        remember = next(t for t in create_memory_tools(memory) if t.name == "remember")
        context = types_ns(
            session=types_ns(app_name=APP), user_id="alice", invocation_id="i", function_call_id="f"
        )
        assert await remember.func(fact="alice likes tea", tool_context=context) == "Saved."
    assert memory._store_check is not None
    await memory._store_check  # awaited: no timing involved
    assert "no worker of deployment" in caplog.text
    await memory.aclose()


def _watch_of_an_agent_running_for_a_while() -> shared_store.StoreWatch:
    """The store watch of an agent process started long enough ago that no worker's
    announcement can be on its way still (``ANNOUNCED_SECONDS``)."""
    now = [0.0]
    watch = shared_store.StoreWatch(clock=lambda: now[0])
    now[0] = 3600.0
    return watch


async def test_an_agent_without_a_worker_says_so_at_its_first_turn_and_again_when_it_goes(
    make_settings: Callable[..., Settings],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No worker: every run says "no memory" and the messages wait in Redis; the agent's
    log says why, once, and again once a worker came and went."""
    from afterthought.agent_hooks import turn_memory
    from afterthought.connections import connect
    from afterthought.shared_store import withdraw

    monkeypatch.setattr(turn_memory, "STORE_RECHECK_SECONDS", 0.0)
    settings = make_settings()
    memory = TurnMemory(settings)
    memory._store_watch = _watch_of_an_agent_running_for_a_while()
    runner, _ = make_runner(create_callbacks(memory))

    async def turn() -> str:
        caplog.clear()
        await say(runner, "alice", await new_session(runner, "alice"), "hello there")
        assert memory._store_check is not None
        await memory._store_check  # awaited: no timing involved
        return caplog.text

    assert "no worker of deployment" in await turn()
    assert "no worker of deployment" not in await turn()  # said once
    await _worker_running_on(settings)
    assert "no worker" not in await turn()
    client = connect(settings.redis_url)
    await withdraw(client, settings, worker="elsewhere:1")
    await client.aclose()
    assert "no worker of deployment" in await turn()
    await memory.aclose()


async def test_an_agent_on_a_store_awaiting_an_upgrade_is_told_to_start_a_worker(
    local_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """No worker has announced a store: the agent's own store is still checked."""
    import sqlite3

    from afterthought.backends.base import OutgoingMessage
    from afterthought.backends.local import LocalBackend

    store = LocalBackend(local_settings.local_db_path)
    user, _ = await store.ensure_user(zep_user_id="alice")
    thread = await store.create_thread(user=user, idempotency_key="t")
    said = [OutgoingMessage("user", "I keep bees", reference_time="2025-01-01T00:00:00+00:00")]
    await store.add_messages(thread_uuid=thread, messages=said, idempotency_key="b")
    await store.aclose()
    with sqlite3.connect(local_settings.local_db_path) as db:
        db.execute("PRAGMA user_version = 4")  # written by an older release
    memory = TurnMemory(local_settings)
    runner, _ = make_runner(create_callbacks(memory))
    await say(runner, "alice", await new_session(runner, "alice"), "hello there")
    assert memory._store_check is not None
    await memory._store_check
    assert "local store awaits a schema upgrade" in caplog.text
    await memory.aclose()


ONE_TURN = """
import asyncio, sys
from afterthought.agent_hooks import create_callbacks
from tests.adk_support import make_runner, new_session, say

async def main() -> None:
    runner, _ = make_runner(create_callbacks())  # settings from the environment
    await say(runner, "alice", await new_session(runner, "alice"), "hello there")

asyncio.run(main())
"""


async def test_a_process_of_one_turn_or_one_search_is_warned_of_another_store(
    make_settings: Callable[..., Settings], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The check is awaited on the first turn (within the read budget), so a script that
    lives for one turn warns before it exits; a search alone checks too."""
    from afterthought.agent_hooks import ZepMemoryService

    worker_settings = make_settings(local_db_path=tmp_path / "worker" / "memory.sqlite3")
    await _worker_running_on(worker_settings)
    elsewhere = worker_settings.model_copy(update={"local_db_path": tmp_path / "agent.sqlite3"})
    done = subprocess.run(
        [sys.executable, "-c", ONE_TURN],
        env={**os.environ, **elsewhere.as_env()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "different stores" in done.stderr, done.stderr
    searching = ZepMemoryService(memory=TurnMemory(elsewhere))
    await searching.search_memory(app_name="memtest", user_id="alice", query="hello")
    assert "different stores" in caplog.text
    await searching.memory.aclose()


async def test_two_workers_of_a_deployment_on_two_stores_are_an_error_and_a_problem(
    make_settings: Callable[..., Settings], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """While both run: an error in the second's log, and ``split_store``; once the first
    stops, its announcement goes with it."""
    first = make_settings(local_db_path=tmp_path / "one.sqlite3")
    running = spawn_worker(first)
    try:
        deadline = time.monotonic() + 60
        while status(first)[1]["local_stores"] != 1:
            assert time.monotonic() < deadline and running.poll() is None
            await asyncio.sleep(0.05)
        await run_worker_once(first.model_copy(update={"local_db_path": tmp_path / "two.sqlite3"}))
        assert "workers of this deployment use different stores" in caplog.text
        assert str(tmp_path / "one.sqlite3") in caplog.text
        assert status(first)[1]["local_stores"] == 1  # the second stopped: it withdrew its own
        await run_worker_once(first)  # the same store as the running one: no error
    finally:
        running.terminate()
        running.wait(timeout=30)
    assert status(first)[1]["local_stores"] == 0  # the first withdrew at SIGTERM


def test_split_store_is_a_problem_of_the_status(local_settings: Settings) -> None:
    from afterthought.status import PauseStatus, QueueStatus, Status, SynthesisStatus

    queue = QueueStatus(
        messages=0, threads=0, due=0, leased=0, deferred=0, stranded=0,
        oldest_age_seconds=None, jobs_waiting=0,
    )  # fmt: skip
    base = Status(
        prefix="p", at=0.0, queue=queue, dead_letters=0, pause=PauseStatus(paused=False),
        synthesis=SynthesisStatus(pending_users=0, lag_seconds=None), workers=[],
    )  # fmt: skip
    assert "split_store" not in base.model_copy(update={"local_stores": 1}).problems
    assert "split_store" in base.model_copy(update={"local_stores": 2}).problems


def test_a_worker_rides_out_a_redis_restart_and_stops_with_130_on_ctrl_c(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """arq exits on the first failed poll; ours polls again, then drains what came after."""
    from afterthought.testing import RedisServer

    server = RedisServer()
    settings = make_settings(redis_url=server.start())
    log_file = tmp_path / "worker.log"
    with log_file.open("w") as log_out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "afterthought.cli", "--log-level", "WARNING", "worker"],
            env={**os.environ, **settings.as_env()},
            stderr=log_out,
        )
    try:
        asyncio.run(enqueue(settings, queued("before", 1)))
        assert asyncio.run(wait_settled(settings, 60))
        server.stop()
        deadline = time.monotonic() + 60
        while "poll failed, retrying" not in log_file.read_text():
            assert worker.poll() is None, log_file.read_text()
            assert time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.05)
        server.start()  # the same port, empty (nothing persisted): as after a restart
        asyncio.run(enqueue(settings, queued("after", 2, session="s2")))
        assert asyncio.run(wait_settled(settings, 60)), log_file.read_text()
        assert worker.poll() is None
        worker.send_signal(signal.SIGINT)
        assert worker.wait(timeout=30) == 130, log_file.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        server.close()


async def test_redis_restarted_without_persistence_under_a_worker_is_reported(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, tmp_path: Path
) -> None:
    """Redis comes back empty under a running worker, with messages queued (the backend
    refusing them for now): nothing is left to show a sequence gap, so the worker's
    marker is what tells — a problem in ``status``, a metric and a log line."""
    from afterthought.testing import RedisServer

    server = RedisServer()
    port = free_port()
    settings = make_settings(
        redis_url=server.start(),
        backend="zep",
        zep_api_key="test-key",
        zep_base_url=zep_fake.base_url,
        metrics_port=port,
    )
    zep_fake.inject(Fault(match=ADDS, status=503, times=100_000))  # kept queued
    log_file = tmp_path / "worker.log"
    with log_file.open("w") as log_out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "afterthought.cli", "--log-level", "WARNING", "worker"],
            env={**os.environ, **settings.as_env()},
            stderr=log_out,
        )
    try:
        for n in range(4):
            await enqueue(settings, queued(f"secret {n}", n))
        deadline = time.monotonic() + 60
        tried = [r for r in zep_fake.requests if r.path.endswith("/messages")]
        while not tried:  # the worker runs, and has checked the marker
            tried = [r for r in zep_fake.requests if r.path.endswith("/messages")]
            assert worker.poll() is None and time.monotonic() < deadline, log_file.read_text()
            await asyncio.sleep(0.05)
        _, before = status(settings)
        assert before["queue"]["messages"] == 4 and "redis_lost_data" not in before["problems"]

        server.stop()
        server.start()  # the same port, empty: nothing was persisted

        while "redis lost its data" not in log_file.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, log_file.read_text()
            await asyncio.sleep(0.05)
        code, found = status(settings)
        assert code == 1 and "redis_lost_data" in found["problems"]
        assert found["redis_lost_data_at"] is not None and found["redis_lost_data_at"] > 0
        text = run_cli_here(settings, "status").stdout
        assert "redis lost    its data at" in text and "secret" not in text
        async with httpx.AsyncClient() as http:
            body = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
        assert "afterthought_redis_data_lost_total 1.0" in body
        assert "secret" not in log_file.read_text()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        server.close()


async def test_every_worker_through_a_loss_reports_it_and_it_is_recorded_once(
    make_settings: Callable[..., Settings], redis: aioredis.Redis
) -> None:
    """Two workers know the marker; Redis loses it: each reports the loss once (the one
    that finds it second sees a marker it does not know), and ``status`` has one record,
    which expires. A worker started afterwards finds an empty Redis like a new one."""
    from afterthought.queue import DATA_LOST_REPORT_MS, ThreadQueue
    from afterthought.worker.jobs import Markers

    settings = make_settings()
    keys = Keys.of(settings)
    queue = ThreadQueue(redis, settings)
    first, second = Markers(queue), Markers(queue)
    assert (await first.check(), await second.check()) == (0, 0)  # one writes, one adopts
    assert (await first.check(), await second.check()) == (0, 0)
    await redis.delete(keys.marker())  # Redis came back without it
    assert (await first.check(), await second.check()) == (1, 1)
    assert (await first.check(), await second.check()) == (0, 0)  # reported once each
    assert len(await redis.hgetall(keys.data_lost())) == 1
    assert 0 < await redis.pttl(keys.data_lost()) <= DATA_LOST_REPORT_MS
    assert await Markers(queue).check() == 0
    _, found = status(settings)
    assert "redis_lost_data" in found["problems"] and found["redis_lost_data_at"] > 0


def test_a_relative_store_path_is_made_absolute_where_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert Settings(local_db_path=Path("data/m.sqlite3")).local_db_path == (
        tmp_path / "data" / "m.sqlite3"
    )
    default = Settings().local_db_path
    assert default.is_absolute() and default.name == "memory.sqlite3"


async def test_only_stores_announced_lately_count(
    local_settings: Settings, redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Last week's worker used the agent's (old) file; today's uses another: warned."""
    from afterthought.backends.local import LocalBackend
    from afterthought.shared_store import ANNOUNCED_SECONDS, StoreWatch

    agent = LocalBackend(local_settings.local_db_path)
    mine = await agent.store_id()
    key = Keys(local_settings.key_prefix).stores
    now = time.time()

    async def announced(**entries: float) -> bool | None:
        await redis.delete(key)
        for store, at in entries.items():
            entry = {"store": store, "path": f"/srv/{store}", "at": at}
            await redis.hset(key, f"host:{store}", json.dumps(entry))
        return await StoreWatch().check(redis, local_settings, agent)

    assert await announced(**{mine: now}) is True
    assert await announced(**{mine: now - 2 * ANNOUNCED_SECONDS}) is None  # nobody lately
    caplog.clear()
    assert await announced(**{mine: now - 2 * ANNOUNCED_SECONDS, "other": now}) is False
    assert "different stores" in caplog.text and "/srv/other" in caplog.text
    await redis.delete(key)
    await agent.aclose()


async def test_an_agent_warns_within_a_minute_of_its_only_worker_being_killed(
    local_settings: Settings,
    redis: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The announcement is a heartbeat: a worker SIGKILLed just after its last beat (it
    never withdraws) stops counting, and its list expires, soon enough that an agent
    checking at its own pace, whatever its phase, warns within 60 s; a live worker that
    missed one beat still counts. On the clock of the module (injected)."""
    from afterthought.agent_hooks.turn_memory import STORE_RECHECK_SECONDS
    from afterthought.backends.local import LocalBackend
    from afterthought.shared_store import ANNOUNCE_EVERY_SECONDS, StoreWatch, announce

    clock = [time.time()]
    monkeypatch.setattr(shared_store, "time", types_ns(time=lambda: clock[0]))
    backend = LocalBackend(local_settings.local_db_path)
    killed = clock[0]
    await announce(redis, local_settings, backend, worker="host:1")
    ttl = await redis.ttl(Keys(local_settings.key_prefix).stores)
    assert 0 < ttl <= 60 and ttl > ANNOUNCE_EVERY_SECONDS * 2
    clock[0] = killed + 2 * ANNOUNCE_EVERY_SECONDS  # one beat late: still a worker
    assert await StoreWatch().check(redis, local_settings, backend) is True
    for phase in (0.0, STORE_RECHECK_SECONDS / 2, STORE_RECHECK_SECONDS - 0.01):
        # An agent started an hour before; each phase's warning is its process's first.
        clock[0] = killed - 3600
        watch, warned = StoreWatch(clock=lambda: clock[0]), None
        shared_store._no_workers_said.clear()
        at = killed + phase
        while warned is None and at < killed + 600:
            clock[0] = at
            caplog.clear()
            if await watch.check(redis, local_settings, backend) is None:
                assert "no worker of deployment" in caplog.text
                warned = at - killed
            at += STORE_RECHECK_SECONDS
        assert warned is not None and warned <= 60, (phase, warned)
    await redis.delete(Keys(local_settings.key_prefix).stores)
    await backend.aclose()


async def test_no_worker_is_said_only_once_the_agent_could_know_and_once_a_process(
    local_settings: Settings,
    redis: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent whose first turn comes before a worker started with it announced (younger
    than ``ANNOUNCED_SECONDS``) says nothing; past that, one line, however many watch (the
    callbacks' and a memory service's ``TurnMemory``); a worker that comes and then goes
    is said again."""
    from afterthought.backends.local import LocalBackend
    from afterthought.shared_store import ANNOUNCED_SECONDS, StoreWatch, announce

    monkeypatch.setattr(shared_store, "_no_workers_said", set())
    now = [1000.0]
    backend = LocalBackend(local_settings.local_db_path)
    callbacks, service = StoreWatch(clock=lambda: now[0]), StoreWatch(clock=lambda: now[0])

    async def said() -> int:
        caplog.clear()
        for watch in (callbacks, service):
            await watch.check(redis, local_settings, backend)
        return caplog.text.count("no worker of deployment")

    assert await said() == 0  # the first turn, at start
    now[0] += ANNOUNCED_SECONDS - 0.5
    assert await said() == 0
    now[0] += 0.5
    assert await said() == 1
    now[0] += ANNOUNCED_SECONDS
    assert await said() == 0  # said already
    await announce(redis, local_settings, backend, worker="host:1")
    assert await said() == 0
    await redis.delete(Keys(local_settings.key_prefix).stores)  # it went
    assert await said() == 1
    await backend.aclose()


def test_every_dashboard_panel_queries_metrics_the_worker_exports() -> None:
    """deploy/grafana: each panel's PromQL names series and labels the worker exports (a
    renamed metric would leave an empty panel nobody notices)."""
    import re

    from prometheus_client.metrics import MetricWrapperBase

    from afterthought.worker import metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    exported: dict[str, set[str]] = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            (family,) = metric.describe()
            labels = set(metric._labelnames) | ({"le"} if family.type == "histogram" else set())
            for suffix in suffixes[family.type]:
                exported[family.name + suffix] = labels
    deploy = ROOT / "deploy" / "grafana"
    dashboard = json.loads((deploy / "dashboards" / "afterthought.json").read_text())
    uid = re.search(r"uid: (\S+)", (deploy / "provisioning/datasources/prometheus.yml").read_text())
    assert uid is not None
    assert len(dashboard["panels"]) >= 12
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == uid.group(1), panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            series = re.findall(r"afterthought_\w+", expr)
            assert series and all(s in exported for s in series), (panel["title"], series)
            used = {
                label.strip()
                for group in re.findall(r"by \(([^)]*)\)", expr)
                for label in group.split(",")
            } | set(re.findall(r"(\w+)\s*=~?\s*\"", expr))
            allowed = set().union(*(exported[s] for s in series))
            assert used <= allowed, (panel["title"], used - allowed)
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards" in compose


async def test_a_stop_is_not_lost_to_a_poll_that_failed(
    local_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker polls again after Redis failed it; but once a signal asked it to stop, a
    poll's failure (the stop's cancellation can surface as the client's timeout) ends it,
    or the worker would stay up for good (seen under load, after a Sentinel failover)."""
    from arq.worker import Worker
    from redis.exceptions import TimeoutError as RedisTimeout

    import afterthought.worker.jobs as jobs

    async def failing(self: Worker) -> None:
        raise RedisTimeout("Timeout reading from socket")

    monkeypatch.setattr(Worker, "_poll_iteration", failing)
    monkeypatch.setattr(jobs, "POLL_RETRY_SECONDS", 0.0)
    worker = jobs.create_worker(local_settings, handle_signals=False)
    await worker._poll_iteration()  # Redis away: it goes on
    worker.handle_sig(signal.SIGTERM)
    with pytest.raises(asyncio.CancelledError):
        await worker._poll_iteration()
    assert not worker.interrupted
    await worker.close()


async def test_a_failover_while_a_job_starts_does_not_take_a_job_slot_for_good(
    local_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """arq takes a job slot before it marks the job in progress and kept it when Redis
    failed right then (a failover): a worker of one slot polled on and never started a job
    again (seen in a Sentinel handover run: jobs queued, none ongoing, for good)."""
    from arq.connections import ArqRedis
    from redis.exceptions import ConnectionError as RedisConnectionError

    import afterthought.worker.jobs as jobs

    ran: list[str] = []

    async def probe(ctx: dict[str, Any]) -> None:
        ran.append("probe")

    worker = jobs.create_worker(
        local_settings, handle_signals=False, max_jobs=1, functions=[func(probe, name="probe")]
    )
    job_id = f"{local_settings.key_prefix}:probe"  # the prefix: cleaned up with the test's keys
    await worker.pool.enqueue_job("probe", _job_id=job_id, _queue_name=worker.queue_name)
    real = ArqRedis.pipeline
    cuts = [1]

    def pipeline(self: ArqRedis, *args: Any, **kwargs: Any) -> Any:
        if cuts and kwargs.get("transaction", True):
            cuts.pop()
            raise RedisConnectionError("Connection closed by server.")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ArqRedis, "pipeline", pipeline)
    monkeypatch.setattr(jobs, "POLL_RETRY_SECONDS", 0.0)
    await worker._poll_iteration()  # the cut: nothing starts
    assert not ran
    await worker._poll_iteration()
    await asyncio.gather(*worker.tasks.values())
    assert ran == ["probe"]
    await worker.close()


async def test_a_flat_queue_is_never_stranded_by_switching_to_shards(
    local_settings: Settings, redis: aioredis.Redis
) -> None:
    """A deployment from before the layout was recorded has a flat queue and no record:
    a process started with shards refuses (its messages would wait where no worker looks,
    and a session's new ones pass its old ones) until workers of the flat layout drain it."""
    from afterthought.enqueue import Enqueuer

    await enqueue(local_settings, queued("said before the switch", 1))
    keys = Keys.of(local_settings)
    await redis.delete(keys.layout)  # as a deployment from before the record
    sharded = local_settings.model_copy(update={"redis_shards": 4})
    refused = run_cli_here(sharded, "status")
    assert refused.returncode == 2 and "holds messages in the flat layout" in refused.stderr
    enqueuer = Enqueuer(sharded)
    assert not await enqueuer.enqueue([queued("said after", 2)])
    assert (enqueuer.dropped, enqueuer.buffered) == (1, 0)  # counted, never queued
    await enqueuer.aclose()
    assert not await redis.exists(keys.layout)  # nothing recorded meanwhile
    # The one-time migration: refused while anything is queued, then done by its command.
    early = run_cli_here(local_settings, "reshard", "--to", "4", "--yes")
    assert early.returncode == 1 and "holds 1 messages" in early.stderr
    await drain(local_settings)
    dry = run_cli_here(local_settings, "reshard", "--to", "4")
    assert dry.returncode == 2 and "add --yes" in dry.stderr  # a dry run, as every one
    assert await redis.get(keys.layout) == b"0"
    assert run_cli_here(local_settings, "reshard", "--to", "4", "--yes").returncode == 0
    assert await redis.get(keys.layout) == b"4"
    assert run_cli_here(sharded, "status").returncode in (
        0,
        1,
    )  # every process now runs with 4
    assert "set AFTERTHOUGHT_REDIS_SHARDS=4" in run_cli_here(local_settings, "status").stderr


async def test_a_worker_says_at_start_when_zep_cannot_be_used(
    make_settings: Callable[..., Settings], zep_fake: ZepFake, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker pointed at a Zep it cannot reach, or with a key Zep refuses, said "ready"
    and then deferred every message naming no host; it says so at start, and goes on (what
    it is sent waits in the queue, as in any outage)."""
    from afterthought.backends.zep import ZepBackend

    cases = {
        f"http://127.0.0.1:{free_port()}/api/v4": "cannot reach Zep at 127.0.0.1:",
        zep_fake.base_url: None,
    }
    for url, said in cases.items():
        caplog.clear()
        backend = ZepBackend(make_settings(backend="zep", zep_api_key="k", zep_base_url=url))
        await backend.prepare()
        await backend.aclose()
        if said is None:
            assert "zep unusable" not in caplog.text
        else:
            assert "zep unusable at start error=unavailable" in caplog.text and said in caplog.text
    zep_fake.inject(Fault(match=".*", status=401, times=1))
    backend = ZepBackend(
        make_settings(backend="zep", zep_api_key="k", zep_base_url=zep_fake.base_url)
    )
    await backend.prepare()
    await backend.aclose()
    assert "zep unusable at start error=unauthorized status=401" in caplog.text


@pytest.mark.timeout(120)
async def test_messages_a_restarted_redis_lost_are_counted_at_the_threads_next_enqueue(
    make_settings: Callable[..., Settings], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``appendfsync everysec`` loses up to a second of writes on a host crash: Redis loads
    the AOF up to what reached the disk, the thread's counter back with it. (Simulated by
    cutting the AOF back to its size before the last writes, after a SIGKILL.) The next
    message of the thread from the process that saw the lost ones accepted gets a number
    past them: none is handed out twice, the gap is in ``status``'s ``lost_unverified``
    until a worker has checked it, and the worker, finding neither in the backend, logs it
    with ids only and counts it in ``lost_messages``."""
    import redis as sync_redis

    from afterthought.queue import ThreadQueue

    port = free_port()
    data = tmp_path / "aof"
    data.mkdir()
    args = [
        "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "yes", "--appendfsync", "always", "--dir", str(data),
    ]  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                if sync_redis.Redis(port=port).ping():
                    return proc
            except sync_redis.ConnectionError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    proc = start()
    settings = make_settings(redis_url=f"redis://127.0.0.1:{port}/0")
    try:
        client = aioredis.Redis(port=port)
        queue = ThreadQueue(client, settings)
        assert await queue.enqueue([queued("kept", 1)], now_ms=1) == 1
        (incr,) = (data / "appendonlydir").glob("*.incr.aof")
        durable = incr.stat().st_size  # what reached the disk before the crash
        for n, text in ((2, "secret one"), (3, "secret two")):
            assert await queue.enqueue([queued(text, n)], now_ms=n) == 1
        await client.aclose()
        proc.kill()
        proc.wait()
        os.truncate(incr, durable)  # the last writes never reached the disk
        proc = start()

        client = aioredis.Redis(port=port)
        # The same writer: what it was handed stays.
        queue = ThreadQueue(client, settings, handed_out=queue.handed_out)
        ref = queue.ref_of(queued("x", 0))
        assert await client.llen(queue.keys.pending(ref)) == 1  # two are gone
        assert await queue.enqueue([queued("secret three", 4)], now_ms=4) == 1
        tail = await client.lindex(queue.keys.pending(ref), -1)
        await client.aclose()
        assert tail is not None and tail.startswith(b'{"seq":4,')
        assert f"redis counter went back thread={ref} skipped=2 seqs=2..3" in caplog.text
        before = status(settings)[1]
        assert (before["lost_messages"], before["lost_unverified"]) == (0, 2)
        await drain(settings)  # the worker finds neither in the backend: lost
        assert f"redis lost queued messages thread={ref} lost=2" in caplog.text
        assert "secret" not in caplog.text
        assert status(settings)[1]["lost_messages"] == 2
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        (None, "https://api.getzep.com/api/v4", True),
        (None, "https://API.GetZep.com:443/api/v4/", True),
        ("HTTPS://api.getzep.com/api/v4", "https://api.getzep.com/api/v4/", True),
        ("http://[::1]:8011/api/v4", "http://[::1]:8011/api/v4/", True),
        (None, "https://api.getzep.com:8443/api/v4", False),
        (None, "https://zep.example.com/api/v4", False),
    ],
)
async def test_one_zep_address_spelt_two_ways_is_one_store(
    make_settings: Callable[..., Settings], one: str | None, other: str | None, same: bool
) -> None:
    """An agent that leaves ZEP_BASE_URL unset and a worker that spells the default out
    write to one Zep project: no "different stores" warning between them."""
    from afterthought.backends.zep import ZepBackend
    from afterthought.shared_store import store_of

    found = []
    for url in (one, other):
        settings = make_settings(backend="zep", zep_api_key="k", zep_base_url=url)
        found.append(await store_of(settings, ZepBackend(settings)))
    assert (found[0] == found[1]) is same, found
