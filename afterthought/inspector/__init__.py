"""``afterthought inspect``: a local web page to look at a deployment's memory (the
``inspect`` extra: Starlette, Jinja2, uvicorn).

What it shows, read through the same paths as the commands: users (the registry, searched
by id), each user's facts current and retired with their validity and the statements they
came from (the backend port), their statements, quarantined proposals with the reason
(``afterthought.quarantine``), dead letters (``afterthought.dead_letters``), queue and
worker health (``afterthought.status``); and a forget whose dry run is shown before it can
be confirmed (``Forgetter.preview_user`` / ``forget_fact(confirm=False)``, as ``afterthought
forget`` does). Read-only unless started with ``--allow-forget``.

Security: bound to 127.0.0.1 unless told otherwise, and only for the Host names it serves
(``[::1]`` too); every page but the login needs the token printed at start, sent as
``Authorization: Bearer`` or through the login, which opens a session of the server's own:
a random id in an HttpOnly, SameSite=Strict cookie named after the port, ended by a logout,
by ``--session-hours`` unused (12) or by a restart. A post (a forget, a logout) carries its
session's CSRF token and is refused when the browser says it comes from another site; a
forget also carries a fingerprint of the dry run it confirms, and runs only while that is
still what a dry run finds. A forget where no worker announced its store says that it
cannot tell whether it deleted from theirs, never "Forgotten". Pages are rendered with
autoescaping, ids with their non-ASCII and invisible code points marked, are never cached,
and carry a CSP without scripts, no-referrer and X-Frame-Options DENY. Its log lines name
the route, method and status: never a query, an id or a word of memory."""
