"""A loopback stand-in for Zep's v4 REST API, for tests that use the real ``zep-cloud`` SDK.

It models what is known of real Zep (``reference/zep_fidelity.md``) and is no kinder:
a duplicate user is a 400 "already exists", content over the plan's limit and episodes
over 10,000 characters are refused with a 400 naming the length, deletes are accepted
(202) and done later by a task, messages are ingested late (``return_context`` does not
show them yet) and Zep extracts edges of its own from them, and lists come in pages no
larger than the server's maximum. Where Zep's behaviour is unknown (repeated
``Idempotency-Key``s), a switch offers every option; the defaults are the worst plausible.

A request may also be served late (``Fault(late=...)``, ``late_commit_rate``): its
connection is dropped at once and its work done when the fake's clock (``clock``, which a
test may drive by hand) has moved on by up to minutes, as behind a stalled load balancer;
keys are checked then, as a request served late would be.

It records every request with its key and injects latency and faults (status codes with
``Retry-After``, hangs, dropped connections, lost replies). It counts the faults it
injected and the ambiguous outcomes: mutations it committed whose client got no success
reply. Point the SDK at :attr:`ZepFake.base_url` (``ZEP_BASE_URL``). Control it in
process, or over HTTP under ``/_fake/`` when it runs in another process."""

from __future__ import annotations

import contextlib
import json
import random
import re
import select
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from afterthought.backends.retrieval import query_stems

API_PREFIX = "/api/v4"
JSON = dict[str, Any]


class _Reply(Exception):
    def __init__(self, status: int, body: JSON | None = None, *, committed: bool = False) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.committed = committed
        """A mutation whose effect now stands (done now, or replayed by its key)."""


def _error(status: int, code: str, message: str) -> _Reply:
    return _Reply(status, {"error": {"code": code, "message": message}})


@dataclass
class Fault:
    """Applied to the next ``times`` requests whose ``METHOD path`` matches ``match``."""

    match: str = ".*"
    status: int | None = None
    """Answer with this status (and a Zep error body) instead of doing the work."""
    retry_after: float | None = None
    delay: float = 0.0
    """Sleep this long first (longer than the client's timeout: a hang)."""
    drop: bool = False
    """Close the connection without a reply."""
    after_commit: bool = False
    """With ``drop`` or ``status``: do the work first, then fail (a lost reply)."""
    hang: bool = False
    """Wait until the client gives up (closes the connection, by
    :attr:`ZepFake.client_timeout` or soon after), then :attr:`ZepFake.hang_overshoot`, then
    do the work: it commits after the client gave up."""
    released: threading.Event | None = field(default=None, repr=False)
    """With ``hang``: hang until the test sets this instead (however slow the machine, the
    request is still in flight when the client gives up and its retry arrives)."""
    late: float | None = None
    """Drop the connection now and do the work this many seconds later on the fake's clock
    (:attr:`ZepFake.clock`): a request served long after its client gave up."""
    times: int = 1

    @property
    def kind(self) -> str:
        """How the fault is counted: ``hang``, ``drop``, a status, ``delay``; with
        ``_after_commit`` when the work is done first."""
        if self.hang:
            return "hang"
        if self.late is not None:
            return "late"
        what = "drop" if self.drop else str(self.status) if self.status else "delay"
        return f"{what}_after_commit" if self.after_commit and what != "delay" else what


#: Per-message content limit of each plan, in characters (Zep docs "Adding memory").
PLAN_CONTENT_LIMITS = {"free": 2500, "paid": 14_000}
#: Characters one ``graph.episode.add`` takes (Zep docs "Chunking large documents").
EPISODE_LIMIT = 10_000
#: What a repeated key with another body gets: the first reply, or a conflict.
KEY_REUSE = ("replay", "409", "422")
#: What a repeated key gets while the first request is still running.
KEY_IN_FLIGHT = ("wait", "409", "run_both")

#: How long past ``client_timeout`` a hang waits for its client to give up (a loaded
#: machine's client times out late); a client that waits longer is answered then.
HANG_GRACE_SECONDS = 1.0

#: What ``fault_rate`` draws from: refusals and dropped connections before the work, lost
#: replies after it (an error status, a dropped connection), rate limiting, and a hang that
#: commits once the client has given up.
RANDOM_FAULTS = (
    Fault(status=503),
    Fault(status=500, after_commit=True),
    Fault(drop=True),
    Fault(drop=True, after_commit=True),
    Fault(status=429, retry_after=0.2),
    Fault(hang=True),
)


@dataclass
class Recorded:
    method: str
    path: str
    idempotency_key: str | None
    body: Any
    status: int
    """0 until answered (and for a dropped connection)."""
    at: float
    query: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Kept:
    """The reply a keyed mutation got, to replay while the key is honoured."""

    status: int
    body: JSON | None
    request: str
    """The request body, canonically encoded: a repeat with another body is a conflict."""
    at: float


@dataclass(frozen=True)
class _Held:
    """A request to be served late: when (the fake's clock), and what."""

    due: float
    method: str
    path: str
    query: JSON
    body: Any
    key: str | None


@dataclass
class _State:
    users: dict[str, JSON] = field(default_factory=dict)
    threads: dict[str, JSON] = field(default_factory=dict)
    messages: dict[str, list[JSON]] = field(default_factory=dict)
    replies: dict[tuple[str, str, str], _Kept] = field(default_factory=dict)
    """Replies to keyed mutations, by key (and method and path: ``key_scope``)."""
    episodes: dict[str, list[JSON]] = field(default_factory=dict)
    templates: dict[str, JSON] = field(default_factory=dict)
    edges: dict[str, list[JSON]] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    tasks: dict[str, JSON] = field(default_factory=dict)
    unprocessed: list[JSON] = field(default_factory=list)
    """Messages and episodes not yet ingested, oldest first."""
    held: list[_Held] = field(default_factory=list)
    """Requests to be served late, in the order they arrived."""


def _now() -> str:
    return datetime.now(UTC).isoformat()


class ZepFake:
    """The fake. Every switch is a constructor keyword, an attribute, and a field of
    ``POST /_fake/config`` (see :meth:`configure`); the defaults are listed there."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency: float = 0.0,
        honor_idempotency: bool = True,
        idempotency_window: float | None = None,
        key_reuse: str = "422",
        key_in_flight: str = "409",
        key_scope: str = "project",
        duplicate_user_status: int = 400,
        plan: str = "free",
        too_long_status: int = 400,
        delete_pending_polls: int = 2,
        delete_pending_seconds: float = 1.0,
        delete_outcome: str = "succeeded",
        ingestion_lag_calls: int = 1,
        ingestion_lag_seconds: float = 0.0,
        max_page_size: int = 50,
        fault_rate: float = 0.0,
        seed: int | None = None,
        client_timeout: float = 30.0,
        hang_overshoot: float = 0.5,
        search_unmatched: str = "include",
        search_score: str = "score",
        late_commit_rate: float = 0.0,
        late_commit_max_seconds: float = 120.0,
        episode_metadata: str = "kept",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        """Seconds, for everything the fake times: key windows, ingestion and delete lags,
        late requests. A test may pass its own and move it by hand."""
        self.latency = latency
        self.honor_idempotency = honor_idempotency
        """Whether keyed mutations are replayed at all (False: every request runs)."""
        self.idempotency_window = idempotency_window
        """Seconds a key is honoured after its first reply; None: forever."""
        self.key_reuse = key_reuse
        """A repeated key with another body: ``replay`` the first reply, or answer ``409``
        or ``422`` (a conflict)."""
        self.key_in_flight = key_in_flight
        """A repeated key while the first request runs: ``wait`` for it and replay its
        reply, answer ``409``, or ``run_both``."""
        self.key_scope = key_scope
        """Where a key is known: in the whole ``project`` (one key on two paths, two
        threads say, is one request), or per ``path`` (method and path)."""
        self.duplicate_user_status = duplicate_user_status
        """``user.create`` of a taken ``user_id``: 400 "already exists" (as Zep answers) or 409."""
        self.plan = plan
        """``free`` or ``paid``: the per-message content limit (:data:`PLAN_CONTENT_LIMITS`)."""
        self.too_long_status = too_long_status
        """Content over the limit: 400 (Zep) or 413; the message names the length."""
        self.delete_pending_polls = delete_pending_polls
        """A delete's task stays pending until polled this often (``GET /tasks/{uuid}``)..."""
        self.delete_pending_seconds = delete_pending_seconds
        """... or until this long has passed; until then the data stays visible."""
        self.delete_outcome = delete_outcome
        """How a delete's task ends: ``succeeded``, or ``failed`` (the data stays)."""
        self.ingestion_lag_calls = ingestion_lag_calls
        """Messages and episodes are ingested (in context, searchable, extracted to edges)
        once this many further API calls have arrived (1: ``return_context`` and the next
        reads lack what was just sent, as on Zep; 0, the default, is kinder: this
        project's cached-block refresh relies on it, see the README)..."""
        self.ingestion_lag_seconds = ingestion_lag_seconds
        """... and this long has passed."""
        self.max_page_size = max_page_size
        """Largest page a list returns, whatever ``page_size`` asks for."""
        self.fault_rate = fault_rate
        """Share of requests failed at random, drawn from :data:`RANDOM_FAULTS`."""
        self.client_timeout = client_timeout
        """The clients' request timeout, in seconds (set it to theirs): a hang outlasts it.
        The default is the worker's default ``backend_timeout``."""
        self.hang_overshoot = hang_overshoot
        """How long after its client gave up (or past ``client_timeout``, where the
        connection is not watched) a hung request commits."""
        self.search_unmatched = search_unmatched
        """Graph search results that share no word with the query: ``include`` them after
        those that do, scored lower (Zep's semantic and graph-neighbour retrieval may return
        them; whether it does for an unrelated query is not documented), or ``exclude``."""
        self.search_score = search_score
        """``score`` on every search result, higher first (the SDK documents "the ranking
        score returned with every search result"; this fake's is reciprocal rank fusion,
        k = 60, about 0.016..0.033; Zep's scale is not documented), or ``omit`` it."""
        self.episode_metadata = episode_metadata
        """Whether the episode Zep makes of a thread message keeps the message's metadata
        (``kept``) or has none (``dropped``): not documented either way."""
        self.late_commit_rate = late_commit_rate
        """Share of mutations served late (dropped now, done up to
        ``late_commit_max_seconds`` later on :attr:`clock`, uniformly drawn)."""
        self.late_commit_max_seconds = late_commit_max_seconds
        self._landing = False
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.injected: Counter[str] = Counter()
        """Faults applied, by :attr:`Fault.kind`."""
        self.ambiguous: Counter[str] = Counter()
        """Committed mutations whose client got no success reply, by cause: a fault's
        :attr:`Fault.kind` (a failure after the work, a hang), ``client_gone`` (the client
        closed the connection first: it timed out or died) or ``reply_failed`` (writing the
        reply failed)."""
        self._random = random.Random(seed)
        self._state = _State()
        self._lock = threading.RLock()
        self._keys_in_flight: dict[tuple[str, str, str], threading.Lock] = {}
        self.hanging = 0
        """Requests in a hang now (a keyed one holds its key meanwhile, but with ``run_both``)."""
        self._calls = 0
        """API requests handled: ingestion lag is counted in them."""
        self._finish: dict[str, Callable[[], None]] = {}
        """What each pending delete task does when it succeeds."""
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._server = _Server((host, port), Handler)
        self._server.daemon_threads = True
        self._serving: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{API_PREFIX}"

    def start(self) -> ZepFake:
        # A short poll: stop() waits for the server loop to notice, 0.5 s by default.
        self._serving = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._serving.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ZepFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- control ------------------------------------------------------------------------
    def inject(self, fault: Fault) -> None:
        with self._lock:
            self.faults.append(fault)

    def reset(self) -> None:
        with self._lock:
            self._state = _State()
            self._finish.clear()
            self.requests.clear()
            self.faults.clear()
            self.injected.clear()
            self.ambiguous.clear()

    def messages(self, thread_uuid: str | None = None) -> list[JSON]:
        """Stored messages of one thread (or of all, in thread creation order)."""
        with self._lock:
            self._settle()
            if thread_uuid is not None:
                return [_public(m) for m in self._state.messages.get(thread_uuid, [])]
            return [_public(m) for msgs in self._state.messages.values() for m in msgs]

    def users(self) -> list[JSON]:
        with self._lock:
            self._settle()
            return list(self._state.users.values())

    def threads(self) -> list[JSON]:
        with self._lock:
            self._settle()
            return list(self._state.threads.values())

    def edges(self, *, extracted: bool | None = None) -> list[JSON]:
        """Live edges: those added with ``graph.edge.add`` and those Zep extracted from
        ingested messages and episodes (``extracted`` picks one kind)."""
        with self._lock:
            self._settle()
            return [
                e
                for added in self._state.edges.values()
                for e in added
                if e["uuid"] not in self._state.deleted
                and (extracted is None or e["extracted"] == extracted)
            ]

    def episodes(self, *, of_messages: bool = False) -> list[JSON]:
        """Live episodes added with ``graph.episode.add`` (with ``of_messages``, also those
        made of ingested thread messages)."""
        with self._lock:
            self._settle()
            return [
                _public(e)
                for added in self._state.episodes.values()
                for e in added
                if e["uuid"] not in self._state.deleted and (of_messages or not e["thread_uuid"])
            ]

    def tasks(self) -> list[JSON]:
        with self._lock:
            self._settle()
            return [dict(t) for t in self._state.tasks.values()]

    def snapshot(self) -> JSON:
        with self._lock:
            return {
                "users": self.users(),
                "threads": self.threads(),
                "messages": {t: self.messages(t) for t in self._state.messages},
                "edges": self.edges(),
                "episodes": self.episodes(of_messages=True),
                "tasks": self.tasks(),
                "requests": [asdict(r) for r in self.requests],
                "config": self.config(),
                **self.outcomes(),
            }

    def outcomes(self) -> JSON:
        """The counters, copied at one moment: ``injected`` faults and ``ambiguous``
        outcomes, each by kind, and the requests ``held`` to be served late."""
        with self._lock:
            self._land_late()
            return {
                "injected": dict(self.injected),
                "ambiguous": dict(self.ambiguous),
                "held": len(self._state.held),
            }

    def config(self) -> JSON:
        """The switches as they are now (what ``/_fake/config`` sets)."""
        with self._lock:
            return {name: getattr(self, name) for name in _SWITCHES}

    def configure(self, body: JSON) -> None:
        """Set switches (any of :data:`_SWITCHES`) and add ``faults``. Defaults:
        ``honor_idempotency`` True, ``idempotency_window`` None (forever), ``key_reuse``
        ``422``, ``key_in_flight`` ``409``, ``key_scope`` ``project``,
        ``duplicate_user_status`` 400, ``plan`` ``free`` (2,500 characters),
        ``too_long_status`` 400, ``delete_pending_polls`` 2,
        ``delete_pending_seconds`` 1, ``delete_outcome`` ``succeeded``,
        ``ingestion_lag_calls`` 1 (as Zep: a write shows from the next call on),
        ``ingestion_lag_seconds`` 0, ``max_page_size`` 50, ``search_unmatched``
        ``include``, ``search_score`` ``score``, ``late_commit_rate`` 0,
        ``late_commit_max_seconds`` 120, ``episode_metadata`` ``kept``."""
        unknown = set(body) - set(_SWITCHES) - {"faults"}
        if unknown:
            raise ValueError(f"unknown switches: {sorted(unknown)}")
        for name, allowed in _SWITCHES.items():
            if name in body and allowed and body[name] not in allowed:
                raise ValueError(f"{name} must be one of {allowed}")
        with self._lock:
            for name in _SWITCHES:
                if name in body:
                    setattr(self, name, body[name])
            for fault in body.get("faults", []):
                self.faults.append(Fault(**fault))

    # --- request handling ---------------------------------------------------------------
    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            target = f"{method} {path}"
            for fault in self.faults:
                if re.search(fault.match, target):
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    self.injected[fault.kind] += 1
                    return fault
            if (
                method in _MUTATING
                and self.late_commit_rate
                and self._random.random() < self.late_commit_rate
            ):
                late = Fault(late=self._random.uniform(0.0, self.late_commit_max_seconds))
                self.injected[late.kind] += 1
                return late
            if self.fault_rate and self._random.random() < self.fault_rate:
                drawn = self._random.choice(RANDOM_FAULTS)
                self.injected[drawn.kind] += 1
                return drawn
        return None

    def delay_of(self, fault: Fault | None) -> float:
        """How long a request sleeps before the work: latency, plus the fault's delay, plus
        past the client's timeout for a hang."""
        if fault is None:
            return self.latency
        timed = fault.hang and fault.released is None
        hang = self.client_timeout + self.hang_overshoot if timed else 0.0
        return self.latency + fault.delay + hang

    def wait_out(
        self, fault: Fault | None, client_gone: Callable[[float], bool] | None = None
    ) -> None:
        """Sleep a request's :meth:`delay_of`, then wait for a hang's ``released``; a hang
        counts in :attr:`hanging` meanwhile. A timed hang whose connection is known
        (``client_gone``: waits at most that long for the client to close it) waits for
        its client to give up instead (at most :data:`HANG_GRACE_SECONDS` past
        ``client_timeout``), then ``hang_overshoot``: it commits after the client gave
        up however slow the machine, the client's loop included."""
        delay = self.delay_of(fault)
        if fault is None or not fault.hang:
            if delay:
                time.sleep(delay)
            return
        with self._lock:
            self.hanging += 1
        try:
            if fault.released is not None:
                time.sleep(delay)
                fault.released.wait()
            elif client_gone is None:
                time.sleep(delay)
            else:
                time.sleep(self.latency + fault.delay)
                client_gone(self.client_timeout + HANG_GRACE_SECONDS)
                time.sleep(self.hang_overshoot)
        finally:
            with self._lock:
                self.hanging -= 1

    def note_ambiguous(self, cause: str) -> None:
        with self._lock:
            self.ambiguous[cause] += 1

    @contextlib.contextmanager
    def holding_key(self, method: str, path: str, key: str | None) -> Iterator[None]:
        """A keyed mutation holds its key (per method and path) until it is answered; a
        repeat arriving meanwhile waits for it (then replays its reply), is refused with
        409, or runs beside it (``key_in_flight``)."""
        if (
            not key
            or not self.honor_idempotency
            or method not in _MUTATING
            or self.key_in_flight == "run_both"
        ):
            yield
            return
        with self._lock:
            scope = self._scope(method, path, key)
            held = self._keys_in_flight.setdefault(scope, threading.Lock())
            # One served late is still running: a repeat gets 409, or (``wait``, which
            # cannot wait for a clock a test moves) runs, and the late one replays it.
            late = any(self._scope(h.method, h.path, h.key) == scope for h in self._state.held)
        if late and self.key_in_flight == "409":
            raise _error(409, "idempotency_conflict", "a request with this key is in progress")
        if not held.acquire(blocking=self.key_in_flight == "wait"):
            raise _error(409, "idempotency_conflict", "a request with this key is in progress")
        try:
            yield
        finally:
            held.release()

    def known_key(self, method: str, path: str, key: str | None) -> bool:
        """Whether a reply is kept for this key (checked on arrival: with ``run_both``, a
        request that arrived before any reply was kept runs, whatever lands meanwhile)."""
        with self._lock:
            return self._scope(method, path, key) in self._state.replies

    def _scope(self, method: str, path: str, key: str | None) -> tuple[str, str, str]:
        """What a key is known by (``key_scope``)."""
        if self.key_scope == "project":
            return ("", "", key or "")
        return (method, path, key or "")

    def handle(
        self,
        method: str,
        path: str,
        query: JSON,
        body: Any,
        key: str | None,
        *,
        replay: bool = True,
    ) -> _Reply:
        """Route one API request; returns the reply (raised internally for errors).
        ``replay``: a kept reply to its key may answer it."""
        route = _ROUTES_BY_METHOD.get(method, [])
        for pattern, handler in route:
            found = pattern.fullmatch(path)
            if found is None:
                continue
            keyed = bool(key) and method in _MUTATING and handler not in _READ_ONLY
            with self._lock:
                self._calls += 1
                self._settle()
                scope = self._scope(method, path, key)
                request = json.dumps(body, sort_keys=True)
                kept = self._state.replies.get(scope) if keyed and replay else None
                if kept is not None and self._honoured(kept):
                    if kept.request == request or self.key_reuse == "replay":
                        return _Reply(kept.status, kept.body, committed=True)
                    status = int(self.key_reuse)
                    return _error(status, "idempotency_conflict", "key reused with another body")
                try:
                    status, reply = handler(self, *found.groups(), query=query, body=body)
                except _Reply as error:
                    return error
                if keyed and status < 300:
                    self._state.replies[scope] = _Kept(status, reply, request, self.clock())
                committed = method in _MUTATING and status < 300 and handler not in _READ_ONLY
                return _Reply(status, reply, committed=committed)
        return _error(404, "not_found", f"no route {method} {path}")

    def hold(
        self, fault: Fault, method: str, path: str, query: JSON, body: Any, key: str | None
    ) -> None:
        """Serve this request ``fault.late`` seconds from now (:meth:`_land_late`)."""
        with self._lock:
            due = self.clock() + (fault.late or 0.0)
            self._state.held.append(_Held(due, method, path, query, body, key))

    def held(self) -> int:
        """Requests waiting to be served late."""
        with self._lock:
            return len(self._state.held)

    def _land_late(self) -> None:
        """Serve the held requests whose time has come, earliest first (at every request
        and every inspection)."""
        if self._landing:
            return
        self._landing = True
        try:
            now = self.clock()
            due = sorted((h for h in self._state.held if h.due <= now), key=lambda h: h.due)
            for held in due:
                self._state.held.remove(held)
                reply = self.handle(held.method, held.path, held.query, held.body, held.key)
                if reply.committed:
                    self.ambiguous["late"] += 1
        finally:
            self._landing = False

    def _honoured(self, kept: _Kept) -> bool:
        if not self.honor_idempotency:
            return False
        window = self.idempotency_window
        return window is None or self.clock() - kept.at < window

    # --- time passing: ingestion and delete tasks ----------------------------------------
    def _settle(self) -> None:
        """Ingest what is due (episodes, and edges extracted from them) and finish the
        delete tasks whose time has come, after serving what was held for late. Runs at
        every request and every inspection."""
        self._land_late()
        now = self.clock()
        while self._state.unprocessed:
            item = self._state.unprocessed[0]
            if (
                self._calls - item["_call"] < self.ingestion_lag_calls
                or now - item["_at"] < self.ingestion_lag_seconds
            ):
                break
            self._state.unprocessed.pop(0)
            self._ingest(item)
        for task in list(self._state.tasks.values()):
            if task["status"] in ("pending", "processing") and (
                now - task["_at"] >= self.delete_pending_seconds
            ):
                self._complete(task)

    def _ingest(self, item: JSON) -> None:
        item["processed"] = True
        if "thread_uuid" in item and "graph_uuid" not in item:  # a message
            if not item["_ingested"] or item["thread_uuid"] not in self._state.threads:
                return
            thread = self._state.threads[item["thread_uuid"]]
            episode = {
                "uuid": str(uuid.uuid4()),
                "content": item["content"],
                "role": item.get("role"),
                "role_name": item.get("name"),
                "thread_uuid": item["thread_uuid"],
                "user_uuid": thread["user_uuid"],
                "graph_uuid": thread["graph_uuid"],
                "metadata": dict(item.get("metadata") or {})
                if self.episode_metadata == "kept"
                else {},
                "reference_time": item.get("reference_time"),
                "source": "message",
                "created_at": _now(),
                "processed": True,
            }
            self._state.episodes.setdefault(thread["user_uuid"], []).append(episode)
            self._extract(thread["user_uuid"], episode)
        elif item["uuid"] not in self._state.deleted:
            self._extract(item["user_uuid"], item)

    def _extract(self, user_uuid: str, episode: JSON) -> None:
        """Zep's own extraction, made deterministic: one edge per sentence, with none of
        our provenance, naming the episode it came from."""
        speaker = episode.get("role_name") or episode.get("role") or "user"
        for sentence in re.split(r"(?<=[.!?])\s+", episode["content"].strip()):
            if not sentence:
                continue
            edge = {
                "uuid": str(uuid.uuid4()),
                "graph_uuid": episode["graph_uuid"],
                "user_uuid": user_uuid,
                "name": "STATED",
                "fact": sentence,
                "source_node_name": speaker,
                "target_node_name": sentence.split()[-1].strip(".!?"),
                "attributes": {},
                "episode_uuids": [episode["uuid"]],
                "created_at": _now(),
                "valid_at": episode.get("reference_time"),
                "invalid_at": None,
                "extracted": True,
            }
            self._state.edges.setdefault(user_uuid, []).append(edge)

    def _task(self, kind: str, finish: Callable[[], None] | None = None) -> JSON:
        """A task for an asynchronous operation; ``finish`` is done when it succeeds
        (immediately when no delay is configured)."""
        task: JSON = {
            "uuid": str(uuid.uuid4()),
            "type": kind,
            "status": "pending",
            "created_at": _now(),
            "_at": self.clock(),
            "_polls": 0,
        }
        self._state.tasks[task["uuid"]] = task
        if finish is not None:
            self._finish[task["uuid"]] = finish
        if self.delete_pending_polls <= 0 or self.delete_pending_seconds <= 0:
            self._complete(task)
        return _public(task)

    def _complete(self, task: JSON) -> None:
        finish = self._finish.pop(task["uuid"], None)
        failed = finish is not None and self.delete_outcome == "failed"
        if finish is not None and not failed:
            finish()
        task["status"] = "failed" if failed else "succeeded"
        task["completed_at"] = _now()
        if failed:
            task["error"] = {"code": "delete_failed", "message": "the delete did not complete"}

    def _get_task(self, task_uuid: str, *, query: JSON, body: Any) -> tuple[int, JSON]:
        task = self._state.tasks.get(task_uuid)
        if task is None:
            raise _error(404, "not_found", "task not found")
        task["_polls"] += 1
        if task["status"] in ("pending", "processing"):
            if task["_polls"] >= self.delete_pending_polls:
                self._complete(task)
            else:
                task["status"] = "processing"
                task["started_at"] = task.get("started_at") or _now()
        return 200, _public(task)

    # --- the v4 subset ------------------------------------------------------------------
    def _create_user(self, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        user_id = body.get("user_id")
        if user_id and any(u["user_id"] == user_id for u in self._state.users.values()):
            if self.duplicate_user_status == 409:
                raise _error(409, "already_exists", "user already exists")
            raise _error(400, "bad_request", f"user {user_id} already exists")
        user: JSON = {
            "uuid": str(uuid.uuid4()),
            "graph_uuid": str(uuid.uuid4()),
            "created_at": _now(),
            **{k: body.get(k) for k in ("user_id", "email", "first_name", "last_name")},
            "metadata": body.get("metadata") or {},
        }
        self._state.users[user["uuid"]] = user
        return 201, user

    def _user(self, user_uuid: str) -> JSON:
        user = self._state.users.get(user_uuid)
        if user is None:
            raise _error(404, "not_found", "user not found")
        return user

    def _get_user(self, user_uuid: str, *, query: JSON, body: Any) -> tuple[int, JSON]:
        return 200, self._user(user_uuid)

    def _lookup_user(self, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        for user in self._state.users.values():
            if user["user_id"] is not None and user["user_id"] == body.get("user_id"):
                return 200, user
        raise _error(404, "not_found", "user not found")

    def _delete_user(self, user_uuid: str, *, query: JSON, body: Any) -> tuple[int, JSON]:
        self._user(user_uuid)

        def finish() -> None:
            self._state.users.pop(user_uuid, None)
            for thread in [t for t in self._state.threads.values() if t["user_uuid"] == user_uuid]:
                self._drop_thread(thread["uuid"])
            for item in (
                *self._state.episodes.pop(user_uuid, []),
                *self._state.edges.pop(user_uuid, []),
            ):
                self._state.deleted.add(item["uuid"])

        return 202, {"task": self._task("user.delete", finish)}

    def _drop_thread(self, thread_uuid: str) -> None:
        self._state.threads.pop(thread_uuid, None)
        self._state.messages.pop(thread_uuid, None)

    def _delete_thread(self, thread_uuid: str, *, query: JSON, body: Any) -> tuple[int, JSON]:
        self._thread(thread_uuid)
        return 202, {"task": self._task("thread.delete", lambda: self._drop_thread(thread_uuid))}

    def _create_thread(self, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        user = self._user(str(body.get("user_uuid")))
        thread = {
            "uuid": str(uuid.uuid4()),
            "thread_id": body.get("thread_id"),
            "user_uuid": user["uuid"],
            "graph_uuid": user["graph_uuid"],
            "created_at": _now(),
            "updated_at": _now(),
        }
        self._state.threads[thread["uuid"]] = thread
        self._state.messages[thread["uuid"]] = []
        return 201, thread

    def _thread(self, thread_uuid: str) -> JSON:
        thread = self._state.threads.get(thread_uuid)
        if thread is None:
            raise _error(404, "not_found", "thread not found")
        return thread

    def _get_thread(self, thread_uuid: str, *, query: JSON, body: Any) -> tuple[int, JSON]:
        return 200, self._thread(thread_uuid)

    def _add_messages(self, thread_uuid: str, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        thread = self._thread(thread_uuid)
        incoming = body.get("messages") or []
        if not 1 <= len(incoming) <= 30:
            raise _error(400, "invalid_request", "between 1 and 30 messages per call")
        ignored = set(body.get("ignore_roles") or [])
        limit = PLAN_CONTENT_LIMITS[self.plan]
        for m in incoming:
            if not isinstance(m.get("content"), str) or not m["content"]:
                raise _error(400, "invalid_request", "message content is required")
            if len(m["content"]) > limit:
                raise _error(
                    self.too_long_status,
                    "bad_request",
                    f"message content exceeds {limit} characters ({len(m['content'])} given)",
                )
            if len(m.get("metadata") or {}) > 10:
                raise _error(400, "invalid_request", "at most 10 metadata keys")
        added = []
        for m in incoming:
            stored = {
                "uuid": str(uuid.uuid4()),
                "thread_uuid": thread_uuid,
                "role": m.get("role"),
                "name": m.get("name"),
                "content": m["content"],
                "metadata": m.get("metadata") or {},
                "reference_time": m.get("reference_time"),
                "created_at": _now(),
                "processed": False,
                "_ingested": m.get("role") not in ignored,
                "_call": self._calls,
                "_at": self.clock(),
            }
            self._state.messages[thread_uuid].append(stored)
            self._state.unprocessed.append(stored)
            added.append(_public(stored))
        self._settle()  # with no lag configured, they are ingested at once
        reply: JSON = {"messages": added, "task": self._task("thread.add_messages")}
        if body.get("return_context"):
            reply["context"] = self._context_for(thread["user_uuid"], "", 4000)
        return 202, reply

    def _update_message(
        self, thread_uuid: str, message_uuid: str, *, query: JSON, body: JSON
    ) -> tuple[int, JSON]:
        """Metadata merged; a null value deletes its key (the only field v4 updates)."""
        self._thread(thread_uuid)
        for message in self._state.messages[thread_uuid]:
            if message["uuid"] == message_uuid:
                merged = {**(message.get("metadata") or {}), **(body.get("metadata") or {})}
                merged = {k: v for k, v in merged.items() if v is not None}
                if len(merged) > 10:
                    raise _error(400, "invalid_request", "at most 10 metadata keys")
                message["metadata"] = merged
                return 200, _public(message)
        raise _error(404, "not_found", "message not found")

    def _page(self, items: list[JSON], query: JSON) -> JSON:
        """One page: at most ``page_size`` (capped at the server's maximum) items after the
        opaque ``cursor`` (the last item's uuid, so writes between pages shift nothing)."""
        size = max(1, min(int(query.get("page_size") or 50), self.max_page_size))
        start = 0
        if query.get("cursor"):
            start = next(
                (i + 1 for i, item in enumerate(items) if item["uuid"] == query["cursor"]), None
            ) or len(items)
        page = items[start : start + size]
        more = start + len(page) < len(items)
        return {
            "items": [_public(item) for item in page],
            "next_cursor": page[-1]["uuid"] if more and page else "",
            "total_size": len(items),
        }

    def _list_messages(self, thread_uuid: str, *, query: JSON, body: Any) -> tuple[int, JSON]:
        self._thread(thread_uuid)
        items = self._state.messages[thread_uuid]
        if query.get("order") == "desc":
            items = list(reversed(items))
        return 200, self._page(items, query)

    def _list_thread_episodes(
        self, thread_uuid: str, *, query: JSON, body: Any
    ) -> tuple[int, JSON]:
        """The episodes Zep made of the thread's messages (each keeps its message's
        metadata as it was at ingestion), as they were made; ``total_size`` is omitted."""
        thread = self._thread(thread_uuid)
        items = [
            e
            for e in self._live_episodes(thread["user_uuid"])
            if e.get("thread_uuid") == thread_uuid
        ]
        page = self._page(items, query)
        page.pop("total_size", None)
        return 200, page

    def _thread_context(self, thread_uuid: str, *, query: JSON, body: Any) -> tuple[int, JSON]:
        thread = self._thread(thread_uuid)
        return 200, {"context": self._context_for(thread["user_uuid"], "", 4000)}

    def _graph_context(self, graph_uuid: str, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        owner = self._owner(graph_uuid)
        limit = int(body.get("max_characters") or 4000)
        template = body.get("template_uuid")
        if template:  # a toy renderer: %{edges} gets the facts, other variables nothing
            if template not in self._state.templates:
                raise _error(404, "not_found", "template not found")
            facts = "\n".join(f"- {m['content']}" for m in self._knowledge(owner["uuid"]))
            text = re.sub(
                r"%\{edges[^}]*\}", lambda _: facts, self._state.templates[template]["template"]
            )
            text = re.sub(r"%\{[^}]*\}", "", text)
            return 200, {"context": text[:limit], "truncated": False}
        context = self._context_for(owner["uuid"], str(body.get("query", "")), limit)
        return 200, {"context": context, "truncated": False}

    def _create_template(self, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        if any(t["name"] == body.get("name") for t in self._state.templates.values()):
            raise _error(409, "already_exists", "template name taken")
        if "%{" not in str(body.get("template", "")):
            raise _error(400, "invalid_template", "no variables")
        created: JSON = {
            "uuid": str(uuid.uuid4()),
            "name": body.get("name"),
            "template": body.get("template"),
            "created_at": _now(),
        }
        self._state.templates[created["uuid"]] = created
        return 201, created

    def _template(self, template_uuid: str, *, query: JSON, body: Any) -> tuple[int, JSON]:
        if template_uuid not in self._state.templates:
            raise _error(404, "not_found", "template not found")
        return 200, self._state.templates[template_uuid]

    def _update_template(self, template_uuid: str, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        self._template(template_uuid, query=query, body=body)
        self._state.templates[template_uuid].update(
            {k: body[k] for k in ("name", "template") if k in body}
        )
        return 200, self._state.templates[template_uuid]

    def _delete_template(self, template_uuid: str, *, query: JSON, body: Any) -> tuple[int, JSON]:
        self._template(template_uuid, query=query, body=body)
        del self._state.templates[template_uuid]
        return 200, {}

    def _live_edges(self, user_uuid: str) -> list[JSON]:
        return [
            e for e in self._state.edges.get(user_uuid, []) if e["uuid"] not in self._state.deleted
        ]

    def _live_episodes(self, user_uuid: str) -> list[JSON]:
        return [
            e
            for e in self._state.episodes.get(user_uuid, [])
            if e["processed"] and e["uuid"] not in self._state.deleted
        ]

    def _knowledge(self, user_uuid: str) -> list[JSON]:
        """What the user's context is made of, newest first: the live edges (their fact
        as ``content``), then the ingested episodes not wholly stated by live edges
        (deleting an edge leaves its episode, which can come back in context, as on Zep)."""
        edges = [{**e, "content": e["fact"]} for e in self._live_edges(user_uuid)]
        stated = {e["fact"] for e in edges}
        episodes = [
            e
            for e in self._live_episodes(user_uuid)
            if not all(s in stated for s in re.split(r"(?<=[.!?])\s+", e["content"].strip()))
        ]
        return [
            *sorted(edges, key=lambda m: m["created_at"], reverse=True),
            *sorted(episodes, key=lambda m: m["created_at"], reverse=True),
        ]

    def _owner(self, graph_uuid: str) -> JSON:
        for user in self._state.users.values():
            if graph_uuid in (user["graph_uuid"], user["uuid"]):
                return user
        raise _error(404, "not_found", "graph not found")

    def _search(self, graph_uuid: str, scope: str, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        owner = self._owner(graph_uuid)
        size = int(query.get("page_size") or 50)
        if not 1 <= size <= 50:
            raise _error(400, "invalid_request", "page_size must be 1..50")
        if scope == "observations" and body.get("filters"):
            raise _error(400, "unsupported_filter", "observation search supports no filters")
        wanted = query_stems(str(body.get("query", "")))

        def best(found: list[JSON], text: str) -> list[JSON]:
            """Ranked as Zep's default reranker does: reciprocal rank fusion (k = 60) of a
            keyword ranking (the items sharing a word with the query, by how many, as
            :func:`query_stems` reads words) and a second ranking standing in for semantic
            and graph-neighbour retrieval (the same order, then, with ``search_unmatched``
            ``include``, every other item, newest first)."""
            shared = [len(wanted & query_stems(str(m.get(text) or ""))) for m in found]
            order = sorted(
                range(len(found)), key=lambda i: (-shared[i], _desc(found[i]["created_at"]))
            )
            keyword = [i for i in order if shared[i]]
            rankings = [keyword, order if self.search_unmatched == "include" else keyword]
            scores: dict[int, float] = {}
            for ranking in rankings:
                for rank, i in enumerate(ranking, start=1):
                    scores[i] = scores.get(i, 0.0) + 1.0 / (60 + rank)
            top = sorted(scores, key=lambda i: -scores[i])[:size]
            if self.search_score == "omit":
                return [found[i] for i in top]
            return [{**found[i], "score": scores[i]} for i in top]

        items: list[JSON] = []
        if scope == "edges":
            items = [_edge(e) for e in best(self._live_edges(owner["uuid"]), "fact")]
        elif scope == "episodes":
            items = [_public(e) for e in best(self._live_episodes(owner["uuid"]), "content")]
        return 200, {"items": items, "next_cursor": ""}

    def _add_episode(self, graph_uuid: str, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        owner = self._owner(graph_uuid)
        if not isinstance(body.get("data"), str) or not body["data"]:
            raise _error(400, "invalid_request", "data is required")
        if len(body["data"]) > EPISODE_LIMIT:
            raise _error(
                400,
                "bad_request",
                f"episode data exceeds {EPISODE_LIMIT} characters ({len(body['data'])} given)",
            )
        episode = {
            "uuid": str(uuid.uuid4()),
            "content": body["data"],
            "metadata": body.get("metadata") or {},
            "source_description": body.get("source_description"),
            "source": body.get("type") or "text",
            "reference_time": body.get("reference_time"),
            "created_at": _now(),
            "graph_uuid": owner["graph_uuid"],
            "user_uuid": owner["uuid"],
            "thread_uuid": None,
            "processed": False,
            "_call": self._calls,
            "_at": self.clock(),
        }
        self._state.episodes.setdefault(owner["uuid"], []).append(episode)
        self._state.unprocessed.append(episode)
        self._settle()
        return 202, {"episode": _public(episode), "task": self._task("graph.episode.add")}

    def _episode(self, graph_uuid: str, episode_uuid: str) -> tuple[JSON, JSON]:
        owner = self._owner(graph_uuid)
        for episode in self._state.episodes.get(owner["uuid"], []):
            if episode["uuid"] == episode_uuid and episode["uuid"] not in self._state.deleted:
                return owner, episode
        raise _error(404, "not_found", "episode not found")

    def _get_episode(
        self, graph_uuid: str, episode_uuid: str, *, query: JSON, body: Any
    ) -> tuple[int, JSON]:
        return 200, _public(self._episode(graph_uuid, episode_uuid)[1])

    def _delete_episode(
        self, graph_uuid: str, episode_uuid: str, *, query: JSON, body: Any
    ) -> tuple[int, JSON]:
        """The episode, and the edges that came only from episodes now deleted; never the
        thread message it was made of."""
        owner, _ = self._episode(graph_uuid, episode_uuid)

        def finish() -> None:
            deleted = self._state.deleted
            deleted.add(episode_uuid)
            for edge in self._state.edges.get(owner["uuid"], []):
                sources = edge.get("episode_uuids") or []
                if sources and all(s in deleted for s in sources):
                    deleted.add(edge["uuid"])

        return 202, {"task": self._task("graph.episode.delete", finish)}

    def _add_edges(self, graph_uuid: str, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        owner = self._owner(graph_uuid)
        incoming = body.get("edges") or []
        if not 1 <= len(incoming) <= 100:
            raise _error(400, "invalid_request", "between 1 and 100 edges")
        added = []
        for e in incoming:
            if not e.get("fact") or not e.get("fact_name"):
                raise _error(400, "invalid_request", "fact and fact_name are required")
            edge = {
                "uuid": str(uuid.uuid4()),
                "graph_uuid": owner["graph_uuid"],
                "user_uuid": owner["uuid"],
                "name": e["fact_name"],
                "created_at": _now(),
                **{k: e.get(k) for k in ("fact", "attributes", "metadata", "valid_at")},
                "invalid_at": e.get("invalid_at"),
                "episode_uuids": [],
                "extracted": False,
            }
            self._state.edges.setdefault(owner["uuid"], []).append(edge)
            added.append({**_edge(edge), "fact_name": edge["name"]})
        return 202, {"edges": added, "task": self._task("graph.edge.add")}

    def _edge(self, graph_uuid: str, edge_uuid: str) -> tuple[JSON, JSON]:
        owner = self._owner(graph_uuid)
        for edge in self._live_edges(owner["uuid"]):
            if edge["uuid"] == edge_uuid:
                return owner, edge
        raise _error(404, "not_found", "edge not found")

    def _get_edge(
        self, graph_uuid: str, edge_uuid: str, *, query: JSON, body: Any
    ) -> tuple[int, JSON]:
        return 200, _edge(self._edge(graph_uuid, edge_uuid)[1])

    def _list_edges(self, graph_uuid: str, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        owner = self._owner(graph_uuid)
        page = self._page(self._live_edges(owner["uuid"]), query)
        page["items"] = [_edge(e) for e in page["items"]]
        return 200, page

    def _list_threads(self, *, query: JSON, body: Any) -> tuple[int, JSON]:
        """Filtered by ``user_uuid``, sorted by ``order_by`` (``created_at``, ``updated_at``
        or ``uuid``; creation order if none) in ``order``, in pages (as Zep's ``GET
        /threads``); threads of one timestamp in creation order (reversed by ``desc``)."""
        items = [
            t
            for t in self._state.threads.values()
            if not query.get("user_uuid") or t["user_uuid"] == query["user_uuid"]
        ]
        by = query.get("order_by")
        if by not in (None, "created_at", "updated_at", "uuid"):
            raise _error(400, "bad_request", "order_by")
        if by is not None:
            items.sort(key=lambda t: str(t[by]))
        if query.get("order") == "desc":
            items.reverse()
        return 200, self._page(items, query)

    def _delete_edge(
        self, graph_uuid: str, edge_uuid: str, *, query: JSON, body: Any
    ) -> tuple[int, JSON]:
        """The edge only: its source episodes and messages stay (as on Zep)."""
        self._edge(graph_uuid, edge_uuid)

        def finish() -> None:
            self._state.deleted.add(edge_uuid)

        return 202, {"task": self._task("graph.edge.delete", finish)}

    def _context_for(self, user_uuid: str, query: str, limit: int) -> str:
        """Zep would rank what it extracted; the fake lists what it has ingested."""
        facts = [
            f"  - {m['content']} ({(m.get('reference_time') or m['created_at'])[:10]} - present)"
            for m in self._knowledge(user_uuid)
        ]
        if not facts:
            return ""
        lines = [
            "FACTS and ENTITIES represent relevant context to the current conversation.",
            "<FACTS>",
        ]
        size = sum(len(x) + 1 for x in lines) + len("</FACTS>")
        for fact in facts:
            if size + len(fact) + 1 > limit:
                break
            lines.append(fact)
            size += len(fact) + 1
        return "\n".join([*lines, "</FACTS>"])


def _desc(text: str) -> list[int]:
    """A sort key putting ``text`` (an ISO time) newest first."""
    return [-ord(c) for c in text]


def _public(item: JSON) -> JSON:
    """What the API shows of a stored item: not the fake's bookkeeping (``_`` fields)."""
    return {k: v for k, v in item.items() if not k.startswith("_")}


def _edge(edge: JSON) -> JSON:
    """An edge as the API shows it (whether Zep extracted it shows only in its
    attributes and episodes, as on Zep)."""
    return {k: v for k, v in edge.items() if k != "extracted"}


_MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: The switches ``configure`` takes, with their allowed values (empty: any).
_SWITCHES: dict[str, tuple[Any, ...]] = {
    "latency": (),
    "honor_idempotency": (True, False),
    "idempotency_window": (),
    "key_reuse": KEY_REUSE,
    "key_in_flight": KEY_IN_FLIGHT,
    "key_scope": ("project", "path"),
    "duplicate_user_status": (400, 409),
    "plan": tuple(PLAN_CONTENT_LIMITS),
    "too_long_status": (400, 413),
    "delete_pending_polls": (),
    "delete_pending_seconds": (),
    "delete_outcome": ("succeeded", "failed"),
    "ingestion_lag_calls": (),
    "ingestion_lag_seconds": (),
    "max_page_size": (),
    "fault_rate": (),
    "client_timeout": (),
    "hang_overshoot": (),
    "search_unmatched": ("include", "exclude"),
    "search_score": ("score", "omit"),
    "late_commit_rate": (),
    "late_commit_max_seconds": (),
    "episode_metadata": ("kept", "dropped"),
}

_Handler_t = Callable[..., tuple[int, JSON]]
_ROUTES: list[tuple[str, str, _Handler_t]] = [
    ("POST", r"/users", ZepFake._create_user),
    ("POST", r"/users/lookup", ZepFake._lookup_user),
    ("GET", r"/users/([\w-]+)", ZepFake._get_user),
    ("DELETE", r"/users/([\w-]+)", ZepFake._delete_user),
    ("POST", r"/threads", ZepFake._create_thread),
    ("GET", r"/threads/([\w-]+)", ZepFake._get_thread),
    ("DELETE", r"/threads/([\w-]+)", ZepFake._delete_thread),
    ("POST", r"/threads/([\w-]+)/messages", ZepFake._add_messages),
    ("GET", r"/threads/([\w-]+)/messages", ZepFake._list_messages),
    ("PATCH", r"/threads/([\w-]+)/messages/([\w-]+)", ZepFake._update_message),
    ("GET", r"/threads/([\w-]+)/episodes", ZepFake._list_thread_episodes),
    ("GET", r"/threads/([\w-]+)/context", ZepFake._thread_context),
    ("POST", r"/graphs/([\w-]+)/context", ZepFake._graph_context),
    ("POST", r"/graphs/([\w-]+)/search/(edges|nodes|episodes|observations)", ZepFake._search),
    ("POST", r"/graphs/([\w-]+)/search/(thread)-summaries", ZepFake._search),
    ("POST", r"/graphs/([\w-]+)/episodes", ZepFake._add_episode),
    ("GET", r"/graphs/([\w-]+)/episodes/([\w-]+)", ZepFake._get_episode),
    ("DELETE", r"/graphs/([\w-]+)/episodes/([\w-]+)", ZepFake._delete_episode),
    ("GET", r"/graphs/([\w-]+)/edges/([\w-]+)", ZepFake._get_edge),
    ("DELETE", r"/graphs/([\w-]+)/edges/([\w-]+)", ZepFake._delete_edge),
    ("POST", r"/graphs/([\w-]+)/edges", ZepFake._add_edges),
    ("POST", r"/graphs/([\w-]+)/edges/list", ZepFake._list_edges),
    ("GET", r"/threads", ZepFake._list_threads),
    ("GET", r"/tasks/([\w-]+)", ZepFake._get_task),
    ("POST", r"/context-templates", ZepFake._create_template),
    ("GET", r"/context-templates/([\w-]+)", ZepFake._template),
    ("PUT", r"/context-templates/([\w-]+)", ZepFake._update_template),
    ("DELETE", r"/context-templates/([\w-]+)", ZepFake._delete_template),
]
#: POST routes that change nothing: failing their reply leaves nothing ambiguous, and
#: their keys are never replayed.
_READ_ONLY: frozenset[_Handler_t] = frozenset(
    {ZepFake._lookup_user, ZepFake._graph_context, ZepFake._search, ZepFake._list_edges}
)
_ROUTES_BY_METHOD: dict[str, list[tuple[re.Pattern[str], _Handler_t]]] = {}
for _method, _pattern, _fn in _ROUTES:
    _ROUTES_BY_METHOD.setdefault(_method, []).append((re.compile(_pattern), _fn))


class _Server(ThreadingHTTPServer):
    request_queue_size = (
        256  # socketserver's 5 turns bursts of new connections into 1 s SYN retries
    )

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (timeout, budget) is normal here; anything else is not."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server_fake: ZepFake
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm the body waited for the
    # client's delayed ACK, 40 ms a request (a 5,400-message thread read in 5 s, not 0.5).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read .requests
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def _serve(self, method: str) -> None:
        fake = self.server_fake
        url = urlparse(self.path)
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            self._reply(400, {"error": {"code": "invalid_json", "message": "bad JSON"}})
            return
        if url.path.startswith("/_fake/"):
            self._control(method, url.path, body)
            return
        if not url.path.startswith(API_PREFIX):
            self._reply(404, {"error": {"code": "not_found", "message": "unknown path"}})
            return
        path = url.path[len(API_PREFIX) :]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        key = self.headers.get("Idempotency-Key")
        # Recorded on arrival, so a request that hangs is visible while it hangs.
        seen = self._record(method, path, key, body, query)
        if not (self.headers.get("Authorization") or "").startswith("Api-Key "):
            seen.status = 401
            self._reply(401, {"error": {"code": "unauthorized", "message": "missing key"}})
            return
        with fake._lock:
            fake._land_late()  # a repeat of a request due by now finds it served
        fault = fake._take_fault(method, path)
        if fault is not None and fault.late is not None:
            fake.hold(fault, method, path, query, body, key)
            self.close_connection = True
            self.connection.close()
            return
        replay = fake.key_in_flight != "run_both" or fake.known_key(method, path, key)
        try:
            with fake.holding_key(method, path, key):
                fake.wait_out(fault, self._client_gone)
                if fault and not fault.after_commit and (fault.drop or fault.status):
                    seen.status = fault.status or 0
                    self._fail(fault)
                    return
                reply = fake.handle(method, path, query, body, key, replay=replay)
        except _Reply as refused:  # the key is held by a request still running
            reply = refused
        seen.status = reply.status
        if fault and fault.after_commit and (fault.drop or fault.status):
            if reply.committed:
                fake.note_ambiguous(fault.kind)
            self._fail(fault)
            return
        if reply.committed and self._client_gone():
            fake.note_ambiguous("hang" if fault and fault.hang else "client_gone")
            self.close_connection = True
            return
        try:
            self._reply(reply.status, reply.body)
        except OSError:  # the client went away while we wrote (a reset, a broken pipe)
            if reply.committed:
                fake.note_ambiguous("reply_failed")
            self.close_connection = True

    def _client_gone(self, within: float = 0.0) -> bool:
        """The client closed its end while the request was served (it timed out, or died),
        now or ``within`` seconds: the connection reads as closed. A live HTTP/1.1 client
        sends nothing before the reply, so a readable socket means end of stream or a
        reset."""
        try:
            # poll, not select: select() refuses descriptors above 1023, which a long
            # test process (or a busy server) reaches.
            poller = select.poll()
            poller.register(self.connection, select.POLLIN)
            readable = poller.poll(int(within * 1000))
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _control(self, method: str, path: str, body: JSON) -> None:
        fake = self.server_fake
        if method == "GET" and path == "/_fake/state":
            self._reply(200, fake.snapshot())
        elif method == "GET" and path == "/_fake/outcomes":
            self._reply(200, fake.outcomes())
        elif method == "POST" and path == "/_fake/reset":
            fake.reset()
            self._reply(200, {})
        elif method == "GET" and path == "/_fake/config":
            self._reply(200, fake.config())
        elif method == "POST" and path == "/_fake/config":
            try:
                fake.configure(body)
            except (TypeError, ValueError) as exc:
                self._reply(400, {"error": {"code": "bad_config", "message": str(exc)}})
                return
            self._reply(200, {})
        else:
            self._reply(404, {"error": {"code": "not_found", "message": "unknown control"}})

    def _record(
        self, method: str, path: str, key: str | None, body: Any, query: dict[str, str]
    ) -> Recorded:
        seen = Recorded(method, path, key, body, status=0, at=time.time(), query=query)
        with self.server_fake._lock:
            self.server_fake.requests.append(seen)
        return seen

    def _fail(self, fault: Fault) -> None:
        if fault.drop:
            self.close_connection = True
            self.connection.close()
            return
        status = fault.status or 500
        headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
        self._reply(status, {"error": {"code": f"injected_{status}", "message": "fault"}}, headers)

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
