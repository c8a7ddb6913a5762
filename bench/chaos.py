"""Chaos run of the write path, driven as a real agent drives it: concurrent ADK ``Runner``
sessions in one event loop that stalls now and then (GC pauses, CPU-bound tools), worker
processes SIGKILLed at random, and a Zep fake that fails before and after committing and
hangs past the client's timeout, then commits. Afterwards every message of every session,
the user's lines and the model's replies, must be in the fake exactly once, in order.

    python bench/chaos.py --messages 10000 --sessions 30 --workers 4 --kills 20 --fault-rate 0.2

With ``--backend postgres`` the workers persist to the PostgreSQL store instead, in a
PostgreSQL server the run starts for itself (never a shared one); ``--pg-restarts N``
crash-restarts it N times as the turns pass evenly spaced points (workers' transactions
cut mid-way), and the check reads the store's tables:

    python bench/chaos.py --backend postgres --pg-restarts 1 --workers 4 --kills 20

With ``--pin-identity`` every session's state pins its Zep user and thread
(``zep_user_uuid``, ``zep_thread_uuid``, untrusted: ``trust_state_identity`` off), as an
application that provisions its own users does: the turn path has a registry check of
those pins to make, and the worker an owner check of the thread.

The agent only runs turns: it never retries, never calls enqueue itself, and is not closed
before the check; the run waits (bounded) for the deployment to settle while its loop stays
alive, as a long-running agent server's would. Prints one JSON object (see ``run``). Uses
REDIS_URL or 127.0.0.1:6379 (keys under a fresh prefix, removed afterwards)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.models import BaseLlm  # noqa: E402
from google.adk.models.llm_request import LlmRequest  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.genai import types  # noqa: E402

from afterthought.agent_hooks import create_callbacks  # noqa: E402
from afterthought.agent_hooks.messages import said_text  # noqa: E402
from afterthought.agent_hooks.turn_memory import TurnMemory  # noqa: E402
from afterthought.backends import open_backend  # noqa: E402
from afterthought.backends.base import COPY_OF_FIELD, MESSAGE_KEY_FIELD  # noqa: E402
from afterthought.connections import connect, connect_sync  # noqa: E402
from afterthought.contract import QueuedMessage  # noqa: E402
from afterthought.direct_write import DirectWriter  # noqa: E402
from afterthought.enqueue import UNREACHABLE, Enqueuer  # noqa: E402
from afterthought.identity import IdentityRegistry  # noqa: E402
from afterthought.keys import Keys  # noqa: E402
from afterthought.loops import PerLoop  # noqa: E402
from afterthought.queue import ThreadQueue  # noqa: E402
from afterthought.settings import Settings  # noqa: E402
from afterthought.testing.postgres_server import PostgresServer  # noqa: E402
from afterthought.testing.processes import cleanup, spawn_worker, wait_settled  # noqa: E402
from afterthought.testing.redis_server import free_port, listening  # noqa: E402
from afterthought.worker.flush import Flusher  # noqa: E402

APP = "chaos"
JSON = dict[str, Any]
#: Sessions belong to this many users (several sessions, and threads, per user).
USERS = 5
#: The worker's client timeout, in seconds: short, so that a hang outlasts it quickly.
BACKEND_TIMEOUT = 1.0
#: After this long a timed-out backend call is taken as settled on the server (the write
#: path's ``backend_settle_seconds``).
SETTLE_SECONDS = 1.0
#: How long a worker may take to stop after SIGTERM (a container's default grace period).
STOP_GRACE_SECONDS = 30.0
#: How long past the client's timeout a hung request commits: within the settle time, so a
#: write path that waits it out sees every commit before it reconciles.
HANG_OVERSHOOT = 0.5
#: Short leases and pauses: a killed worker's threads are taken over within seconds.
WORKER_SETTINGS: dict[str, float] = {
    "lease_seconds": 3.0,
    "backend_timeout": BACKEND_TIMEOUT,
    "pause_seconds": 1.0,
}
#: Between stalls the loop runs freely for this long (seconds, uniform), then blocks for
#: ``STALL_SECONDS``: about as often and as long as a loaded agent's GC pauses.
STALL_GAP = (0.2, 0.5)
STALL_SECONDS = (0.15, 0.3)

_SAYINGS = (
    "I think I'll walk to work tomorrow if it doesn't rain.",
    "My sister is visiting next week, she loves the old town.",
    "Can you remind me what I said about the budget?",
    "I moved my dentist appointment to Thursday afternoon.",
    "The new coffee place near the station is pretty good.",
    "I'm trying to read more, maybe twenty pages a day.",
    "We're thinking about a trip to the coast in June.",
    "Work was hectic today, three meetings back to back.",
    "Remind me to call the plumber about the kitchen sink.",
    "I finally finished that puzzle, all thousand pieces!",
)
_USAGE = types.GenerateContentResponseUsageMetadata(
    prompt_token_count=1, candidates_token_count=1, total_token_count=2
)
_LINE = re.compile(r"^Line (\d+) of (\S+):")


def user_line(session_id: str, n: int) -> str:
    """What the user says on turn ``n``: ordinary text with its place written into it."""
    return f"Line {n} of {session_id}: {_SAYINGS[n % len(_SAYINGS)]}"


def reply_to(said: str) -> str:
    """The model's reply names the line it answers, so every reply is known in advance."""
    found = _LINE.match(said)
    what = f"line {found[1]} of {found[2]}" if found else "that"
    return f"Thanks, I've noted {what}. Anything else on your mind?"


class Replier(BaseLlm):
    """A model that answers the user's latest line (and keeps no requests: a long run)."""

    model: str = "chaos-replier"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        said = next((said_text(c) for c in reversed(llm_request.contents) if c.role == "user"), "")
        yield LlmResponse(
            content=types.ModelContent(reply_to(said)), turn_complete=True, usage_metadata=_USAGE
        )


@dataclass(frozen=True)
class Conversation:
    session_id: str
    user_id: str
    turns: int
    pins: tuple[str, str] | None = None
    """(user, thread) UUIDs its session state pins, if any."""

    def state(self) -> dict[str, str]:
        if self.pins is None:
            return {}
        return {"zep_user_uuid": self.pins[0], "zep_thread_uuid": self.pins[1]}

    def expected(self) -> list[tuple[str, str]]:
        """(role, content) of every message it should leave in the backend, in order."""
        said = [user_line(self.session_id, n) for n in range(self.turns)]
        return [item for s in said for item in (("user", s), ("assistant", reply_to(s)))]


def plan(messages: int, sessions: int, turns_per_session: int) -> list[list[Conversation]]:
    """Each of ``sessions`` concurrent slots holds conversations one after another, of
    ``turns_per_session`` turns (0: one conversation per slot); two messages a turn."""
    turns = math.ceil(messages / 2)
    slots: list[list[Conversation]] = []
    for slot in range(sessions):
        left = turns // sessions + (slot < turns % sessions)
        size = turns_per_session or left
        chats: list[Conversation] = []
        while left > 0:
            n = min(size, left)
            chats.append(Conversation(f"chat{slot}-{len(chats)}", f"user{slot % USERS}", n))
            left -= n
        slots.append(chats)
    return slots


class FakeProcess:
    """The Zep fake in a process of its own, as real Zep is: its timing (when a hung
    request commits) must not depend on the agent's process, whose loop the bench stalls."""

    def __init__(
        self,
        *,
        fault_rate: float,
        honor_idempotency: bool,
        seed: int | None,
        late_rate: float = 0.0,
        late_max: float = 0.0,
    ) -> None:
        port = free_port()
        command = [sys.executable, "-m", "afterthought.testing", "--port", str(port)]
        command += ["--latency", "0.01", "--fault-rate", str(fault_rate)]
        command += [] if seed is None else ["--seed", str(seed)]
        command += [] if honor_idempotency else ["--ignore-idempotency"]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        self._root = f"http://127.0.0.1:{port}"
        self.settings: JSON = {"zep_api_key": "chaos", "zep_base_url": f"{self._root}/api/v4"}
        self._state: JSON | None = None
        self._late = {"late_commit_rate": late_rate, "late_commit_max_seconds": late_max}

    def __enter__(self) -> FakeProcess:
        deadline = time.monotonic() + 30
        while not listening("127.0.0.1", int(self._root.rsplit(":", 1)[1])):
            if time.monotonic() > deadline or self._process.poll() is not None:
                raise RuntimeError("the Zep fake did not start")
            time.sleep(0.05)
        config = {"client_timeout": BACKEND_TIMEOUT, "hang_overshoot": HANG_OVERSHOOT, **self._late}
        self.configure(config)
        return self

    def configure(self, config: JSON) -> None:
        self._call("/_fake/config", config)

    def __exit__(self, *exc: object) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)

    def _call(self, path: str, body: JSON | None = None) -> JSON:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self._root + path, data=data, method="POST" if data else "GET"
        )
        with urllib.request.urlopen(request, timeout=120) as reply:
            found: JSON = json.load(reply)
        return found

    def outcomes(self) -> JSON:
        return self._call("/_fake/outcomes")

    def heal(self) -> None:
        """No more faults, nothing more served late (what is held still lands)."""
        self._call("/_fake/config", {"fault_rate": 0.0, "late_commit_rate": 0.0})

    def messages(self, thread_uuid: str | None = None) -> list[JSON]:
        """Stored messages, read once when first asked (the run has settled by then)."""
        if self._state is None:
            self._state = self._call("/_fake/state")
        stored: dict[str, list[JSON]] = self._state["messages"]
        if thread_uuid is not None:
            return stored.get(thread_uuid, [])
        return [m for msgs in stored.values() for m in msgs]

    def graph_copies(self) -> int:
        """Second episodes of one message (thread, key and text) in the users' graphs: what
        Zep's context block and search would meet twice."""
        if self._state is None:
            self._state = self._call("/_fake/state")
        made = Counter(
            (e["thread_uuid"], e["metadata"].get(MESSAGE_KEY_FIELD), e["content"])
            for e in self._state["episodes"]
            if e.get("thread_uuid")
        )
        return sum(n - 1 for n in made.values())


class PostgresStore:
    """The PostgreSQL store in a server of the run's own (it is restarted): the fake's
    reading side, for the check. Nothing is injected but what the run does to the server
    and the workers."""

    SCHEMA = "chaos"

    def __init__(self) -> None:
        self.server = PostgresServer(fsync=False)
        self.settings: JSON = {}
        self._state: dict[str, list[JSON]] | None = None

    def __enter__(self) -> PostgresStore:
        self.server.start()
        self.settings = {
            "backend": "postgres",
            "database_url": self.server.url,
            "database_schema": self.SCHEMA,
        }
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def restart(self) -> int:
        self.server.restart()
        return self.server.restarts

    def configure(self, config: JSON) -> None:
        """Nothing to configure: no faults but the run's own."""

    def heal(self) -> None:
        """Nothing to heal."""

    def outcomes(self) -> JSON:
        return {"ambiguous": {}, "held": 0, "injected": {"restarts": self.server.restarts}}

    def messages(self, thread_uuid: str | None = None) -> list[JSON]:
        """Stored messages in the order stored, read once when first asked."""
        if self._state is None:
            self._state = _in_thread(self._read)
        if thread_uuid is not None:
            return self._state.get(thread_uuid, [])
        return [m for msgs in self._state.values() for m in msgs]

    async def _read(self) -> dict[str, list[JSON]]:
        import asyncpg

        db = await asyncpg.connect(self.server.url)
        try:
            rows = await db.fetch(
                f"SELECT thread_uuid, role, content, metadata FROM {self.SCHEMA}.messages"
                " ORDER BY id"
            )
        finally:
            await db.close()
        stored: dict[str, list[JSON]] = {}
        for r in rows:
            stored.setdefault(r["thread_uuid"], []).append(
                {"role": r["role"], "content": r["content"], "metadata": json.loads(r["metadata"])}
            )
        return stored

    def graph_copies(self) -> int:
        return 0  # no graph: the statements are the messages' rows


def _in_thread(work: Callable[[], Any]) -> Any:
    """``asyncio.run(work())`` from a thread of its own: the caller may be inside a loop."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(asyncio.run(work())))
    thread.start()
    thread.join()
    return out[0]


Store = FakeProcess | PostgresStore


class ObservedEnqueuer(Enqueuer):
    """The hooks' own enqueuer, watched at each attempt to queue: which attempts
    Redis confirmed, and, the first time an attempt carrying a message fails without knowing
    whether the script ran (a timeout), the thread's sequence counter right after."""

    def __init__(self, settings: Settings, *, direct: DirectWriter | None) -> None:
        super().__init__(settings, direct=direct)
        self.confirmed: Counter[str] = Counter()
        self.failed_at: dict[str, int] = {}
        """Message key -> the thread's last handed-out sequence number as that attempt
        failed. No other attempt has pushed the message yet (earlier ones were refused, and
        it is not buffered for a retry before this one returns), so if it is stored with a
        number up to this, that attempt queued it after all."""
        self.keys: dict[tuple[str, str, str], str] = {}
        """(session, role, content) -> message key, to say where a lost message stopped."""
        self._probe = PerLoop(lambda: connect(settings.redis_url))
        self._thread_keys = Keys.of(settings)

    async def _send(
        self, queue: ThreadQueue, messages: Sequence[QueuedMessage], timeout: float
    ) -> str | None:
        # Every attempt, the turn path's and the drain thread's (on its own loop).
        why = await super()._send(queue, messages, timeout)
        for m in messages:
            self.keys[(m.session_id, m.role or "", m.content)] = m.key
            if why is None:
                self.confirmed[m.key] += 1
        if why == UNREACHABLE:
            with contextlib.suppress(RedisError, OSError):  # then it stays uncounted
                handed_out = await self._probe.get().hget(
                    self._thread_keys.thread(queue.ref_of(messages[0])), "seq"
                )
                for m in messages:
                    self.failed_at.setdefault(m.key, int(handed_out or 0))
        return why

    async def aclose(self) -> None:
        await super().aclose()
        probe = self._probe.pop_current()
        if probe is not None:
            await probe.aclose()


class LogTally(logging.Handler):
    """Counts log lines by their words and error type (ids and counts left out)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:  # called under the handler's lock
        words = record.getMessage().split()
        self.seen[" ".join(w for w in words if "=" not in w or w.startswith("error="))] += 1

    def counts(self) -> dict[str, int]:
        """A copy, consistent even while another thread logs."""
        with self.lock or contextlib.nullcontext():
            return dict(self.seen)


@contextlib.contextmanager
def _tallying(product: logging.Logger) -> Iterator[LogTally]:
    """The product's log lines, INFO and up, counted instead of printed (thousands of them
    in a long run); the logger is put back as it was."""
    tally = LogTally()
    level, propagate = product.level, product.propagate
    product.addHandler(tally)
    product.setLevel(logging.INFO)
    product.propagate = False
    try:
        yield tally
    finally:
        product.removeHandler(tally)
        product.setLevel(level)
        product.propagate = propagate


@dataclass
class Progress:
    """Shared by the loop (writer) and the killer thread (reader)."""

    turns: int = 0
    stalls: int = 0
    stalled: float = 0.0


class Workers:
    """Worker processes, of which one is SIGKILLed and replaced now and then."""

    def __init__(self, settings: Settings, count: int) -> None:
        self._settings = settings
        path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self._env = {"PYTHONPATH": os.pathsep.join(path)}
        self.pool = [self._spawn() for _ in range(count)]
        self.kills = 0
        self.slow_stops = 0
        """Workers still running ``STOP_GRACE_SECONDS`` after SIGTERM (then killed)."""

    def _spawn(self) -> subprocess.Popen[bytes]:
        # The workers import this tree, whatever the interpreter has installed.
        return spawn_worker(self._settings, **self._env)

    def wait_up(self, timeout: float) -> bool:
        """Wait until every worker has written its health line (they are up before the
        agent takes traffic, as in a deployment); False if ``timeout`` passes first."""
        keys = Keys.of(self._settings)
        names = [keys.health(f"{socket.gethostname()}:{proc.pid}") for proc in self.pool]
        client = connect_sync(self._settings.jobs_redis_url)  # arq's health lines
        deadline = time.monotonic() + timeout
        try:
            while client.exists(*names) < len(names):
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.1)
            return True
        finally:
            client.close()

    def kill_one(self, rng: random.Random) -> None:
        victim = rng.randrange(len(self.pool))
        self.pool[victim].kill()
        self.pool[victim].wait()
        self.pool[victim] = self._spawn()
        self.kills += 1

    def killer(
        self, at_turns: list[int], progress: Progress, stop: threading.Event, rng: random.Random
    ) -> threading.Thread:
        """A thread killing a worker as the agent's turn count passes each of ``at_turns``
        (progress, not wall time: the same run on a slower machine is killed alike)."""
        return _at_turns(at_turns, progress, stop, lambda: self.kill_one(rng))

    def stop(self) -> None:
        """SIGTERM, as an orchestrator stops them; SIGKILL after its grace period (what a
        killed worker held falls due by itself), counted in ``slow_stops``."""
        for proc in self.pool:
            proc.terminate()
        for proc in self.pool:
            try:
                proc.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.slow_stops += 1
                proc.kill()
                proc.wait()


def _at_turns(
    at_turns: list[int], progress: Progress, stop: threading.Event, action: Callable[[], object]
) -> threading.Thread:
    """A thread doing ``action`` as the agent's turn count passes each of ``at_turns``."""

    def act() -> None:
        for turn in at_turns:
            while progress.turns < turn:
                if stop.wait(0.05):
                    return
            action()

    thread = threading.Thread(target=act, name="chaos-action", daemon=True)
    thread.start()
    return thread


async def _stall(rng: random.Random, progress: Progress) -> None:
    """Block the agent's loop now and then, as a GC pause or a CPU-bound tool would."""
    while True:
        await asyncio.sleep(rng.uniform(*STALL_GAP))
        pause = rng.uniform(*STALL_SECONDS)
        time.sleep(pause)  # deliberately blocking: nothing else in the loop runs meanwhile
        progress.stalls += 1
        progress.stalled += pause


async def _converse(
    runner: Runner,
    chats: list[Conversation],
    progress: Progress,
    think: Callable[[], float],
) -> None:
    """One slot: its conversations in turn, each turn a line said and a reply heard."""
    for chat in chats:
        await runner.session_service.create_session(
            app_name=APP, user_id=chat.user_id, session_id=chat.session_id, state=chat.state()
        )
        for n in range(chat.turns):
            async for _ in runner.run_async(
                user_id=chat.user_id,
                session_id=chat.session_id,
                new_message=types.UserContent(user_line(chat.session_id, n)),
            ):
                pass
            progress.turns += 1
            await asyncio.sleep(think())


async def _settle(settings: Settings, enqueuer: Enqueuer, timeout: float) -> bool:
    """True once the agent holds nothing back and the queue is empty; False after
    ``timeout``. The agent is not closed first, nor says anything more: a real agent
    server's buffered messages have to leave without a next turn."""
    deadline = time.monotonic() + timeout
    while not (enqueuer.buffered == 0 and await wait_settled(settings, 0)):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.25)
    return True


async def _land_and_repair(
    settings: Settings, fake: FakeProcess, enqueuer: Enqueuer, timeout: float
) -> JSON:
    """Heal the fake (its faults and late serving stop, as the repair's reads and marks
    would otherwise be served late too), wait (bounded) until it has served every request
    it holds and the queue has settled again, then run the late-copy repair as the
    workers' cron does, every noted thread counted as noted long enough ago, again while
    a read of it fails; what it did."""
    fake.heal()
    deadline = time.monotonic() + timeout
    while fake.outcomes()["held"] and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
    await _settle(settings, enqueuer, timeout)
    client = connect(settings.redis_url)
    backend = open_backend(settings)
    done: Counter[str] = Counter()
    try:
        flusher = Flusher(settings, client, backend)
        for _ in range(10):  # a read the fake failed is read at the cron's next run
            run = await flusher.repair_late(now_ms=int(time.time() * 1000) + 60_000)
            done.update(run)
            if not run["unread"]:
                break
    finally:
        await backend.aclose()
        await client.aclose()
    return dict(done)


@dataclass
class Findings:
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    stray: int = 0
    sessions_hit: int = 0
    """Sessions with anything lost, duplicated or out of order."""
    lost_where: Counter[str] = field(default_factory=Counter)
    duplicated_how: Counter[str] = field(default_factory=Counter)
    out_of_order_how: Counter[str] = field(default_factory=Counter)
    committed_anyway: int = 0
    repaired: int = 0
    """Late copies found marked (``afterthought_copy_of``): repaired, skipped by reads, but
    still in the thread as Zep's own API lists it (Zep deletes no message)."""
    graph_copies: int = 0
    """Second episodes of one message left in the graph (:meth:`FakeProcess.graph_copies`)."""


@dataclass(frozen=True)
class _Whereabouts:
    """Where the hooks and Redis last saw each message (by key), to say where a lost one
    stopped."""

    observed: ObservedEnqueuer
    pending: set[str]
    dead: set[str]

    def of(self, session_id: str, role: str, content: str) -> str:
        key = self.observed.keys.get((session_id, role, content))
        if key is None:
            return "never_sent_to_redis"  # held in the hooks' buffer, or dropped
        if key in self.pending:
            return "still_queued"
        if key in self.dead:
            return "dead_lettered"
        if self.observed.confirmed[key]:
            return "vanished_after_queue"  # Redis confirmed it; it never reached the backend
        return "not_confirmed"  # every attempt to queue it failed


async def _whereabouts(
    client: aioredis.Redis,
    settings: Settings,
    chats: list[Conversation],
    observed: ObservedEnqueuer,
) -> _Whereabouts:
    keys = Keys.of(settings)
    pending: set[str] = set()
    for chat in chats:
        ref = keys.thread_ref(APP, chat.user_id, chat.session_id)
        pending |= {_key_of(raw) for raw in await client.lrange(keys.pending(ref), 0, -1)}
    # A dead letter is a JSON header line, then the queued payload.
    letters = [
        raw for shard in keys.shard_ids for raw in await client.lrange(keys.dead(shard), 0, -1)
    ]
    dead = {_key_of(raw.partition(b"\n")[2]) for raw in letters}
    return _Whereabouts(observed, pending, dead)


def _key_of(payload: bytes) -> str:
    try:
        return str(json.loads(payload)["key"])
    except (ValueError, KeyError, TypeError):
        return ""


async def _verify(
    settings: Settings, fake: Store, chats: list[Conversation], observed: ObservedEnqueuer
) -> Findings:
    client = connect(settings.redis_url)
    registry = IdentityRegistry(client, settings)
    where = await _whereabouts(client, settings, chats, observed)
    found = Findings()
    seen_total = 0
    for chat in chats:
        known = await registry.lookup(app=APP, user_id=chat.user_id, session_id=chat.session_id)
        thread = chat.pins[1] if chat.pins else known.thread_uuid
        stored = fake.messages(thread) if thread else []
        seen_total += len(stored)
        before = (found.lost, found.duplicated, found.out_of_order)
        _check(chat, stored, where, found)
        found.sessions_hit += (found.lost, found.duplicated, found.out_of_order) != before
    found.stray += len(fake.messages()) - seen_total  # stored under no session's thread
    found.committed_anyway = _committed_anyway(fake, observed)
    found.graph_copies = fake.graph_copies()
    await client.aclose()
    return found


def _check(chat: Conversation, stored: list[JSON], where: _Whereabouts, found: Findings) -> None:
    """One session: each expected message stored once, in the order it was said."""
    expected = chat.expected()
    place = {said: i for i, said in enumerate(expected)}
    seqs: dict[tuple[str, str], list[Any]] = {}  # the queue's sequence number of each copy
    for m in stored:
        if COPY_OF_FIELD in m["metadata"]:  # a late copy, repaired: every read skips it
            found.repaired += 1
            continue
        seqs.setdefault((str(m["role"]), str(m["content"])), []).append(
            m["metadata"].get("afterthought_seq")
        )
    for role, content in expected:
        if (role, content) not in seqs:
            found.lost += 1
            found.lost_where[where.of(chat.session_id, role, content)] += 1
    for said, copies in seqs.items():
        if said not in place:
            found.stray += len(copies)
            continue
        found.duplicated += len(copies) - 1
        # Copies queued twice carry different sequence numbers; sent twice, the same one.
        found.duplicated_how["queued_twice"] += len(set(copies)) - 1
        found.duplicated_how["sent_twice"] += len(copies) - len(set(copies))
    firsts = [(place[said], copies[0]) for said, copies in seqs.items() if said in place]
    for (said_a, seq_a), (said_b, seq_b) in itertools.pairwise(firsts):
        if said_b < said_a:
            found.out_of_order += 1
            # Queued in the wrong order (the agent's side), or sent out of the queue's order.
            how = "queued_out_of_order" if (seq_b or 0) > (seq_a or 0) else "sent_out_of_order"
            found.out_of_order_how[how] += 1


def _committed_anyway(fake: Store, observed: ObservedEnqueuer) -> int:
    """Messages whose attempt to queue failed, yet which that attempt queued: stored
    with a sequence number handed out before the failure came back. At least this many (a
    message lost downstream is not seen)."""
    lowest: dict[str, int] = {}
    for m in fake.messages():
        key, seq = m["metadata"].get(MESSAGE_KEY_FIELD), m["metadata"].get("afterthought_seq")
        if key in observed.failed_at and isinstance(seq, int):
            lowest[key] = min(seq, lowest.get(key, seq))
    return sum(1 for key, seq in lowest.items() if seq <= observed.failed_at[key])


async def _pinned(
    settings: Settings,
    fake: Store,
    slots: list[list[Conversation]],
    faults: JSON,
) -> list[list[Conversation]]:
    """The conversations, each pinned to a Zep user (registered, as the worker would) and
    a thread of its own, made while the fake injects no faults and serves nothing late
    (set-up, not under test; ``faults``: the run's, restored after)."""
    fake.configure(dict.fromkeys(faults, 0.0))
    client = connect(settings.redis_url)
    registry = IdentityRegistry(client, settings)
    backend = open_backend(settings)
    try:
        pinned = []
        for slot in slots:
            chats = []
            for chat in slot:
                user, _ = await registry.ensure_user(backend, app=APP, user_id=chat.user_id)
                thread = await backend.create_thread(user=user, idempotency_key=chat.session_id)
                chats.append(replace(chat, pins=(user.user_uuid, thread)))
            pinned.append(chats)
        return pinned
    finally:
        await backend.aclose()
        await client.aclose()
        fake.configure(faults)


def _settings(redis_url: str | None, fake: Store, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "redis_url": redis_url or os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        "key_prefix": f"chaos-{uuid.uuid4().hex[:8]}",
        **fake.settings,
        **WORKER_SETTINGS,
        "backend_settle_seconds": SETTLE_SECONDS,
        **overrides,
    }
    return Settings(**values)


def run(
    *,
    messages: int = 500,
    sessions: int = 30,
    turns_per_session: int = 25,
    workers: int = 3,
    kills: int = 2,
    fault_rate: float = 0.1,
    honor_idempotency: bool = True,
    stall: bool = True,
    think: float = 0.05,
    seed: int | None = None,
    redis_url: str | None = None,
    timeout: float = 60.0,
    threads: int | None = None,
    failover: Callable[[], object] | None = None,
    failovers: int = 1,
    pin_identity: bool = False,
    late_rate: float = 0.0,
    late_max: float = 0.0,
    backend: str = "zep",
    pg_restarts: int = 0,
    **overrides: Any,
) -> JSON:
    """One run; ``timeout`` bounds the wait for the deployment to settle. ``think``: the
    mean pause, in seconds, between a reply and the user's next line. ``threads`` is the
    old name of ``sessions``. ``failover``: called ``failovers`` times, one after another on
    a thread of its own, as the turns done pass evenly spaced points (one: a third of the
    way; a Redis master killed and replaced, say); ``pin_identity``: sessions pin their user
    and thread in state (see the module's text); ``overrides``: settings of the agent and
    the workers. ``late_rate``: the share of writes the fake serves late, up to
    ``late_max`` seconds after their client gave up (once the turns are done and the queue
    has settled, the fake is healed, the run waits for every one to land, and runs the
    late-copy repair as its cron would). ``backend``: ``zep`` (the fake) or ``postgres``
    (a server of the run's own, crash-restarted ``pg_restarts`` times as the turns pass
    evenly spaced points, as ``failover`` is called; the fault and late options then do
    nothing).

    Reports ``lost``, ``duplicated`` (extra copies), ``out_of_order`` (messages stored
    before one said earlier), ``stray`` (stored where no session's messages belong),
    ``settled``, and the ambiguous outcomes exercised: ``backend`` (calls the fake
    committed whose client got no success reply, by cause), ``enqueue_timeouts`` (enqueue
    calls that timed out in the agent, from its log), ``enqueue_failed_messages`` (messages
    an attempt failed to queue without knowing whether the script ran) and
    ``enqueue_failed_but_queued`` (of those, queued by that attempt all the same: at least
    this many). ``hooks`` are the enqueuer's own counters as the wait ended; ``diagnosis``
    says where lost messages stopped and how copies and disorder arose."""
    sessions = threads or sessions
    rng = random.Random(seed)
    slots = plan(messages, sessions, turns_per_session)
    turns = sum(chat.turns for slot in slots for chat in slot)
    progress = Progress()
    with contextlib.ExitStack() as stack:  # undone in reverse: workers, keys, logging, fake
        fake: Store
        if backend == "postgres":
            fake = store = stack.enter_context(PostgresStore())
            if pg_restarts:
                failover, failovers = store.restart, pg_restarts
        else:
            fake = stack.enter_context(
                FakeProcess(
                    fault_rate=fault_rate,
                    honor_idempotency=honor_idempotency,
                    seed=seed,
                    late_rate=late_rate,
                    late_max=late_max,
                )
            )
        settings = _settings(redis_url, fake, **overrides)
        stack.callback(lambda: asyncio.run(cleanup(settings)))
        if pin_identity:
            faults = {"fault_rate": fault_rate, "late_commit_rate": late_rate}
            slots = asyncio.run(_pinned(settings, fake, slots, faults))
        chats = [chat for slot in slots for chat in slot]
        tally = stack.enter_context(_tallying(logging.getLogger("afterthought")))
        pool = Workers(settings, workers)
        stack.callback(pool.stop)
        if not pool.wait_up(60):
            raise RuntimeError("the workers did not start")
        started = time.monotonic()
        kill_at = sorted(rng.randint(max(1, turns // 50), turns) for _ in range(kills))
        stop = threading.Event()
        killer = pool.killer(kill_at, progress, stop, random.Random(rng.random()))
        stack.callback(killer.join)
        failed_over = []
        if failover is not None:
            points = [turns * (i + 1) // (failovers + 2) for i in range(failovers)]
            act = _at_turns(points, progress, stop, lambda: failed_over.append(failover()))
            stack.callback(act.join)
        stack.callback(stop.set)
        memory = TurnMemory.create(settings=settings)
        observed = memory.enqueuer = ObservedEnqueuer(settings, direct=memory.direct)
        callbacks = create_callbacks(memory)
        agent = LlmAgent(
            name="helper",
            model=Replier(),
            instruction="Be brief.",
            before_model_callback=callbacks.before_model_callback,
            after_model_callback=callbacks.after_model_callback,
        )
        runner = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())
        pace = random.Random(rng.random())

        def pause() -> float:
            return pace.uniform(0, 2 * think)

        async def agent_server() -> tuple[JSON, Findings]:
            stalls = random.Random(rng.random())
            staller = asyncio.create_task(_stall(stalls, progress)) if stall else None
            try:
                await asyncio.gather(*(_converse(runner, c, progress, pause) for c in slots))
                produced = time.monotonic() - started
                settled = await _settle(settings, observed, timeout)
                repair = {}
                if late_rate:
                    repair = await _land_and_repair(settings, fake, observed, late_max + timeout)
                # As the wait ended: closing the hooks (below) sends what they still hold.
                at_end: JSON = {
                    "settled": settled,
                    "producing_seconds": round(produced, 1),
                    "seconds": round(time.monotonic() - started, 1),
                    **fake.outcomes(),
                    "hooks": {"dropped": observed.dropped, "buffered": observed.buffered},
                    "repair": repair,
                    "log": tally.counts(),
                }
            finally:
                if staller is not None:
                    staller.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await staller
            found = await _verify(settings, fake, chats, observed)
            await memory.aclose()
            await runner.close()
            return at_end, found

        at_end, found = asyncio.run(agent_server())
    return {
        "backend": backend,
        "messages": 2 * turns,
        "sessions": len(chats),
        "concurrent_sessions": len(slots),
        "workers": workers,
        "kills": pool.kills,
        "slow_stops": pool.slow_stops,
        "failovers": len(failed_over),
        "stalls": {"count": progress.stalls, "seconds": round(progress.stalled, 1)},
        "fault_rate": fault_rate,
        "honor_idempotency": honor_idempotency,
        "pin_identity": pin_identity,
        "lost": found.lost,
        "duplicated": found.duplicated,
        "out_of_order": found.out_of_order,
        "stray": found.stray,
        "settled": at_end["settled"],
        "seconds": at_end["seconds"],
        "producing_seconds": at_end["producing_seconds"],
        "ambiguous": {
            "backend": {**at_end["ambiguous"], "total": sum(at_end["ambiguous"].values())},
            "enqueue_timeouts": at_end["log"].get("enqueue failed error=TimeoutError", 0),
            "enqueue_failed_messages": len(observed.failed_at),
            "enqueue_failed_but_queued": found.committed_anyway,
        },
        "hooks": at_end["hooks"],
        "late": {
            "rate": late_rate,
            "max_seconds": late_max,
            "served_late": at_end["ambiguous"].get("late", 0),
            "held_left": at_end["held"],
            "repair": at_end["repair"],
            "copies_marked_found": found.repaired,
            # What a raw listing of the threads (Zep's API, not afterthought's reads) still
            # shows twice, and the graph's second episodes (context block, search).
            "raw_listing_copies": found.repaired + found.duplicated,
            "graph_copies": found.graph_copies,
        },
        "diagnosis": {
            "sessions_hit": found.sessions_hit,
            "lost_where": dict(found.lost_where),
            "duplicated_how": {k: v for k, v in found.duplicated_how.items() if v},
            "out_of_order_how": dict(found.out_of_order_how),
            "faults_injected": at_end["injected"],
            "agent_log": at_end["log"],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument(
        "--sessions", "--threads", type=int, default=30, help="sessions open at once"
    )
    parser.add_argument(
        "--turns-per-session", type=int, default=25, help="then a new session; 0: never"
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument("--ignore-idempotency", action="store_true")
    parser.add_argument("--late-rate", type=float, default=0.0, help="share of writes served late")
    parser.add_argument("--late-max", type=float, default=90.0, help="at most this many s late")
    parser.add_argument("--stall", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--think", type=float, default=0.05, help="mean seconds between turns")
    parser.add_argument("--settle-timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--pin-identity", action="store_true", help="sessions pin user and thread in state"
    )
    parser.add_argument("--backend", choices=["zep", "postgres"], default="zep")
    parser.add_argument(
        "--pg-restarts", type=int, default=0, help="postgres: crash-restart the server N times"
    )
    args = parser.parse_args()
    print(
        json.dumps(
            run(
                messages=args.messages,
                sessions=args.sessions,
                turns_per_session=args.turns_per_session,
                workers=args.workers,
                kills=args.kills,
                fault_rate=args.fault_rate,
                honor_idempotency=not args.ignore_idempotency,
                stall=args.stall,
                think=args.think,
                seed=args.seed,
                timeout=args.settle_timeout,
                pin_identity=args.pin_identity,
                late_rate=args.late_rate,
                late_max=args.late_max,
                backend=args.backend,
                pg_restarts=args.pg_restarts,
            )
        )
    )


if __name__ == "__main__":
    main()
