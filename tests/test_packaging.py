"""What a new user touches first: the example, the CLI, compose, the import layout."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from afterthought.settings import Settings
from afterthought.testing.processes import spawn_worker, wait_settled

ROOT = Path(__file__).resolve().parents[1]


def _run(settings: Settings, *command: str) -> subprocess.CompletedProcess[str]:
    """A user's command, offline: no model or Zep keys, the test Redis."""
    env = {k: v for k, v in os.environ.items() if k not in {"GOOGLE_API_KEY", "ZEP_API_KEY"}}
    env["REDIS_URL"] = settings.redis_url
    return subprocess.run(
        [sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_offline_example_remembers_across_sessions(local_settings: Settings) -> None:
    done = _run(local_settings, "examples/offline_chat.py")
    assert done.returncode == 0, done.stderr
    _, session_1, session_2 = done.stdout.split("--- session ")
    assert "no memory" in session_1.split("agent>", 1)[1].lower()
    assert "stand-in model" in session_2
    assert "lives in: Lisbon" in session_2  # a fact from "we finally moved to Lisbon"
    assert "peanut" in session_2


def test_the_demo_remembers_and_retrieves_for_the_question(local_settings: Settings) -> None:
    done = _run(local_settings, "-m", "afterthought.cli", "demo")
    assert done.returncode == 0, done.stderr
    _, _, session_2, default, cached = done.stdout.split("--- session ")
    assert "stand-in model" in session_2
    # A fact from a natural sentence ("we finally moved to Lisbon last week").
    assert "lives in: Lisbon" in session_2
    # A passing remark the default brings back, retrieved for the question; the block
    # built before it does not hold it.
    assert "the default" in default and "wooden benches" in default.split("agent>", 1)[1]
    assert "cached mode" in cached and "trams" not in cached.split("agent>", 1)[1]


async def test_the_first_agent_remembers_with_a_worker_in_another_process(
    local_settings: Settings,
) -> None:
    """The README's first agent, run as it says: a worker in one process, two runs of the
    script (two sessions) in another; the second is given what the first said. The
    README's code is the example's, to the byte."""
    readme = (ROOT / "README.md").read_text()
    pasted = re.search(r"```python\n(.*?)```", readme[readme.index("## Your first agent") :], re.S)
    assert pasted and pasted.group(1) == (ROOT / "examples" / "first_agent.py").read_text()
    settings = local_settings.model_copy(update={"synthesis_idle_seconds": 0})
    env = {k: v for k, v in os.environ.items() if k not in {"GOOGLE_API_KEY", "ZEP_API_KEY"}}
    env.update(settings.as_env())

    def say(text: str) -> str:
        done = subprocess.run(
            [sys.executable, "examples/first_agent.py", text],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    worker = spawn_worker(settings)
    try:
        assert "no memory" in say("big news, we moved to Lisbon last week")
        for _ in range(5):  # the fact follows the stored turn by one synthesis job
            assert await wait_settled(settings, 60)
            second = say("any tips for my new city?")
            if "lives in: Lisbon" in second:
                break
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert "lives in: Lisbon" in second and '"big news, we moved to Lisbon last week"' in second


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("REDIS_URL", "notaurl", "REDIS_URL: the Redis URL must start with redis://"),
        ("AFTERTHOUGHT_RETRIEVAL_BUDGET", "-1", "retrieval_budget (AFTERTHOUGHT_RETRIEVAL_BUDGET)"),
        # A secret pasted into the wrong variable, a nested one too, is never echoed.
        ("AFTERTHOUGHT_LEASE_SECONDS", "sk-live-SECRET", "lease_seconds"),
        ("AFTERTHOUGHT_FACT_TTL_DAYS", '{"ephemeral": "sk-live-SECRET"}', "fact_ttl_days"),
        # A ~user without a home here: pathlib's RuntimeError was a traceback.
        (
            "AFTERTHOUGHT_SPOOL_PATH",
            "~sk-live-SECRET/spool",
            "spool_path (AFTERTHOUGHT_SPOOL_PATH)",
        ),
    ],
)
def test_the_first_agent_with_a_bad_setting_says_one_line(
    local_settings: Settings, variable: str, value: str, says: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"GOOGLE_API_KEY", "ZEP_API_KEY"}}
    env.update(local_settings.as_env())
    env[variable] = value
    done = subprocess.run(
        [sys.executable, "examples/first_agent.py", "hello"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and not done.stdout
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("my_agent: bad setting: ")
    assert says in done.stderr and "SECRET" not in done.stderr


def test_multi_user_example_keeps_each_users_memory_apart(local_settings: Settings) -> None:
    done = _run(local_settings, "examples/multi_user_app.py")
    assert done.returncode == 0, done.stderr
    ada, grace = done.stdout.split(": session 2")[1:]
    assert "Lisbon" in ada and "window seats" in ada and "Oslo" not in ada
    assert "Oslo" in grace and "skiing" in grace and "Lisbon" not in grace
    assert "search_memory(ada, 'seat')" in done.stdout


def test_live_example_says_which_keys_are_missing(local_settings: Settings) -> None:
    done = _run(local_settings, "examples/live_gemini_zep.py")
    assert done.returncode == 2
    assert "GOOGLE_API_KEY" in done.stderr and "ZEP_API_KEY" in done.stderr


def test_cli_explains_itself() -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "afterthought.cli", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=30)

    top = cli("--help")
    assert top.returncode == 0 and "exit codes" in top.stdout
    for command in ("worker", "status", "prune", "forget", "dlq", "backfill", "demo"):
        assert command in top.stdout
        assert cli(command, "--help").returncode == 0, command
    assert cli("nope").returncode == 2


def test_compose_runs_durable_redis_two_workers_the_agent_and_prometheus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What ``docker compose config`` would check where Docker exists, and what we mean."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "worker", "agent", "prometheus"} <= set(services)
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command and "noeviction" in redis_command
    worker = services["worker"]
    assert worker["command"][0] == "afterthought" and worker["command"][-1] == "worker"
    assert worker["deploy"]["replicas"] == 2
    port = worker["environment"]["AFTERTHOUGHT_METRICS_PORT"]
    assert f"127.0.0.1:{port}/healthz" in " ".join(worker["healthcheck"]["test"])
    for name, value in worker["environment"].items():  # compose's ${NAME:-default}, unset
        if value := re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value):
            monkeypatch.setenv(name, value)
    assert Settings().metrics_port == int(port)  # the environment is valid settings
    assert services["agent"]["depends_on"]["worker"]["condition"] == "service_healthy"

    # The sentinel profile: two replicas of `redis` (as the README says: WAIT 1 then goes
    # on while one is down or promoted), each announced by its own name, three sentinels
    # watching them, and the REDIS_URL its header gives is one the settings take.
    sentinels = [n for n, svc in services.items() if n.startswith("sentinel-")]
    replicas = [n for n, svc in services.items() if n.startswith("redis-replica")]
    assert len(sentinels) == 3 and len(replicas) == 2
    for name in replicas:
        command = " ".join(services[name]["command"])
        assert services[name]["profiles"] == ["sentinel"] and "--replicaof redis 6379" in command
        assert f"--replica-announce-ip {name}" in command
    for name in sentinels:
        assert set(replicas) <= set(services[name]["depends_on"])
        assert services[name]["profiles"] == ["sentinel"]
        assert "sentinel monitor afterthought redis 6379 2" in services[name]["command"][-1]
    header = (ROOT / "docker-compose.yml").read_text()
    url = re.search(r"REDIS_URL=(redis\+sentinel://\S+)", header)
    assert url and Settings(redis_url=url.group(1)).redis_url.endswith("/afterthought/0")

    mount = services["prometheus"]["volumes"][0].split(":")
    scrape = yaml.safe_load((ROOT / mount[0]).read_text())
    (job,) = scrape["scrape_configs"]
    (discovery,) = job["dns_sd_configs"]
    assert discovery["names"] == ["worker"] and discovery["port"] == int(port)
    for service in services.values():  # every build context and mounted file exists
        for volume in service.get("volumes", []):
            if volume.startswith("./"):
                assert (ROOT / volume.split(":")[0]).exists(), volume


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}


def test_each_side_imports_only_the_core() -> None:
    """DESIGN.md's layout: the core imports nothing of ours (but what the CLI runs: its
    demo and the inspector, whose forget is the worker's)."""

    def ours(path: Path) -> set[str]:
        sides = set()
        for name in _imported(path):
            parts = name.split(".")
            if parts[0] == "afterthought":
                sides.add(parts[1] if parts[1:2] in (["agent_hooks"], ["worker"]) else parts[0])
        return sides

    sides = {"agent_hooks", "worker"}
    for path in (ROOT / "afterthought").rglob("*.py"):
        inside = path.relative_to(ROOT / "afterthought").parts[0]
        runs_sides = inside == "inspector" or path.name in {"cli.py", "demo.py"}
        if inside not in sides and not runs_sides:
            assert ours(path) <= {"afterthought"}, path
    for side in sides:
        for path in (ROOT / side).rglob("*.py"):
            assert ours(path) <= {"afterthought", side}, path


def test_nothing_imports_the_source_folders_by_their_own_names() -> None:
    """``agent_hooks`` and ``worker`` are imported as ``afterthought.agent_hooks`` and
    ``afterthought.worker`` everywhere (installed, only those names exist; in this tree,
    importing both would load every module twice, with two copies of its state)."""
    for path in ROOT.glob("*/**/*.py"):
        if path.parts[len(ROOT.parts)] in {".venv", "afterthought"}:
            continue
        bare = {n for n in _imported(path) if n.split(".")[0] in {"agent_hooks", "worker"}}
        assert not bare, (path, bare)


def test_the_wheel_installs_one_package_beside_one_that_owns_worker(tmp_path: Path) -> None:
    """Built and installed as a user would, into a fresh venv that already holds a package
    owning the top-level ``worker`` (there are such distributions): ours installs only
    ``afterthought`` (agent side and worker inside it), leaves theirs alone, and runs."""
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("afterthought_adk-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        assert {"afterthought/worker/jobs.py", "afterthought/agent_hooks/plugin.py"} <= set(
            archive.namelist()
        )
    assert {t for t in tops if not t.endswith(".dist-info")} == {"afterthought"}

    theirs = tmp_path / "theirs"
    (theirs / "worker").mkdir(parents=True)
    (theirs / "worker" / "__init__.py").write_text("OWNER = 'someone else'\n")
    (theirs / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "their-worker"\nversion = "1.0"\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["worker"]\n'
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, str(theirs)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([*pip, str(wheel)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    probe = (
        "import worker, afterthought.worker.jobs, afterthought.agent_hooks.plugin;"
        "from afterthought.agent_hooks import MemoryPlugin;"
        "print(worker.OWNER, afterthought.worker.jobs.__name__)"
    )
    ran = subprocess.run([python, "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["someone", "else", "afterthought.worker.jobs"]
    cli = subprocess.run(
        [str(venv / "bin" / "afterthought"), "--help"], capture_output=True, text=True
    )
    assert cli.returncode == 0 and "worker" in cli.stdout, cli.stderr


def test_every_setting_is_in_the_readme_table() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Settings") : readme.index("## Identity")]
    bare = {"redis_url", "arq_redis_url", "zep_api_key", "zep_base_url"}  # by their env names
    for field in Settings.model_fields:
        assert f"`{field.upper() if field in bare else field}`" in table, field


def test_the_docs_name_only_files_that_exist() -> None:
    """The README and docs/ stand alone: every file they name is in the repository (paths
    in the layout table are relative to the package they sit under)."""
    named = re.compile(r"`([\w./-]+/[\w.-]+\.(?:md|py|json|ya?ml|toml|txt))`")
    for doc in (ROOT / "README.md", *(ROOT / "docs").glob("*.md")):
        for path in named.findall(doc.read_text()):
            assert (ROOT / path).exists() or (ROOT / "afterthought" / path).exists(), (doc, path)
