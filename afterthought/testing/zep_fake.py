"""A loopback stand-in for Zep's v4 REST API, for tests that use the real ``zep-cloud`` SDK.

It keeps users, threads and messages in memory, records every request with its
``Idempotency-Key``, replays keyed mutations unless told not to, and injects latency and
faults (status codes with ``Retry-After``, hangs, dropped connections, lost replies). It
counts the faults it injected and the ambiguous outcomes: mutations it committed whose
client got no success reply. Point the SDK at :attr:`ZepFake.base_url` (``ZEP_BASE_URL``).
Control it in process, or over HTTP under ``/_fake/`` when it runs in another process."""

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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

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
    """Sleep past the client's timeout (:attr:`ZepFake.client_timeout` plus
    :attr:`ZepFake.hang_overshoot`), then do the work: it commits after the client gave up."""
    times: int = 1

    @property
    def kind(self) -> str:
        """How the fault is counted: ``hang``, ``drop``, a status, ``delay``; with
        ``_after_commit`` when the work is done first."""
        if self.hang:
            return "hang"
        what = "drop" if self.drop else str(self.status) if self.status else "delay"
        return f"{what}_after_commit" if self.after_commit and what != "delay" else what


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


@dataclass
class _State:
    users: dict[str, JSON] = field(default_factory=dict)
    threads: dict[str, JSON] = field(default_factory=dict)
    messages: dict[str, list[JSON]] = field(default_factory=dict)
    replies: dict[str, tuple[int, JSON | None]] = field(default_factory=dict)
    episodes: dict[str, list[JSON]] = field(default_factory=dict)
    templates: dict[str, JSON] = field(default_factory=dict)
    edges: dict[str, list[JSON]] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class ZepFake:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency: float = 0.0,
        honor_idempotency: bool = True,
        fault_rate: float = 0.0,
        seed: int | None = None,
        client_timeout: float = 30.0,
        hang_overshoot: float = 0.5,
    ) -> None:
        self.latency = latency
        self.honor_idempotency = honor_idempotency
        self.fault_rate = fault_rate
        """Share of requests failed at random, drawn from :data:`RANDOM_FAULTS`."""
        self.client_timeout = client_timeout
        """The clients' request timeout, in seconds (set it to theirs): a hang outlasts it.
        The default is the worker's default ``backend_timeout``."""
        self.hang_overshoot = hang_overshoot
        """How long past ``client_timeout`` a hung request commits."""
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
        self._keys_in_flight: dict[str, threading.Lock] = {}
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
        self._serving = threading.Thread(target=self._server.serve_forever, daemon=True)
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
            self.requests.clear()
            self.faults.clear()
            self.injected.clear()
            self.ambiguous.clear()

    def messages(self, thread_uuid: str | None = None) -> list[JSON]:
        """Stored messages of one thread (or of all, in thread creation order)."""
        with self._lock:
            if thread_uuid is not None:
                return list(self._state.messages.get(thread_uuid, []))
            return [m for msgs in self._state.messages.values() for m in msgs]

    def users(self) -> list[JSON]:
        with self._lock:
            return list(self._state.users.values())

    def threads(self) -> list[JSON]:
        with self._lock:
            return list(self._state.threads.values())

    def snapshot(self) -> JSON:
        with self._lock:
            return {
                "users": self.users(),
                "threads": self.threads(),
                "messages": self._state.messages,
                "requests": [asdict(r) for r in self.requests],
                **self.outcomes(),
            }

    def outcomes(self) -> JSON:
        """The counters, copied at one moment: ``injected`` faults and ``ambiguous``
        outcomes, each by kind."""
        with self._lock:
            return {"injected": dict(self.injected), "ambiguous": dict(self.ambiguous)}

    def configure(self, body: JSON) -> None:
        with self._lock:
            for name in (
                "latency",
                "honor_idempotency",
                "fault_rate",
                "client_timeout",
                "hang_overshoot",
            ):
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
        hang = self.client_timeout + self.hang_overshoot if fault.hang else 0.0
        return self.latency + fault.delay + hang

    def note_ambiguous(self, cause: str) -> None:
        with self._lock:
            self.ambiguous[cause] += 1

    def key_in_flight(self, method: str, key: str | None) -> threading.Lock | None:
        """Like an idempotent API, a keyed mutation holds its key until it is answered: a
        retry arriving meanwhile waits, then gets the first one's reply."""
        if not key or not self.honor_idempotency or method not in {"POST", "PUT", "DELETE"}:
            return None
        with self._lock:
            return self._keys_in_flight.setdefault(key, threading.Lock())

    def handle(self, method: str, path: str, query: JSON, body: Any, key: str | None) -> _Reply:
        """Route one API request; returns the reply (raised internally for errors)."""
        route = _ROUTES_BY_METHOD.get(method, [])
        for pattern, handler in route:
            found = pattern.fullmatch(path)
            if found is None:
                continue
            mutating = method in {"POST", "PUT", "PATCH", "DELETE"}
            with self._lock:
                if mutating and key and self.honor_idempotency and key in self._state.replies:
                    status, reply = self._state.replies[key]
                    return _Reply(status, reply, committed=True)
                try:
                    status, reply = handler(self, *found.groups(), query=query, body=body)
                except _Reply as error:
                    return error
                if mutating and key and status < 300:
                    self._state.replies[key] = (status, reply)
                committed = mutating and status < 300 and handler not in _READ_ONLY
                return _Reply(status, reply, committed=committed)
        return _error(404, "not_found", f"no route {method} {path}")

    # --- the v4 subset ------------------------------------------------------------------
    def _create_user(self, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        user_id = body.get("user_id")
        if user_id and any(u["user_id"] == user_id for u in self._state.users.values()):
            raise _error(409, "already_exists", "user already exists")
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
        del self._state.users[user_uuid]
        # Real Zep: "once it completes, the user's threads, messages, and graph are removed".
        self._state.edges.pop(user_uuid, None)
        self._state.episodes.pop(user_uuid, None)
        for thread in [t for t in self._state.threads.values() if t["user_uuid"] == user_uuid]:
            del self._state.threads[thread["uuid"]]
            self._state.messages.pop(thread["uuid"], None)
        return 202, {"task": _task("user.delete")}

    def _create_thread(self, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        user = self._user(str(body.get("user_uuid")))
        thread = {
            "uuid": str(uuid.uuid4()),
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
        added = []
        for m in incoming:
            if not isinstance(m.get("content"), str) or not m["content"]:
                raise _error(400, "invalid_request", "message content is required")
            if len(m.get("metadata") or {}) > 10:
                raise _error(400, "invalid_request", "at most 10 metadata keys")
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
                "processed": True,
                "ingested": m.get("role") not in ignored,
            }
            self._state.messages[thread_uuid].append(stored)
            added.append({k: v for k, v in stored.items() if k != "ingested"})
        reply: JSON = {"messages": added, "task": _task("thread.add_messages")}
        if body.get("return_context"):
            reply["context"] = self._context_for(thread["user_uuid"], "", 4000)
        return 202, reply

    def _list_messages(self, thread_uuid: str, *, query: JSON, body: Any) -> tuple[int, JSON]:
        self._thread(thread_uuid)
        items = self._state.messages[thread_uuid]
        if query.get("order") == "desc":
            items = list(reversed(items))
        start = int(query.get("cursor") or 0)
        size = int(query.get("page_size") or 50)
        page = items[start : start + size]
        end = start + len(page)
        return 200, {
            "items": [{k: v for k, v in m.items() if k != "ingested"} for m in page],
            "next_cursor": str(end) if end < len(items) else "",
            "total_size": len(items),
        }

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

    def _knowledge(self, user_uuid: str) -> list[JSON]:
        """What Zep would have extracted facts from: ingested messages and added episodes,
        newest first (the fake's "facts" are their texts; deleted ones are gone)."""
        said = [
            m
            for t in self._state.threads.values()
            if t["user_uuid"] == user_uuid
            for m in self._state.messages[t["uuid"]]
            if m["ingested"]
        ]
        added = self._state.episodes.get(user_uuid, [])
        edges = [{**e, "content": e["fact"]} for e in self._state.edges.get(user_uuid, [])]
        return sorted(
            (m for m in [*said, *added, *edges] if m["uuid"] not in self._state.deleted),
            key=lambda m: m["created_at"],
            reverse=True,
        )

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
        words = set(str(body.get("query", "")).lower().split())
        known = sorted(
            self._knowledge(owner["uuid"]),
            key=lambda m: -len(words & set(m["content"].lower().split())),
        )[:size]
        if scope == "edges":
            items = [
                {
                    "uuid": m["uuid"],
                    "fact": m["content"],
                    "name": "STATED",
                    "created_at": m["created_at"],
                    "valid_at": m.get("reference_time"),
                }
                for m in known
            ]
        elif scope == "episodes":
            items = [
                {"uuid": m["uuid"], "content": m["content"], "created_at": m["created_at"]}
                for m in known
            ]
        else:
            items = []
        return 200, {"items": items, "next_cursor": ""}

    def _add_episode(self, graph_uuid: str, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        owner = self._owner(graph_uuid)
        if not isinstance(body.get("data"), str) or not body["data"]:
            raise _error(400, "invalid_request", "data is required")
        episode = {
            "uuid": str(uuid.uuid4()),
            "content": body["data"],
            "metadata": body.get("metadata") or {},
            "source_description": body.get("source_description"),
            "reference_time": body.get("reference_time"),
            "created_at": _now(),
            "graph_uuid": owner["graph_uuid"],
        }
        self._state.episodes.setdefault(owner["uuid"], []).append(episode)
        return 202, {"episode": episode, "task": _task("graph.episode.add")}

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
                "name": e["fact_name"],
                "created_at": _now(),
                **{k: e.get(k) for k in ("fact", "attributes", "metadata", "valid_at")},
                "invalid_at": e.get("invalid_at"),
            }
            self._state.edges.setdefault(owner["uuid"], []).append(edge)
            added.append({**edge, "fact_name": edge["name"]})
        return 202, {"edges": added, "task": _task("graph.edge.add")}

    def _list_edges(self, graph_uuid: str, *, query: JSON, body: JSON) -> tuple[int, JSON]:
        owner = self._owner(graph_uuid)
        items = [
            e
            for e in self._state.edges.get(owner["uuid"], [])
            if e["uuid"] not in self._state.deleted
        ]
        start, size = int(query.get("cursor") or 0), int(query.get("page_size") or 50)
        page = items[start : start + size]
        end = start + len(page)
        return 200, {"items": page, "next_cursor": str(end) if end < len(items) else ""}

    def _list_threads(self, *, query: JSON, body: Any) -> tuple[int, JSON]:
        items = [
            t
            for t in self._state.threads.values()
            if not query.get("user_uuid") or t["user_uuid"] == query["user_uuid"]
        ]
        return 200, {"items": items, "next_cursor": "", "total_size": len(items)}

    def edges(self) -> list[JSON]:
        with self._lock:
            return [
                e
                for added in self._state.edges.values()
                for e in added
                if e["uuid"] not in self._state.deleted
            ]

    def episodes(self) -> list[JSON]:
        with self._lock:
            return [e for added in self._state.episodes.values() for e in added]

    def _delete_edge(
        self, graph_uuid: str, edge_uuid: str, *, query: JSON, body: Any
    ) -> tuple[int, JSON]:
        owner = self._owner(graph_uuid)
        if not any(m["uuid"] == edge_uuid for m in self._knowledge(owner["uuid"])):
            raise _error(404, "not_found", "edge not found")
        self._state.deleted.add(edge_uuid)
        return 202, {"task": _task("graph.edge.delete")}

    def _context_for(self, user_uuid: str, query: str, limit: int) -> str:
        """Zep would extract facts; the fake lists what it knows, newest first."""
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


def _task(kind: str) -> JSON:
    return {"uuid": str(uuid.uuid4()), "type": kind, "status": "succeeded", "created_at": _now()}


_Handler_t = Callable[..., tuple[int, JSON]]
_ROUTES: list[tuple[str, str, _Handler_t]] = [
    ("POST", r"/users", ZepFake._create_user),
    ("POST", r"/users/lookup", ZepFake._lookup_user),
    ("GET", r"/users/([\w-]+)", ZepFake._get_user),
    ("DELETE", r"/users/([\w-]+)", ZepFake._delete_user),
    ("POST", r"/threads", ZepFake._create_thread),
    ("GET", r"/threads/([\w-]+)", ZepFake._get_thread),
    ("POST", r"/threads/([\w-]+)/messages", ZepFake._add_messages),
    ("GET", r"/threads/([\w-]+)/messages", ZepFake._list_messages),
    ("GET", r"/threads/([\w-]+)/context", ZepFake._thread_context),
    ("POST", r"/graphs/([\w-]+)/context", ZepFake._graph_context),
    ("POST", r"/graphs/([\w-]+)/search/(edges|nodes|episodes|observations)", ZepFake._search),
    ("POST", r"/graphs/([\w-]+)/search/(thread)-summaries", ZepFake._search),
    ("POST", r"/graphs/([\w-]+)/episodes", ZepFake._add_episode),
    ("DELETE", r"/graphs/([\w-]+)/edges/([\w-]+)", ZepFake._delete_edge),
    ("POST", r"/graphs/([\w-]+)/edges", ZepFake._add_edges),
    ("POST", r"/graphs/([\w-]+)/edges/list", ZepFake._list_edges),
    ("GET", r"/threads", ZepFake._list_threads),
    ("POST", r"/context-templates", ZepFake._create_template),
    ("GET", r"/context-templates/([\w-]+)", ZepFake._template),
    ("PUT", r"/context-templates/([\w-]+)", ZepFake._update_template),
    ("DELETE", r"/context-templates/([\w-]+)", ZepFake._delete_template),
]
#: POST routes that change nothing: failing their reply leaves nothing ambiguous.
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
        seen = self._record(method, path, key, body)
        if not (self.headers.get("Authorization") or "").startswith("Api-Key "):
            seen.status = 401
            self._reply(401, {"error": {"code": "unauthorized", "message": "missing key"}})
            return
        fault = fake._take_fault(method, path)
        held = fake.key_in_flight(method, key)
        with held or contextlib.nullcontext():
            delay = fake.delay_of(fault)
            if delay:
                time.sleep(delay)
            if fault and not fault.after_commit and (fault.drop or fault.status):
                seen.status = fault.status or 0
                self._fail(fault)
                return
            reply = fake.handle(method, path, query, body, key)
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

    def _client_gone(self) -> bool:
        """The client closed its end while the request was served (it timed out, or died):
        the connection reads as closed. A live HTTP/1.1 client sends nothing before the
        reply, so a readable socket means end of stream or a reset."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _control(self, method: str, path: str, body: JSON) -> None:
        fake = self.server_fake
        if method == "GET" and path == "/_fake/state":
            self._reply(200, fake.snapshot())
        elif method == "POST" and path == "/_fake/reset":
            fake.reset()
            self._reply(200, {})
        elif method == "POST" and path == "/_fake/config":
            fake.configure(body)
            self._reply(200, {})
        else:
            self._reply(404, {"error": {"code": "not_found", "message": "unknown control"}})

    def _record(self, method: str, path: str, key: str | None, body: Any) -> Recorded:
        seen = Recorded(method, path, key, body, status=0, at=time.time())
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
