"""``afterthought adk init AGENTS_DIR``: the registration of ``afterthought://`` written
into an ADK agents folder's ``services.py`` (which ADK imports at start), keeping what
the file holds. It needs no ADK: the file it writes imports
``afterthought.agent_hooks.adk_services``."""

from __future__ import annotations

import ast
import io
import os
import tempfile
import tokenize
from pathlib import Path

BEGIN = "# --- afterthought: --memory_service_uri afterthought:// (afterthought adk init) ---"
END = "# --- end of afterthought ---"
BLOCK = f"""{BEGIN}
from afterthought.agent_hooks.adk_services import register as _register_afterthought

_register_afterthought()
{END}
"""
#: The module a registration written by hand imports ``register`` from (the README's two
#: lines).
_SERVICES = "afterthought.agent_hooks.adk_services"


class AgentsDirError(ValueError):
    """A folder ``afterthought adk init`` cannot write the registration into."""


def init_agents_dir(agents_dir: Path) -> str:
    """Writes the registration into ``agents_dir/services.py``: a new file, or appended
    to one that lacks it, or our block brought up to date in place. Everything else in
    the file is kept as it was, byte for byte; a file that already registers us (our
    block, or an import of ``register`` that it calls, by hand) is left alone. A
    ``services.py`` that is a link is written through (the link stays). Says what it
    did."""
    if not agents_dir.is_dir():
        raise AgentsDirError(f"{agents_dir} is not a directory: name your agents folder")
    if any((agents_dir / name).exists() for name in ("agent.py", "root_agent.yaml")):
        # ADK reads services.py of the folder it was given, which holds the agents.
        raise AgentsDirError(
            f"{agents_dir} is an agent's own folder; ADK reads services.py from the "
            f"folder that holds the agents (its parent, {agents_dir.resolve().parent}), "
            "the one you pass to adk web"
        )
    target = agents_dir / "services.py"
    real = target.resolve()
    if target.is_symlink() and not real.exists():
        raise AgentsDirError(
            f"{target} is a link to {real}, which does not exist: point it at a file, or remove it"
        )
    if not target.exists():
        _write(real, BLOCK, "utf-8")
        return f"wrote {target}"
    if not real.is_file():  # a FIFO would block the read forever, a device worse
        raise AgentsDirError(f"{real} is not a regular file: ADK imports a Python file there")
    text, encoding = _source(real)
    _registers_by_hand(text, real)  # refuses a file Python cannot parse either
    newline = "\r\n" if "\r\n" in text else "\n"
    ours = BLOCK.replace("\n", newline)
    block = _block(text)
    if block is not None:
        start, stop = block
        if text[start:stop] == ours:
            return f"{target} already registers afterthought://"
        _write(real, text[:start] + ours + text[stop:], encoding)
        return f"updated the afterthought block of {target}"
    if _registers_by_hand(text, real):
        return f"{target} already registers afterthought:// (by hand): left as it is"
    ends = text.endswith
    joint = "" if not text or ends(newline * 2) else newline if ends(newline) else newline * 2
    _write(real, text + joint + ours, encoding)
    return f"added the afterthought block to {target}"


def _source(path: Path) -> tuple[str, str]:
    """The file's text and encoding as Python reads source (PEP 263: a BOM, a coding
    line, else UTF-8), its newlines untouched."""
    try:
        data = path.read_bytes()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding), encoding
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError) as exc:
        raise AgentsDirError(
            f"cannot read {path}: {_why(exc)} (Python reads a source file as UTF-8 unless a "
            "coding line says otherwise)"
        ) from None


def _markers(marker: str, text: str) -> list[tuple[int, int]]:
    """Where the marker is a comment of a line of its own (not inside a string, nor
    after code), each from its line's start to past its line's end."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        row, column = token.start
        if token.type == tokenize.COMMENT and column == 0 and token.string == marker:
            found.append((starts[row - 1], starts[row]))
    return found


def _block(text: str) -> tuple[int, int] | None:
    """Where our block starts and ends (its last line break included): the first end
    marker and the begin marker nearest above it. A begin marker left without its end
    (the rest of an old block someone cut short) is not ours to bring up to date, nor is
    what follows it."""
    begins = _markers(BEGIN, text)
    for end_start, end_stop in _markers(END, text):
        above = [start for start, _ in begins if start < end_start]
        if above:
            return above[-1], end_stop
    return None


def _registers_by_hand(text: str, path: Path) -> bool:
    """Whether the file calls ``register`` of our module, imported by name (``from … import
    register [as r]; r()``) or with the module (``import … as m; m.register()``): parsed,
    so a comment or a string naming the module is no registration."""
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise AgentsDirError(
            f"{path} is not valid Python (line {exc.lineno}): ADK could not import it "
            "either; fix it, then run this again"
        ) from None
    functions: set[str] = set()
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == _SERVICES and not node.level:
            functions |= {a.asname or a.name for a in node.names if a.name == "register"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == _SERVICES}
    calls = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
    return any(
        (isinstance(called, ast.Name) and called.id in functions)
        or (
            isinstance(called, ast.Attribute)
            and called.attr == "register"
            and ast.unparse(called.value) in modules
        )
        for called in calls
    )


def _why(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__


def _write(target: Path, text: str, encoding: str) -> None:
    """All or nothing (a new file beside it, renamed over), in the file's encoding (its
    BOM kept), keeping an existing file's permissions; a failure names the file, not the
    temporary one."""
    temporary = None
    try:
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".services-", suffix=".py")
        with os.fdopen(fd, "wb") as out:
            out.write(text.encode(encoding))
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException as exc:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise AgentsDirError(
                f"cannot write {target}: {_why(exc)} (it is written as a new file in "
                f"{target.parent}, then renamed over the old one)"
            ) from None
        raise
