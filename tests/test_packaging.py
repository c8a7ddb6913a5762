"""What a new user touches first: the example, the CLI, compose, the import layout."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import yaml

from afterthought.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def test_offline_example_remembers_across_sessions(local_settings: Settings) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"GOOGLE_API_KEY", "ZEP_API_KEY"}}
    env["REDIS_URL"] = local_settings.redis_url
    done = subprocess.run(
        [sys.executable, "examples/offline_chat.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    session_2 = done.stdout.split("--- session 2")[1]
    assert "stand-in model" in session_2
    assert "Lisbon" in session_2 and "genmaicha" in session_2


def test_cli_explains_itself() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "afterthought.cli", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "worker" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "afterthought.cli", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2


def test_compose_has_durable_redis_a_worker_and_the_agent() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "worker", "agent"} <= set(services)
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command and "noeviction" in redis_command
    assert services["worker"]["command"] == ["afterthought", "worker"]


def test_each_side_imports_only_the_core() -> None:
    """DESIGN.md's layout: the core imports nothing of ours (but the CLI, lazily)."""

    def ours(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        return {n.split(".")[0] for n in names} & {"afterthought", "agent_hooks", "worker"}

    for path in (ROOT / "afterthought").rglob("*.py"):
        if path.name != "cli.py":
            assert ours(path) <= {"afterthought"}, path
    for side, allowed in (
        ("agent_hooks", {"afterthought", "agent_hooks"}),
        ("worker", {"afterthought", "worker"}),
    ):
        for path in (ROOT / side).rglob("*.py"):
            assert ours(path) <= allowed, path
