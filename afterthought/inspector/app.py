"""The inspector's ASGI app (see the package's docstring for what it shows and how it is
guarded)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis
from jinja2 import Environment, PackageLoader, StrictUndefined
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
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
from afterthought.shared_store import ONE_STORE, elsewhere
from afterthought.status import snapshot
from afterthought.worker.forget import Forgetter, Forgotten

log = logging.getLogger("afterthought.inspect")

COOKIE = "afterthought_inspect"
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


@dataclass
class Inspector:
    """What the pages read with: opened in the app's lifespan, on the server's loop."""

    settings: Settings
    token: str
    allow_forget: bool
    redis: aioredis.Redis = field(init=False)
    jobs: aioredis.Redis | None = field(init=False, default=None)
    backend: MemoryBackend = field(init=False)
    forgetter: Forgetter = field(init=False)

    def _derived(self, purpose: str) -> str:
        return hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    @property
    def session(self) -> str:
        """The cookie's value: not the token itself (a cookie is kept on disk)."""
        return self._derived("session")

    @property
    def csrf(self) -> str:
        return self._derived("csrf")

    def authenticated(self, request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given:
            return hmac.compare_digest(given.strip().encode(), self.token.encode())
        cookie = request.cookies.get(COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie.encode(), self.session.encode())

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


def _page(name: str, code: int = 200, **values: Any) -> HTMLResponse:
    return HTMLResponse(_templates.get_template(name).render(**values), status_code=code)


async def _form(request: Request) -> dict[str, str]:
    """A urlencoded form's first value of each field (no multipart: nothing here uploads)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    fields = parse_qs(body.decode(errors="replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


def _same_origin(request: Request) -> bool:
    """Whether a POST comes from this server's own page: a browser says so in
    ``Sec-Fetch-Site`` (its Origin is ``null`` under the no-referrer policy), else in an
    Origin naming this server; a client that sends neither (a script with the token) is
    judged by its token alone."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


Endpoint = Callable[[Request, Inspector], Awaitable[Response]]


def _guarded(inspector: Inspector, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint for an authenticated request; 401 with a pointer to the login else. A
    failing Redis or backend is a page that says which, never a traceback."""

    async def guarded(request: Request) -> Response:
        if not inspector.authenticated(request):
            return _page("denied.html", 401)
        try:
            return await endpoint(request, inspector)
        except BackendError as exc:
            return _page("failed.html", 502, what=f"the memory backend failed ({exc.kind})")
        except RedisError as exc:
            return _page("failed.html", 503, what=f"Redis failed ({type(exc).__name__})")

    return guarded


async def login_page(request: Request) -> Response:
    return _page("login.html", wrong=False)


def _login(inspector: Inspector) -> Callable[[Request], Awaitable[Response]]:
    async def login(request: Request) -> Response:
        given = (await _form(request)).get("token", "").strip()
        if not _same_origin(request) or not hmac.compare_digest(
            given.encode(), inspector.token.encode()
        ):
            log.warning("login refused")
            return _page("login.html", 401, wrong=True)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE,
            inspector.session,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    return login


async def logout(request: Request, inspector: Inspector) -> Response:
    if not _same_origin(request):
        return PlainTextResponse("cross-origin request refused", 403)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
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
    return _page("letters.html", letters=await _letters(inspector), total=total)


async def quarantine_page(request: Request, inspector: Inspector) -> Response:
    entries = await Quarantine(inspector.redis, inspector.settings).entries()
    return _page("quarantine.html", entries=list(reversed(entries)))


async def _other_store(inspector: Inspector) -> str | None:
    """Why a forget here would miss what the workers wrote (another store), or None."""
    theirs = await elsewhere(inspector.redis, inspector.settings, inspector.backend)
    if theirs:
        return f"this store is not the workers' ({', '.join(theirs)}); {ONE_STORE}"
    return None


async def forget_page(request: Request, inspector: Inspector) -> Response:
    """The dry run: what a forget of the user (or of one fact) would delete."""
    who = _who(request)
    if who is None:
        return RedirectResponse("/", status_code=303)
    app, user_id = who
    fact = request.query_params.get("fact") or None
    if fact is None:
        held = await inspector.forgetter.preview_user(app, user_id)
    else:
        held = await inspector.forgetter.forget_fact(
            app=app, user_id=user_id, fact_uuid=fact, confirm=False
        )
        held = held if held.facts else None
    return _page(
        "forget.html",
        inspector=inspector,
        app=app,
        user_id=user_id,
        fact=fact,
        held=held,
        done=None,
        refused=await _other_store(inspector),
    )


async def forget(request: Request, inspector: Inspector) -> Response:
    """The forget the dry run showed; refused on a read-only inspector, without the CSRF
    token, from another origin, or where the store is not the workers'."""
    form = await _form(request)
    if not inspector.allow_forget:
        return PlainTextResponse("read-only: start `afterthought inspect --allow-forget`", 403)
    if not _same_origin(request) or not hmac.compare_digest(
        form.get("csrf", "").encode(), inspector.csrf.encode()
    ):
        return PlainTextResponse("forget refused: no valid CSRF token", 403)
    app, user_id, fact = form.get("app", ""), form.get("user", ""), form.get("fact") or None
    if not (app.strip() and user_id.strip()):
        return PlainTextResponse("forget needs app and user", 400)
    refused = await _other_store(inspector)
    if refused:
        return PlainTextResponse(f"forget refused: {refused}", 409)
    done: Forgotten
    if fact is None:
        done = await inspector.forgetter.forget_user_reported(app, user_id)
    else:
        done = await inspector.forgetter.forget_fact(app=app, user_id=user_id, fact_uuid=fact)
    log.info(
        "forget user=%s fact=%s facts=%s statements=%s queued=%d pending=%s",
        digest(app, user_id),
        fact is not None,
        done.fact_count if done.fact_count is not None else len(done.facts),
        done.statement_count if done.statement_count is not None else len(done.statements),
        done.queued,
        done.pending,
    )
    return _page(
        "forget.html",
        inspector=inspector,
        app=app,
        user_id=user_id,
        fact=fact,
        held=None,
        done=done,
        refused=None,
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
) -> tuple[Starlette, Inspector]:
    """The app and its state; ``token`` a random one when None. ``hosts``: the Host names
    it answers (a page found under another name, through DNS rebinding, is refused)."""
    inspector = Inspector(settings, token or secrets.token_urlsafe(24), allow_forget)

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
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=hosts))
    app = Starlette(routes=routes, middleware=middleware, lifespan=inspector.opened)
    return app, inspector
