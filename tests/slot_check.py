"""The slot check: what Redis Cluster would refuse, found on a standalone Redis.

A sync ``MONITOR`` connection records every command the server runs (commands a script
runs too, as ``lua``), a run of the product's operations is cut into phases by ``ECHO``
markers, and each multi-key command, each script (the keys it declares and the keys it
touches) and each client's MULTI ... EXEC block is checked to name keys of one hash slot
only. A MULTI counts as an offence whatever its keys: redis-py's cluster client refuses
``pipeline(transaction=True)`` outright. Each offence names its call site (a script by
the module and constant that define it, else the command) so the list reads as a to-do."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import pkgutil
import re
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis as syncredis
from redis.crc import key_slot
from redis.exceptions import ResponseError

import afterthought

_SCRIPT_CALLS = {b"EVAL", b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO", b"FCALL", b"FCALL_RO"}
_LINE = re.compile(r"^\d+\.\d+ \[(\d+) ([^\]]+)\] (.*)$")
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b"}


@dataclass(frozen=True)
class Script:
    module: str
    name: str

    @property
    def site(self) -> str:
        return f"{self.module}.{self.name}"


def known_scripts() -> dict[str, Script]:
    """SHA1 -> the module constant holding the script, for every Lua script of the
    package (with and without the ``allow-oom`` flag line the queue puts in front)."""
    found: dict[str, Script] = {}
    for info in pkgutil.walk_packages(afterthought.__path__, "afterthought."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra's module: no script of ours in it
            continue
        source = inspect.getsource(module)
        for name, value in vars(module).items():
            # Defined here, not imported: its owner is the module that assigns it.
            if not (isinstance(value, str) and "redis.call" in value):
                continue
            if not re.search(rf"^{name}\s*[:=]", source, re.MULTILINE):
                continue
            for text in (value, "#!lua flags=allow-oom\n" + value):
                found[hashlib.sha1(text.encode()).hexdigest()] = Script(info.name, name)
    return found


@dataclass
class Command:
    client: str
    db: int
    args: list[bytes]
    inner: list[list[bytes]] = field(default_factory=list)
    """What a script ran (MONITOR shows it right after the call, as ``lua``)."""

    @property
    def name(self) -> str:
        return self.args[0].decode().upper() if self.args else ""


@dataclass(frozen=True)
class Offence:
    phase: str
    site: str
    why: str
    keys: tuple[bytes, ...]

    def __str__(self) -> str:
        shown = ", ".join(k.decode(errors="replace") for k in self.keys[:4])
        more = f" (+{len(self.keys) - 4})" if len(self.keys) > 4 else ""
        return f"[{self.phase}] {self.site}: {self.why}: {shown}{more}"


def _unquote(text: str) -> bytes:
    """One argument as MONITOR quotes it (``sdscatrepr``)."""
    out, i = bytearray(), 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "x":
                out.append(int(text[i + 2 : i + 4], 16))
                i += 4
                continue
            out += _ESCAPES.get(nxt, nxt.encode())
            i += 2
            continue
        out += text[i].encode()
        i += 1
    return bytes(out)


def parse(lines: list[str]) -> list[Command]:
    commands: list[Command] = []
    last_script: Command | None = None
    for line in lines:
        match = _LINE.match(line)
        if not match:
            continue
        db, client, rest = int(match[1]), match[2], match[3]
        args = [_unquote(a) for a in _ARG.findall(rest)]
        if client == "lua":
            if last_script is not None:
                last_script.inner.append(args)
            continue
        command = Command(client, db, args)
        commands.append(command)
        last_script = command if command.name.encode() in _SCRIPT_CALLS else None
    return commands


class Recorder:
    """MONITOR in a thread, from ``start`` to ``stop``; ``phase`` marks where the next
    operation begins."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._token = uuid.uuid4().hex
        self._lines: list[str] = []
        self._client = syncredis.Redis.from_url(url)
        self._monitor = self._client.monitor()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> None:
        self._monitor.__enter__()  # MONITOR, and its OK: recording from here on
        self._thread.start()

    def _read(self) -> None:
        stop = f"slot-check:{self._token}:stop"
        while True:
            raw = self._monitor.connection.read_response()
            line = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            if stop in line:
                return
            self._lines.append(line)

    def phase(self, name: str) -> None:
        self._client.echo(f"slot-check:{self._token}:phase:{name}")

    def stop(self) -> dict[str, list[Command]]:
        """The commands of each phase."""
        self._client.echo(f"slot-check:{self._token}:stop")
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the MONITOR reader did not stop"
        self._monitor.__exit__()
        self._client.close()
        phases: dict[str, list[Command]] = defaultdict(list)
        current = ""
        marker = f"slot-check:{self._token}:phase:"
        for command in parse(self._lines):
            if command.name == "ECHO" and command.args[1].decode().startswith(marker):
                current = command.args[1].decode().removeprefix(marker)
                continue
            if current:
                phases[current].append(command)
        return phases


class Checker:
    """Finds the offences among the commands that touch keys under ``prefix``."""

    def __init__(self, url: str, prefix: str, *, db: int = 0) -> None:
        self._client = syncredis.Redis.from_url(url)
        self._prefix = prefix.encode()
        self._db = db
        self._scripts = known_scripts()
        self._keys: dict[tuple[bytes, ...], list[bytes]] = {}

    def close(self) -> None:
        self._client.close()

    def keys_of(self, args: list[bytes]) -> list[bytes]:
        """The command's keys, as the server itself finds them (``COMMAND GETKEYS``)."""
        cached = self._keys.get(tuple(args))
        if cached is None:
            try:
                found = self._client.command_getkeys(*args)
                cached = [k if isinstance(k, bytes) else k.encode() for k in found]
            except ResponseError:  # no keys, or not a command with keys
                cached = []
            self._keys[tuple(args)] = cached
        return cached

    def offences(self, phase: str, commands: list[Command]) -> list[Offence]:
        found = []
        for unit, transaction in self._units(commands):
            calls = [args for c in unit for args in (c.args, *c.inner)]
            if not any(self._prefix in arg for args in calls for arg in args):
                continue  # another test's, or another engineer's: not asked for its keys
            keys = [k for args in calls for k in self.keys_of(args)]
            if not any(self._prefix in k for k in keys):
                continue
            slots = {key_slot(k) for k in keys}
            if not transaction and len(slots) <= 1:
                continue
            site = self._site(unit, transaction)
            why = f"keys in {len(slots)} slots" if len(slots) > 1 else "one slot"
            if transaction:
                why = f"a transaction, {why} (a cluster client refuses MULTI)"
            found.append(Offence(phase, site, why, tuple(dict.fromkeys(keys))))
        return found

    def _units(self, commands: list[Command]) -> Iterator[tuple[list[Command], bool]]:
        """Each command alone, or a client's MULTI ... EXEC as one."""
        open_blocks: dict[str, list[Command]] = {}
        for command in commands:
            if command.db != self._db:
                continue
            block = open_blocks.get(command.client)
            if command.name == "MULTI":
                open_blocks[command.client] = []
            elif block is not None and command.name in ("EXEC", "DISCARD"):
                del open_blocks[command.client]
                yield block, True
            elif block is not None:
                block.append(command)
            else:
                yield [command], False

    def _site(self, unit: list[Command], transaction: bool) -> str:
        if transaction:
            return "MULTI [" + " ".join(c.name for c in unit) + "]"
        (command,) = unit
        if command.name in ("EVALSHA", "EVALSHA_RO"):
            script = self._scripts.get(command.args[1].decode())
            if script is None:
                return f"EVALSHA {command.args[1].decode()[:12]} (a script of no module)"
            return f"EVALSHA {script.site}"
        if command.name in ("EVAL", "EVAL_RO"):
            first = command.args[1].decode(errors="replace").strip().splitlines()[0]
            return f"EVAL {first[:60]!r}"
        return command.name
