"""ADK's real ``adk api_server --memory_service_uri afterthought://`` (issue 26): an agents
folder prepared by ``afterthought adk init``, an agent with only ADK's own memory tools
(``tests/fixtures/adk_agents/remembering``), two users over HTTP, a worker beside it."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from afterthought.settings import Settings
from afterthought.testing.processes import spawn_worker, wait_settled
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / "tests" / "fixtures" / "adk_agents"
APP = "remembering"
#: How long a loaded machine may take to start ADK's server (a bound, not a measurement).
START_BOUND = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def adk_server(
    command: str, agents: Path, uri: str, env: dict[str, str], log: Path
) -> Iterator[httpx.Client]:
    """``adk api_server`` (or ``adk web``: ``command``) on a free port, as a user starts it;
    a client once it answers."""
    port = _free_port()
    adk = Path(sys.executable).with_name("adk")
    argv = [str(adk), command, "--no-reload", "--port", str(port)]
    with log.open("wb") as out:
        server = subprocess.Popen(
            [*argv, "--memory_service_uri", uri, str(agents)],
            env=env,
            cwd=agents.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    try:
        deadline = time.monotonic() + START_BOUND
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                if client.get("/list-apps").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield client
    finally:
        client.close()
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _session(client: httpx.Client, user: str) -> str:
    answer = client.post(f"/apps/{APP}/users/{user}/sessions", json={})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def _turn(client: httpx.Client, user: str, session: str, text: str) -> str:
    """One turn over ``/run``; the final reply's text."""
    answer = client.post(
        "/run",
        json={
            "app_name": APP,
            "user_id": user,
            "session_id": session,
            "new_message": {"role": "user", "parts": [{"text": text}]},
        },
    )
    assert answer.status_code == 200, answer.text
    texts = [
        "".join(part.get("text") or "" for part in (event.get("content") or {}).get("parts", []))
        for event in answer.json()
    ]
    return [text for text in texts if text][-1]


def test_adk_api_server_serves_two_users_memory_through_adks_own_memory_tools(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings()
    agents = tmp_path / "agents"
    shutil.copytree(AGENTS, agents, ignore=shutil.ignore_patterns("__pycache__"))
    init = run_cli(settings, "adk", "init", str(agents))
    assert init.returncode == 0 and "wrote" in init.stdout, init.stderr
    # The URI names the prefix: the server's environment does not (the worker's does).
    env = {**os.environ, **settings.as_env(), "PYTHONPATH": str(ROOT)}
    del env["AFTERTHOUGHT_KEY_PREFIX"]
    uri = f"afterthought://?key_prefix={settings.key_prefix}&limit=5"
    worker = spawn_worker(settings)
    try:
        with adk_server("api_server", agents, uri, env, tmp_path / "adk.log") as client:
            assert APP in client.get("/list-apps").json()
            ada, bob = _session(client, "ada"), _session(client, "bob")
            first = _turn(client, "ada", ada, "We moved to Lisbon last week.")
            assert "no memory" in first, first
            _turn(client, "ada", ada, "The boxes are everywhere.")  # the session added again
            _turn(client, "bob", bob, "I keep bees in Porto.")
            # ADK's own endpoint for add_session_to_memory too: nothing is stored twice.
            patched = client.patch(f"/apps/{APP}/users/bob/memory", json={"session_id": bob})
            assert patched.status_code == 200, patched.text
            assert asyncio.run(wait_settled(settings, 60))

            # New sessions: PreloadMemoryTool gives each user their own, each statement once.
            ada_tips = _turn(client, "ada", _session(client, "ada"), "Any tips for Lisbon?")
            assert ada_tips.count("user: We moved to Lisbon last week.") == 1, ada_tips
            assert "Time: " in ada_tips and "bees" not in ada_tips, ada_tips
            bob_tips = _turn(client, "bob", _session(client, "bob"), "Lisbon or Porto bees?")
            assert bob_tips.count("user: I keep bees in Porto.") == 1, bob_tips
            assert "moved" not in bob_tips, bob_tips
            # Ada's Lisbon is not Bob's. His own last turn may be stored by now (the worker
            # runs beside): what he said may be there, never what she did.
            theirs = _turn(client, "bob", _session(client, "bob"), "Tips for Lisbon?")
            assert "moved" not in theirs and "boxes" not in theirs, theirs

            # load_memory, called by the model.
            recalled = _turn(client, "ada", _session(client, "ada"), "recall: boxes")
            assert recalled == "load_memory found:\nuser: The boxes are everywhere.", recalled
    finally:
        worker.terminate()
        worker.wait(60)
