"""``afterthought inspect``: a local web page to look at a deployment's memory (the
``inspect`` extra: Starlette, Jinja2, uvicorn).

What it shows, read through the same paths as the commands: users (the registry, searched
by id), each user's facts current and retired with their validity and the statements they
came from (the backend port), their statements, quarantined proposals with the reason
(``afterthought.quarantine``), dead letters (``afterthought.dead_letters``), queue and
worker health (``afterthought.status``); and a forget whose dry run is shown before it can
be confirmed (``Forgetter.preview_user`` / ``forget_fact(confirm=False)``, as ``afterthought
forget`` does). Read-only unless started with ``--allow-forget``.

Security: bound to 127.0.0.1 unless told otherwise, and only for the Host names it serves;
every page but the login needs the token printed at start, sent as ``Authorization: Bearer``
or through the login, which sets an HttpOnly, SameSite=Strict cookie derived from it (both
compared in constant time); a forget is a POST that carries a CSRF token and, when the
browser says, an Origin of this server. Pages are rendered with autoescaping, are never
cached, and carry a CSP without scripts, no-referrer and X-Frame-Options DENY. Its log
lines name the route, method and status: never a query, an id or a word of memory."""
