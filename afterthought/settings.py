"""One settings object, read from the environment (``AFTERTHOUGHT_*`` plus the bare
``REDIS_URL``, ``ZEP_API_KEY`` and ``ZEP_BASE_URL``)."""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import string
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from platformdirs import user_data_path
from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from afterthought.connections import parse as parse_redis_url
from afterthought.connections import split_url
from afterthought.keys import MAX_SHARDS, digest

log = logging.getLogger("afterthought.settings")

#: The most days a setting counts in (a century): a fact's age, pruning's grace.
MAX_DAYS = 36_500

#: Variables of ours that are not settings (the test suite's Redis).
OTHER_VARIABLES = frozenset({"AFTERTHOUGHT_TEST_REDIS_URL", "AFTERTHOUGHT_TEST_DATABASE_URL"})

#: What this process has warned about already: settings are read many times, a warning
#: is worth one line.
_warned: set[str] = set()


#: Warnings of the settings being validated (see ``Settings.__init__``), else None.
_pending: ContextVar[list[tuple[str, str, tuple[object, ...]]] | None] = ContextVar(
    "afterthought_settings_warnings", default=None
)


def _warn_once(what: str, message: str, *args: object) -> None:
    if what in _warned:
        return
    if (pending := _pending.get()) is not None:
        pending.append((what, message, args))
        return
    _warned.add(what)
    log.warning(message, *args)


def _prefix_char(char: str) -> bool:
    return char.isalnum() or char in "-_."


def deployment_led(backend_user_id: str) -> bool:
    """Whether a backend user id has the shape every ``{deployment}``-led template gives:
    a key prefix, then a character none holds (``shop:ada``). Rendered by a template
    without ``{deployment}``, such an id may be another deployment's user."""
    head = next((i for i, c in enumerate(backend_user_id) if not _prefix_char(c)), 0)
    return head > 0


def check_key_prefix(value: str) -> str:
    """A key prefix as every process takes it (``--prefix`` too)."""
    if not value or not all(_prefix_char(c) for c in value):
        raise ValueError("key_prefix must be non-empty letters, digits, '-', '_' or '.'")
    return value


def _default_store(key_prefix: str) -> Path:
    """One file per deployment on a machine: two deployments never share a memory."""
    name = "memory" if key_prefix == "afterthought" else f"memory-{key_prefix}"
    return user_data_path("afterthought") / f"{name}.sqlite3"


def _default_spool(key_prefix: str, redis_url: str) -> Path:
    """One directory per deployment and Redis on a machine: two deployments (or one
    deployment's two Redis) never replay each other's messages. Named by a digest of the
    prefix and the URL without its credentials."""
    parts = urlsplit(redis_url)
    where = digest(key_prefix, parts.scheme, parts.netloc.rpartition("@")[2].lower(), parts.path)
    return user_data_path("afterthought") / "spool" / f"{key_prefix}-{where[:16]}"


class _Environment(EnvSettingsSource):
    """The environment, where a JSON-typed variable that is not JSON is handed on as it
    is: validation then refuses it naming the field and its variable, as every other bad
    setting (pydantic-settings would raise an error naming neither the variable nor what
    is wrong with it)."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            return value


class SettingsError(ValueError):
    """Settings that cannot be used, said in one line: each setting in error, the variable
    that sets it and what is wrong, never its value (a key pasted into the wrong variable
    must not reach a log or a terminal). ``problems``: (setting, what is wrong) pairs, the
    setting empty for a check across several."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        said = [f"{field}: {message}" if field else message for field, message in problems]
        super().__init__("bad setting: " + "; ".join(said))

    @classmethod
    def of(cls, exc: ValidationError) -> SettingsError:
        problems, extra = [], []
        for error in exc.errors(include_input=False):
            if error["type"] == "default_factory_not_called":
                continue  # a default that waits for the field in error: not a second error
            # The setting alone: a part below it may be a dict key, and a key pasted
            # into the wrong variable must not be echoed.
            field = str(error["loc"][0]) if error["loc"] else ""
            if error["type"] == "extra_forbidden":
                extra.append(field)  # the caller's text, not a setting: never said
                continue
            # Our checks' words, without the prefix pydantic puts before a ValueError's.
            message = error["msg"].removeprefix("Value error, ")
            # An error found under a variable's own name (REDIS_URL) is named by it alone.
            if field and not field.isupper():
                field = f"{field} ({_variable(field)})"
            if (field, message) not in problems:
                problems.append((field, message))
        if extra:
            problems.append(("", _no_such_setting(extra, keywords=True)))
        return cls(problems)


def _no_such_setting(names: list[str], *, keywords: bool = False) -> str:
    """What is wrong with variables (or keyword arguments) that name no setting, without
    them (one may be a key pasted where a name goes): how many, and the settings they
    probably meant, as the project names them."""
    known = _known_variables()
    if keywords:
        known = {words: words.lower() for words in known if words.lower() in Settings.model_fields}
    meant = sorted(
        {
            known[close[0]]
            for name in names
            if (close := difflib.get_close_matches(_words(name), list(known), n=1))
        }
    )
    what = "keyword argument" if keywords else "AFTERTHOUGHT_ variable"
    said = f"{len(names)} {what}{'s name' if len(names) > 1 else ' names'} no setting"
    return said + (f" (did you mean {', '.join(meant)}?)" if meant else "")


def _words(name: str) -> str:
    """A variable or keyword as the settings' variables are compared: ``KEY_PREFIX``."""
    return name.upper().removeprefix("AFTERTHOUGHT_")


def _known_variables() -> dict[str, str]:
    """Each setting's variables by their words (``KEY_PREFIX``), as the project names them."""
    known = {}
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        for variable in (
            [str(a) for a in alias.choices if str(a).isupper()]
            if isinstance(alias, AliasChoices)
            else [f"AFTERTHOUGHT_{name.upper()}"]
        ):
            known[_words(variable)] = variable
    return known


def _variable(field: str) -> str:
    """The environment variable that sets a field (its first, for a nested one)."""
    known = Settings.model_fields.get(field.partition(".")[0])
    alias = known.validation_alias if known else None
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    return f"AFTERTHOUGHT_{field.partition('.')[0].upper()}"


class Settings(BaseSettings):
    """Everything both processes need; keyword overrides win over the environment. Bad
    values raise :class:`SettingsError`."""

    model_config = SettingsConfigDict(
        env_prefix="AFTERTHOUGHT_",
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        # A bad URL or key must not be echoed into a log by whoever prints the error.
        hide_input_in_errors=True,
        # Every number is finite (and each has an upper bound): an infinite duration
        # overflows where it becomes a deadline or a key's lifetime.
        allow_inf_nan=False,
    )

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("REDIS_URL", "AFTERTHOUGHT_REDIS_URL", "redis_url"),
        repr=False,  # it may hold a password
    )
    """Redis for the queue, the identity registry and the context cache: ``redis://``,
    ``rediss://`` (TLS), ``unix://``, a Sentinel set, ``redis+sentinel://h:p,h:p/SERVICE``,
    or a Redis Cluster, ``redis+cluster://h:p,h:p`` (with ``redis_shards`` and
    ``arq_redis_url``)."""
    arq_redis_url: str | None = Field(
        None,
        validation_alias=AliasChoices(
            "ARQ_REDIS_URL", "AFTERTHOUGHT_ARQ_REDIS_URL", "arq_redis_url"
        ),
        repr=False,
    )
    """Redis for arq's jobs, when not ``redis_url``: one Redis or a Sentinel set (never a
    cluster: arq cannot use one, so with a cluster ``redis_url`` workers and the CLI need
    this; agents run no arq jobs)."""
    zep_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("ZEP_API_KEY", "zep_api_key")
    )
    """Zep Cloud key; when unset the embedded local backend is used."""
    zep_base_url: str | None = Field(
        None,
        validation_alias=AliasChoices("ZEP_BASE_URL", "zep_base_url"),
        repr=False,  # it may hold a password
    )
    """Overrides Zep's API address, e.g. ``http://127.0.0.1:8011/api/v4`` for the fake."""
    backend: Literal["zep", "local", "postgres"] | None = None
    """Memory backend; ``zep`` when a key is set, else ``postgres`` when ``database_url``
    is, else ``local``."""
    database_url: SecretStr | None = Field(None, repr=False)
    """The PostgreSQL store (``postgresql://user:password@host:port/database``; extra
    ``postgres``): every worker and agent of a deployment names the same one."""
    database_schema: str = Field("afterthought", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    """The schema the PostgreSQL store keeps its tables in (created if missing): one per
    deployment that must not see another's memory."""
    memory_mode: Literal["zep", "managed"] = "zep"
    """On Zep: ``zep`` lets Zep extract facts; ``managed`` stores history only."""
    key_prefix: str = "afterthought"
    """Deployment prefix of every Redis key, arq's queue and job ids included."""
    redis_shards: int = Field(0, ge=0, le=MAX_SHARDS)
    """Virtual shards the queue is laid out in; 0 keeps the flat layout of one Redis. On
    Redis Cluster, required: the deployment's total (say 3 to 8 per master, times the
    masters): every user's keys share one shard's hash slot. Fixed for a deployment:
    recorded in Redis, and a process configured with another number refuses to start."""
    local_db_path: Path = Field(
        default_factory=lambda fields: _default_store(fields.get("key_prefix", "afterthought"))
    )
    """SQLite file of the local backend; agent and worker must name the same file (the
    default is one per deployment, in the user data directory)."""
    embedding_model: str | None = None
    """Local backend: a model2vec model (path or name; extra ``embeddings``) for hybrid recall."""
    retrieval_budget: float = Field(0.25, gt=0, le=30)
    """Hard deadline, in seconds, for reading memory on the turn path."""
    context_mode: Literal["cached", "query"] = "query"
    """``query`` (default): the block retrieved for the user's message within the budget,
    raced against the cached one (served when the retrieval does not finish, fails, or the
    message has no words); ``cached``: one Redis read of the block the worker built, before
    the message."""
    enqueue_timeout: float = Field(0.1, gt=0, le=5)
    """Deadline, in seconds, for the one Redis round trip that queues a write."""
    redis_wait_replicas: int = Field(0, ge=0, le=16)
    """With it, a queued write counts only once on the node that is master after any
    failover: at least this many replicas, and every replica the master had and the
    sentinels could promote, hold it (``WAIT`` with ``ROLE``; unconfirmed, it is sent
    again). With two replicas per master, 1 keeps a failover from losing or doubling it."""
    zep_user_id_template: str | None = None
    """Backend ``user_id`` from the deployment (``{deployment}``: ``key_prefix``) and ADK's
    ``{app}`` and ``{user_id}``. Unset, the deployment's default, recorded in Redis the first
    time it is needed (``afterthought.identity.default_template``): ``{deployment}:{user_id}``
    (another deployment on the same Zep project or store never shares a user), or
    ``{user_id}`` for a deployment that had users before the default was recorded (they keep
    their memory). Without ``{app}`` one user id is one person in every app of the deployment
    (one memory; forgetting them forgets them in all); ``{deployment}:{app}:{user_id}`` keeps
    each app's memory apart. A template without ``{deployment}`` names the same user in
    every deployment that sets it: say so only for deployments that share their users."""
    shared_store: str | None = Field(None, max_length=200, pattern=r"^[!-~]+$")
    """For deployments that share users (a ``zep_user_id_template`` without
    ``{deployment}``): the name of the store they share, the same in each. Unset, a Zep
    project is named by its address (Zep reports no project id, and one project has many
    API keys), a local store by its path with symlinks resolved. Set it where those differ
    for one store (one file mounted at two paths), or to part two Zep projects at one
    address. Printable ASCII without spaces."""
    assistant_name: str = "Assistant"
    """Display name stored with assistant messages."""
    max_message_chars: int = Field(2500, ge=100, le=1_000_000)
    """Backend per-message limit; longer content is split into ordered parts, never cut."""
    max_queued_chars: int = Field(1_000_000, ge=1000, le=100_000_000)
    """Largest message accepted into the queue at all (protects Redis)."""
    backend_timeout: float = Field(10.0, gt=0, le=300)
    """Seconds a worker-side backend call may take before it counts as a timeout; with the
    settle time, it fits in two thirds of the lease (what a renewed lease always has left)."""
    backend_settle_seconds: float = Field(2.0, ge=0, le=10)
    """After a call whose outcome is unknown (a timeout, a lost reply), how long the server
    may still commit it: the worker waits this long before reading back what landed."""
    late_commit_seconds: float = Field(900.0, ge=0, le=7 * 86400)
    """How long after a call whose outcome was unknown (or one a worker that lost its
    lease may still send) the backend may still commit it. Until then the thread is read
    back, about once a minute, for copies of its messages, which are repaired; and a batch
    that keeps failing is not cut into other calls (narrowed to its first message) before
    it has been failing this long, as a call cut otherwise carries another key."""
    retry_max_attempts: int = Field(10, ge=1, le=1000)
    """Failed attempts after which a message that keeps failing is dead-lettered, once the
    backend has taken other writes meanwhile (an outage dead-letters nothing)."""
    retry_max_age_seconds: float = Field(3 * 86400, gt=0, le=365 * 86400)
    """A message failing for longer than this is dead-lettered, outage or not."""
    tool_timeout: float = Field(5.0, gt=0, le=60)
    """Seconds a model-called memory tool may wait for the backend."""
    context_max_chars: int = Field(4000, ge=100, le=100_000)
    """Largest context block requested from the backend."""
    context_fresh_seconds: float = Field(60.0, ge=0, le=30 * 86400)
    """A cached block younger than this is served as is; older, it is served and refreshed."""
    context_ttl_seconds: float = Field(7 * 86400, gt=0, le=365 * 86400)
    """A cached block older than this is gone (and read through again)."""
    context_settle_seconds: float = Field(5.0, ge=0, le=3600)
    """On a backend that ingests asynchronously (Zep), a user's block for new sessions is
    read again this long after their last stored batch (debounced)."""
    read_breaker_failures: int = Field(3, ge=1, le=1000)
    """Consecutive failed memory reads that stop the turn path from calling the backend."""
    read_breaker_seconds: float = Field(10.0, gt=0, le=3600)
    """How long the turn path then serves only what the cache holds."""
    context_template_uuid: str | None = None
    """Context template rendering every block (see ``afterthought.templates``)."""
    batch_size: int = Field(30, ge=1, le=30)
    """Messages per ``add_messages`` call (Zep accepts at most 30)."""
    lease_seconds: float = Field(20.0, gt=0, le=25)
    """Per-thread lease; a dead worker's threads are recovered after this."""
    worker_concurrency: int = Field(16, ge=1, le=1000)
    """Threads one worker process flushes at the same time."""
    provision_on_worker: bool = True
    """Provision a missing Zep user/thread from the worker; else dead-letter ``unprovisioned``."""
    idle_ttl_seconds: float = Field(30 * 86400, ge=1, le=3650 * 86400)
    """How long a session's keys (its queue state, its registry entry) outlive its last
    message, and a user's (registry entry, thread set) the last of their sessions: then
    they expire, and are rebuilt on demand (the same backend user; see docs/DESIGN.md,
    "Key lifetimes"). Never while a message of theirs is queued or in flight."""
    thread_queue_cap: int = Field(10_000, ge=1, le=10_000_000)
    """Queued messages one thread may hold before enqueue pushes back."""
    queue_cap: int = Field(1_000_000, ge=1, le=1_000_000_000)
    """Queued messages all threads together may hold before enqueue pushes back. With
    ``redis_shards = N`` each shard holds at most ``ceil(queue_cap / N)`` (a shard's cap is
    checked in one slot, without reading the others'), so one busy shard may push back
    while the deployment as a whole is below this."""
    buffer_size: int = Field(10_000, ge=0, le=10_000_000)
    """Messages an agent process keeps in memory while Redis is unreachable; more go to
    the spool."""
    exit_flush_seconds: float = Field(1.0, ge=0, le=60)
    """At exit (and ``aclose``), how long the buffer may take to reach Redis before what
    is left is spooled."""
    spool_on_signals: bool = True
    """On SIGTERM (and SIGINT set to its default action: Python's KeyboardInterrupt exits
    through the exit hook), spool what the buffer holds (within ``exit_flush_seconds``)
    before the signal's own handler runs: installed as the first memory is made on the
    main thread, chained to the handler it replaces. ``false``: no handler is installed."""
    spool_path: Path = Field(
        default_factory=lambda fields: _default_spool(
            fields.get("key_prefix", "afterthought"), fields.get("redis_url", "")
        )
    )
    """Directory of the spool: the messages this machine's agents could not hand to Redis
    (at exit, or past ``buffer_size``), replayed by the next agent process or a worker
    here. The default is one per deployment and Redis, in the user data directory."""
    spool_max_bytes: int = Field(64 * 1024 * 1024, ge=4096, le=2**40)
    """Largest the spool may grow; messages past it are dropped and counted."""
    breaker_failures: int = Field(3, ge=1, le=1000)
    """Consecutive Redis failures that open the enqueue circuit breaker."""
    breaker_seconds: float = Field(5.0, gt=0, le=3600)
    """How long an open breaker keeps the turn path away from Redis."""
    pause_seconds: float = Field(60.0, gt=0, le=86400)
    """After a 401/403 all workers pause this long, then one probes again."""
    direct_write_on_outage: bool = False
    """While Redis is down, the agent writes buffered messages to the backend itself (for
    threads whose identity it has seen), trading strict thread order for durability."""
    synthesis_idle_seconds: float = Field(5.0, ge=0, le=86400)
    """Synthesis runs this long after a user's last flushed message (debounced)."""
    synthesis_model: str | None = None
    """An ADK model name for fact extraction (e.g. a Gemini model); else the offline rules."""
    accept_assistant_facts: bool = False
    """Write facts the assistant asserted about the user (quarantined by default)."""
    fact_ttl_days: dict[str, float] = Field(default_factory=lambda: {"ephemeral": 7.0})
    """Days a fact of a kind lives (JSON in the environment); kinds not named live on."""
    stale_days: float = Field(365.0, gt=0, le=MAX_DAYS)
    """Unimportant facts (importance < 0.5) not restated for this long are pruned."""
    superseded_grace_days: float = Field(30.0, ge=0, le=MAX_DAYS)
    """Superseded facts are kept this long (for history), then pruned."""
    prune_at: str = "03:17"
    """UTC time (``HH:MM``) of the workers' daily prune, or ``off`` to schedule it yourself."""
    max_facts_per_user: int = Field(500, ge=1, le=1_000_000)
    """Above this, the least important x least recent facts are pruned."""
    prune_zep_edges: bool = False
    """Pruning may delete the edges Zep extracted itself; else only the facts we wrote."""
    zep_delete_wait_seconds: float = Field(10.0, ge=0, le=300)
    """How long a Zep delete (done later by a task) is polled before it counts as pending."""
    forget_clock_margin_seconds: float = Field(1.0, ge=0, le=3600)
    """A message the agent made up to this long after a forget began (by Redis' clock) is
    refused with the ones made before it: an agent's clock may run ahead of Redis' by as
    much (the margin to exceed the skew between any agent machine and Redis)."""
    audit_key: SecretStr | None = None
    """HMAC key of the audit log's user references and content digests; the log is off
    without one (kept out of Redis, so Redis alone cannot tie entries to a user)."""
    tombstone_key: SecretStr | None = None
    """HMAC key of the tombstones a forgotten fact leaves in Redis (so Redis alone cannot
    confirm a guessed fact); unset: a key kept in the local or PostgreSQL store, on Zep one
    derived from ``zep_api_key``. Changed only with the one before in
    ``tombstone_previous_keys`` (see README, "Forgetting")."""
    tombstone_previous_keys: list[SecretStr] = Field(default_factory=list)
    """Tombstone keys used before (``tombstone_key``s, or Zep API keys the key was derived
    from), a JSON list: their tombstones still keep their facts forgotten, and are made
    again under the key in use as synthesis meets them."""
    audit_max_entries: int = Field(100_000, ge=100, le=100_000_000)
    """Entries the audit stream keeps (older ones are trimmed)."""
    metrics_port: int | None = Field(None, ge=0, le=65535)
    """Port of a worker's Prometheus ``/metrics`` and ``/healthz``; off when unset."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics endpoint binds (``0.0.0.0`` in a container)."""
    skip_nested: bool = True
    """Ignore nested runs (an ``AgentTool``'s child runner): no read, no write."""
    trust_state_identity: bool = False
    """Use Zep UUIDs pinned in session state unchecked. ADK's API server lets clients write
    session state, so by default a pinned user or graph must be the registry's for the ADK
    user, and the worker writes to a pinned thread only if it belongs to that user."""

    def __init__(self, **values: Any) -> None:
        # Warnings wait for the settings to be valid: settings refused are said in one line
        # (the error), not after a warning about one of them.
        pending: list[tuple[str, str, tuple[object, ...]]] = []
        token = _pending.set(pending)
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError.of(exc) from None
        finally:
            _pending.reset(token)
        for what, message, args in pending:
            _warn_once(what, message, *args)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _Environment(settings_cls), dotenv_settings, file_secret_settings)

    @field_validator("fact_ttl_days", mode="before")
    @classmethod
    def _json_object(cls, value: object) -> object:
        # Text here is the environment's, and was not JSON (see _Environment).
        if isinstance(value, str):
            raise ValueError('must be a JSON object of days by kind, e.g. {"ephemeral": 7}')
        return value

    @field_validator("fact_ttl_days")
    @classmethod
    def _positive_days(cls, value: dict[str, float]) -> dict[str, float]:
        # A fact that lives no days (or NaN of them) would be pruned as soon as it is written.
        if not all(0 < days <= MAX_DAYS for days in value.values()):
            raise ValueError(
                f"each kind's days must be a number > 0 and at most {MAX_DAYS} "
                "(leave a kind out to keep it)"
            )
        return value

    @property
    def jobs_redis_url(self) -> str:
        """Where arq's jobs live: ``arq_redis_url``, else ``redis_url``. Only workers and
        the CLI use arq, so only they need ``arq_redis_url`` on a Redis Cluster: an agent
        never asks (ValueError, said plainly, when the cluster has no Redis for arq)."""
        if self.arq_redis_url is None and parse_redis_url(self.redis_url).topology == "cluster":
            raise ValueError(
                "a Redis Cluster needs arq_redis_url (ARQ_REDIS_URL) naming one Redis or a "
                "Sentinel set for arq's jobs, in every worker and CLI: arq cannot use a cluster"
            )
        return self.arq_redis_url or self.redis_url

    @field_validator("key_prefix")
    @classmethod
    def _plain_prefix(cls, value: str) -> str:
        return check_key_prefix(value)

    @field_validator("zep_base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        # Else a worker reports ready and every call fails; never quoted (it may hold a
        # password).
        if value is not None:
            parts = split_url(value, "ZEP_BASE_URL")
            try:
                parts.port  # noqa: B018 - raises on a port out of range or not a number
            except ValueError:
                raise ValueError("its port must be a number 0-65535") from None
            if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
                raise ValueError("must be an http:// or https:// URL with a host")
        return value

    @field_validator(
        "arq_redis_url",
        "zep_api_key",
        "zep_base_url",
        "backend",
        "database_url",
        "embedding_model",
        "context_template_uuid",
        "synthesis_model",
        "zep_user_id_template",
        "shared_store",
        "audit_key",
        "tombstone_key",
        "metrics_port",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # Compose and CI set a variable to "" for "not set": it must mean the default. Only
        # spaces are a mistake, not "not set" (a blank key must not select another backend).
        if isinstance(value, str) and not value.strip():
            if value:
                raise ValueError("is blank: set it, or leave it empty for the default")
            return None
        return value

    @field_validator("tombstone_previous_keys", mode="before")
    @classmethod
    def _no_previous_keys(cls, value: object) -> object:
        # "" is "not set" (see _empty_is_unset): none.
        return [] if value == "" else value

    @field_validator("zep_api_key")
    @classmethod
    def _plain_key(cls, value: SecretStr | None) -> SecretStr | None:
        # Else it fails in a request, as an encoding error quoting a character of it, or a
        # protocol error that looks like Zep being down. Never quoted, not even in part.
        key = value.get_secret_value() if value is not None else ""
        if not all(c.isascii() and c.isprintable() and not c.isspace() for c in key):
            raise ValueError(
                "must be printable ASCII without spaces or line breaks: copy the key again"
            )
        return value

    @field_validator("redis_url", "arq_redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        # redis-py reads a path that is not a number as database 0, silently; a URL it
        # cannot parse would fail later, in a turn. Refused here, in words that never
        # quote the URL (it may hold a password).
        if value is not None:
            parse_redis_url(value)
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: SecretStr | None) -> SecretStr | None:
        # Refused here, in words that never quote the URL (it holds a password): a URL
        # asyncpg cannot use would otherwise fail at the first write, quoting parts of it.
        if value is not None:
            check_database_url(value.get_secret_value())
        return value

    @field_validator("spool_path")
    @classmethod
    def _absolute_spool(cls, value: Path) -> Path:
        # An agent and a worker started in other directories must name the same spool.
        return _absolute(value)

    @field_validator("local_db_path")
    @classmethod
    def _absolute_store(cls, value: Path) -> Path:
        # Made absolute where it is read: a relative path names another file in a process
        # started elsewhere. Said without the path, which is the user's text.
        if str(value) == ":memory:":
            return value
        resolved = _absolute(value)
        if not value.expanduser().is_absolute():
            _warn_once(
                f"relative:{value}",
                "local_db_path (AFTERTHOUGHT_LOCAL_DB_PATH) is relative: each process resolves "
                "it in its own working directory, so the agent and the workers may use "
                "different files (give an absolute path)",
            )
        return resolved

    @model_validator(mode="before")
    @classmethod
    def _empty_key_is_said(cls, data: Any) -> Any:
        # An empty ZEP_API_KEY is "not set" (Compose writes "" for that), and selects the
        # local store: when no backend is named, that may be a Zep secret that did not
        # mount, so it is said (a backend=zep deployment is refused for the key instead).
        if isinstance(data, dict):
            key = next((data[k] for k in ("ZEP_API_KEY", "zep_api_key") if k in data), None)
            backend = next(
                (data[k] for k in ("AFTERTHOUGHT_BACKEND", "backend") if k in data), None
            )
            if key == "" and not backend:
                _warn_once(
                    "empty-zep-key",
                    "ZEP_API_KEY is set but empty: the local store is used (unset it, or set "
                    "AFTERTHOUGHT_BACKEND=local, to say that is meant)",
                )
        return data

    @model_validator(mode="after")
    def _contradictions(self) -> Settings:
        # Each a setting that does nothing as set, said once (names, never values).
        shard_cap = -(-self.queue_cap // max(self.redis_shards, 1))
        if self.thread_queue_cap > shard_cap:
            _warn_once(
                "thread-cap",
                "thread_queue_cap (AFTERTHOUGHT_THREAD_QUEUE_CAP) is above queue_cap "
                "(AFTERTHOUGHT_QUEUE_CAP)%s: a thread is pushed back at that cap first",
                " per shard" if self.redis_shards else "",
            )
        if self.context_ttl_seconds < self.context_fresh_seconds:
            _warn_once(
                "context-ttl",
                "context_ttl_seconds (AFTERTHOUGHT_CONTEXT_TTL_SECONDS) is below "
                "context_fresh_seconds (AFTERTHOUGHT_CONTEXT_FRESH_SECONDS): a cached "
                "block is gone before it is stale, so it is never refreshed in the background",
            )
        if self.memory_mode == "managed" and self.resolved_backend == "local":
            _warn_once(
                "managed-local",
                "memory_mode (AFTERTHOUGHT_MEMORY_MODE) managed is for Zep: the local store "
                "is always managed by afterthought's own synthesis",
            )
        if self.shared_store is not None and not self.users_shared:
            _warn_once(
                "shared-store",
                "shared_store (AFTERTHOUGHT_SHARED_STORE) is set, but zep_user_id_template "
                "(AFTERTHOUGHT_ZEP_USER_ID_TEMPLATE) shares no users (unset, or with "
                "{deployment}): it is not used",
            )
        return self

    @model_validator(mode="after")
    def _zep_needs_a_key(self) -> Settings:
        if self.backend == "zep" and self.zep_api_key is None:
            raise ValueError("backend zep needs ZEP_API_KEY (it is unset or empty)")
        if self.backend == "postgres" and self.database_url is None:
            raise ValueError("backend postgres needs AFTERTHOUGHT_DATABASE_URL (it is unset)")
        return self

    @model_validator(mode="after")
    def _unknown_variables(self) -> Settings:
        # A misspelt variable (AFTERTHOUGHT_PREFIX) is otherwise ignored without a word.
        # Not named (its name may be a key pasted where the name goes): counted, with the
        # settings they probably meant.
        known = _known_variables()
        unknown = sorted(
            variable
            for variable in os.environ
            if variable.upper().startswith("AFTERTHOUGHT_")
            and variable.upper() not in OTHER_VARIABLES
            and known.get(_words(variable)) != variable.upper()
        )
        if unknown:
            _warn_once(
                "unknown:" + digest(*unknown),
                "%s: ignored (`env | grep ^AFTERTHOUGHT_` lists them)",
                _no_such_setting(unknown),
            )
        return self

    @model_validator(mode="after")
    def _cluster_needs_shards_and_arq(self) -> Settings:
        if self.arq_redis_url and parse_redis_url(self.arq_redis_url).topology == "cluster":
            raise ValueError("arq_redis_url must not be a Redis Cluster: arq cannot use one")
        if parse_redis_url(self.redis_url).topology == "cluster" and not self.redis_shards:
            raise ValueError(
                "a Redis Cluster needs redis_shards >= 1 (AFTERTHOUGHT_REDIS_SHARDS: the "
                "deployment's total, e.g. 8 per master times the masters): the queue's keys "
                "are spread over shards"
            )
        return self

    @model_validator(mode="after")
    def _settles_within_lease(self) -> Settings:
        if self.backend_timeout + self.backend_settle_seconds > self.lease_seconds * 2 / 3:
            raise ValueError(
                "backend_timeout + backend_settle_seconds must fit in two thirds of "
                "lease_seconds (a worker renews its lease every third of it)"
            )
        return self

    @field_validator("prune_at")
    @classmethod
    def _daily_time(cls, value: str) -> str:
        hour, _, minute = value.partition(":")
        if value != "off" and not (
            hour.isdigit() and minute.isdigit() and int(hour) < 24 and int(minute) < 60
        ):
            raise ValueError("prune_at must be HH:MM (UTC) or off")
        return value

    @field_validator("zep_user_id_template")
    @classmethod
    def _known_fields(cls, value: str | None) -> str | None:
        if value is not None:
            _template_fields(value)  # raises what is wrong with it
        return value

    def as_env(self) -> dict[str, str]:
        """These settings as the environment of another process (a worker, say)."""
        env = {}
        for field, value in self.model_dump().items():
            if value is None:
                continue
            if hasattr(value, "get_secret_value"):
                value = value.get_secret_value()
            elif isinstance(value, list):
                value = [
                    v.get_secret_value() if hasattr(v, "get_secret_value") else v for v in value
                ]
            text = json.dumps(value) if isinstance(value, dict | list) else str(value)
            alias = type(self).model_fields[field].validation_alias
            name = alias.choices[0] if isinstance(alias, AliasChoices) else None
            env[str(name or f"AFTERTHOUGHT_{field.upper()}")] = text
        return env

    @property
    def shard_queue_cap(self) -> int:
        """The messages one shard of the queue holds at most (each checked in its own
        slot): more than this at once is refused however empty the queue is."""
        return math.ceil(self.queue_cap / max(1, self.redis_shards))

    @property
    def resolved_backend(self) -> Literal["zep", "local", "postgres"]:
        if self.backend is not None:
            return self.backend
        if self.zep_api_key:
            return "zep"
        return "postgres" if self.database_url is not None else "local"

    @property
    def apps_apart(self) -> bool:
        """Whether one user id names another person in each app (the template has
        ``{app}``); the default names one person in every app."""
        template = self.zep_user_id_template
        return template is not None and "app" in _template_fields(template)[0]

    @property
    def users_shared(self) -> bool:
        """Whether the template names a user the same in every deployment that sets it (no
        ``{deployment}``): the operator's word that deployments share their users."""
        template = self.zep_user_id_template
        return template is not None and not names_deployment(template)

    def zep_user_id(self, *, app: str, user_id: str, template: str) -> str:
        """The backend user id by ``template`` (the setting, else the deployment's default:
        ``IdentityRegistry.backend_user_id`` knows which)."""
        values = {"app": app, "user_id": user_id, "deployment": self.key_prefix}
        fields, separators = _template_fields(template)
        if len(fields) > 1:
            # Each part escaped, so the text between them marks where each ends: (app
            # ``x``, user ``y:z``) and (app ``x:y``, user ``z``) are two backend users.
            values = {name: _escape(text, separators) for name, text in values.items()}
        return template.format(**values)


#: What a ``zep_user_id_template`` may name.
TEMPLATE_FIELDS = ("deployment", "app", "user_id")


def names_deployment(template: str) -> bool:
    """Whether a (valid) template names ``{deployment}``: no other deployment's names it."""
    return "deployment" in _template_fields(template)[0]


@lru_cache(maxsize=64)
def _template_fields(template: str) -> tuple[tuple[str, ...], str]:
    """The fields a template names, in order, and the characters of the text between them
    (escaped in each part: ``Settings.zep_user_id``); ValueError, one line without the
    template, for one that is not ``{deployment}``, ``{app}`` and ``{user_id}``, each bare,
    ``{user_id}`` among them, any two apart, with no ``%`` in its own text, and
    ``{deployment}``, if there, first and ended by a character no key prefix holds."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:
        raise ValueError("zep_user_id_template has a lone { or }") from None
    # Each field with the literal text before it (``{{`` parses as a piece of its own).
    named, text = [], ""
    for literal, field, spec, conversion in parts:
        text += literal
        if field is None:
            continue
        if field not in TEMPLATE_FIELDS or spec or conversion:
            raise ValueError(
                "zep_user_id_template may use only {deployment}, {app} and {user_id}, each "
                "bare (no format, conversion, attribute or index)"
            )
        named.append((text, field))
        text = ""
    if "user_id" not in [field for _, field in named]:
        raise ValueError("zep_user_id_template must contain {user_id}")
    # A field's own ``%`` is escaped to ``%25``: the same text outside the fields would
    # make two users one (``{app}%25{user_id}`` renders (``a%``, ``b``) and (``a``, ``%b``)
    # both as ``a%25%25b``).
    if "%" in text or any("%" in literal for literal, _ in named):
        raise ValueError("zep_user_id_template may not hold % outside its fields")
    between = [text for text, _ in named[1:]]
    if not all(between):
        raise ValueError("zep_user_id_template must have text between any two fields")
    # Another deployment on the store may have any other template: a deployment's name
    # first, ended by a character no key_prefix holds, is what keeps any two of them
    # apart (``{deployment}-{user_id}`` of ``a``, user ``b/c``, and
    # ``{deployment}/{user_id}`` of ``a-b``, user ``c``, were both ``a-b/c``).
    fields = [field for _, field in named]
    if "deployment" in fields and (
        fields[0] != "deployment" or named[0][0] or _prefix_char(between[0][0])
    ):
        raise ValueError(
            "zep_user_id_template must start with {deployment}, then a character a "
            "key_prefix cannot hold (not a letter, digit, '-', '_' or '.'), e.g. "
            "{deployment}:{user_id}"
        )
    return tuple(field for _, field in named), "".join(sorted(set("".join(between))))


@dataclass(frozen=True, slots=True)
class DatabaseAddress:
    """Where a PostgreSQL URL points, without its user or password: each host in the order
    given (``host:port``, an IPv6 address bare, or a unix socket's directory) and the
    database."""

    hosts: tuple[tuple[str, int], ...]
    database: str

    def __str__(self) -> str:
        """For people: ``h1:5432,h2:5433/db``, a socket as ``/var/run/postgresql (socket,
        port 5432)``."""
        shown = [
            f"{host} (socket, port {port})"
            if host.startswith("/")
            else f"[{host}]:{port}"
            if ":" in host
            else f"{host}:{port}"
            for host, port in self.hosts
        ]
        return f"{','.join(shown)}/{self.database}"


def database_address(url: str) -> DatabaseAddress:
    """Parse a PostgreSQL URL as libpq and asyncpg read one (hosts in the URL's authority,
    comma-separated, each with its port, else in ``host=`` and ``port=`` of the query;
    a host that is a path is a unix socket's directory). ValueError, saying why without
    quoting the URL (it may hold a password), for one the driver cannot use."""
    form = "(postgresql://user:password@host:port/database)"
    try:
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query, strict_parsing=False).items()}
    except ValueError:
        raise ValueError(f"is not a URL {form}") from None
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise ValueError(f"must be a postgresql:// URL {form}")
    spec = parts.netloc.rpartition("@")[2]
    listed = spec.split(",") if spec else []
    given = [p for p in query.get("port", "").split(",") if p]
    if not listed and query.get("host"):
        listed = query["host"].split(",")
        if len(given) not in (0, 1, len(listed)):
            raise ValueError("has a port= list of another length than its host= list")
    if not listed or not all(listed):
        raise ValueError(f"names no host {form}")
    hosts = []
    for i, item in enumerate(listed):
        if item.startswith("/"):
            host, port = item, ""
        elif item.startswith("["):
            host, _, rest = item[1:].partition("]")
            if rest and not rest.startswith(":"):
                raise ValueError("has a bad IPv6 address (write it [::1]:5432)")
            port = rest[1:]
        else:  # a socket's directory may be percent-encoded here (%2Fvar%2Frun%2F...)
            host, _, port = item.partition(":")
            host = unquote(host)
            host = host if host.startswith("/") else host.lower()
        if not host:
            raise ValueError(f"names no host {form}")
        port = port or (given[i] if i < len(given) else given[0] if len(given) == 1 else "5432")
        if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError("has a port that is not a number 1-65535")
        hosts.append((host, int(port)))
    database = unquote(parts.path.lstrip("/")) or query.get("dbname") or "postgres"
    return DatabaseAddress(tuple(hosts), database)


def check_database_url(url: str) -> None:
    """Refuse a PostgreSQL URL the driver cannot use, saying why without quoting it."""
    database_address(url)


def _absolute(path: Path) -> Path:
    """``path`` from the root, ``~`` expanded; ValueError, without the path, for a ``~user``
    this machine has no home for (pathlib's RuntimeError would not say which setting)."""
    try:
        return path.expanduser().absolute()
    except RuntimeError:
        raise ValueError("starts with ~ of a user without a home directory here") from None


def _escape(text: str, separators: str) -> str:
    """``text`` with ``%`` and each separator percent-encoded (UTF-8)."""
    return "".join(
        "".join(f"%{byte:02X}" for byte in char.encode()) if char in separators + "%" else char
        for char in text
    )
