# ruff: noqa: E501  (the cases are whole files, one a line)
"""`afterthought adk init` against odd folders and services.py variants; each case prints
the exit code, the first line of output and whether the resulting services.py still
imports (Python's own import, as ADK's loader does) and registers afterthought://."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

AFT = str(Path(sys.executable).with_name("afterthought"))
root = Path(tempfile.mkdtemp(prefix="b26b-init-"))


def run(folder: Path | str) -> tuple[int, str]:
    p = subprocess.run([AFT, "adk", "init", "--", str(folder)], capture_output=True, text=True)
    return p.returncode, (p.stdout + p.stderr).strip().splitlines()[0] if (
        p.stdout + p.stderr
    ).strip() else ""


def registers(folder: Path) -> str:
    """Imports services.py like ADK (a module from the file) and asks the registry."""
    code = (
        "import importlib.util,sys\n"
        f"spec=importlib.util.spec_from_file_location('services', {str(folder / 'services.py')!r})\n"
        "m=importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "from google.adk.cli.service_registry import get_service_registry as g\n"
        "r=g(); print('afterthought' in getattr(r,'_memory_factories',{}) or 'afterthought' in str(vars(r)))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return p.stdout.strip() or (
        "ERR " + p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "?"
    )


cases: dict[str, bytes | None] = {
    "empty folder": None,
    "empty file": b"",
    "no trailing newline": b"import os\nX = 1",
    "BOM utf-8": b"\xef\xbb\xbfimport os\nX = 1\n",
    "latin-1 with coding line": b"# -*- coding: latin-1 -*-\nNAME = '\xe9t\xe9'\n",
    "CRLF": b"import os\r\nX = 1\r\n",
    "syntax error": b"def (:\n",
    "registered in dead code": b"def never():\n    from afterthought.agent_hooks.adk_services import register\n    register()\n",
    "markers in a docstring": (
        b'"""\n# --- afterthought: --memory_service_uri afterthought:// (afterthought adk init) ---\n'
        b'old\n# --- end of afterthought ---\n"""\nX = 1\n'
    ),
    "only BEGIN marker": b"# --- afterthought: --memory_service_uri afterthought:// (afterthought adk init) ---\nX = 1\n",
    "tab-indented user code": b"if True:\n\tX = 1\n",
    "ends in open backslash": b"X = 1 + \\\n",
}
for name, content in cases.items():
    d = root / name.replace(" ", "_")
    d.mkdir()
    if content is not None:
        (d / "services.py").write_bytes(content)
    code, line = run(d)
    again = run(d)[1] if code == 0 else ""
    kept = content is None or (d / "services.py").read_bytes().startswith(content)
    print(
        f"{name:28} rc={code} {line[:90]!r} | again: {again[:50]!r} | kept: {kept} | registers: {registers(d) if (d / 'services.py').exists() else '-'}"
    )

# folders
weird = [root / "my agents", root / "-dash", root / "a;b", root / "ünï", root / "new\nline"]
for d in weird:
    d.mkdir()
    print(f"{str(d.name)!r:28} rc,line={run(d)}")
ro = root / "readonly"
ro.mkdir()
ro.chmod(0o555)
print("read-only folder            ", run(ro), "(as root:", os.geteuid() == 0, ")")
ro_file = root / "readonly_file"
ro_file.mkdir()
(ro_file / "services.py").write_text("X = 1\n")
(ro_file / "services.py").chmod(0o444)
print(
    "read-only services.py       ",
    run(ro_file),
    oct((ro_file / "services.py").stat().st_mode & 0o777),
)
link = root / "linked"
link.mkdir()
(root / "elsewhere.py").write_text("Y = 2\n")
(link / "services.py").symlink_to(root / "elsewhere.py")
print("symlinked services.py       ", run(link), "link kept:", (link / "services.py").is_symlink())
dangling = root / "dangling"
dangling.mkdir()
(dangling / "services.py").symlink_to(root / "nowhere.py")
print("dangling link               ", run(dangling))
loop = root / "loop"
loop.mkdir()
(loop / "services.py").symlink_to(loop / "services.py")
print("self-loop link              ", run(loop))
dirsvc = root / "dir_services"
(dirsvc / "services.py").mkdir(parents=True)
print("services.py is a folder     ", run(dirsvc))
agent = root / "an_agent"
agent.mkdir()
(agent / "agent.py").write_text("root_agent = None\n")
print("agent's own folder          ", run(agent))
print("a file, not a folder        ", run(root / "elsewhere.py"))
print("missing folder              ", run(root / "missing"))
fifo = root / "fifo"
fifo.mkdir()
os.mkfifo(fifo / "services.py")
try:
    print(
        "services.py is a FIFO       ",
        subprocess.run(
            [AFT, "adk", "init", str(fifo)], capture_output=True, text=True, timeout=10
        ).returncode,
    )
except subprocess.TimeoutExpired:
    print("services.py is a FIFO        HANGS (timeout 10 s)")
ro.chmod(0o755)
shutil.rmtree(root)
