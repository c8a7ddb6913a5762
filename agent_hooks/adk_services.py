"""``afterthought://``: ``ZepMemoryService`` by URI, for ADK's service registry, so that
``adk web`` and ``adk api_server`` take ``--memory_service_uri afterthought://``.

ADK reads third-party schemes only from ``services.py`` (or ``services.yaml``) in the
agents folder; :func:`register` is what that file calls (``afterthought adk init
AGENTS_DIR`` writes the call there: ``afterthought.adk_init``). The URI takes settings as
query parameters by their names (``afterthought://?key_prefix=shop&context_mode=cached``),
over the environment's."""

from __future__ import annotations

import difflib
import json
import typing
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import SecretStr

from afterthought.agent_hooks.memory_service import ZepMemoryService
from afterthought.search import MAX_LIMIT
from afterthought.settings import Settings

SCHEME = "afterthought"
#: The service's own parameter (not a setting): how many entries a search returns.
LIMIT = "limit"
#: Settings a URI may not carry: keys and URLs that may hold a password. A URI is a
#: command-line argument (``ps`` shows it to every user of the machine) and lands in
#: shell history; these belong in the environment.
SECRET = frozenset(
    name
    for name, info in Settings.model_fields.items()
    if info.repr is False or SecretStr in typing.get_args(info.annotation)
)
_SETTINGS = sorted(set(Settings.model_fields) - SECRET)


class MemoryServiceUriError(ValueError):
    """An ``afterthought://`` URI that cannot be used, said in one line, never a value."""


def memory_service_from_uri(uri: str, **_adk: Any) -> ZepMemoryService:
    """The factory ADK's registry calls with the ``--memory_service_uri`` and its own
    keywords (``agents_dir``, which the service has no use for)."""
    return ZepMemoryService(**parse_uri(uri))


def parse_uri(uri: str) -> dict[str, Any]:
    """``ZepMemoryService``'s keywords from a URI: the search limit, and the settings it
    names (checked by :class:`Settings` when the service is made: a bad value is its
    ``SettingsError``)."""
    parts = urlsplit(uri)
    if parts.scheme != SCHEME:
        raise MemoryServiceUriError(f"not an {SCHEME}:// URI")
    if parts.netloc or parts.path.strip("/") or parts.fragment:
        # Not quoted back: a host part may be user:password@host.
        raise MemoryServiceUriError(
            f"{SCHEME}:// takes no host, path or fragment: settings go in its query "
            f"({SCHEME}://?key_prefix=shop), the rest comes from the environment"
        )
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise MemoryServiceUriError(
            f"{SCHEME}:// query must be name=value pairs joined by '&'"
        ) from None
    overrides: dict[str, Any] = {}
    seen: set[str] = set()
    for name, value in pairs:
        if name != LIMIT and name not in Settings.model_fields:
            # Not quoted back: what was typed there may be a secret pasted in the wrong place.
            close = difflib.get_close_matches(name, [*_SETTINGS, LIMIT], n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise MemoryServiceUriError(
                f"{SCHEME}:// has a parameter it does not know{hint}; it takes {LIMIT} and "
                "the settings by name (README: Settings)"
            )
        if name in seen:
            raise MemoryServiceUriError(f"{SCHEME}:// names {name} more than once")
        seen.add(name)
        if name == LIMIT:
            # ASCII digits alone: ``str.isdigit`` takes '²', which ``int`` refuses; and
            # few of them: ``int`` refuses thousands with an error of its own.
            digits = value.isascii() and value.isdigit() and len(value) <= 3
            if not (digits and 1 <= int(value) <= MAX_LIMIT):
                raise MemoryServiceUriError(f"{SCHEME}://?{LIMIT}= must be 1..{MAX_LIMIT}")
            overrides[LIMIT] = int(value)
        elif name in SECRET:
            raise MemoryServiceUriError(
                f"{SCHEME}://?{name}= is refused: it may hold a secret, which a command line "
                "shows to anyone on the machine; set it in the environment"
            )
        else:
            overrides[name] = _value(name, value)
    return overrides


def _value(name: str, value: str) -> Any:
    """Text as the setting takes it: a mapping's is JSON (as its variable's is)."""
    if typing.get_origin(Settings.model_fields[name].annotation) is not dict:
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise MemoryServiceUriError(f"{SCHEME}://?{name}= must be a JSON object") from None


def register() -> None:
    """Teaches ADK's service registry ``afterthought://`` (call it from ``services.py``)."""
    from google.adk.cli.service_registry import get_service_registry

    get_service_registry().register_memory_service(SCHEME, memory_service_from_uri)
