"""Shared harness of the break22 probes: a deployment on a private Redis (port 6422 by
default, BREAK22_REDIS), a worker process logging to a file, turns through a real ADK
runner with the callbacks, and a scan of every place the user's words could stay."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis

REDIS_URL = os.environ.get("BREAK22_REDIS", "redis://127.0.0.1:6422/0")
ROOT = Path(os.environ.get("BREAK22_DIR", "/tmp/break22/runs"))
VENV_BIN = Path(sys.executable).parent


def deployment(name: str, **extra: str) -> dict[str, str]:
    """The environment of a fresh deployment (its own prefix, files and spool)."""
    run = ROOT / f"{name}-{uuid.uuid4().hex[:6]}"
    run.mkdir(parents=True)
    env = {
        "REDIS_URL": REDIS_URL,
        "AFTERTHOUGHT_KEY_PREFIX": run.name.replace("-", "_"),
        "AFTERTHOUGHT_LOCAL_DB_PATH": str(run / "memory.sqlite3"),
        "AFTERTHOUGHT_SPOOL_PATH": str(run / "spool"),
        "AFTERTHOUGHT_SYNTHESIS_IDLE_SECONDS": "0.5",
        "AFTERTHOUGHT_CONTEXT_SETTLE_SECONDS": "0.5",
        "AFTERTHOUGHT_RETRIEVAL_BUDGET": "5",
        "AFTERTHOUGHT_ENQUEUE_TIMEOUT": "2",
        "BREAK22_RUN": str(run),
    }
    env.update(extra)
    return env


def apply(env: dict[str, str]) -> None:
    for k in list(os.environ):
        if k.startswith(("AFTERTHOUGHT_", "ZEP_")):
            del os.environ[k]
    os.environ.update(env)


def spawn_worker(env: dict[str, str], tag: str = "worker", *args: str) -> subprocess.Popen[bytes]:
    log = open(Path(env["BREAK22_RUN"]) / f"{tag}.log", "ab")  # noqa: SIM115 (the worker's)
    return subprocess.Popen(
        [str(VENV_BIN / "afterthought"), "--log-level", "DEBUG", "worker", *args],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def cli(env: dict[str, str], *args: str, tag: str = "cli") -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(VENV_BIN / "afterthought"), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    with open(Path(env["BREAK22_RUN"]) / f"{tag}.log", "a") as f:
        f.write(
            f"$ afterthought {' '.join(args)}\nrc={done.returncode}\n{done.stdout}\n{done.stderr}\n"
        )
    return done


def make_runner(app: str, **kwargs: object):  # type: ignore[no-untyped-def]
    from google.adk.agents import LlmAgent
    from google.adk.runners import InMemoryRunner

    from afterthought.agent_hooks import create_callbacks
    from afterthought.agent_hooks.turn_memory import TurnMemory
    from afterthought.testing import StandInLlm

    memory = TurnMemory.create(**kwargs)
    callbacks = create_callbacks(memory)
    agent = LlmAgent(
        name="assistant",
        model=StandInLlm(),
        before_model_callback=callbacks.before_model_callback,
        after_model_callback=callbacks.after_model_callback,
    )
    return InMemoryRunner(agent=agent, app_name=app), memory


async def talk(runner, app: str, user: str, *texts: str) -> list[str]:  # type: ignore[no-untyped-def]
    from google.genai import types

    session = await runner.session_service.create_session(app_name=app, user_id=user)
    replies = []
    for text in texts:
        async for event in runner.run_async(
            user_id=user, session_id=session.id, new_message=types.UserContent(text)
        ):
            if event.is_final_response() and event.content and event.content.parts:
                replies.append("".join(p.text or "" for p in event.content.parts))
    return replies


def wait_settled(env: dict[str, str], timeout: float = 60) -> bool:
    from afterthought.settings import Settings
    from afterthought.testing.processes import wait_settled as settled

    apply(env)
    return asyncio.run(settled(Settings(), timeout=timeout))


def redis_hits(markers: list[bytes], match: str = "*") -> list[tuple[str, str]]:
    """Every key (of any type) whose name or value holds a marker."""
    r = redis.Redis.from_url(REDIS_URL)
    found = []
    for key in r.scan_iter(match=match, count=1000):
        kind = r.type(key).decode()
        try:
            if kind == "string":
                blobs = [r.get(key) or b""]
            elif kind == "list":
                blobs = r.lrange(key, 0, -1)
            elif kind == "hash":
                blobs = [k + b"=" + v for k, v in r.hgetall(key).items()]
            elif kind == "set":
                blobs = list(r.smembers(key))
            elif kind == "zset":
                blobs = [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
            elif kind == "stream":
                blobs = [repr(e).encode() for e in r.xrange(key)]
            else:
                blobs = [r.dump(key) or b""]
        except redis.ResponseError:
            continue
        blobs.append(key)
        for m in markers:
            if any(m.lower() in b.lower() for b in blobs):
                found.append((key.decode(errors="replace"), m.decode()))
    return found


def file_hits(markers: list[bytes], where: Path) -> list[tuple[str, str]]:
    found = []
    for path in sorted(where.rglob("*")):
        if path.is_file():
            data = path.read_bytes().lower()
            for m in markers:
                if m.lower() in data:
                    found.append((str(path), m.decode()))
    return found


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for(pred, timeout: float = 30, every: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return False
