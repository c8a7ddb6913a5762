"""The afterthought:// parser and ZepMemoryService made from it, on odd URIs: each line
the URI, then the keywords or the error (type: message), checking that an error quotes
no value (the VALUE marker) and that a bad value is refused rather than passed on."""

import sys

from afterthought.agent_hooks.adk_services import memory_service_from_uri, parse_uri

V = "SECRETVALUE"
uris = [
    "afterthought://",
    "afterthought:",
    "afterthought:///",
    "AFTERTHOUGHT://",
    "afterthought://?",
    "afterthought://?limit=5",
    "afterthought://?limit=0",
    "afterthought://?limit=51",
    "afterthought://?limit=%EF%BC%95",
    "afterthought://?limit=\u0665",
    "afterthought://?limit=05",
    "afterthought://?limit=" + "9" * 5000,
    "afterthought://?limit=+5",
    "afterthought://?limit= 5",
    "afterthought://?limit=5&limit=6",
    "afterthought://?key_prefix=a&key_prefix=b",
    "afterthought://?key_prefix=a&key%5Fprefix=b",
    "afterthought://?KEY_PREFIX=shop",
    f"afterthought://?kee_prefix={V}",
    f"afterthought://?{V}",
    f"afterthought://?{V}=1",
    f"afterthought://?zep_api_key={V}",
    f"afterthought://?database_url=postgresql://u:{V}@h/db",
    f"afterthought://?redis_url=redis://:{V}@h",
    f"afterthought://?audit_key={V}",
    f"afterthought://?zep%5Fapi%5Fkey={V}",
    f"afterthought://user:{V}@host",
    f"afterthought://?key_prefix={V}#frag",
    "afterthought://path",
    "afterthought://?key_prefix=",
    "afterthought://?key_prefix=%20",
    "afterthought://?key_prefix=" + "x" * 100000,
    "afterthought://?context_max_chars=\u0665\u0660",
    "afterthought://?context_max_chars=1e999",
    "afterthought://?retrieval_budget=nan",
    "afterthought://?retrieval_budget=inf",
    f"afterthought://?fact_ttl_days={V}",
    'afterthought://?fact_ttl_days={"ephemeral":1e999}',
    "afterthought://?fact_ttl_days=[1]",
    'afterthought://?fact_ttl_days={"ephemeral":-1}',
    f"afterthought://?context_mode={V}",
    "afterthought://?key_prefix=a;b",
    "afterthought://?a&b",
    "afterthought://?=1",
    "afterthought://?key_prefix=%00",
    "afterthought://?key_prefix=%ff",
    f"afterthought://?local_db_path=/tmp/{V}/x.sqlite3",
    "afterthought://?spool_on_signals=maybe",
    "afterthought://?skip_nested=0",
    "afterthought://?limit=5;key_prefix=x",
]
leaks = 0
for uri in uris:
    try:
        kw = parse_uri(uri)
        try:
            svc = memory_service_from_uri(uri, agents_dir="x")
            got = f"OK {str(kw)[:80]} -> service"
        except Exception as exc:
            got = f"service {type(exc).__name__}: {str(exc)[:160]}"
    except Exception as exc:
        got = f"{type(exc).__name__}: {str(exc)[:160]}"
    leak = V in got and not got.startswith("OK")
    leaks += leak
    print(("LEAK " if leak else "     ") + f"{uri[:70]!r:74} {got}")
print("errors quoting a value:", leaks)
sys.exit(1 if leaks else 0)
