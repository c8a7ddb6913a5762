"""The inspector's ASGI app (see the package's docstring for what it shows and how it is
guarded)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import time
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from afterthought.backends import open_backend
from afterthought.backends.base import BackendError, HistoryMessage, MemoryBackend
from afterthought.connections import connect
from afterthought.contract import MalformedPayload, QueuedMessage
from afterthought.dead_letters import DeadLetters
from afterthought.facts import StoredFact, statement
from afterthought.identity import IdentityRegistry
from afterthought.keys import digest
from afterthought.layout import check_layout
from afterthought.quarantine import Quarantine
from afterthought.settings import Settings
from afterthought.shared_store import ONE_STORE, cannot_tell, elsewhere, store_of
from afterthought.status import snapshot
from afterthought.worker.forget import Forgetter, Forgotten

log = logging.getLogger("afterthought.inspect")

#: The login cookie's name, with the inspector's port after it when it has one: two
#: inspectors on one machine (cookies are not told apart by port) keep their own.
COOKIE = "afterthought_inspect"
#: A login ends after this long unused (``afterthought inspect --session-hours``)...
SESSION_IDLE_SECONDS = 12 * 3600.0
#: ...and the oldest ends when there are this many (each login is one).
MAX_SESSIONS = 64
#: Users a search lists; statements and dead letters a page shows.
USERS_SHOWN = 200
STATEMENTS_SHOWN = 1000
LETTERS_SHOWN = 500
#: A form body larger than this is refused (a login or a forget is a few hundred bytes).
MAX_FORM_BYTES = 16_384

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
        " frame-ancestors 'none'; base-uri 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}

_templates = Environment(
    loader=PackageLoader("afterthought.inspector"),
    autoescape=True,
    undefined=StrictUndefined,
)


def _when(at: str | int | float | None) -> str:
    """An ISO time or ms since the epoch, as a page shows it."""
    if at is None or at == "":
        return ""
    if isinstance(at, int | float):
        return datetime.fromtimestamp(at / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return at.replace("T", " ")[:19]


_templates.filters["when"] = _when


def _visible(text: str) -> Markup:
    """An id as an operator can tell it from its look-alikes: printable ASCII as it is
    (a space too, but at either end), every other code point marked with its number (and
    its glyph, when it has one): a Cyrillic a (U+0430) is not shown as a Latin one, nor a
    zero-width space or a trailing one as nothing."""
    shown = []
    for at, char in enumerate(text):
        if "!" <= char <= "~" or (char == " " and 0 < at < len(text) - 1):
            shown.append(escape(char))
            continue
        number = f"U+{ord(char):04X}"
        glyph = char if char.isprintable() and not char.isspace() else ""
        shown.append(
            Markup('<mark class="cp" title="{} {}">{}<small>{}</small></mark>').format(
                number, unicodedata.name(char, "unnamed"), glyph, number
            )
        )
    return Markup("").join(shown)


_templates.filters["visible"] = _visible


@dataclass(frozen=True)
class Visitor:
    """Who an authenticated request is: a login's session (its id), or a client that sent
    the token (``session`` None); ``csrf`` what its forms carry."""

    csrf: str
    session: str | None = None


@dataclass
class _Session:
    csrf: str
    seen: float


@dataclass
class Inspector:
    """What the pages read with: opened in the app's lifespan, on the server's loop."""

    settings: Settings
    token: str
    allow_forget: bool
    port: int | None = None
    session_idle_seconds: float = SESSION_IDLE_SECONDS
    clock: Callable[[], float] = time.monotonic
    sessions: dict[str, _Session] = field(default_factory=dict)
    """Logins by the random id their cookie holds: what a logout or the idle time ends
    (the server's own, so a cookie copied from disk dies with them)."""
    redis: aioredis.Redis = field(init=False)
    jobs: aioredis.Redis | None = field(init=False, default=None)
    backend: MemoryBackend = field(init=False)
    forgetter: Forgetter = field(init=False)

    @property
    def cookie(self) -> str:
        return COOKIE if self.port is None else f"{COOKIE}_{self.port}"

    def login(self) -> str:
        """A new session: its id, for the cookie."""
        now = self.clock()
        for name, session in list(self.sessions.items()):
            if now - session.seen > self.session_idle_seconds:
                del self.sessions[name]
        while len(self.sessions) >= MAX_SESSIONS:
            del self.sessions[min(self.sessions, key=lambda name: self.sessions[name].seen)]
        name = secrets.token_urlsafe(32)
        self.sessions[name] = _Session(secrets.token_urlsafe(32), now)
        return name

    def authenticated(self, request: Request) -> Visitor | None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given:
            if not hmac.compare_digest(given.strip().encode(), self.token.encode()):
                return None
            # Not a secret from the client (it has the token): a browser never sends the
            # header by itself, so a script's post is no forgery.
            csrf = hmac.new(self.token.encode(), b"csrf", hashlib.sha256).hexdigest()
            return Visitor(csrf)
        name = request.cookies.get(self.cookie, "")
        session = self.sessions.get(name)
        if session is None:
            return None
        now = self.clock()
        if now - session.seen > self.session_idle_seconds:
            del self.sessions[name]
            return None
        session.seen = now
        return Visitor(session.csrf, name)

    @contextlib.asynccontextmanager
    async def opened(self, app: Starlette) -> AsyncIterator[None]:
        self.redis = connect(self.settings.redis_url)
        self.jobs = connect(self.settings.arq_redis_url) if self.settings.arq_redis_url else None
        self.backend = open_backend(self.settings)
        try:
            await check_layout(self.redis, self.settings)
            self.forgetter = Forgetter(self.settings, self.redis, self.backend)
            yield
        finally:
            await self.backend.aclose()
            if self.jobs is not None:
                await self.jobs.aclose()
            await self.redis.aclose()


def _page(request: Request, name: str, code: int = 200, **values: Any) -> HTMLResponse:
    """The page, for the visitor the request was authenticated as (none: a login's)."""
    visitor = getattr(request.state, "visitor", None)
    page = _templates.get_template(name).render(visitor=visitor, **values)
    return HTMLResponse(page, status_code=code)


async def _form(request: Request) -> dict[str, str]:
    """A urlencoded form's first value of each field (no multipart: nothing here uploads);
    none of a body larger than ``MAX_FORM_BYTES``, read no further than that: the login
    takes posts from anyone (another site's page too), who must not make it hold a body
    of any size."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_FORM_BYTES:
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return {}
    fields = parse_qs(body.decode(errors="replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


def _same_origin(request: Request) -> bool:
    """Whether a POST is not known to come from another site's page. A browser says where
    from in ``Sec-Fetch-Site`` (``same-site`` is another port of this host), else in an
    Origin naming this server; an Origin of ``null`` (the no-referrer policy makes a
    browser without ``Sec-Fetch-Site`` send it for our own forms) and none at all (a
    script) say nothing. What guards a post is its form's token — the login's, a
    session's CSRF token — and the SameSite=Strict cookie, which no other site's page
    sends; this refuses what a browser does say is foreign."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


def _csrf_given(request: Request, form: dict[str, str]) -> bool:
    visitor: Visitor = request.state.visitor
    given = form.get("csrf", "").encode()
    return _same_origin(request) and hmac.compare_digest(given, visitor.csrf.encode())


Endpoint = Callable[[Request, Inspector], Awaitable[Response]]


def _guarded(inspector: Inspector, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint for an authenticated request; 401 with a pointer to the login else. A
    failing Redis or backend is a page that says which, never a traceback."""

    async def guarded(request: Request) -> Response:
        visitor = inspector.authenticated(request)
        if visitor is None:
            return _page(request, "denied.html", 401)
        request.state.visitor = visitor
        try:
            return await endpoint(request, inspector)
        except BackendError as exc:
            what = f"the memory backend failed ({exc.kind})"
            return _page(request, "failed.html", 502, what=what)
        except RedisError as exc:
            return _page(request, "failed.html", 503, what=f"Redis failed ({type(exc).__name__})")

    return guarded


async def login_page(request: Request) -> Response:
    return _page(request, "login.html", wrong=False)


def _login(inspector: Inspector) -> Callable[[Request], Awaitable[Response]]:
    async def login(request: Request) -> Response:
        given = (await _form(request)).get("token", "").strip()
        if not _same_origin(request) or not hmac.compare_digest(
            given.encode(), inspector.token.encode()
        ):
            log.warning("login refused")
            return _page(request, "login.html", 401, wrong=True)
        response = RedirectResponse("/", status_code=303)
        # A browser's session cookie: the server ends the login (idle, logout, a restart).
        response.set_cookie(
            inspector.cookie,
            inspector.login(),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    return login


async def logout(request: Request, inspector: Inspector) -> Response:
    if not _csrf_given(request, await _form(request)):
        return PlainTextResponse("logout refused: no valid CSRF token", 403)
    visitor: Visitor = request.state.visitor
    if visitor.session is not None:  # not a client that sent the token: it has none
        inspector.sessions.pop(visitor.session, None)  # or a logout at once in another tab
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(inspector.cookie, path="/", httponly=True, samesite="strict")
    return response


async def overview(request: Request, inspector: Inspector) -> Response:
    status = await snapshot(inspector.redis, inspector.settings, jobs=inspector.jobs)
    query = request.query_params.get("q", "").strip()
    users: list[tuple[str, str]] = []
    more = False
    if query:
        wanted = query.casefold()
        async for found in IdentityRegistry(inspector.redis, inspector.settings).users():
            if wanted in found.user_id.casefold() or wanted == found.app.casefold():
                if len(users) == USERS_SHOWN:
                    more = True
                    break
                users.append((found.app, found.user_id))
    quarantined = len(await Quarantine(inspector.redis, inspector.settings).entries())
    return _page(
        request,
        "overview.html",
        inspector=inspector,
        status=status,
        query=query,
        users=sorted(users),
        more=more,
        quarantined=quarantined,
    )


def _who(request: Request) -> tuple[str, str] | None:
    app = request.query_params.get("app", "")
    user_id = request.query_params.get("user", "")
    return (app, user_id) if app.strip() and user_id.strip() else None


@dataclass(frozen=True)
class _FactRow:
    fact: StoredFact
    text: str
    sources: list[tuple[str, HistoryMessage | None]]
    """Each source key with the statement it names (None: not among those read)."""


async def user_page(request: Request, inspector: Inspector) -> Response:
    who = _who(request)
    if who is None:
        return RedirectResponse("/", status_code=303)
    app, user_id = who
    backend = inspector.backend
    users = await inspector.forgetter.backend_users(app, user_id)
    facts: list[StoredFact] = []
    statements: list[HistoryMessage] = []
    more = False
    for user in users:
        facts += await backend.list_facts(user=user)
        after = None
        while not more:
            page, after = await backend.user_messages(
                user=user, after=after, limit=STATEMENTS_SHOWN - len(statements)
            )
            statements += page
            more = len(statements) >= STATEMENTS_SHOWN
            if not page or after is None:
                break
    said = {m.key: m for m in statements}
    rows = [
        _FactRow(
            f, statement(f.subject, f.predicate, f.value), [(k, said.get(k)) for k in f.source_keys]
        )
        for f in facts
    ]
    quarantine = await Quarantine(inspector.redis, inspector.settings).entries(
        app=app, user_id=user_id
    )
    letters = [
        (index, letter, message)
        for index, letter, message in await _letters(inspector)
        if message is not None and (message.app, message.user_id) == who
    ]
    held = await inspector.forgetter.held(app, user_id)
    return _page(
        request,
        "user.html",
        inspector=inspector,
        app=app,
        user_id=user_id,
        known=bool(users),
        current=[r for r in rows if r.fact.invalid_at is None],
        retired=[r for r in rows if r.fact.invalid_at is not None],
        statements=statements,
        more=more,
        quarantine=quarantine,
        letters=letters,
        queued=held.queued,
    )


async def _letters(inspector: Inspector) -> list[tuple[int, Any, QueuedMessage | None]]:
    """Dead letters, each with its message when it can be read back."""
    found = []
    for index, letter in await DeadLetters(inspector.redis, inspector.settings).listing(
        count=LETTERS_SHOWN
    ):
        try:
            message: QueuedMessage | None = QueuedMessage.decode(letter.item)
        except MalformedPayload:
            message = None
        found.append((index, letter, message))
    return found


async def letters_page(request: Request, inspector: Inspector) -> Response:
    total = await DeadLetters(inspector.redis, inspector.settings).count()
    return _page(request, "letters.html", letters=await _letters(inspector), total=total)


async def quarantine_page(request: Request, inspector: Inspector) -> Response:
    entries = await Quarantine(inspector.redis, inspector.settings).entries()
    return _page(request, "quarantine.html", entries=list(reversed(entries)))


@dataclass(frozen=True)
class _Store:
    """Whether a forget here deletes from the store the workers write: ``refused`` why
    not (another store: no forget), ``unsure`` why it cannot be told (no worker to compare
    with: a forget deletes from this store and says it may not be theirs)."""

    refused: str | None = None
    unsure: str | None = None


async def _store(inspector: Inspector) -> _Store:
    theirs = await elsewhere(inspector.redis, inspector.settings, inspector.backend)
    if theirs:
        return _Store(refused=f"this store is not the workers' ({', '.join(theirs)}); {ONE_STORE}")
    if theirs is None:
        mine = await store_of(inspector.settings, inspector.backend)
        return _Store(unsure=cannot_tell(mine[1] if mine else None))
    return _Store()


async def _preview(
    inspector: Inspector, app: str, user_id: str, fact: str | None
) -> Forgotten | None:
    """The dry run of a forget of the user (or of one of their facts): None when nothing
    of it is stored or queued."""
    if fact is None:
        return await inspector.forgetter.preview_user(app, user_id)
    held = await inspector.forgetter.forget_fact(
        app=app, user_id=user_id, fact_uuid=fact, confirm=False
    )
    return held if held.facts else None


def _fingerprint(held: Forgotten | None) -> str:
    """What a dry run showed (its ids, counts and texts), as its confirm carries it back:
    a forget runs only while the dry run is still what the operator saw."""
    shown = {} if held is None else asdict(held)
    return hashlib.sha256(json.dumps(shown, sort_keys=True).encode()).hexdigest()


async def forget_page(request: Request, inspector: Inspector) -> Response:
    """The dry run: what a forget of the user (or of one fact) would delete."""
    who = _who(request)
    if who is None:
        return RedirectResponse("/", status_code=303)
    app, user_id = who
    fact = request.query_params.get("fact") or None
    held = await _preview(inspector, app, user_id, fact)
    return _dry_run(request, inspector, (app, user_id, fact), held, await _store(inspector))


def _dry_run(
    request: Request,
    inspector: Inspector,
    what: tuple[str, str, str | None],
    held: Forgotten | None,
    store: _Store,
    *,
    changed: bool = False,
) -> Response:
    """The dry run's page (``what``: the app, the user and the fact, if one), with the
    fingerprint its confirm carries; ``changed``: shown again, as not what was confirmed."""
    app, user_id, fact = what
    return _page(
        request,
        "forget.html",
        409 if changed else 200,
        inspector=inspector,
        app=app,
        user_id=user_id,
        fact=fact,
        held=held,
        fingerprint=_fingerprint(held),
        changed=changed,
        done=None,
        store=store,
    )


async def forget(request: Request, inspector: Inspector) -> Response:
    """The forget the dry run showed; refused on a read-only inspector, without the CSRF
    token, from another origin, or where the store is not the workers'. A dry run that
    changed since it was shown (a fact stored or forgotten meanwhile) is shown again, to
    confirm anew; one that changes after that check is the forget's to cover (a user's
    forget deletes all of them, what came since too)."""
    form = await _form(request)
    if not inspector.allow_forget:
        return PlainTextResponse("read-only: start `afterthought inspect --allow-forget`", 403)
    if not _csrf_given(request, form):
        return PlainTextResponse("forget refused: no valid CSRF token", 403)
    app, user_id, fact = form.get("app", ""), form.get("user", ""), form.get("fact") or None
    if not (app.strip() and user_id.strip()):
        return PlainTextResponse("forget needs app and user", 400)
    store = await _store(inspector)
    if store.refused:
        return PlainTextResponse(f"forget refused: {store.refused}", 409)
    held = await _preview(inspector, app, user_id, fact)
    if held is None or not hmac.compare_digest(
        _fingerprint(held).encode(), form.get("preview", "").encode()
    ):
        return _dry_run(request, inspector, (app, user_id, fact), held, store, changed=True)
    done: Forgotten
    if fact is None:
        done = await inspector.forgetter.forget_user_reported(app, user_id)
    else:
        done = await inspector.forgetter.forget_fact(app=app, user_id=user_id, fact_uuid=fact)
    log.info(
        "forget user=%s fact=%s facts=%s statements=%s queued=%d pending=%s store=%s",
        digest(app, user_id),
        fact is not None,
        done.fact_count if done.fact_count is not None else len(done.facts),
        done.statement_count if done.statement_count is not None else len(done.statements),
        done.queued,
        done.pending,
        "unverified" if store.unsure else "checked",
    )
    return _page(
        request,
        "forget.html",
        inspector=inspector,
        app=app,
        user_id=user_id,
        fact=fact,
        held=None,
        fingerprint=None,
        changed=False,
        done=done,
        store=store,
    )


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 72rem; padding: 1rem; }
header { display: flex; gap: 1rem; align-items: baseline; border-bottom: 1px solid #ccc; }
header form { margin-left: auto; }
table { border-collapse: collapse; width: 100%; margin: .5rem 0 1.5rem; }
th, td { border-bottom: 1px solid #eee; padding: .25rem .5rem; text-align: left;
  vertical-align: top; }
.text { white-space: pre-wrap; overflow-wrap: anywhere; }
.muted { color: #666; } .bad { color: #a00; } .ok { color: #070; }
mark.cp { background: #fe8; } mark.cp small { font-size: 70%; margin-left: 1px; }
button.danger { background: #a00; color: #fff; border: 0; padding: .4rem .8rem; }
"""


async def style(request: Request) -> Response:
    return Response(STYLE, media_type="text/css")


class _Headers:
    """Security headers on every response; one log line a request without its path's
    ids or query."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 0

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)
        log.info(
            "request method=%s route=%s status=%d ms=%d",
            scope.get("method", ""),
            scope["path"] if scope["path"] in ROUTES else "other",
            status,
            (time.monotonic() - started) * 1000,
        )


def _hostname(host: str) -> str:
    """A Host header's name, without its port: an IPv6 address is bracketed in it
    (``[::1]:8765``), and named here without its brackets, as it is listened on."""
    name, port = host, ""
    if host.startswith("["):
        name, bracket, port = host[1:].partition("]")
        if not bracket or port[:1] not in ("", ":"):
            return ""
        port = port[1:]
    elif ":" in host:
        name, _, port = host.partition(":")
    return name.lower() if port.isascii() and (port.isdigit() or not port) else ""


class _KnownHosts:
    """A request for another Host name than these is refused (a page found under another
    name, through DNS rebinding, is another site's)."""

    def __init__(self, app: Any, hosts: list[str]) -> None:
        self.app = app
        self.hosts = {host.lower().strip("[]") for host in hosts}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if _hostname(host) not in self.hosts:
                await PlainTextResponse("Invalid host header", 400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


ROUTES = {
    "/",
    "/login",
    "/logout",
    "/user",
    "/forget",
    "/dead-letters",
    "/quarantine",
    "/style.css",
}


def create_app(
    settings: Settings,
    *,
    token: str | None = None,
    allow_forget: bool = False,
    hosts: list[str] | None = None,
    port: int | None = None,
    session_idle_seconds: float = SESSION_IDLE_SECONDS,
) -> tuple[Starlette, Inspector]:
    """The app and its state; ``token`` a random one when None. ``hosts``: the Host names
    it answers (a page found under another name, through DNS rebinding, is refused);
    ``port``: the one it listens on, which names its cookie; ``session_idle_seconds``: how
    long a login lasts unused."""
    inspector = Inspector(
        settings,
        token or secrets.token_urlsafe(24),
        allow_forget,
        port=port,
        session_idle_seconds=session_idle_seconds,
    )

    def guard(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        return _guarded(inspector, endpoint)

    routes = [
        Route("/", guard(overview)),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", _login(inspector), methods=["POST"]),
        Route("/logout", guard(logout), methods=["POST"]),
        Route("/user", guard(user_page)),
        Route("/forget", guard(forget_page), methods=["GET"]),
        Route("/forget", guard(forget), methods=["POST"]),
        Route("/dead-letters", guard(letters_page)),
        Route("/quarantine", guard(quarantine_page)),
        Route("/style.css", style),
    ]
    middleware = [Middleware(_Headers)]
    if hosts is not None:
        middleware.append(Middleware(_KnownHosts, hosts=hosts))
    app = Starlette(routes=routes, middleware=middleware, lifespan=inspector.opened)
    return app, inspector
