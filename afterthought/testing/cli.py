"""``afterthought ARGS`` in the calling process, for tests: a process start costs 0.3-0.8 s,
the command itself milliseconds, and a test of what the CLI says needs only its exit code,
stdout and stderr. What a process gives for free is done here by hand: the environment is
the settings', the CLI's logging goes to its stderr, and both are put back afterwards."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import logging
import os
import subprocess

from afterthought import cli
from afterthought.settings import Settings


def run_cli_here(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """What ``afterthought --log-level ERROR ARGS`` run as a process configured like
    ``settings`` returns (:class:`subprocess.CompletedProcess`, as ``subprocess.run``).
    Called from a running event loop (the CLI runs one of its own), it runs in a thread and
    holds the caller's loop until it is done, as ``subprocess.run`` would."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_here(settings, *args)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_run_here, settings, *args).result()


def _run_here(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["--log-level", "ERROR", *args]
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    httpx = logging.getLogger("httpx")
    # basicConfig does nothing to a root logger with handlers (pytest's capture adds its
    # own): without them, the CLI's handler is installed and writes to ``err``.
    handlers, level, httpx_level = root.handlers[:], root.level, httpx.level
    environ = os.environ.copy()
    root.handlers = []
    os.environ.update(settings.as_env())
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as exc:  # argparse's usage errors and --help
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers = handlers
        root.setLevel(level)
        httpx.setLevel(httpx_level)
        os.environ.clear()
        os.environ.update(environ)
    return subprocess.CompletedProcess(
        ["afterthought", *argv], code, out.getvalue(), err.getvalue()
    )
