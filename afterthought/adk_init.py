"""``afterthought adk init AGENTS_DIR``: the registration of ``afterthought://`` written
into an ADK agents folder's ``services.py`` (which ADK imports at start), keeping what
the file holds. It needs no ADK: the file it writes imports
``afterthought.agent_hooks.adk_services``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

BEGIN = "# --- afterthought: --memory_service_uri afterthought:// (afterthought adk init) ---"
END = "# --- end of afterthought ---"
BLOCK = f"""{BEGIN}
from afterthought.agent_hooks.adk_services import register as _register_afterthought

_register_afterthought()
{END}
"""
#: What a registration written by hand imports (the README's two lines).
_BY_HAND = "afterthought.agent_hooks.adk_services"


class AgentsDirError(ValueError):
    """A folder ``afterthought adk init`` cannot write the registration into."""


def init_agents_dir(agents_dir: Path) -> str:
    """Writes the registration into ``agents_dir/services.py``: a new file, or appended
    to one that lacks it, or our block brought up to date in place. Everything else in
    the file is kept as it was, byte for byte; a file that already registers us (our
    block, or the two lines by hand) is left alone. Says what it did."""
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
    if not target.exists():
        _write(target, BLOCK)
        return f"wrote {target}"
    text = target.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    if start >= 0 and end > start:
        stop = end + len(END)
        stop += text[stop:].startswith("\n")
        if text[start:stop] == BLOCK:
            return f"{target} already registers afterthought://"
        _write(target, text[:start] + BLOCK + text[stop:])
        return f"updated the afterthought block of {target}"
    if _BY_HAND in text:
        return f"{target} already registers afterthought:// (by hand): left as it is"
    joint = "" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
    _write(target, text + joint + BLOCK)
    return f"added the afterthought block to {target}"


def _write(target: Path, text: str) -> None:
    """All or nothing (a new file beside it, renamed over), keeping an existing file's
    permissions."""
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".services-", suffix=".py")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
