# ruff: noqa
"""Probe: the CLI and an agent (create_callbacks) never echo a bad setting's value."""

import os, subprocess, sys

C = "CANARYz7w"
cases = {
    "AFTERTHOUGHT_FACT_TTL_DAYS": [f'{{"{C}": -1}}', f'{{"x": "{C}"}}', C],
    "REDIS_URL": [C, f"redis://u:{C}@:99999/0", f"redis://{C}:notaport"],
    "AFTERTHOUGHT_DATABASE_URL": [C, f"postgresql://u:{C}@h:bad/db"],
    "AFTERTHOUGHT_BACKEND": [C],
    "AFTERTHOUGHT_RETRIEVAL_BUDGET": [f"-1{C}", C],
    "AFTERTHOUGHT_ZEP_USER_ID_TEMPLATE": ["{" + C + "}", C + "{"],
    "AFTERTHOUGHT_KEY_PREFIX": [C + ":x"],
    "AFTERTHOUGHT_SPOOL_PATH": ["/dev/null/" + C],
    "AFTERTHOUGHT_AUDIT_KEY": [C + " x"],
    "AFTERTHOUGHT_TOMBSTONE_KEY": [C + "\n"],
    "ZEP_BASE_URL": [C, f"ftp://{C}"],
    "AFTERTHOUGHT_SHARED_STORE": [C + " x"],
    "AFTERTHOUGHT_METRICS_PORT": [C],
}
agent = "from afterthought.agent_hooks.callbacks import create_callbacks\ncreate_callbacks()\n"
base = {
    k: v
    for k, v in os.environ.items()
    if not (k.startswith("AFTERTHOUGHT_") or k in ("REDIS_URL", "ZEP_API_KEY", "ZEP_BASE_URL"))
}
leaks = tried = multi = 0
for name, values in cases.items():
    for v in values:
        for cmd in (
            [sys.executable, "-m", "afterthought.cli", "status"],
            [sys.executable, "-c", agent],
        ):
            tried += 1
            p = subprocess.run(
                cmd, env={**base, name: v}, capture_output=True, text=True, timeout=60
            )
            out = p.stdout + p.stderr
            lines = [l for l in p.stderr.splitlines() if l.strip()]
            if C in out:
                leaks += 1
                print("LEAK", name, repr(v), cmd[1], [l for l in out.splitlines() if C in l][:2])
            if p.returncode == 0 or len(lines) > 2:
                multi += 1
                print(
                    "NOTE",
                    name,
                    repr(v),
                    cmd[-1][:20],
                    "rc",
                    p.returncode,
                    "lines",
                    len(lines),
                    lines[-1][:160] if lines else "",
                )
print("tried", tried, "leaks", leaks, "rc0-or-multiline", multi)
