"""Bad (or unreachable) settings holding a secret: every command must fail naming the
setting, never printing the secret. Runs `afterthought status` and `afterthought worker
--burst` with each environment and greps their output for the secret.

    python probes/break22/p02_secret_settings.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common

S = "Sekr3tPW"
CASES: dict[str, dict[str, str]] = {
    "zep key with space": {"ZEP_API_KEY": f"zk_{S} x"},
    "zep key unicode": {"ZEP_API_KEY": f"zk_{S}\u2019"},
    "zep base url creds unreachable": {
        "ZEP_API_KEY": "k",
        "ZEP_BASE_URL": f"http://u:{S}@127.0.0.1:1/api/v4",
    },
    "zep base url bad scheme": {"ZEP_API_KEY": "k", "ZEP_BASE_URL": f"ftp://u:{S}@h/api"},
    "zep base url no host": {"ZEP_API_KEY": "k", "ZEP_BASE_URL": f"http://:{S}@/api"},
    "zep base url bad port": {"ZEP_API_KEY": "k", "ZEP_BASE_URL": f"http://u:{S}@h:99999/api"},
    "redis unreachable": {"REDIS_URL": f"redis://:{S}@127.0.0.1:1/0"},
    "redis no host": {"REDIS_URL": f"redis://:{S}@/0"},
    "redis bad port": {"REDIS_URL": f"redis://:{S}@127.0.0.1:abc/0"},
    "redis bad scheme": {"REDIS_URL": f"htp://:{S}@127.0.0.1:6422/0"},
    "redis bad db": {"REDIS_URL": f"redis://:{S}@127.0.0.1:6422/x{S}"},
    "redis query": {"REDIS_URL": f"redis://127.0.0.1:6422/0?password={S}&socket_timeout=abc"},
    "redis pw no auth configured": {"REDIS_URL": f"redis://:{S}@127.0.0.1:6422/0"},
    "redis user pw": {"REDIS_URL": f"redis://nobody:{S}@127.0.0.1:6422/0"},
    "sentinel bad": {"REDIS_URL": f"redis+sentinel://:{S}@127.0.0.1:1/mymaster/0"},
    "sentinel pw param": {
        "REDIS_URL": f"redis+sentinel://127.0.0.1:1/mymaster/0?sentinel_password={S}"
    },
    "arq url": {"ARQ_REDIS_URL": f"redis://:{S}@127.0.0.1:1/0"},
    "pg unreachable": {"AFTERTHOUGHT_DATABASE_URL": f"postgresql://u:{S}@127.0.0.1:1/test"},
    "pg unknown role": {
        "AFTERTHOUGHT_DATABASE_URL": f"postgresql://nobody22:{S}@127.0.0.1:5432/test"
    },
    "pg bad port": {"AFTERTHOUGHT_DATABASE_URL": f"postgresql://u:{S}@127.0.0.1:abc/test"},
    "pg space": {"AFTERTHOUGHT_DATABASE_URL": f"postgresql://u:{S} x@127.0.0.1:5432/test"},
    "pg scheme": {"AFTERTHOUGHT_DATABASE_URL": f"postgres+asyncpg://u:{S}@127.0.0.1:5432/test"},
    "pg sslmode": {
        "AFTERTHOUGHT_DATABASE_URL": f"postgresql://u:{S}@127.0.0.1:5432/test?sslmode={S}"
    },
    "pg option": {"AFTERTHOUGHT_DATABASE_URL": f"postgresql://u:{S}@127.0.0.1:5432/test?bogus={S}"},
    "pg password param": {
        "AFTERTHOUGHT_DATABASE_URL": f"postgresql://127.0.0.1:1/test?password={S}"
    },
    "pg bad db": {"AFTERTHOUGHT_DATABASE_URL": f"postgresql://postgres:{S}@127.0.0.1:5432/no{S}"},
    "pg bad pct": {"AFTERTHOUGHT_DATABASE_URL": f"postgresql://u:{S}%zz@127.0.0.1:5432/test"},
    "pg ipv6": {"AFTERTHOUGHT_DATABASE_URL": f"postgresql://u:{S}@[::1/test"},
    "pg multi host": {
        "AFTERTHOUGHT_DATABASE_URL": f"postgresql://u:{S}@127.0.0.1:1,127.0.0.1:2/test"
    },
    "pg unix": {"AFTERTHOUGHT_DATABASE_URL": f"postgresql:///test?host=/nonexist&password={S}"},
    "backend pg no url": {"AFTERTHOUGHT_BACKEND": f"{S}"},
    "schema": {"AFTERTHOUGHT_DATABASE_SCHEMA": f"{S}-x"},
    "prefix": {"AFTERTHOUGHT_KEY_PREFIX": f"{S}:x"},
    "template": {"AFTERTHOUGHT_ZEP_USER_ID_TEMPLATE": f"{{{S}}}"},
    "template2": {"AFTERTHOUGHT_ZEP_USER_ID_TEMPLATE": f"{S}%{{user_id}}"},
    "ttl json": {"AFTERTHOUGHT_FACT_TTL_DAYS": f'{{"{S}": 7}}'},
    "ttl json2": {"AFTERTHOUGHT_FACT_TTL_DAYS": f"{S}"},
    "shared store": {"AFTERTHOUGHT_SHARED_STORE": f"{S} x"},
    "audit key blank": {"AFTERTHOUGHT_AUDIT_KEY": "   "},
    "prune at": {"AFTERTHOUGHT_PRUNE_AT": f"{S}"},
    "synthesis model": {"AFTERTHOUGHT_SYNTHESIS_MODEL": f"{S}"},
    "embedding model": {"AFTERTHOUGHT_EMBEDDING_MODEL": f"/nonexistent/{S}"},
    "memory mode": {"AFTERTHOUGHT_MEMORY_MODE": f"{S}"},
    "context mode": {"AFTERTHOUGHT_CONTEXT_MODE": f"{S}"},
    "number": {"AFTERTHOUGHT_LEASE_SECONDS": f"{S}"},
    "bool": {"AFTERTHOUGHT_DIRECT_WRITE_ON_OUTAGE": f"{S}"},
    "template uuid": {"AFTERTHOUGHT_CONTEXT_TEMPLATE_UUID": f"{S}"},
    "assistant name": {"AFTERTHOUGHT_ASSISTANT_NAME": f"{S}\n"},
    "misspelt": {"AFTERTHOUGHT_ZEP_APIKEY": f"{S}"},
    "misspelt2": {f"AFTERTHOUGHT_{S.upper()}": "1"},
    "metrics host": {"AFTERTHOUGHT_METRICS_HOST": f"{S}.invalid", "AFTERTHOUGHT_METRICS_PORT": "0"},
    "spool path": {"AFTERTHOUGHT_SPOOL_PATH": f"relative/{S}"},
    "wait replicas": {"AFTERTHOUGHT_REDIS_WAIT_REPLICAS": f"{S}"},
    "shards": {"AFTERTHOUGHT_REDIS_SHARDS": f"{S}"},
}

leaks = 0
for name, over in CASES.items():
    env = common.deployment("p02")
    env.pop("AFTERTHOUGHT_LOCAL_DB_PATH")
    env.update(over)
    for args in (["status"], ["worker", "--burst"], ["forget", "--app", "a", "--user", "u"]):
        try:
            done = subprocess.run(
                [str(common.VENV_BIN / "afterthought"), *args],
                env={
                    **{
                        k: v
                        for k, v in __import__("os").environ.items()
                        if not k.startswith(("AFTERTHOUGHT_", "ZEP_"))
                    },
                    **env,
                },
                capture_output=True,
                text=True,
                timeout=40,
            )
            out, rc = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            out, rc = (exc.stdout or b"").decode() + (exc.stderr or b"").decode(), "timeout"
        leaked = S.lower() in out.lower()
        leaks += leaked
        last = [line for line in out.strip().splitlines() if line.strip()][-1:] or [""]
        print(f"{'LEAK ' if leaked else 'ok   '}{name:32} {args[0]:7} rc={rc} {last[0][:150]}")
        if leaked:
            for line in out.splitlines():
                if S.lower() in line.lower():
                    print("      >>", line[:300])
print("leaks:", leaks)
